"""The LLVM renderer's vector lanes (codegen/render_llvm.py): a register block's columns are computed as vectors,
so every epilogue op, dtype and access kind a blocked contraction can hold must equal NumPy in vector form."""
import math

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.optimize import optimize, stride_along
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.target import AVX2, AVX512, host_target
from prepjit.uop import Ops

EPILOGUES = {
    "gelu_erf": (lambda h: 0.5 * h * (1 + pnp.erf(h * 0.7071)),
                 lambda h: 0.5 * h * (1 + np.vectorize(math.erf)(h.astype(np.float64) * 0.7071))),
    "exp": (lambda h: pnp.exp(h * 0.1), lambda h: np.exp(h * 0.1)),
    "tanh_per_lane": (lambda h: pnp.tanh(h), np.tanh),
    "where_compare": (lambda h: pnp.where(h > 0.5, h, -h * 2), lambda h: np.where(h > 0.5, h, -h * 2)),
    "int_roundtrip": (lambda h: (h * 4).astype(np.int32) % 3 + h.astype(np.int64) // 2,
                      lambda h: (h * 4).astype(np.int32) % 3 + h.astype(np.int64) // 2),
    "maximum_sqrt": (lambda h: pnp.sqrt(pnp.maximum(h, 0)), lambda h: np.sqrt(np.maximum(h, 0))),
}


def _lanes_of(f, *args) -> list[int]:
    """The extents of the lane ranges in the kernels of `f`'s plan once optimised for this host."""
    return [u.src[0].arg for k in f.plan(*args).kernels for u in optimize(k.kernel.scheduled, "llvm").toposort()
            if u.op is Ops.RANGE and u.arg[1] == "lane"]


@pytest.mark.parametrize("name", sorted(EPILOGUES))
def test_blocked_epilogues_in_vectors_match_numpy(rng, name):
    ours, ref = EPILOGUES[name]
    w, b = rng.standard_normal((24, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    f = pj.prepare(lambda x, w, b: ours(x @ w + b), vars={"n": (1, 40)}, shapes={"x": ("n", None)}, device="cpu")
    for n in (1, 7, 9, 40):
        x = rng.standard_normal((n, 24)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(x, w, b)), ref(x @ w + b), rtol=2e-4, atol=2e-4, err_msg=f"n={n}")
    assert _lanes_of(f, x, w, b), "the contraction was not computed in vector lanes"


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float16, 2e-2)])
def test_vector_lanes_of_other_float_widths(rng, dtype, tol):
    a, b = rng.standard_normal((19, 16)).astype(dtype), rng.standard_normal((16, 64)).astype(dtype)
    f = pj.prepare(lambda a, b: pnp.maximum(a @ b, 0), device="cpu")
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)
    np.testing.assert_allclose(np.asarray(f(a, b)).astype(np.float64), want, rtol=tol, atol=tol)
    assert _lanes_of(f, a, b), "the contraction was not computed in vector lanes"
    (kernel,) = f.plan(a, b).kernels
    assert f"x {'double' if dtype == np.float64 else 'half'}>" in kernel.kernel.source   # vectors of its width


def test_symbolic_columns_contiguous_mask_and_tail(rng):
    """q @ k.T with a symbolic sequence: k.T packed into column panels (for this host's vector width), so no
    operand is gathered: AVX-512 blocks of 8 rows x 2 vectors of 16 lanes (AVX2: 6 rows x 2 vectors of 8), each
    loading its mask values as one contiguous vector, then a peeled tail of one scalar column per row."""
    f = pj.prepare(lambda q, k, m: pnp.where(m > 0, q @ k.T, -1e9), vars={"s": (1, 70)},
                   shapes={"q": ("s", 16), "k": ("s", 16), "m": ("s",)}, device="cpu")
    for s in (1, 15, 32, 33, 70):
        q, k = rng.standard_normal((s, 16)).astype(np.float32), rng.standard_normal((s, 16)).astype(np.float32)
        m = (rng.random(s) > 0.3).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(q, k, m)), np.where(m > 0, q @ k.T, -1e9), rtol=1e-4, atol=1e-4)
    assert _lanes_of(f, q, k, m), "the symbolic columns were not computed in vector lanes"
    pack, kernel = f.plan(q, k, m).kernels
    assert pack.ast.arg[:5] == "pack_"
    host = host_target()  # the target the pack kernel's panels were laid out for
    blocked = optimize(kernel.kernel.scheduled, "llvm", host)
    mask_strides = []  # per store: its lanes, and the mask load's step along them (None: a scalar store)
    for store in blocked.src:
        lane = next((u for u in store.toposort() if u.op is Ops.RANGE and u.arg[1] == "lane"), None)
        summed = {u for r in store.toposort() if r.op is Ops.REDUCE for u in r.toposort()}
        (mask,) = [u for u in store.src[2].toposort() if u.op is Ops.LOAD and u not in summed]
        mask_strides.append((lane.src[0].arg, stride_along(mask.src[1], lane)) if lane is not None else None)
    rows, lanes = (8, 16) if host.vector_bytes == 64 else (6, 8)
    assert mask_strides == [(lanes, 1)] * (rows * 2) + [None] * rows
    assert "masked.gather" not in render_llvm(blocked, host).source


@pytest.mark.parametrize("target,lanes", [(AVX512, 16), (AVX2, 8)])
def test_lane_width_is_one_vector_register(rng, target, lanes):
    a, b = rng.standard_normal((16, 16)).astype(np.float32), rng.standard_normal((16, 64)).astype(np.float32)
    (kernel,) = pj.prepare(lambda a, b: a @ b, device="cpu").plan(a, b).kernels
    blocked = optimize(kernel.kernel.scheduled, "llvm", target)
    assert {u.src[0].arg for u in blocked.toposort() if u.op is Ops.RANGE and u.arg[1] == "lane"} == {lanes}
    source = render_llvm(blocked, target).source
    assert f"<{lanes} x float>" in source and "masked.gather" not in source  # contiguous: plain vector loads
