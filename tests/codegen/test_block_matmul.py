"""Contractions of several rows over a weight in blocks (codegen/block_matmul.py): x @ pj.quant.dequantize(b).T for a
var or static row count reads the blocks themselves (no float32 copy of the weight), equals NumPy's float64 product
with the dequantized weights, and gives a row the same bits whatever the batch around it."""
import numpy as np
import pytest

import prepjit as pj
from prepjit.codegen import block_matmul
from prepjit.codegen.block_matmul import TILE_BYTES
from prepjit.codegen.block_scales import TABLE_LANES
from prepjit.codegen.llvm_reductions import PREFETCH_BYTES
from prepjit.codegen.optimize import optimize
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.target import AVX2, AVX512, host_target
from prepjit.uop import Ops, UOp, simplify

from .test_quant_matvec import _blocks

N, K = 72, 768   # K: whole q6_k blocks (256)


def _batched(kind, device, rows=(1, 64), k=K):
    return pj.prepare(lambda x, b: x @ pj.quant.dequantize(b, kind).T, vars={"B": rows}, shapes={"x": ("B", k)},
                      device=device)


@pytest.mark.parametrize("kind", ["q8_0", "q4_1", "q6_k"])
def test_batched_rows_match_numpy_without_a_float32_weight(kind, device, rng):
    """B in {1, 3, 16, 64} through one prepared function with B a var: one kernel, no intermediate buffer (the
    float32 weight was dequantized into one, and packed into another, per call), values equal to float64 NumPy of
    the dequantized weights with the float32 tests' tolerance (the sum is reassociated)."""
    blocks = _blocks(rng, kind, N, K)
    w = pj.quant.dequantize(blocks, kind).astype(np.float64)
    f = _batched(kind, device)
    for rows in (1, 3, 16, 64):
        x = rng.standard_normal((rows, K)).astype(np.float32)
        ref = x.astype(np.float64) @ w.T
        np.testing.assert_allclose(np.asarray(f(x, blocks)), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    plan = f.plan(x, blocks)
    assert len(plan.kernels) == 1 and plan.memory_bytes == 0


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_prefill_rows_read_the_blocks(kind, device, rng):
    """A prefill of up to 512 rows (131 here: blocks of 4 rows, then one of 2 and one of 1) is one kernel reading
    the blocks, with no float32 weight, and equals NumPy."""
    blocks = _blocks(rng, kind, N, K)
    w = pj.quant.dequantize(blocks, kind).astype(np.float64)
    f = _batched(kind, device, rows=(1, 512))
    x = rng.standard_normal((131, K)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T
    np.testing.assert_allclose(np.asarray(f(x, blocks)), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    plan = f.plan(x, blocks)
    assert len(plan.kernels) == 1 and plan.memory_bytes == 0


@pytest.mark.parametrize("kind", ["q8_0", "q4_1", "q6_k"])
def test_a_row_has_the_same_bits_in_any_batch(kind, device, rng):
    """Each row of a batch of 16 (any position in a register block of 4) has the bits that row has alone (B = 1,
    a block of 1) and in a batch of 7 (blocks of 4, 2 and 1): a serving engine's greedy output does not depend on
    its batch."""
    blocks = _blocks(rng, kind, N, K)
    f = _batched(kind, device)
    x = rng.standard_normal((16, K)).astype(np.float32)
    batch = np.asarray(f(x, blocks))
    for b in (0, 1, 3, 4, 15):
        np.testing.assert_array_equal(np.asarray(f(x[b:b + 1], blocks))[0], batch[b])
    np.testing.assert_array_equal(np.asarray(f(x[9:16], blocks)), batch[9:16])


@pytest.mark.parametrize("kind,loads", [("q8_0", "load <32 x i8>"), ("q4_1", "load <16 x i8>")])
def test_each_block_is_unpacked_once_for_a_register_block_of_rows(kind, loads, rng):
    """The kernel as launched (AVX-512 and AVX2): R x C stores (rows x columns of the register block, R > 1) for the
    full row blocks, then (R - 1) x C, ..., 1 x C for the rows past them; the column panels outermost (threads
    split them); its IR loads each column's block bytes once per step of each loop nest, for all its rows (q4_1:
    its two nibble halves read the same 16 bytes, unrolled; AVX2's factored sums, block_scales.py: 8 bytes a step of
    the in-block loop), not once per row."""
    blocks = _blocks(rng, kind, 1536, K)
    x = rng.standard_normal((3, K)).astype(np.float32)
    (kernel,) = _batched(kind, "cpu", rows=(1, 4)).plan(x, blocks).kernels  # at most one block: no tile
    halves = 2 if kind == "q4_1" else 1
    for target, (rows, columns, nests), (load, per_nest) in ((AVX512, (4, 2, 4), (loads, halves)),
                                                            (AVX2, (3, 1, 3), ("load <8 x i8>", 1))):
        out = optimize(kernel.kernel.scheduled, "llvm", target)
        assert len([st for st in out.src if st.src[0].op is Ops.DEFINE_GLOBAL]) == rows * (rows + 1) // 2 * columns
        loops = sorted((u for u in out.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"), key=lambda r: r.arg[0])
        assert loops[0].src[0].op is Ops.CONST and 1536 % (loops[0].src[0].arg * columns) == 0
        ir = render_llvm(out, target).source
        assert ir.count(load) == nests * columns * per_nest




@pytest.mark.parametrize("most", [4, 512])
def test_packing_asks_whether_blocks_are_read_without_building_the_kernel(most, monkeypatch, rng):
    """reads_blocks (packing asks it of every contraction it schedules) runs block_matmul's checks, not the build of
    its register blocks or tile (which optimisation does once it blocks the kernel)."""
    blocks = _blocks(rng, "q4_1", 1536, K)
    x = rng.standard_normal((3, K)).astype(np.float32)
    (kernel,) = _batched("q4_1", "cpu", rows=(1, most)).plan(x, blocks).kernels

    def built(*args):
        raise AssertionError("reads_blocks built the kernel")
    monkeypatch.setattr(block_matmul, "_weight_tile", built)
    monkeypatch.setattr(block_matmul, "block_stores", built)
    block_matmul.block_matmul.cache_clear()
    assert block_matmul.reads_blocks(kernel.kernel.scheduled, AVX512)
    assert block_matmul.reads_blocks(kernel.kernel.scheduled, AVX2)


@pytest.mark.parametrize("most", [4, 16])
def test_rows_up_to_a_register_block_read_the_blocks_in_one_nest(most, rng):
    """Every live row count up to a decode batch's register block (AVX-512 6 x 2, AVX2 3 x 1) runs as one block of
    exactly its rows: of the kernel's loop nests (their var extents at that B) one runs, with B x C stores. A nest
    reads and unpacks every weight block of the panels, so three rows as a block of 2 and one of 1 (the powers of
    two) read them twice: one thread, 3072 x 576 q4_1, B = 3 took 223 us against B = 4's 171."""
    blocks = _blocks(rng, "q4_1", 1536, K)
    x = rng.standard_normal((3, K)).astype(np.float32)
    (kernel,) = _batched("q4_1", "cpu", rows=(1, most)).plan(x, blocks).kernels
    for target, (rows, columns) in ((AVX512, (6, 2)), (AVX2, (3, 1))):
        out = optimize(kernel.kernel.scheduled, "llvm", target)
        for b in range(1, min(rows, most) + 1):
            nests = {}
            for store in out.src:
                loops = frozenset(r for r in store.toposort() if r.op is Ops.RANGE and r.src[0].op is not Ops.CONST)
                if all(_at(r.src[0], B=b).arg > 0 for r in loops) and store.src[0].op is Ops.DEFINE_GLOBAL:
                    nests.setdefault(loops, []).append(store)
            assert [len(stores) for stores in nests.values()] == [b * columns], (target.cpu, b)


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_every_column_of_a_register_block_prefetches_its_blocks(kind, rng):
    """Each column of a register block streams its own weight row: each loop nest of the kernel as launched asks
    for every column's blocks PREFETCH_BYTES ahead, once per block (a block's scale and bytes are one stream), not
    only its first column's (AVX-512: 2 columns, 4 nests -> 8 prefetches; AVX2: 1 column, 3 nests -> 3). Without the second
    column's prefetch SmolLM2's engine decode step of one sequence took 7.7 ms against the one-row plan's 6.2."""
    blocks = _blocks(rng, kind, 1536, K)
    x = rng.standard_normal((3, K)).astype(np.float32)
    (kernel,) = _batched(kind, "cpu", rows=(1, 4)).plan(x, blocks).kernels
    for target, (columns, nests) in ((AVX512, (2, 4)), (AVX2, (1, 3))):
        ir = render_llvm(optimize(kernel.kernel.scheduled, "llvm", target), target).source
        calls = [line for line in ir.splitlines() if "call void @llvm.prefetch" in line]
        assert len(calls) == nests * columns


@pytest.mark.parametrize("kind,block_bytes", [("q8_0", 34), ("q4_1", 20)])
def test_a_register_blocks_columns_are_prefetched_past_the_farthest_of_them(kind, block_bytes, rng):
    """The columns of a register block are adjacent weight rows read at once: each is asked for PREFETCH_BYTES past
    the block's farthest column (PREFETCH_BYTES plus the columns' spread, a row's bytes for 2 columns on AVX-512),
    not PREFETCH_BYTES past its own start, which lands only PREFETCH_BYTES minus a row past what the block reads
    (one row x 2 columns over 1536-wide q4_1 rows from DRAM: 76-78 us against the one-row kernel's 67-68). One
    column (AVX2's blocks, the one-row kernel) keeps PREFETCH_BYTES."""
    blocks = _blocks(rng, kind, 1536, K)
    x = rng.standard_normal((3, K)).astype(np.float32)
    (kernel,) = _batched(kind, "cpu", rows=(1, 4)).plan(x, blocks).kernels
    row = K // 32 * block_bytes
    for target, spread in ((AVX512, row), (AVX2, 0)):
        ir = render_llvm(optimize(kernel.kernel.scheduled, "llvm", target), target).source.splitlines()
        ahead = {line.split("=")[0].strip(): int(line.rsplit(" ", 1)[1]) for line in ir
                 if "getelementptr i8, ptr %p" in line}
        calls = [line.split("(ptr ")[1].split(",")[0] for line in ir if "call void @llvm.prefetch" in line]
        assert calls and {ahead[c] for c in calls} == {PREFETCH_BYTES + spread}, target.cpu
def _at(u, **values):
    """`u` with its vars set to `values`, simplified (a range's live extent)."""
    return simplify(u.substitute({v: UOp.const(values[v.arg[0]]) for v in u.toposort() if v.op is Ops.DEFINE_VAR}))


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_a_batch_of_more_rows_than_a_register_block_reads_a_tile(kind, rng):
    """A decode batch (B a var up to 16, more rows than AVX-512's 6 x 2 block of two-register sums) unpacks each
    4-column panel's blocks once into a tile for all its rows when the live rows exceed one block: the fill runs
    4 columns at B = 7 and 16 and none at B = 1 or 6; the tile's sums are 3 x 4 blocks (12 stores a block) over
    the block split's own ranges (the sums of the block kernel), and the rows of one block or fewer read the
    blocks in one block of 6, 5, ..., 1 rows x 2 columns (a loop over the panel's two), each column's blocks
    prefetched. The IR loads a column's block bytes in the fill
    (its nibble halves a loop) and in each direct nest (halves unrolled), never in the tile's sums."""
    blocks = _blocks(rng, kind, 1536, K)
    x = rng.standard_normal((16, K)).astype(np.float32)
    (kernel,) = _batched(kind, "cpu", rows=(1, 16)).plan(x, blocks).kernels
    out = optimize(kernel.kernel.scheduled, "llvm", AVX512)
    fill, *stores = out.src
    assert fill.src[0].op is Ops.DEFINE_LOCAL and fill.src[0].arg[1] == 4 * K
    column = min((r for r in fill.toposort() if r.op is Ops.RANGE and r.arg[1] == "serial"), key=lambda r: r.arg[0])
    assert [_at(column.src[0], B=b).arg for b in (1, 6, 7, 16)] == [0, 0, 4, 4]
    on_tile = [s for s in stores if any(u.op is Ops.DEFINE_LOCAL for u in s.toposort())]
    direct = [s for s in stores if s not in on_tile]
    assert len(on_tile) == (3 + 2 + 1) * 4 and len(direct) == 6 * 7 // 2 * 2  # direct: a loop of 2 blocks
    block_bytes = [u for u in out.toposort() if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL and
                   u.src[0].arg == 2]
    assert block_bytes and not any(u in s.toposort() for s in on_tile for u in block_bytes)
    assert len({r.src[1:] for s in stores for r in s.toposort() if r.op is Ops.REDUCE}) == 1  # one set of ranges
    ir = render_llvm(out, AVX512).source
    halves = 2 if kind == "q4_1" else 1
    assert ir.count("load <32 x i8>" if kind == "q8_0" else "load <16 x i8>") == 1 + 6 * 2 * halves  # fill: a loop
    assert sum("call void @llvm.prefetch" in line for line in ir.splitlines()) >= 6 * 2


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_avx2_batch_factors_its_scales(kind, rng):
    """On AVX2 (8 lanes, narrower than a block's) a decode batch's sums take their block scales out of the in-block
    sums as the one-row kernel's do (block_scales.py): q4_1's m times x's block totals, computed once per call for
    every row into an array laid out for the most rows (B up to 16: 16 x K / 32 floats), read by a scalar sum a
    row; q8_0 has no such term. Such sums cost less than a tile's (unpacking is a conversion and an FMA a
    weight): the batch reads the blocks at every B, no tile of the weights."""
    blocks = _blocks(rng, kind, 1536, K)
    x = rng.standard_normal((16, K)).astype(np.float32)
    (kernel,) = _batched(kind, "cpu", rows=(1, 16)).plan(x, blocks).kernels
    out = optimize(kernel.kernel.scheduled, "llvm", AVX2)
    arrays = {u.arg[1] for u in out.toposort() if u.op is Ops.DEFINE_LOCAL}
    assert arrays == ({16 * K // 32} if kind == "q4_1" else set())
    one_row = [st for st in out.src if st.src[0].op is Ops.DEFINE_GLOBAL][-1]  # (the last nest: one row's)
    sums = [u for u in one_row.toposort() if u.op is Ops.REDUCE]
    lanes = [r for r in sums if any(x.op is Ops.RANGE and x.arg[1] == "lane" for x in r.src[1:])]
    assert len(lanes) == 1 and len(sums) == (3 if kind == "q4_1" else 2)  # d's lane sum of in-block sums (, m's)


@pytest.mark.parametrize("kind", ["q8_0", "q4_1", "q6_k"])
def test_batch_rows_on_or_off_the_tile_match_numpy_and_keep_their_bits(kind, device, rng):
    """B a var up to 16 (on the cpu rows past one register block read a tile, fewer the blocks): every B in
    {1, 3, 4, 5, 7, 16} equals float64 NumPy, and a row has the same bits alone, in a batch of 4 or 5 (the blocks) and
    in one of 7 or 16 (the tile), whichever position it takes."""
    blocks = _blocks(rng, kind, N, K)
    w = pj.quant.dequantize(blocks, kind).astype(np.float64)
    f = _batched(kind, device, rows=(1, 16))
    x = rng.standard_normal((16, K)).astype(np.float32)
    batch = np.asarray(f(x, blocks))
    for rows in (1, 3, 4, 5, 7, 16):
        ref = x[:rows].astype(np.float64) @ w.T
        got = np.asarray(f(x[:rows], blocks))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
        np.testing.assert_array_equal(got, batch[:rows])
    for b in (0, 5, 15):
        np.testing.assert_array_equal(np.asarray(f(x[b:b + 1], blocks))[0], batch[b])
        np.testing.assert_array_equal(np.asarray(f(x[b:b + 4], blocks))[0], batch[b])
    assert len(f.plan(x, blocks).kernels) == 1 and f.plan(x, blocks).memory_bytes == 0


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_a_register_blocks_sums_add_their_lanes_up_together(kind, rng):
    """A decode batch's register blocks add up their sums' lanes in one halving tree of shuffles and adds
    (llvm_reductions.lanes_added_up), not each by llvm.vector.reduce.fadd (AVX-512: no sum alone; AVX2's blocks are
    3 x 1, so its one-row block is a lone sum); in that intrinsic's order, so each row has the bits the one-row
    matvec (a lone sum, reduced by the intrinsic) gives it where that matvec sums as the blocks do (AVX-512; AVX2's
    sums a block before its scales, block_scales.py: the same values but for rounding)."""
    from .test_quant_matvec import _matvec
    blocks = _blocks(rng, kind, N, K)
    f = _batched(kind, "cpu", rows=(1, 16))
    x = rng.standard_normal((16, K)).astype(np.float32)
    (kernel,) = f.plan(x, blocks).kernels
    for target, alone in ((AVX512, 0), (AVX2, 1)):
        ir = render_llvm(optimize(kernel.kernel.scheduled, "llvm", target), target).source
        assert ir.count("call reassoc float @llvm.vector.reduce.fadd") == alone and "shufflevector" in ir
    one = _matvec(kind)
    same_bits = host_target().lanes(4) >= TABLE_LANES
    assert not same_bits or "llvm.vector.reduce.fadd" in one.plan(x[:1], blocks).kernels[0].kernel.source
    batch = np.asarray(f(x, blocks))
    for b in (0, 1, 5, 15):
        alone = np.asarray(one(x[b:b + 1], blocks))[0]
        if same_bits:
            np.testing.assert_array_equal(alone, batch[b])
        else:
            np.testing.assert_allclose(alone, batch[b], rtol=1e-5, atol=1e-5 * np.abs(batch[b]).max())


@pytest.mark.parametrize("kind", ["q8_0", "q4_1", "q6_k"])
def test_a_prefill_unpacks_each_panels_blocks_once_into_a_tile(kind, rng):
    """With up to 512 rows (a prefill) the kernel as launched (AVX-512 and AVX2) first unpacks a panel's columns
    of blocks into a tile of its own (one store into a DEFINE_LOCAL of columns x K floats, at most TILE_BYTES),
    and its register blocks read the tile, not the blocks: no store of the outputs loads a block byte."""
    blocks = _blocks(rng, kind, 1536, K)
    x = rng.standard_normal((3, K)).astype(np.float32)
    (kernel,) = _batched(kind, "cpu", rows=(1, 512)).plan(x, blocks).kernels
    for target, columns in ((AVX512, 6), (AVX2, 4)):
        out = optimize(kernel.kernel.scheduled, "llvm", target)
        fills = [s for s in out.src if s.src[0].op is Ops.DEFINE_LOCAL]
        assert len(fills) == 1 and fills[0] is out.src[0] and fills[0].src[0].arg[1] == columns * K
        assert fills[0].src[0].arg[1] * 4 <= TILE_BYTES
        for store in out.src[1:]:
            assert not any(u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL and u.src[0].arg == 2
                           for u in store.toposort())
        render_llvm(out, target)


def test_a_prefill_tiles_rows_past_its_register_blocks_run_one_at_a_time(rng):
    """A prefill's rows past its full register blocks (AVX-512 3 x 6, AVX2 2 x 4) run as one nest of one-row blocks
    over the tile: R x C + C output stores, not a nest for each count below R (AVX-512 18 + 12 + 6: the tile's
    rows read it from L1, so a block of 2 saved little beside its code, which LLVM compiled and the bounds proof
    proved: SmolLM2's prefill o-projection IR 85 -> 59 KB). The rows' bits: test_prefill_rows_over_a_tile_..."""
    blocks = _blocks(rng, "q4_1", 1536, K)
    x = rng.standard_normal((3, K)).astype(np.float32)
    (kernel,) = _batched("q4_1", "cpu", rows=(1, 512)).plan(x, blocks).kernels
    for target, (rows, columns) in ((AVX512, (3, 6)), (AVX2, (2, 4))):
        out = optimize(kernel.kernel.scheduled, "llvm", target)
        outputs = [s for s in out.src if s.src[0].op is Ops.DEFINE_GLOBAL]
        assert len(outputs) == rows * columns + columns, target.cpu


@pytest.mark.parametrize("kind", ["q8_0", "q4_1", "q6_k"])
def test_prefill_rows_over_a_tile_match_numpy_and_keep_their_bits(kind, device, rng):
    """A prefill plan (B up to 512: the weights unpacked into a tile per panel on the cpu) equals float64 NumPy for
    B in {1, 3, 128, 131}, holds no float32 weight, and gives a row the bits it has alone."""
    blocks = _blocks(rng, kind, N, K)
    w = pj.quant.dequantize(blocks, kind).astype(np.float64)
    f = _batched(kind, device, rows=(1, 512))
    x = rng.standard_normal((131, K)).astype(np.float32)
    for rows in (1, 3, 128, 131):
        ref = x[:rows].astype(np.float64) @ w.T
        np.testing.assert_allclose(np.asarray(f(x[:rows], blocks)), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    batch = np.asarray(f(x, blocks))
    for b in (0, 2, 130):
        np.testing.assert_array_equal(np.asarray(f(x[b:b + 1], blocks))[0], batch[b])
    assert len(f.plan(x, blocks).kernels) == 1 and f.plan(x, blocks).memory_bytes == 0


@pytest.mark.parametrize("kind", ["q4_0", "q4_1"])
@pytest.mark.parametrize("most", [16, 512])
def test_a_tiles_4_bit_weights_are_looked_up_in_a_table_of_their_block(kind, most, rng):
    """On AVX-512 the fill of a batch's or a prefill's tile unpacks a 4-bit weight as the block sums do (llvm_reductions
    .lookup_tables): one permute of its block's 16-entry table a vector of lanes, not a conversion, a multiply and an
    add; a 16-row batch's kernel permutes in its fill (once: its nibble halves are a loop) and in its direct nests (6
    nests of 1-6 rows x 2 columns x 2 unrolled halves), a prefill's only in its fill. AVX2 (8 lanes) keeps the arithmetic. The bits are those of
    the arithmetic (test_batch_rows_on_or_off_the_tile_..., test_prefill_rows_over_a_tile_...)."""
    from prepjit.codegen.llvm_reductions import PERMUTE
    blocks = _blocks(rng, kind, 1536, K)
    x = rng.standard_normal((16, K)).astype(np.float32)
    (kernel,) = _batched(kind, "cpu", rows=(1, most)).plan(x, blocks).kernels
    ir = render_llvm(optimize(kernel.kernel.scheduled, "llvm", AVX512), AVX512).source
    assert ir.count(f"call <16 x float> @{PERMUTE}(") == 1 + (6 * 2 * 2 if most == 16 else 0)
    assert PERMUTE not in render_llvm(optimize(kernel.kernel.scheduled, "llvm", AVX2), AVX2).source


@pytest.mark.parametrize("most", [4, 16, 512])
def test_avx2_unpacks_4_bit_weights_in_int32_not_in_bytes(most, rng):
    """On AVX2 (no byte shifts) a q4_1 batch's and a prefill's kernels shift and mask their nibbles in int32 lanes
    (block_scales' widening: the same values), not in i8 vectors (a variable shift and two selects a vector); their
    bits are the bytes' (test_a_row_has_the_same_bits_..., test_batch_rows_on_or_off_the_tile_...)."""
    blocks = _blocks(rng, "q4_1", 1536, K)
    x = rng.standard_normal((3, K)).astype(np.float32)
    (kernel,) = _batched("q4_1", "cpu", rows=(1, most)).plan(x, blocks).kernels
    ir = render_llvm(optimize(kernel.kernel.scheduled, "llvm", AVX2), AVX2).source
    masks = [line for line in ir.splitlines() if "shr <" in line or " = and <" in line]
    assert masks and all("x i32>" in line for line in masks), masks


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
@pytest.mark.parametrize("most", [16, 512])
def test_a_tiles_fill_prefetches_the_blocks_ahead(kind, most, rng):
    """The fill of a batch's or a prefill's tile (a burst between the tile's sums that the hardware prefetchers do not
    run ahead of) asks for the weight's bytes PREFETCH_BYTES past those it unpacks, once a store (its panels'
    blocks are contiguous: the next panels'); the activations, which the sums read, are not asked for. (AVX2's batch
    reads the blocks with its scales factored out of the sums, and no tile: test_avx2_batch_factors_its_scales.)"""
    blocks = _blocks(rng, kind, 1536, K)
    x = rng.standard_normal((16, K)).astype(np.float32)
    (kernel,) = _batched(kind, "cpu", rows=(1, most)).plan(x, blocks).kernels
    for target in (AVX512, AVX2) if most >= block_matmul.MIN_TILE_ROWS else (AVX512,):
        out = optimize(kernel.kernel.scheduled, "llvm", target)
        lines = render_llvm(UOp(Ops.SINK, out.dtype, (out.src[0],), out.arg), target).source.splitlines()
        (prefetch,) = [line for line in lines if line.strip().startswith("call void @llvm.prefetch")]
        ahead = prefetch.split("(ptr ")[1].split(",")[0]
        (gep,) = [line for line in lines if line.strip().startswith(f"{ahead} = getelementptr i8")]
        assert gep.endswith(f"i64 {PREFETCH_BYTES}")
        here = gep.split(", ptr ")[1].split(",")[0]
        assert any(line.strip().startswith(f"{here} = getelementptr") and "%buf2" in line for line in lines)
