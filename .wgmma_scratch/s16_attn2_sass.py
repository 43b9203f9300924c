"""helper s16 attention2 (issue 22), no GPU needed: the fused attention kernels (render_attention.py) rendered for
CUDA_HOPPER_TARGET and compiled by nvcc for sm_90a (-Xptxas -v), their SASS counted (cuobjdump + nvdisasm from the
pip wheels under /tmp/cuobj, /tmp/nvdis; see .wgmma_scratch/s15m/sass_counts.py). Kernels: MiniLM b32 t128 bf16
(static T, 1 layer), the test's split-head attention in bf16 and f16 (var T <= 128 and <= 256) and its causal
heads of 64. argv: an output folder (default /tmp/s16a2sass). Prints per kernel: registers, spills, shared bytes,
static SASS counts (both sides of a branch count: the copies' element fallbacks, the division's slow path)."""
import glob
import math
import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from examples.models import minilm
from examples.models.common import DTYPES, tree_cast
from prepjit.codegen.gpu_launch import launch_of
from prepjit.codegen.optimize import DEFAULT_BLOCKING, optimize
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_HOPPER_TARGET
from tests.codegen.test_attention_tiles import SHAPES, VARS, _args, attention, causal

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/s16a2sass"
os.makedirs(out, exist_ok=True)
cuobjdump = (glob.glob("/tmp/cuobj/x/nvidia/*/bin/cuobjdump") or ["cuobjdump"])[0]
nvdisasm = glob.glob("/tmp/nvdis/x/nvidia/*/bin/nvdisasm")
env = dict(os.environ, PATH=os.path.dirname(nvdisasm[0]) + ":" + os.environ["PATH"]) if nvdisasm else os.environ
INSTR = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+([@A-Z].*?) ;")
OPS = ("HMMA", "LDSM", "LDS", "LDG", "LDGSTS", "STS", "SHFL", "BAR", "MUFU.EX2", "MUFU.RCP", "FMNMX", "F2F", "F2FP",
       "CALL", "BSSY")


def traced_cases():
    rng = np.random.default_rng(0)
    p = tree_cast(minilm.random_params(rng, layers=1, vocab=30522), DTYPES["bf16"])
    b, t = 32, 128
    yield "minilm_b32_t128_bf16", pj.trace(minilm.prepared_embed(b, t, symbolic=False, device="cpu"), p,
                                            np.ones((b, t), np.int64), np.ones((b, t), np.float32))
    for dtype, name in ((ml_dtypes.bfloat16, "bf16"), (np.float16, "f16")):
        for longest in (128, 256):
            f = pj.prepare(lambda q, k, v, mask: attention(pnp, q, k, v, mask), vars={**VARS, "T": (1, longest)},
                           shapes=SHAPES)
            yield f"split_{name}_T{longest}", pj.trace(f, *_args(dtype, 2, 40))
    f = pj.prepare(lambda q, k, v: causal(pnp, q, k, v), vars={"T": (1, 128)}, shapes={x: (2, 2, "T", 64) for x in "qkv"})
    yield "causal_bf16_d64", pj.trace(f, *[rng.standard_normal((2, 2, 40, 64)).astype(ml_dtypes.bfloat16)
                                           for _ in range(3)])


print(f"{'case':22s} {'regs':>4s} {'spill':>5s} {'smem':>6s} {'instrs':>6s} " + " ".join(f"{o:>8s}" for o in OPS))
for case, traced in traced_cases():
    sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
    for i, k in enumerate(sched.kernels):
        ast = CUDA_HOPPER_TARGET.launched(optimize(k.ast, "cuda"), DEFAULT_BLOCKING)
        if (launch_of(ast) or ("",))[0] != "attention":
            continue
        src = CUDA_HOPPER_TARGET.render(ast)
        base = f"{out}/{case}"
        open(base + ".cu", "w").write(src.source)
        info = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-std=c++17", "-Xptxas", "-v", "-o", base + ".cubin",
                               base + ".cu"], capture_output=True, text=True)
        if info.returncode:
            print(case, "COMPILE FAILED\n", info.stderr[-3000:])
            continue
        regs = re.search(r"Used (\d+) registers", info.stderr)
        spill = re.search(r"(\d+) bytes spill stores", info.stderr)
        smem = re.search(r"(\d+) bytes smem", info.stderr)
        sass = subprocess.run([cuobjdump, "--dump-sass", base + ".cubin"], capture_output=True, text=True, env=env).stdout
        ins = [m.group(1) for line in sass.splitlines() if (m := INSTR.match(line))]
        ops = [re.sub(r"^@!?U?P[T0-9] ", "", s).split(" ")[0] for s in ins]
        counts = [sum(o == n or o.startswith(n + ".") for o in ops) for n in OPS]
        print(f"{case:22s} {regs.group(1) if regs else '?':>4s} {spill.group(1) if spill else '?':>5s} "
              f"{smem.group(1) if smem else '?':>6s} {len(ins):6d} " + " ".join(f"{c:8d}" for c in counts))
