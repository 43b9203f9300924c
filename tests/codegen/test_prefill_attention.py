"""A prefill's attention on the work-group targets (llama_paged.prefill_batch: T tokens of chunks side by side, each
attending to its sequence's cached blocks and, through a window of rows back from its own, to its chunk's tokens up
to itself) is one row kernel, a work-group per (token, query head), that stops each row's passes at its last visible
block and its last token of the window (row_bounds.py): a 128-token chunk's rows see 1 to 128 of its tokens, not
the window's 128 each. What a row does not see (another chunk's rows in its window, stale pool slots) never reaches
its values."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.optimize import optimize
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET, OPENCL_TARGET
from prepjit.uop import Ops

from . import cuda_emulation
from .test_paged_attention_cpu import GROUP, HD, KV, _chunk_attention, _chunks

VARS = {"T": (1, 64), "NB": (1, 8), "window": (1, 32)}
SHAPES = {"q": ("T", KV, GROUP, 1, HD), "k": ("T", KV, HD), "v": ("T", KV, HD), "pos": ("T",), "offset": ("T",),
          "table": ("T", "NB")}
TOLERANCE = {np.float32: 1e-5, ml_dtypes.bfloat16: 2e-2}


def _function(dtype):
    def attend(q, k, v, pos, offset, table, k_pool, v_pool, window):
        return _chunk_attention(pnp, q, k, v, pos, offset, table, k_pool, v_pool, window, dtype)
    return attend


def _args(dtype, seed=0):
    """Chunks of 5 and 19 tokens after 7 and 40 cached positions, tables of 3 blocks, in `dtype`."""
    args = _chunks(np.random.default_rng(seed), [5, 19], np.array([7, 40]), 3)
    return [a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype == np.float32 else a for a in args]


def _reference(args, dtype):
    return np.asarray(_chunk_attention(np, *(a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == dtype
                                             else a for a in args), dtype), np.float32)


def _check(got, want, dtype):
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tol, atol=tol * np.abs(want).max())


def _poisoned(args):
    """`args` with the first chunk's values and keys NaN: the second chunk's rows read them through their window
    (positions before their chunk), masked."""
    poisoned = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    poisoned[1][:5] = poisoned[2][:5] = np.nan
    return poisoned


@pytest.mark.parametrize("target", [CUDA_TARGET, OPENCL_TARGET], ids=["cuda", "opencl"])
def test_a_prefill_row_stops_at_its_last_token_of_the_window(target):
    """The chunk's part of a prefill row (scores, max, sum, probabilities, p @ V over the window) runs over its
    chunk's tokens up to itself, min(window, offset[t] + 1), and the cached part over min(NB, ceil(cached / block))
    blocks: two bounded ranges, each reading the row's offset; the row's length stays the window's largest."""
    traced = pj.trace(pj.prepare(_function(np.float32), vars=VARS, shapes=SHAPES), *_args(np.float32))
    (kernel,) = schedule(list(traced.outputs), list(traced.inputs)).kernels
    launched = target.launched(optimize(kernel.ast, target.language))
    ends = {r.src[0] for u in launched.toposort() if u.op is Ops.REDUCE for r in u.src[1:]}
    bounded = sorted((e for e in ends if e.op is Ops.MIN), key=lambda e: e.vmax)
    assert [e.vmax for e in bounded] == [8, 32], ends   # (blocks, window)
    assert all(any(u.op is Ops.LOAD for u in e.toposort()) for e in bounded), bounded


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_a_prefill_row_never_reads_another_chunks_tokens(device, dtype):
    """A token's window reaches back past its chunk's first token (the previous chunk's rows): those positions add
    nothing to its row, NaN keys and values included (was NaN: 0 * NaN in p @ V); NumPy's values of the clean
    arguments, on every device."""
    f = pj.prepare(_function(dtype), vars=VARS, shapes=SHAPES, device=device)
    args = _args(dtype)
    got = np.asarray(f(*_poisoned(args)), np.float32)
    _check(got[5:], _reference(args, dtype)[5:], dtype)


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_emulated_bounded_prefill_kernel_equals_numpy(dtype):
    """The CUDA row kernel of a prefill's attention (static shapes: the emulation takes no vars), rows stopping at
    their last cached block and their last token of the window, through cuda_emulation, the first chunk's keys and
    values NaN for the second chunk's rows: NumPy's values of the clean arguments."""
    args = _args(dtype)
    traced = pj.trace(_function(dtype), *args)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kernel,) = sched.kernels
    launched = CUDA_TARGET.launched(optimize(kernel.ast, "cuda"))
    src = CUDA_TARGET.render(launched)
    bufs = {i: a.ravel() for i, a in zip(sched.inputs, _poisoned(args)) if isinstance(a, np.ndarray)}
    out = np.zeros(sched.buffers[kernel.buffers[0]].max_size, dtype)
    cuda_emulation.run(src, [out] + [bufs[i] for i in kernel.buffers[1:]])
    want = _reference(args, dtype)
    _check(out.reshape(want.shape)[5:], want[5:], dtype)
