"""Contraction precision, as JAX's `precision=` and `jax.default_matmul_precision`: "highest" (exact float32, the
default), "tf32" or "bf16" (a device may round float32 operands to those in its tensor cores). The choice of a
contraction is its own `precision=`, else the innermost `pj.default_matmul_precision(...)` around its trace, else
PREPJIT_DEFAULT_MATMUL_PRECISION, else "highest".

No renderer has a tensor-core path yet, so every device computes every precision exactly (as the contract allows
for a device without such units); the setting is validated and resolved here, the one place a contraction asks.
"""
from __future__ import annotations

import contextlib
import contextvars
import os

PRECISIONS = ("highest", "tf32", "bf16")
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
