"""A cpu kernel's loops split at a quantized operand's blocks (block_split.split_kernel_at_blocks): an embedding's
rows read inside a norm, whose sum of squares and stores stepped over 34-byte q8_0 blocks one weight at a time
(LLVM vectorised them with gathers), become loops over blocks around contiguous loops over a block's steps."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.block_split import split_kernel_at_blocks
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import LLVM
from prepjit.uop import Ops, UOp, dtypes

VOCAB, DIM, TOKENS = 64, 576, 5


def _embedded_norm(xp, ids, table, gain, kind):
    x = pj.quant.dequantize(table[ids], kind) if xp is pnp else table[ids]
    return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * gain


def _block_indexed_ranges(ast: UOp) -> set:
    """The ranges of `ast` that an index divides or takes modulo by a constant."""
    return {r for u in ast.toposort() if u.op in (Ops.IDIV, Ops.MOD) and u.src[1].op is Ops.CONST
            for r in u.src[0].toposort() if r.op is Ops.RANGE}


def test_an_embedded_norm_reads_its_blocks_contiguously(rng):
    """Equal to NumPy's float64 norm of the dequantized q8_0 rows (one kernel: q4's nibbles are dequantized into
    rows first); the launched kernel has no index divided by a block any more: its sum and its stores run over
    blocks and a block's steps."""
    kind = "q8_0"
    table = pj.quant.quantize((rng.standard_normal((VOCAB, DIM)) * 0.1).astype(np.float32), kind)
    ids = rng.integers(0, VOCAB, TOKENS).astype(np.int64)
    gain = rng.standard_normal(DIM).astype(np.float32)
    f = pj.prepare(lambda ids, table, gain: _embedded_norm(pnp, ids, table, gain, kind), device="cpu")
    want = _embedded_norm(np, ids, pj.quant.dequantize(table, kind).astype(np.float64), gain.astype(np.float64), kind)
    np.testing.assert_allclose(np.asarray(f(ids, table, gain)), want, rtol=2e-5, atol=2e-5)

    traced = pj.trace(lambda ids, table, gain: _embedded_norm(pnp, ids, table, gain, kind), ids, table, gain)
    (kernel,) = schedule(list(traced.outputs), list(traced.inputs), pack_contractions=True).kernels
    assert len(_block_indexed_ranges(kernel.ast)) == 2   # the sum's range and the stores'
    launched = LLVM.launched(kernel.ast)
    assert not _block_indexed_ranges(launched)
    (reduce,) = [u for u in launched.toposort() if u.op is Ops.REDUCE]
    assert [r.src[0].arg for r in reduce.src[1:]] == [18, 32]


def _blocked_read(k: UOp, block: int, steps: int, row: UOp | None = None) -> UOp:
    """x[row, (k // block) * (block + 2) + k % block]: a block of `block` steps after 2 bytes of scale."""
    width = steps // block * (block + 2)
    index = k // block * (block + 2) + k % block + (0 if row is None else row * width)
    return UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1), index))


def _kernel(store_index: UOp, value: UOp) -> UOp:
    out = UOp(Ops.STORE, dtypes.bool, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), store_index, value))
    return UOp(Ops.SINK, dtypes.bool, (out,), "k")


def _range(n: int, axis: int, kind: str) -> UOp:
    return UOp(Ops.RANGE, dtypes.index, (UOp.const(n),), (axis, kind))


@pytest.mark.parametrize("block, split", [(32, True), (16, False)])
def test_a_sum_and_an_inner_loop_split_at_blocks_of_min_block_steps_at_least(block, split):
    """Over blocks of 32 steps, a row's sum and a loop inside the parallel one (rows) each become two ranges,
    numbered in their place, no index divided any more; blocks of 16 (shorter than MIN_BLOCK) stay as they are."""
    i, k, j = _range(4, 0, "loop"), _range(64, 1, "reduce"), _range(64, 2, "loop")
    total = UOp(Ops.REDUCE, dtypes.float32, (_blocked_read(k, block, 64, i), k), Ops.ADD)
    stores = (*_kernel(i, total).src, *_kernel(i * 64 + j, _blocked_read(j, block, 64, i)).src)
    ast = UOp(Ops.SINK, dtypes.bool, stores, "k")
    out = split_kernel_at_blocks(ast)
    if not split:
        assert out is ast
        return
    ranges = sorted(r.arg for r in out.toposort() if r.op is Ops.RANGE)
    assert ranges == [(0, "loop"), (1, "reduce"), (2, "reduce"), (3, "loop"), (4, "loop")]
    assert not _block_indexed_ranges(out)


def test_the_parallel_range_stays_whole():
    """Threads split the parallel range: indexed by blocks, it stays one range, also once a loop inside it split."""
    i, j = _range(64, 0, "loop"), _range(64, 1, "loop")
    value = UOp(Ops.ADD, dtypes.float32, (_blocked_read(i, 32, 64), _blocked_read(j, 32, 64)))
    out = split_kernel_at_blocks(_kernel(i * 64 + j, value))
    ranges = sorted((r.arg, r.src[0].arg) for r in out.toposort() if r.op is Ops.RANGE)
    assert ranges == [((0, "loop"), 64), ((1, "loop"), 2), ((2, "loop"), 32)]
    assert [r.src[0].arg for r in _block_indexed_ranges(out)] == [64]
    alone = _kernel(i, _blocked_read(i, 32, 64))
    assert split_kernel_at_blocks(alone) is alone
