"""Contraction precision, as JAX's `precision=` and `jax.default_matmul_precision`: "highest" (exact float32, the
default), "tf32" or "bf16" (a device may round float32 operands to those in its tensor cores). The choice of a
contraction is its own `precision=`, else the innermost `pj.default_matmul_precision(...)` around its trace, else
PREPJIT_DEFAULT_MATMUL_PRECISION, else "highest".

The setting is validated and resolved here, the one place a contraction asks, and carried in the graph as the arg
of the contraction's product (`product`: MUL(a, b) with arg "tf32" or "bf16"; exact products have none), so it
survives vmap, lowering, the kernel cache's key and saved plans. What each device makes of it: a CUDA GPU multiplies
a float32 contraction under "tf32" on tensor cores (operands rounded to tf32, codegen/render_fragments.py), under
"bf16" rounds them to bfloat16 for the bfloat16 tensor-core path; the cpu and OpenCL compute every precision exactly
(as the contract allows for a device without such units, and as JAX on the CPU does).
"""
from __future__ import annotations

import contextlib
import contextvars
import os

from ..uop import Ops, UOp, dtypes
from ..uop.ops import PRODUCT_PRECISIONS
from . import prims
from .tracer import Tracer

PRECISIONS = ("highest", *PRODUCT_PRECISIONS)
_NAMES = {"highest": "highest", "float32": "highest", "tf32": "tf32", "tensorfloat32": "tf32", "bf16": "bf16",
          "bfloat16": "bf16"}  # ours, and jax.default_matmul_precision's long names
ENV = "PREPJIT_DEFAULT_MATMUL_PRECISION"
_default: contextvars.ContextVar[str | None] = contextvars.ContextVar("prepjit_matmul_precision", default=None)


def _checked(value, where: str) -> str:
    if isinstance(value, str) and value.lower() in _NAMES:
        return _NAMES[value.lower()]
    raise ValueError(f"{where}: unknown matmul precision {value!r} (one of {', '.join(PRECISIONS)})")


def matmul_precision(precision=None) -> str:
    """The precision a contraction traced now computes in: `precision` when given, else the default in force."""
    if precision is not None:
        return _checked(precision, "precision=")
    chosen = _default.get()
    if chosen is not None:
        return chosen
    env = os.environ.get(ENV, "").strip()
    return _checked(env, ENV) if env else "highest"


@contextlib.contextmanager
def default_matmul_precision(precision: str):
    """`with pj.default_matmul_precision("tf32"): ...`: the precision of every contraction traced inside that
    gives none itself (jax.default_matmul_precision)."""
    token = _default.set(_checked(precision, "default_matmul_precision"))
    try:
        yield
    finally:
        _default.reset(token)


def product(lhs: Tracer, rhs: Tracer, precision: str) -> Tracer:
    """The elementwise product summed by a contraction traced at `precision` (matmul_precision's): a float32 MUL
    carries the precision as its arg where it is not "highest" (a renderer with tensor cores reads it there, others
    ignore it); other dtypes are exact at every precision, as in JAX."""
    out = prims.elementwise(Ops.MUL, lhs, rhs)
    if precision == "highest" or out.dtype != dtypes.float32:
        return out
    return Tracer(UOp(Ops.MUL, out.uop.dtype, out.uop.src, precision), weak=out.weak)
