"""The work-group targets' launch pass (gpu_launch.py, targets.py): a GPU kernel's launch (tile, rows, items) is
decided on the AST before the bounds proof and the renderer, and the proof runs on that launched AST."""
import pytest

from prepjit.codegen import bounds, gpu_launch, targets
from prepjit.codegen.bounds import prove_kernel, prove_launched
from prepjit.codegen.optimize import Blocking
from prepjit.codegen.render_tiles import match_contraction
from prepjit.codegen.targets import CUDA_HOPPER_TARGET, CUDA_TARGET, LLVM, OPENCL_TARGET, TARGETS, target_for
from prepjit.errors import CompileError
from prepjit.runtime.devices import get_device
from prepjit.uop import Ops, UOp, dtypes

from .test_render_cuda import matmul_kernel, softmax_kernel
from .test_render_opencl import N, kernel, load, loop

GPUS = [CUDA_TARGET, OPENCL_TARGET]
M, NN, K = UOp.variable("m", 1, 256), UOp.variable("n", 1, 300), UOp.variable("k", 1, 500)
MATMUL_SHAPES = [(M, NN), (M, K), (K, NN)]
SOFTMAX_SHAPES = [(N, 128), (N, 128)]


@pytest.mark.parametrize("target", GPUS, ids=lambda t: t.language)
def test_a_tiled_contraction_carries_its_tile_and_its_accesses_are_proven(target):
    ast = matmul_kernel()
    c = match_contraction(ast)
    launched = target.launched(ast)
    assert gpu_launch.launch_of(launched) == ("tile", c.tm, c.tn, c.splits)
    assert target.render(launched).local_size == (c.threads,)
    assert prove_launched(launched, MATMUL_SHAPES) == 3   # two loads and the store of the launched kernel
    tuned = target.launched(ast, Blocking(tile=(64, 64, 2)))   # PREPJIT_TUNE's choice is part of the AST
    assert gpu_launch.launch_of(tuned) == ("tile", 64, 64, 2) and tuned is not launched
    assert target.render(tuned).local_size == (64 // 8 * 64 // 8 * 2,)


@pytest.mark.parametrize("target", GPUS, ids=lambda t: t.language)
def test_row_kernels_and_elementwise_kernels_carry_their_launch(target):
    rows = target.launched(softmax_kernel(4096))
    kind, group, pack, _ = gpu_launch.launch_of(rows)
    assert kind == "rows" and target.render(rows).local_size == (group * pack,)
    short = gpu_launch.launch_of(target.launched(softmax_kernel(16)))   # short rows: computed inline
    assert short == ("items", 1)   # few outputs (1000 rows of 16 at most): one a work-item
    r0 = loop(UOp.variable("n", 1, gpu_launch.FEW_OUTPUTS), 0)
    many = gpu_launch.launch_of(target.launched(kernel(load(1, dtypes.float32, r0) + UOp.const(1.0, dtypes.float32), r0)))
    assert many == ("items", 4 if target is CUDA_TARGET else 1)
    assert target.launched(rows) is rows   # a launched AST keeps its launch


def test_the_proof_sees_the_shared_passes_of_a_row_kernel():
    """On cuda a static softmax row of 128 is one warp's runs of 4: its reductions read the columns' range (the
    launch pass rewrites them), and the proof is of that rewritten kernel."""
    ast = softmax_kernel(128, static=True)
    launched = CUDA_TARGET.launched(ast)
    reduce_ranges = {r for u in launched.toposort() if u.op is Ops.REDUCE for r in u.src[1:]}
    assert [r.arg[1] for r in reduce_ranges] == ["loop"]   # the columns' range, not reduce ranges of their own
    # the launched kernel's accesses: the row's three loads are one (the scheduled kernel has 3 loads, 1 store)
    assert prove_launched(launched, SOFTMAX_SHAPES) == prove_kernel(launched, SOFTMAX_SHAPES) == 2
    assert prove_kernel(ast, SOFTMAX_SHAPES) == 4


def test_a_wrong_launch_rewrite_is_refused_by_the_proof(monkeypatch):
    """A launch pass that rewrote a row's passes over a range one longer than the row would read past it: the
    proof runs on the launched kernel, so it refuses to compile it (on the scheduled AST it passed)."""
    def past_the_row(ast, items, warp_rows):
        wrong = UOp(Ops.RANGE, UOp.const(0).dtype, (UOp.const(129),), (9, "loop"))
        return ast.substitute({u.src[1]: wrong for u in ast.toposort() if u.op is Ops.REDUCE})
    monkeypatch.setattr(gpu_launch, "share_passes", past_the_row)
    monkeypatch.setattr(bounds, "_proof_cache", {})   # (not the right launch and its proof, memoised by other tests)
    targets._launched.cache_clear()
    ast = softmax_kernel(128, static=True)
    try:
        with pytest.raises(CompileError, match="cannot prove the load from buffer slot 1"):
            prove_launched(CUDA_TARGET.launched(ast), SOFTMAX_SHAPES)
    finally:
        targets._launched.cache_clear()


def test_each_device_names_its_target(device):
    device = get_device(device)
    target = target_for(device)
    assert target is (CUDA_HOPPER_TARGET if getattr(device, "arch", None) == "sm_90" else TARGETS[device.language])
    assert target.work_groups == device.device_memory == (target is not LLVM)
    assert target.packs_contractions == (target is LLVM)


def test_a_hopper_gpu_takes_its_own_target_by_default():
    """An sm_90 GPU's kernels are CUDA_HOPPER_TARGET's (bulk tensor copies: render_fragments_tma.py) with no switch;
    other CUDA GPUs' are CUDA_TARGET's (the arch is in the device's compiler_id, so the disk keys differ)."""
    class FakeGPU:
        language = "cuda"
        def __init__(self, arch):
            self.arch = arch
    assert target_for(FakeGPU("sm_90")) is CUDA_HOPPER_TARGET
    assert target_for(FakeGPU("sm_80")) is target_for(FakeGPU("sm_89")) is CUDA_TARGET


def test_a_plans_kernels_are_the_kernels_as_launched(device):
    """PreparedKernel.ast is what was rendered and proven (the target's launched AST, a GPU's with its LAUNCH
    node, the cpu's blocked), not the scheduled kernel it came from (CachedKernel.scheduled)."""
    import numpy as np
    import prepjit as pj
    f = pj.prepare(lambda x, w: pj.numpy.exp(x @ w), device=device)
    x, w = np.ones((64, 96), np.float32) / 8, np.ones((96, 80), np.float32) / 8
    np.testing.assert_allclose(np.asarray(f(x, w)), np.exp(x @ w), rtol=1e-5)
    target = target_for(get_device(device))
    kernels = list(f.plan(x, w).kernels)
    assert all(k.ast is k.kernel.ast is target.launched(k.kernel.scheduled) for k in kernels)
    assert kernels[-1].ast is not kernels[-1].kernel.scheduled
