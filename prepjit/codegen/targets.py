"""One target per kind of device: its policy, its AST passes and its renderer (DESIGN.md: kernel structure is an
AST decision). A device names the kernel language it runs (`device.language`) and `target_for(device)` is its
target; everything that differs between the kernels of the cpu and the GPUs asks the target, never the device's
class. (Runtime facts of a device, such as whether its memory is the host's, are the device's own.)

`launched(ast, blocking)` is the kernel as it runs: on the cpu, blocked for this host's vector unit
(optimize.py, matvec.py), a contraction's computed operands first computed once per call (operand_prologue.py),
its other loops split at the blocks of the quantized values they read (block_split.split_kernel_at_blocks), an
elementwise kernel's selects between the same reads of different buffers one read of a select of buffers
(buffer_select.py);
on a GPU, with its launch decided (gpu_launch.py: a tiled contraction, a row kernel or elementwise work-items), a
row kernel's reductions stopping where the rest of a row is masked (row_bounds.py), an elementwise kernel's selects
between the same reads of different buffers one read of a select of buffers (buffer_select.py).
The Blocking is passed, never looked up: the planner asks PREPJIT_TUNE's record (jit/tune.py) once per kernel
build and keeps the launched AST with the compiled kernel (CachedKernel.ast), so the bounds proof, the renderer,
the disk key and PREPJIT_TUNE's candidates all see that one kernel.
"""
from __future__ import annotations

import functools
from typing import Callable

import attrs

from ..uop import UOp
from . import gpu_launch
from .block_split import split_kernel_at_blocks
from .buffer_select import with_buffer_selects
from .kernel import KernelSource
from .llvm_softmax import softmax_rows
from .operand_prologue import with_operand_prologue
from .optimize import DEFAULT_BLOCKING, Blocking, blocking_candidates, optimize_with
from .c_dialect import Dialect
from .render_c import render_c
from .render_cuda import CUDA, CUDA_HOPPER
from .render_llvm import render_llvm
from .render_opencl import OPENCL
from .render_tiles import tile_candidates
from .row_bounds import bounded_rows
from .target import host_target


@attrs.frozen
class Target:
    language: str                  # the kernel language its renderer writes (KernelSource.language)
    work_groups: bool              # kernels run as a grid of work-groups (a GPU), not loops split over CPU threads
    packs_contractions: bool       # the schedule adds kernels packing contraction operands (packing.py)
    passes: Callable[[UOp, Blocking], UOp]          # a scheduled kernel AST -> the kernel as launched
    renderer: Callable[[UOp], KernelSource]         # a launched kernel AST -> its source
    candidates: Callable[[UOp], list[Blocking]]     # Blockings PREPJIT_TUNE times for a kernel (the default first)
    fuses_attention: bool = False  # an encoder's softmax is computed inside p @ V (attention_tiles.py: tensor cores)
    tensor_cores: bool = False     # its kernels multiply on tensor cores (render_fragments.py)

    @property
    def tensor_batch_rows(self) -> int | None:
        """The least rows of a var batch (a decode step's sequences) from which its kernels differ from those of a
        range from one row: gpu_launch.TENSOR_BATCH_ROWS with tensor cores (tensor_batch_tile; SmolLM2's attention
        folds from as many too, row_plan.FOLD_MIN_GROUPS), a caller serving both preparing two ranges
        (llama_paged.prepared); None without (one kernel serves every batch)."""
        return gpu_launch.TENSOR_BATCH_ROWS if self.tensor_cores else None

    def launched(self, ast: UOp, blocking: Blocking = DEFAULT_BLOCKING) -> UOp:
        """The kernel as launched, with `blocking` (the default, or the one PREPJIT_TUNE chose for it: tune.py);
        memoised: PREPJIT_TUNE's candidates and a kernel's build ask for the same kernel."""
        return _launched(self, ast, blocking)

    def run_passes(self, ast: UOp, blocking: Blocking) -> UOp:
        return self.passes(ast, blocking)

    def render(self, launched: UOp) -> KernelSource:
        return self.renderer(launched)


@functools.lru_cache(maxsize=4096)
def _launched(target: Target, ast: UOp, blocking: Blocking) -> UOp:
    return target.run_passes(ast, blocking)


def _gpu(dialect: Dialect) -> Target:
    def candidates(ast: UOp) -> list[Blocking]:   # the tile policy's own is the first: the default
        return [DEFAULT_BLOCKING] + [Blocking(tile=t) for t in tile_candidates(ast)[1:]]
    return Target(dialect.language, work_groups=True, packs_contractions=False,
                  passes=lambda ast, blocking: with_buffer_selects(bounded_rows(gpu_launch.launch(ast, dialect,
                                                                                                 blocking))),
                  renderer=lambda ast: render_c(ast, dialect), candidates=candidates,
                  fuses_attention=dialect.tensor_core_mma is not None, tensor_cores=dialect.tensor_core_mma is not None)


def _llvm_passes(ast: UOp, blocking: Blocking) -> UOp:
    lowered = softmax_rows(ast, host_target())  # a softmax inside its contraction's kernel (llvm_softmax.py)
    if lowered is not None:
        return lowered
    kernel = with_operand_prologue(ast, lambda main: optimize_with(main, "llvm", None, blocking))
    return with_buffer_selects(split_kernel_at_blocks(kernel))


LLVM = Target("llvm", work_groups=False, packs_contractions=True, passes=_llvm_passes,
              renderer=render_llvm,
              candidates=blocking_candidates)
OPENCL_TARGET = _gpu(OPENCL)
CUDA_TARGET = _gpu(CUDA)
CUDA_HOPPER_TARGET = _gpu(CUDA_HOPPER)   # sm_90a: wide 16-bit tiles on bulk tensor copies (render_fragments_tma.py)
TARGETS = {t.language: t for t in (LLVM, OPENCL_TARGET, CUDA_TARGET)}


def target_for(device) -> Target:
    """The target of the kernels `device` runs: named by its kernel language, except a Hopper GPU's (sm_90, compiled
    for sm_90a), which has its own. The arch is in the device's compiler_id, so the disk cache and saved plans
    tell its kernels from another GPU's."""
    if getattr(device, "arch", None) == "sm_90":
        return CUDA_HOPPER_TARGET
    return TARGETS[device.language]
