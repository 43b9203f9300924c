"""KernelSource: what a renderer hands the runtime (source text, argument order, launch size)."""
from __future__ import annotations

import attrs

from ..uop import Ops, UOp


@attrs.frozen
class KernelSource:
    name: str
    source: str
    language: str                  # "llvm" | "opencl" | "cuda"
    var_names: tuple[str, ...]     # trailing scalar arguments, in order
    global_size: tuple[UOp, ...]   # launch size expressions over the vars
    local_size: tuple[int, ...] = ()


def kernel_vars(ast: UOp) -> list[UOp]:
    """The DEFINE_VARs a kernel reads, in argument order (sorted by name)."""
    return ast.variables()


def parallel_range(ast: UOp) -> UOp | None:
    """The outermost loop range: CPU threads split it, GPUs map it to the grid."""
    loops = [u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"]
    return min(loops, key=lambda r: r.arg[0]) if loops else None
