"""A grouped-query decode attention kernel computes a KV head's query heads in one work-group (row_plan.Rows.fold,
render_row_fold.py): each key and value element loaded once for the group's heads, each head's sums added in the
order of its own work-group, so the kernel's results equal the one of a work-group a query head bit for bit (and
NumPy's), on CUDA (through cuda_emulation) and OpenCL (PoCL), at ragged positions with stale slots NaN. A kernel
folds only where the folded work-groups at the batch's least are row_plan.FOLD_MIN_GROUPS (SmolLM2's 3 KV heads: a
batch var from 32); the tests of the folded kernel lower it (conftest's `few_groups`: batches the emulation runs in
seconds)."""
import math

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from examples.models import llama_paged
from examples.models.common import cast
from prepjit.codegen import row_plan, targets
from prepjit.codegen.gpu_launch import launch_of
from prepjit.codegen.optimize import DEFAULT_BLOCKING, optimize
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET
from prepjit.runtime.cache import kernel_cache
from prepjit.uop import Ops

from ..conftest import DEVICES
from . import cuda_emulation
from .test_softmax_contraction import TOLERANCE

D, BLOCK, POOL = 64, 16, 24   # a head's dimension; a paged cache of 24 blocks of 16 positions


def paged_attend(xp, q, k, v, pos, table, k_pool, v_pool, dtype):
    """llama_paged's decode attention of kv heads of `group` query heads each (q: (B, KV * GROUP, D)): the cached
    positions < pos of the blocks a row's table lists, and its own key / value, one softmax over both."""
    b, nb = table.shape
    kv = k.shape[1]
    slots = xp.arange(nb)[:, None] * BLOCK + xp.arange(BLOCK)[None, :]
    visible = (slots[None] < pos[:, None, None])[:, None]
    q = q.reshape(b, kv, q.shape[1] // kv, 1, D)
    own = cast(xp.einsum("bkgqd,bkd->bkgq", q, k) * (1 / math.sqrt(D)), np.float32)[..., None]
    cached = llama_paged._cached_scores(xp, q, k_pool[table], visible, D)
    return llama_paged._attend(xp, cached, own, v_pool[table], v[:, :, None], visible, dtype)


def _args(dtype, kv, group, pos, nb, stale=np.nan, seed=5):
    """Arguments of `paged_attend`, each pool slot past its row's position (in the row's blocks) `stale`; a pool of
    POOL blocks, or each row's own where they are more."""
    rng = np.random.default_rng(seed)
    b = len(pos)
    q, k, v = (rng.standard_normal(s) * 2 for s in ((b, kv * group, D), (b, kv, D), (b, kv, D)))
    k_pool, v_pool = (rng.standard_normal((max(POOL, b * nb), kv, BLOCK, D)) for _ in range(2))
    table = rng.permutation(len(k_pool))[:b * nb].reshape(b, nb)
    clean = [a.astype(np.float32).astype(dtype) for a in (q, k, v, k_pool, v_pool)]
    k_pool, v_pool = (a.copy() for a in clean[3:])
    for row, p in enumerate(pos):
        for n, block in enumerate(table[row]):
            for pool in (k_pool, v_pool):
                pool[block, :, max(0, p - n * BLOCK):] = stale
    return clean[:3] + [np.array(pos, np.int64), table, k_pool, v_pool], clean


def _reference(args, clean, dtype):
    q, k, v, k_pool, v_pool = (a.astype(np.float32) for a in clean)
    return paged_attend(np, q, k, v, args[3], args[4], k_pool, v_pool, dtype)


def _prepared(dtype, kv, group, nb=8, device=None, batch=(1, 8)):
    """`paged_attend` prepared at var rows (B, in `batch`) and table width (NB, at most `nb`)."""
    shapes = {"q": ("B", kv * group, D), "k": ("B", kv, D), "v": ("B", kv, D), "pos": ("B",), "table": ("B", "NB")}
    return pj.prepare(lambda q, k, v, pos, table, k_pool, v_pool: paged_attend(pnp, q, k, v, pos, table, k_pool,
                                                                                v_pool, dtype),
                      vars={"B": batch, "NB": (1, nb)}, shapes=shapes, **({"device": device} if device else {}))


def _attention_kernel(dtype, kv, group, args, batch=(1, 8)):
    """(the GPU schedule, its attention kernel) of `paged_attend` at var rows (in `batch`) and table width."""
    traced = pj.trace(_prepared(dtype, kv, group, batch=batch), *args)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kernel,) = [k for k in sched.kernels if any(u.op is Ops.REDUCE and u.arg is Ops.MAX for u in k.ast.toposort())]
    return sched, kernel


