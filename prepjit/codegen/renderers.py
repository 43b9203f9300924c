"""The renderer of each kernel language, and `render`: an optimised kernel AST -> its KernelSource, with the
block shape a Blocking chose (on the C-style languages, a contraction's tile; on llvm the Blocking is already
in the optimised AST)."""
from __future__ import annotations

from ..uop import UOp
from .kernel import KernelSource
from .optimize import DEFAULT_BLOCKING, Blocking
from .render_cuda import render_cuda
from .render_llvm import render_llvm
from .render_opencl import render_opencl

RENDERERS = {"llvm": render_llvm, "opencl": render_opencl, "cuda": render_cuda}


def render(ast: UOp, language: str, blocking: Blocking = DEFAULT_BLOCKING) -> KernelSource:
    if language == "llvm":
        return render_llvm(ast)
    return RENDERERS[language](ast, blocking.tile)
