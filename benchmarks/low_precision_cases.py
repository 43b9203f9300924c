"""Contractions of 16-bit floats (bfloat16, float16) on the cpu: a decode step's matrix-vector products and
square matmuls, each against the same values in float32 through prepjit ("prepjit-args": prepjit called another
way) and NumPy ("numpy"). A bfloat16 weight is half the bytes of a float32 one, so a bandwidth-bound matvec over
it should take about half the time (the rates count the 16-bit bytes read)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from .case import Case

DTYPES = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


def matmul(xp, a, b):
    return a @ b


def _float32_peers():
    """The peers' calls: the contraction of the same values widened to float32, by NumPy and by prepjit."""
    import prepjit as pj

    def widened(call):
        return lambda *xs: call(*(x.astype(np.float32) for x in xs))
    return {"numpy": lambda arrays: widened(np.matmul),
            "prepjit-args": lambda arrays: widened(pj.prepare(lambda a, b: a @ b))}


def _inputs(shapes, smoke_shapes, dtype):
    def make(rng, smoke):
        return [rng.standard_normal(s).astype(dtype) for s in (smoke_shapes if smoke else shapes)]
    return make


def _bytes(arrays):
    return sum(a.nbytes for a in arrays), "GB/s"


def _flops(arrays):
    a, b = arrays
    return 2 * a.shape[0] * a.shape[1] * b.shape[1], "GFLOP/s"


def _case(name, shapes, smoke_shapes, dtype, work, goal=None):
    return Case(f"{name}_{dtype}", matmul, _inputs(shapes, smoke_shapes, DTYPES[dtype]), work=work, peers=(),
                peer_fns=_float32_peers(), goal=goal, rtol=1e-2, atol=1e-1)


LOW_PRECISION_CASES = tuple(
    case for dtype in DTYPES for case in (
        # bandwidth-bound: half the bytes of float32, so at most 0.6x its time
        _case("matvec_576x3072", ((576,), (576, 3072)), ((24,), (24, 64)), dtype, _bytes, ("prepjit-args", 0.6)),
        _case("matvec_head_49152x576", ((49152, 576), (576,)), ((40, 24), (24,)), dtype, _bytes,
              ("prepjit-args", 0.6)),
        _case("matmul_512", ((512, 512), (512, 512)), ((8, 8), (8, 8)), dtype, _flops),
        _case("matmul_1024", ((1024, 1024), (1024, 1024)), ((8, 8), (8, 8)), dtype, _flops),
    ))