def _launched(target, ast, fold_max: int, monkeypatch):
    """`ast` launched on `target` with row_plan.FOLD_MAX at `fold_max` (the launch cache bypassed)."""
    monkeypatch.setattr(row_plan, "FOLD_MAX", fold_max)
    return target.run_passes(optimize(ast, target.language), DEFAULT_BLOCKING)


def _emulated(sched, kernel, launched, args, values) -> np.ndarray:
    src = CUDA_TARGET.render(launched)
    bufs = {i: a.ravel() for i, a in zip(sched.inputs, args)}
    spec = sched.buffers[kernel.buffers[0]]
    out = np.zeros(spec.max_size, spec.dtype.np)
    cuda_emulation.run(src, [out] + [bufs[i] for i in kernel.buffers[1:]],
                       var_values={v: values[v] for v in src.var_names})
    return out


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("dtype, kv, group", [(ml_dtypes.bfloat16, 3, 1), (ml_dtypes.bfloat16, 2, 2),
                                              (ml_dtypes.bfloat16, 3, 3), (ml_dtypes.bfloat16, 2, 4),
                                              (np.float32, 3, 3)])
def test_the_emulated_folded_kernel_equals_a_work_group_a_head(dtype, kv, group, monkeypatch, few_groups):
    """The CUDA kernel of a work-group a KV head (its `group` query heads folded; group 1: nothing to fold, a KV
    head's key rows are its own) at var rows and table width, through cuda_emulation: rows of no cached position, one
    inside the second block, the table's last, one inside the first; stale slots NaN. Its bytes are those of the
    kernel of a work-group a query head (FOLD_MAX 0), and its values NumPy's of the clean pool."""
    args, clean = _args(dtype, kv, group, [0, 20, 48, 7], 3)
    sched, kernel = _attention_kernel(dtype, kv, group, args)
    folded = _launched(CUDA_TARGET, kernel.ast, row_plan.FOLD_MAX, monkeypatch)
    apart = _launched(CUDA_TARGET, kernel.ast, 0, monkeypatch)
    assert launch_of(folded)[4:] == ((group,) if group > 1 else ()) and len(launch_of(apart)) == 4
    values = {"B": 4, "NB": 3}
    got = _emulated(sched, kernel, folded, args, values)
    assert np.array_equal(got.view(np.uint8), _emulated(sched, kernel, apart, args, values).view(np.uint8))
    want = _reference(args, clean, dtype)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(got[:want.size].reshape(want.shape).astype(np.float32), want, rtol=tol,
                               atol=tol * np.abs(want).max())


def test_a_fold_reads_each_key_and_value_element_once(monkeypatch, few_groups):
    """The folded CUDA kernel loads the key and value pools as often as the kernel of a work-group a query head does
    (a position's element once, for all the KV head's query heads), the query three times as often (each head its
    own), and launches a third of the work-items (a work-group a KV head), FOLD_RESIDENT of them a multiprocessor."""
    args, _ = _args(ml_dtypes.bfloat16, 3, 3, [5, 9], 2)
    sched, kernel = _attention_kernel(ml_dtypes.bfloat16, 3, 3, args)
    slot = {sched.inputs.index(i): f"buf{s}[" for s, i in enumerate(kernel.buffers) if i in sched.inputs}
    launched = [_launched(CUDA_TARGET, kernel.ast, fold, monkeypatch) for fold in (8, 0)]
    folded, apart = (CUDA_TARGET.render(ast) for ast in launched)
    for arg in (5, 6):   # (the key and value pools)
        assert folded.source.count(slot[arg]) == apart.source.count(slot[arg]) > 0, slot[arg]
    assert folded.source.count(slot[0]) == 3 * apart.source.count(slot[0]) > 0   # (the query heads)
    group = launch_of(launched[0])[1]   # (128 positions at most: a work-group of 128)
    assert (folded.global_size[0].vmax, apart.global_size[0].vmax) == (8 * 3 * group, 8 * 9 * group)
    assert f"__launch_bounds__({group}, {row_plan.FOLD_RESIDENT})" in folded.source   # (its registers bounded)
    assert f"__launch_bounds__({group}, 1)" in apart.source


