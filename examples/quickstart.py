"""Quick start: prepare a function with a symbolic batch dim and a decode position, replay it."""
import numpy as np

import prepjit as pj
import prepjit.numpy as pnp


@pj.prepare(vars={"n": (1, 1024), "pos": (0, 63)}, shapes={"x": ("n", 64)})
def layer(x, w, pos, scale=1.0):
    h = pnp.tanh(x @ w)                                   # (n, 64)
    probs = pnp.exp(h - h.max(axis=1, keepdims=True))
    probs = probs / probs.sum(axis=1, keepdims=True)      # softmax over rows
    return probs[:, :pos + 1] * scale                     # a window that grows with pos


rng = np.random.default_rng(0)
w = rng.standard_normal((64, 64)).astype(np.float32) / 8
for n, pos in [(1, 0), (3, 5), (8, 17), (100, 63)]:
    x = rng.standard_normal((n, 64)).astype(np.float32)
    out = np.asarray(layer(x, w, pos))
    h = np.tanh(x @ w)
    ref = np.exp(h - h.max(1, keepdims=True))
    ref = (ref / ref.sum(1, keepdims=True))[:, :pos + 1]
    print(f"n={n:<4} pos={pos:<3} -> shape {out.shape}, max |err| vs NumPy = {np.abs(out - ref).max():.2e}")

print("\nstats:", layer.stats, "(one trace, every later call a replay)")
plan = layer.plan(x, w, pos)
print("\n" + str(plan))
window = next(k for k in plan.kernels if "pos" in k.kernel.var_names)   # the fused softmax-window kernel
print(f"\nsource of kernel {window.kernel.name} (n and pos are its trailing arguments):\n" + window.kernel.source)

try:
    layer(rng.standard_normal((2000, 64)).astype(np.float32), w, 0)
except pj.VarBoundError as e:
    print("bad input is refused:", e)