@pytest.mark.parametrize("context, folded", [(1024, True), (2048, False)])
def test_a_fold_takes_no_more_local_memory_than_its_bound(context, folded, monkeypatch, few_groups):
    """A fold's rows each hold their scores, probabilities and partials in local memory: a KV head's 3 query heads of
    1024 positions (10 KB each on CUDA) fit row_plan.FOLD_LOCAL_BYTES, of 2048 (18 KB each) do not (a work-group a
    query head, as before)."""
    nb = context // BLOCK
    args, _ = _args(ml_dtypes.bfloat16, 3, 3, [5, 9], 2)
    traced = pj.trace(_prepared(ml_dtypes.bfloat16, 3, 3, nb), *args)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kernel,) = [k for k in sched.kernels if any(u.op is Ops.REDUCE and u.arg is Ops.MAX for u in k.ast.toposort())]
    launch = launch_of(_launched(CUDA_TARGET, kernel.ast, row_plan.FOLD_MAX, monkeypatch))
    assert launch[:4] == ("rows", 256, 1, 8) and launch[4:] == ((3,) if folded else ())


@pytest.mark.parametrize("batch, folded", [((1, 64), False), ((31, 64), False), ((32, 64), True), ((32, 32), True)])
def test_a_fold_needs_enough_work_groups_at_the_batchs_least(batch, folded, monkeypatch):
    """The kernel serves every batch of its var's range, so SmolLM2's 3 KV heads of 3 query heads fold only where the
    least batch leaves row_plan.FOLD_MIN_GROUPS (96) work-groups folded: a batch from 32 (or a batch of 32 only); from
    1 (3 work-groups: on an H100 17.0 us folded against 12.4) or 31 (93) a work-group a query head."""
    args, _ = _args(ml_dtypes.bfloat16, 3, 3, [5] * batch[0], 2)
    _, kernel = _attention_kernel(ml_dtypes.bfloat16, 3, 3, args, batch)
    launch = launch_of(_launched(CUDA_TARGET, kernel.ast, row_plan.FOLD_MAX, monkeypatch))
    assert launch[:2] == ("rows", 128) and launch[4:] == ((3,) if folded else ()), launch


@pytest.fixture
def unfolded(monkeypatch):
    """Kernels launched with row_plan.FOLD_MAX 0 (a work-group a query head) while the test runs, the kernel disk
    cache off; the launch and kernel caches (keyed by the scheduled kernel: they know no knob) cleared before and
    after."""
    targets._launched.cache_clear()
    kernel_cache.clear()
    monkeypatch.setattr(row_plan, "FOLD_MAX", 0)
    monkeypatch.setenv("PREPJIT_CACHE", "0")
    yield
    targets._launched.cache_clear()
    kernel_cache.clear()


def _run_on_opencl(dtype, args):
    f = _prepared(dtype, 3, 3, device="opencl")
    plan = f.plan(*args)
    (launch,) = [launch_of(pk.kernel.ast) for pk in plan.kernels if pk.kernel.ast is not None and any(
        u.op is Ops.REDUCE and u.arg is Ops.MAX for u in pk.kernel.ast.toposort())]
    return np.asarray(f(*args)), launch


@pytest.mark.skipif("opencl" not in DEVICES, reason="needs an OpenCL device (PoCL)")
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_folded_kernel_on_opencl_equals_a_work_group_a_head(dtype, request, few_groups):
    """On OpenCL (PoCL; no shuffles: a fold's query heads' scores in one loop of a work-item a position) the kernel of
    a work-group a KV head gives the bytes of the kernel of a work-group a query head, at ragged positions with stale
    slots NaN, and NumPy's values of the clean pool."""
    args, clean = _args(dtype, 3, 3, [0, 20, 48, 7], 3)
    got, launch = _run_on_opencl(dtype, args)
    assert launch[4:] == (3,), launch
    request.getfixturevalue("unfolded")
    apart, launch = _run_on_opencl(dtype, args)
    assert len(launch) == 4, launch
    assert np.array_equal(got.view(np.uint8), apart.view(np.uint8))
    want = _reference(args, clean, dtype)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=tol, atol=tol * np.abs(want).max())
