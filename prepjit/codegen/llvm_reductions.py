"""How the LLVM renderer renders reductions: a loop nest of accumulators per upcast block (reduce), a lone sum
over a row of 16-bit float weights with the rows ahead prefetched (prefetch_sum), a sum over a "lane" range as
vector accumulators added up once (lane_sum) with its streamed blocks prefetched (prefetch_streams), a softmax row's
cached key and value rows asked for ahead of its scores (prefetch_positions), a block's float16 scales converted
two at a time (half_pairs) and its functions of 4-bit values looked up in 16-entry tables (lookup_tables), and
bfloat16 products summed in pairs by vdpbf16ps (bfloat16_pairs). A mixin of render_llvm's renderer: it reads the
renderer's state and emitters."""
from __future__ import annotations

from ..uop import DType, Ops, UOp, dtypes, simplify
from .llvm_amx import AMXRendering
from .llvm_ir import const_literal, intrinsic_suffix, mem_type, reg_type
from .optimize import stride_along

UNROLLED_STEPS = 4  # a sum over lanes unrolls an innermost loop of this many steps at most (lane_sum)
GATED_STEPS = 8  # and one of this many at most whose loads are gated by its step (gated_by): a RoPE'd query's rotated
# half, read across a 64-element head in AVX2's 8 lanes (a decode step's attention scores), is 8 steps of masked loads
# whose masks are built at run time; unrolled, each step's mask is a constant (a plain load or none) and the query's
# RoPE, the same for every key, leaves the keys' loop. SmolLM2 decode on an AVX2-only Zen 3 (2 threads; both plans in
# one process, alternating step by step, 100 steps each): q8_0 9.27 -> 8.40 ms at pos 136, 13.09 -> 9.98 at 512;
# gguf 9.06 -> 8.26 at 136; bf16 weights 12.22 -> 11.41 at 136. (AVX-512 takes a 64-element head in 4 steps: unrolled)
PREFETCH_BYTES = 2048  # how far ahead a sum over lanes prefetches the blocks it streams (prefetch_streams): on one
# thread from DRAM, q8_0 49152 x 576 took 2.9 ms with 512 bytes, 2.6 with 1024, 2.3 with 2048, 2.3 with 4096
SUM_AHEAD_BYTES = 8192  # how far ahead a lone sum over a row of narrow weights prefetches (prefetch_sum): bfloat16
# x (576) @ W.T, 2 threads, 300-140 weights round robin from DRAM: (576, 576) 42 -> 31 us with 2304 or 9216 bytes,
# (3072, 576) 202 -> 162-165 with 4608, 9216 or 18432, (1536, 576) ~91 -> 75-81; float32 weights gain nothing
LINE_BYTES = 64
ROLLED = '!"llvm.loop.unroll.disable"'  # loop metadata that keeps a loop rolled (lane_sum's loop over a float32 row's
# steps). Unrolled (LLVM unrolls a row's 18 steps whole), its prefetches sink below the row's loads and its lanes' sum:
# each row asks for the next one's 36 lines in one burst after its own, not 2 lines every 128 bytes as it streams.
# SmolLM2 f32 decode step at pos 140, 2 threads, both plans in one process alternating step by step (same weights,
# bit-identical logits), 100 steps a round: medians 0.11-0.30 ms lower in 10 of 10 rounds (17.70 -> 17.47 ms on a
# quiet host), PREPJIT_CPU=haswell 0.21-0.24 lower in 3 of 3; 121 lone f32 matvecs of its shapes without the
# decode's fills, split 4 chunks a thread: 0.15-0.25 ms higher (16.5-17.2 ms, 3 rounds), 1 chunk a thread: even.
PAGE_BYTES = 4096  # a register block's narrow load that steps this far a reduction step is prefetched (prefetch_rows)
ROWS_AHEAD = 4  # reduction steps ahead it is prefetched: x (576) @ W (576, 3072) bfloat16, one thread, 8 weights
# round robin (28 MB, from L3): 164-183 us without, 148-160 with 4 steps, 162 with 2 and 8, 168 with 16. float32
# weights gain nothing (320-328 us without, 334-340 with a prefetch per line or per two lines): not prefetched


def _stream(buf: UOp, start: UOp, step: int) -> tuple:
    """The stream of a load of `buf` starting at `start` whose index moves `step` elements a step of the loop it is
    prefetched in: its buffer, the non-constant part of its index and which step's span its constant offset falls
    in. The parts of a weight row's block (a scale, its quants) are one stream; the next weight row, a register
    block's next column (a row's length away: at least a step), is another."""
    if not step:
        return (buf,)
    if start.op is Ops.ADD and start.src[1].op is Ops.CONST:
        return buf, start.src[0], start.src[1].arg // step
    return (buf, None, start.arg // step) if start.op is Ops.CONST else (buf, start, 0)


def _half_bytes(u: UOp) -> tuple[UOp, UOp] | None:
    """(buffer, index) of the two bytes float16 value `u` is read from (BITCAST(low | high << 8) of two uint8 loads
    at index and index + 1), or None."""
    if u.op is not Ops.BITCAST or u.dtype != dtypes.float16 or u.src[0].op is not Ops.OR:
        return None
    loads = {}
    for part in u.src[0].src:
        shift = 0
        if part.op is Ops.SHL and part.src[1].op is Ops.CONST:
            part, shift = part.src[0], part.src[1].arg
        if part.op is not Ops.CAST or part.src[0].op is not Ops.LOAD or part.src[0].dtype != dtypes.uint8:
            return None
        loads[shift] = part.src[0]
    if set(loads) != {0, 8} or loads[0].src[0] is not loads[8].src[0] or len(loads[0].src) != 2 or \
            len(loads[8].src) != 2 or simplify(loads[8].src[1] - loads[0].src[1]).op is not Ops.CONST or \
            simplify(loads[8].src[1] - loads[0].src[1]).arg != 1:
        return None
    return loads[0].src[0], loads[0].src[1]


def _identity(op: Ops, dt: DType):
    if op is Ops.ADD or op is Ops.OR:
        return 0
    if op is Ops.MUL or op is Ops.AND:
        return 1
    if op is Ops.MAX:
        return dt.min()
    return dt.max()


# vdpbf16ps (AVX512_BF16): 16 float lanes, each plus the two products of its pair of bfloat16 lanes
DOT, DOT_LANES, DOT_PAIRS = "llvm.x86.avx512bf16.dpbf16ps.512", 16, "<32 x bfloat>"
# vpermps (AVX-512): 16 float lanes, each the entry of a 16-float table its lane's index (low 4 bits) picks
PERMUTE, TABLE_ENTRIES = "llvm.x86.avx512.permvar.sf.512", 16


def _nibble_of_byte(index: UOp) -> tuple[UOp, UOp | None] | None:
    """(byte, shift or None) where a table's 4-bit index is a nibble of a uint8 value, (byte >> shift) & 15 (shift
    below 8) or byte & 15: vpermps reads only the low 4 bits of each lane's index, so the byte widened to 32 bits
    (once for both its nibbles) and shifted as 32-bit lanes is the index as it is, no byte shift or mask (q4_1 x
    (576) @ W.T (3072, 576), one thread: a vgf2p8affineqb and a vpmovzxbd fewer a block, both on the shuffle port)."""
    if index.op is Ops.AND and index.src[1].op is Ops.CONST and index.src[1].arg == TABLE_ENTRIES - 1:
        index = index.src[0]
    if index.dtype != dtypes.uint8:
        return None
    if index.op is Ops.SHR and index.src[1].vmax < 8:
        return index.src[0], index.src[1]
    return index, None


class ReductionRendering(AMXRendering):
    """The reduction methods of render_llvm._Renderer."""

    def reduce(self, u: UOp) -> str:
        """`u` and every not yet rendered reduction over the same ranges (an upcast block) whose loops are
        open here, in one loop nest.

        A lone float sum is reassociated so LLVM vectorises its loop; a block's sums are not (its
        accumulators vectorise across the block instead) and fuse their multiply-adds, as a lone sum of vectors
        (a value of the lanes: block_scales.py's in-block sums) does.
        """
        if self.lane is not None and self.lane in u.src[1:]:
            return self.lane_sum(u)
        here, laned = set(self.open_ranges), u in self.laned
        group = [u] + [r for r in self.reduce_groups[(u.arg, u.dtype, u.src[1:])]
                       if r is not u and self.reduce_loops[r] <= here and (r in self.laned) == laned
                       and not any(r in scope for scope in self.scopes)]
        tiled = u.src[-1].arg[1] == "tile" and laned and self.tile_sums(group)  # amx.py's blocks
        if tiled:
            for r, out in zip(group[1:], tiled[1:]):
                self.scopes[-1][r] = out
            return tiled[0]
        t, block = self.ty(u.dtype), len(group) > 1
        accs = [self.tmp("acc") for _ in group]
        # a vector sum over steps that all run (block_scales.py's in-block sums, alone or a block's) starts at -0.0,
        # which LLVM drops from the first add (x + -0.0 is x; x + 0.0 is not, for x = -0.0): a row's sum the same
        # bits alone as in a block of rows (block_matmul.py; from 0.0 a block's differed in the last bits)
        start = -0.0 if laned and u.arg is Ops.ADD and u.dtype.is_float and \
            all(r.src[0].op is Ops.CONST and r.src[0].arg > 0 for r in u.src[1:]) else _identity(u.arg, u.dtype)
        for acc in accs:
            self.allocas.append(f"  {acc} = alloca {t}")
            self.emit(f"store {t} {self.const(const_literal(start, u.dtype), u.dtype)}, ptr {acc}")
        pair = u.src[-1] if u.src[-1].arg[1] in ("pair", "tile") else None
        dot = pair is not None and laned and self.width == DOT_LANES
        looped = [r for r in u.src[1:] if not (dot and r is pair)]
        if not block and not laned and len(looped) == 1:
            self.prefetch_sum([x.src[0] for x in group], looped[0], u.dtype)
        loops = [self.open_loop(r, "0", self.value(r.src[0])) for r in looped]
        if block and looped:
            self.prefetch_rows([r.src[0] for r in group], looped[-1], u.dtype)
        as_value = (lambda x: self.vector(x, self.value(x))) if laned else self.value
        pairs = self.bfloat16_pairs([r.src[0] for r in group], pair) if dot else None
        for r, acc in zip(group, accs):
            x = r.src[0]
            if dot:
                cur = self.op(f"load {t}, ptr {acc}")
                a, b = (pairs[s] for s in x.src)
                self.emit(f"store {t} {self.call(DOT, t, [(t, cur), (DOT_PAIRS, a), (DOT_PAIRS, b)])}, ptr {acc}")
                continue
            if (block or laned) and u.arg is Ops.ADD and u.dtype.is_float and x.op is Ops.MUL:
                v = self.op(f"fmul contract {t} {as_value(x.src[0])}, {as_value(x.src[1])}")
            else:
                v = as_value(x)
            cur = self.op(f"load {t}, ptr {acc}")
            if u.arg is Ops.ADD and u.dtype.is_float:
                new = self.op(f"fadd {'contract' if block or laned else 'reassoc'} {t} {cur}, {v}")
            else:
                new = self.alu(u.arg, u.dtype, u.dtype, [cur, v])
            self.emit(f"store {t} {new}, ptr {acc}")
        for loop in reversed(loops):
            self.close_loop(loop)
        outs = []
        for acc in accs:
            out = self.op(f"load {t}, ptr {acc}")
            outs.append(self.round_to(out, u.dtype) if u.dtype.narrow else out)
        for r, out in zip(group[1:], outs[1:]):
            self.scopes[-1][r] = out
        return outs[0]

    def lane_sum(self, u: UOp) -> str:
        """A float sum over the lane range and loops (block_split.py's split of a quantized weight's blocks), with
        every not yet rendered sum over the same ranges: each accumulates the vectors of its lanes over the loops
        and adds the lanes up once at the end. After each loop opens, what depends on it and on no range still
        to open (a block's scale) is computed there, once per step, before the inner loops. The innermost loop,
        when it has at most UNROLLED_STEPS steps (q4_1's two nibble halves), or GATED_STEPS with loads its step
        gates (a RoPE'd query's rotated half), is unrolled with an accumulator per step, so consecutive vectors add
        into independent registers. A not yet rendered scalar sum over the same loops and no lanes (block_scales.py's
        q4_1 minimum term: a block's m times x's block total) rides along: one scalar accumulator, one FMA a step, not
        a loop of its own."""
        here = set(self.open_ranges)
        group = [u] + [r for r in self.reduce_groups[(u.arg, u.dtype, u.src[1:])]
                       if r is not u and self.reduce_loops[r] <= here and not any(r in scope for scope in self.scopes)]
        t = reg_type(u.dtype)
        vt = f"<{self.width} x {t}>"
        ranges = [r for r in u.src[1:] if r is not self.lane]
        last = ranges[-1].src[0] if ranges else None
        unrolled = ranges.pop() if last is not None and last.op is Ops.CONST and (
            last.arg <= UNROLLED_STEPS or
            last.arg <= GATED_STEPS and self.gated_by([x.src[0] for x in group], ranges[-1])) else None
        steps = range(unrolled.src[0].arg) if unrolled is not None else range(1)
        accs = [[self.tmp("acc") for _ in steps] for _ in group]
        for acc in (a for per_sum in accs for a in per_sum):
            self.allocas.append(f"  {acc} = alloca {vt}")
            self.emit(f"store {vt} zeroinitializer, ptr {acc}")
        riders = [r for r in self.reduce_groups.get((u.arg, u.dtype, tuple(ranges)), [])  # scalar sums, same loops
                  if ranges and unrolled is None and r not in self.laned and self.reduce_loops[r] <= here
                  and not any(r in scope for scope in self.scopes)]
        rider_accs = [self.tmp("acc") for _ in riders]
        for acc in rider_accs:
            self.allocas.append(f"  {acc} = alloca {t}")
            self.emit(f"store {t} {const_literal(_identity(u.arg, u.dtype), u.dtype)}, ptr {acc}")
        loops, opened = [], set(self.open_ranges)
        for r in ranges:
            loops.append(self.open_loop(r, "0", self.value(r.src[0])))
            opened.add(r)
            if r is ranges[0]:  # (at the first step of the ranges inside: the sum's, and any sum's in its body)
                nested = (s for x in group for v in x.src[0].toposort() if v.op is Ops.REDUCE for s in v.src[1:])
                lined = self.prefetch_streams([x.src[0] for x in group], r, (*u.src[2:], *nested))
            scalars = [v for x in group + riders for v in x.src[0].toposort()
                       if v not in self.laned and r in self.ranges[v] and self.ranges[v] <= opened]
            self.half_pairs(scalars)
            for v in scalars:
                self.value(v)
        tables = self.lookup_tables([x.src[0] for x in group])
        for table in tables.values():  # built once per block, unless it changes with the unrolled step
            if unrolled not in self.ranges[table]:
                self.value(table)
        for r, acc in zip(riders, rider_accs):
            x = r.src[0]
            v = self.op(f"fmul contract {t} {self.value(x.src[0])}, {self.value(x.src[1])}") if x.op is Ops.MUL \
                else self.value(x)
            cur = self.op(f"load {t}, ptr {acc}")
            self.emit(f"store {t} {self.op(f'fadd contract {t} {cur}, {v}')}, ptr {acc}")
        for step in steps:
            if unrolled is not None:
                self.scopes.append({unrolled: str(step)})
            for u, table in tables.items():
                self.look_up(u, table)
            for r, per_sum in zip(group, accs):
                x = r.src[0]
                if x.op is Ops.MUL:  # contracted with the add: one FMA
                    v = self.op(f"fmul contract {vt} {self.vector(x.src[0], self.value(x.src[0]))}, "
                                f"{self.vector(x.src[1], self.value(x.src[1]))}")
                else:
                    v = self.vector(x, self.value(x))
                cur = self.op(f"load {vt}, ptr {per_sum[step]}")
                self.emit(f"store {vt} {self.op(f'fadd reassoc contract {vt} {cur}, {v}')}, ptr {per_sum[step]}")
            if unrolled is not None:
                self.scopes.pop()
        for loop in reversed(loops):  # a float32 row's lines asked for as its steps reach them: the loop stays rolled
            self.close_loop(loop, (ROLLED,) if loop is loops[0] and lined else ())
        totals = []
        for per_sum in accs:
            lanes = [self.op(f"load {vt}, ptr {acc}") for acc in per_sum]
            total = lanes[0]
            for more in lanes[1:]:
                total = self.op(f"fadd reassoc {vt} {total}, {more}")
            totals.append(total)
        outs = self.lanes_added_up(totals, u.dtype)
        for r, out in zip(group[1:], outs[1:]):
            self.scopes[-1][r] = out
        for r, acc in zip(riders, rider_accs):
            self.scopes[-1][r] = self.op(f"load {t}, ptr {acc}")
        return outs[0]

    def gated_by(self, bodies: list[UOp], r: UOp) -> bool:
        """Whether a load in `bodies` has a gate that changes with range `r` (a masked load: its mask built per
        step)."""
        return any(v.op is Ops.LOAD and len(v.src) > 2 and r in self.ranges[v.src[2]]
                   for x in bodies for v in x.toposort())

    def half_pairs(self, values: list[UOp]):
        """Among `values` (a block's scalars: its scales), the float16 values read from two bytes each (a quantized
        block's scales: pj.quant assembles them from the uint8 blocks) 2 bytes apart, two at a time, converted as one
        vector: one load of <2 x half> and one vcvtph2ps for both, not a vpinsrw and a vcvtph2ps each (q4_1's d and m;
        AVX2 q4_1 x (576) @ W.T (1536, 576), one thread, in L2: 72 -> 62 us)."""
        halves = {v: at for v in dict.fromkeys(values) if (at := _half_bytes(v)) is not None and
                  self._rendered(v) is None}
        for v, (buf, at) in list(halves.items()):
            partner = next((w for w, (b, other) in halves.items() if w is not v and b is buf and
                            simplify(other - at).op is Ops.CONST and simplify(other - at).arg == 2), None)
            if v not in halves or partner is None:
                continue
            lanes, self.vec = self.vec, 0
            pair = self.op(f"load <2 x half>, ptr {self.address(buf, self.value(at))}, align 1")
            self.vec = lanes
            wide = self.op(f"fpext <2 x half> {pair} to <2 x float>")
            for k, node in enumerate((v, partner)):
                self.scopes[-1][node] = self.op(f"extractelement <2 x float> {wide}, i64 {k}")
                del halves[node]

    def lanes_added_up(self, vectors: list[str], dtype: DType) -> list[str]:
        """Each vector's lanes added up in a halving tree: lane i plus lane i + half of each run of lanes, the runs
        halving down to one lane, the order of LLVM's reassociated llvm.vector.reduce.fadd, which adds up a lone
        sum's. A register block's sums share the tree, their runs side by side: each level adds two vectors, each
        the halves of two vectors' runs (shuffles of both). 12 sums of 16 lanes (AVX-512 3 x 4 over a decode
        batch's tile): 12 adds and 24 shuffles, not 48 adds and ~50 shuffles one sum at a time (one thread, 16 rows
        x 576 @ 960 q4_1 186 -> 180 us, q8_0 165 -> 154; SmolLM2 gguf's 16-row decode step on 2 threads 27.0 ->
        26.0 ms). A row's sums have the same bits in a block of any size and alone."""
        t, width = reg_type(dtype), self.width
        vt = f"<{width} x {t}>"
        if len(vectors) == 1:
            name = f"llvm.vector.reduce.fadd.{intrinsic_suffix(t, width)}"
            self.decls.add(f"declare {t} @{name}({t}, {vt})")
            return [self.op(f"call reassoc {t} @{name}({t} {const_literal(-0.0, dtype)}, {vt} {vectors[0]})")]
        items = [(v, [n]) for n, v in enumerate(vectors)]  # (vector, the sums in it: a run of `run` lanes each)
        run = width
        while run > 1:
            half, paired = run // 2, []
            for k in range(0, len(items), 2):
                (a, in_a), (b, in_b) = items[k], items[k + 1] if k + 1 < len(items) else ("poison", [])
                low = [base + n * run + i for base, count in ((0, len(in_a)), (width, len(in_b)))
                       for n in range(count) for i in range(half)]
                masks = [", ".join([f"i32 {x + up}" for x in low] + ["i32 poison"] * (width - len(low)))
                         for up in (0, half)]
                lo, hi = (self.op(f"shufflevector {vt} {a}, {vt} {b}, <{width} x i32> <{m}>") for m in masks)
                paired.append((self.op(f"fadd {vt} {lo}, {hi}"), in_a + in_b))
            items, run = paired, half
        where = {n: (v, lane) for v, sums in items for lane, n in enumerate(sums)}
        return [self.op(f"extractelement {vt} {where[n][0]}, i64 {where[n][1]}") for n in range(len(vectors))]

    def prefetch_streams(self, bodies: list[UOp], step: UOp, inner: tuple) -> bool:
        """Ask for the bytes PREFETCH_BYTES ahead of each block a sum over lanes streams (a load of a buffer that
        moves with the parallel range: a weight's rows, not the activations every row reuses; each column of a
        register block is a stream of its own), once per block of each stream (`step` the loop of blocks), and
        for float weights (a bfloat16 or float32 row's block) once per cache line of it. Unpacking a block keeps
        the core busy long enough that the hardware prefetchers fall behind, and the matvec waits on memory (q8_0
        49152 x 576 from DRAM on one thread: 4.4 ms without, 2.3 ms with); a float32 row is streamed faster with
        its lines asked for ahead too (reading 540 MB on this host's 2 threads: 31 GB/s without, 37-40 with
        one prefetch per line 256-2048 bytes ahead, 31-34 with 3072 or more). The streams of one buffer (a block's
        columns, adjacent weight rows) are each asked for PREFETCH_BYTES past the farthest of them (plus their
        spread): the block reads all of them at once, so PREFETCH_BYTES past its own start would land only that
        far minus the spread past what the block already reads (a decode batch's one row x 2 columns over a 1536-wide
        q4_1 row, 960 bytes a column, one thread, weights from DRAM: 76-78 us, the one-row kernel's 67-68).
        Whether it asked for every line of a float32 stream's block (lane_sum then keeps the loop of `step` rolled:
        ROLLED)."""
        if self.prange is None:
            return False
        lined = False
        streams: dict = {}
        for ld in (v for x in bodies for v in x.toposort() if v.op is Ops.LOAD):
            if self.prange not in self.ranges[ld.src[1]]:
                continue
            start = simplify(ld.src[1].substitute({r: UOp.const(0) for r in inner}))
            # each column of a register block is a stream of its own
            streams.setdefault(_stream(ld.src[0], start, abs(stride_along(ld.src[1], step) or 0)), (ld, start))
        for ld, start in streams.values():
            apart = [d.arg for o, other in streams.values() if o.src[0] == ld.src[0]
                     for d in [simplify(other - start)] if d.op is Ops.CONST]  # this stream's own 0 among them
            distance = PREFETCH_BYTES + (max(apart) - min(apart)) * ld.dtype.itemsize
            last = simplify(ld.src[1].substitute({r: r.src[0] - 1 for r in inner}) - start)
            span = (last.arg + 1) * ld.dtype.itemsize if ld.dtype.is_float and last.op is Ops.CONST else 1
            here = self.address_of(ld.src[0], start)
            for at in range(distance, distance + span, LINE_BYTES):
                self.prefetch(here, at)
            lined = lined or (ld.dtype == dtypes.float32 and span > LINE_BYTES)
        return lined

    def address_of(self, buf: UOp, index: UOp) -> str:
        """A pointer to `buf`'s element at `index`, rendered as one scalar index whatever the lanes open (a
        prefetch's address)."""
        lanes, self.vec = self.vec, 0
        at = self.value(index)
        self.vec = lanes
        return self.op(f"getelementptr {mem_type(buf.dtype)}, ptr %buf{buf.arg}, i64 {at}", "p")

    def prefetch(self, pointer: str, offset, locality: int = 3):
        """Ask for the cache line `offset` bytes past `pointer` (llvm.prefetch of a read; `locality` 3: keep it in
        every level, 2: L2 and below)."""
        self.decls.add("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
        line = self.op(f"getelementptr i8, ptr {pointer}, i64 {offset}", "p")
        self.emit(f"call void @llvm.prefetch.p0(ptr {line}, i32 0, i32 {locality}, i32 1)")

    def prefetch_fill(self, value: UOp):
        """Ask for the bytes PREFETCH_BYTES ahead of what a fill of the kernel's own array (a block_matmul tile)
        reads of each buffer that moves with the parallel range (a panel's weight rows, contiguous from panel to
        panel), once a store: the fill is a burst between the tile's sums, too short for the hardware prefetchers
        to run ahead of it, and its weights come from memory in a model's step."""
        if self.prange is None:
            return
        starts: dict = {}
        for ld in value.toposort():
            if ld.op is Ops.LOAD and self.prange in self.ranges[ld.src[1]]:
                starts.setdefault(ld.src[0], simplify(ld.src[1].substitute({self.lane: UOp.const(0)})))
        for buf, start in starts.items():
            self.prefetch(self.address_of(buf, start), PREFETCH_BYTES)

    def prefetch_sum(self, bodies: list[UOp], r: UOp, acc: DType):
        """Before a lone sum's loop over reduction range `r` (a matvec's output row against a weight contiguous along
        `r`, W (out, in), its rows one after another, where the row is not summed over lanes: matvec.py), ask for
        the row SUM_AHEAD_BYTES ahead into L2, one prefetch per cache line of a row, for each buffer of values
        narrower than its `acc` accumulator (bfloat16 or float16 weights, widened) that moves with the parallel
        range: widening keeps the core busy long enough that the hardware prefetchers fall behind the rows."""
        if self.prange is None or r.src[0].op is not Ops.CONST:
            return
        here = set(self.open_ranges)
        seen = set()
        for ld in (v for x in bodies for v in x.toposort() if v.op is Ops.LOAD):
            index = ld.src[1]
            if ld.src[0] in seen or not ld.dtype.is_float or ld.dtype.itemsize >= acc.itemsize \
                    or self.prange not in self.ranges[index] or not self.ranges[index] - {r} <= here:
                continue  # (before the strides: simplifying them is what costs)
            if stride_along(index, r) != 1 or stride_along(index, self.prange) != r.src[0].arg:
                continue  # not one contiguous run of rows
            seen.add(ld.src[0])
            row = self.address_of(ld.src[0], simplify(index.substitute({r: UOp.const(0)})))
            ahead = self.op(f"getelementptr i8, ptr {row}, i64 {SUM_AHEAD_BYTES}", "p")
            lines = -(-r.src[0].arg * ld.dtype.itemsize // LINE_BYTES)
            loop = self.open_loop(None, "0", str(lines))
            self.prefetch(ahead, self.op(f"mul i64 {loop[2]}, {LINE_BYTES}"), locality=2)
            self.close_loop(loop)

    def prefetch_positions(self, store: UOp, r: UOp):
        """In the loop over a softmax row's positions that fills its first row array (`r`, open here, a var count:
        llvm_softmax.py's scores over the cached keys), ask for the rows of the kernel arguments that this `store`
        and the kernel's stores after it read a cache line or more apart a position (a key's row; a value's row,
        which p @ V reads in a later loop over the same positions: a range of the same extent) PREFETCH_BYTES
        ahead, one prefetch per line of a position's row: a key's into every cache level, a value's into L2 (read
        after the row's scores, max and probabilities). A step computes long enough (a group of query heads' dot
        products) that the hardware prefetchers fall behind the one stream it reads, and the cache comes from
        memory in a model's step (written a step before, the weights read since)."""
        if self.prange is None or r.src[0].op is Ops.CONST:
            return
        later = self.ast.src[self.ast.src.index(store) + 1:]
        alike = {v: r for s in later for v in self.ranges[s] if v is not r and v.src[0] is r.src[0]}
        if not alike:
            return  # no later loop over these positions: no softmax row's (a block_matmul tile's fill: prefetch_fill)
        rows: dict = {}  # (buffer, whether only a later loop reads it) -> its indices as functions of r
        for s, mapping in [(store, {r: r})] + [(s, alike) for s in later]:
            for ld in s.toposort():
                if ld.op is not Ops.LOAD or ld.src[0].op is not Ops.DEFINE_GLOBAL or not mapping.keys() & \
                        self.ranges[ld.src[1]] or (s is not store and (ld.src[0], False) in rows):
                    continue  # (before the strides: simplifying them is what costs)
                index = ld.src[1].substitute(mapping)
                step = stride_along(index, r)
                if step is not None and step * ld.dtype.itemsize >= LINE_BYTES:
                    rows.setdefault((ld.src[0], s is not store), {})[index] = ld.dtype.itemsize
        for (buf, read_later), indices in rows.items():
            # from the first to the last lane and step of the ranges not open here (the lane, a dot product's steps)
            unopened = {v for index in indices for v in index.toposort() if v.op is Ops.RANGE
                        and (v is self.lane or not any(v in scope for scope in self.scopes))}
            starts = [simplify(i.substitute({v: UOp.const(0) for v in unopened})) for i in indices]
            lasts = [simplify(i.substitute({v: v.src[0] - 1 for v in unopened})) for i in indices]
            offsets = [simplify(x - starts[0]) for x in starts + lasts]
            if any(o.op is not Ops.CONST for o in offsets):
                continue
            first, last = min(o.arg for o in offsets), max(o.arg for o in offsets)
            base = self.address_of(buf, simplify(starts[0] + first))
            for at in range(0, (last + 1 - first) * next(iter(indices.values())), LINE_BYTES):
                self.prefetch(base, PREFETCH_BYTES + at, locality=2 if read_later else 3)

    def prefetch_rows(self, bodies: list[UOp], r: UOp, acc: DType):
        """Ask for the bytes a register block will read ROWS_AHEAD steps of reduction range `r` ahead, for each buffer
        of values narrower than its `acc` accumulators (bfloat16 or float16 weights, widened) that it reads a row at a
        time, rows PAGE_BYTES or more apart (x @ W of one row over W (in, out), blocked along the columns: each step
        reads the block's few cache lines of the next row, a page away, where the hardware prefetchers, which stay
        inside a page, do not follow), one prefetch per cache line of the block's span."""
        if self.prange is None:
            return
        rows = {}
        for ld in dict.fromkeys(v for x in bodies for v in x.toposort() if v.op is Ops.LOAD):
            if ld.dtype.itemsize >= acc.itemsize or self.prange not in self.ranges[ld.src[1]]:
                continue  # (before the stride: simplifying it is what costs)
            step = stride_along(ld.src[1], r)
            if step is not None and step * ld.dtype.itemsize >= PAGE_BYTES:
                rows.setdefault(ld.src[0], []).append(ld)
        for buf, loads in rows.items():
            # at the first lane and pair step: the ranges not open here (the lane, vdpbf16ps's pair)
            unopened = [v for v in self.ranges[loads[0].src[1]]
                        if v is self.lane or not any(v in scope for scope in self.scopes)]
            starts = [simplify(ld.src[1].substitute({v: UOp.const(0) for v in unopened})) for ld in loads]
            offsets = [simplify(x - starts[0]) for x in starts]
            if any(o.op is not Ops.CONST for o in offsets):
                continue
            size = loads[0].dtype.itemsize
            first, last = min(o.arg for o in offsets), max(o.arg for o in offsets) + (self.width if self.lane in unopened else 1)
            base = self.address_of(buf, simplify(starts[0].substitute({r: r + ROWS_AHEAD}) + first))
            span = (last - first) * size
            for at in sorted(set(range(0, span, 64)) | {span - 1}):
                self.prefetch(base, at)

    def lookup_tables(self, bodies: list[UOp]) -> dict[UOp, UOp]:
        """Per float32 value of `bodies` computed lane by lane that depends on the lane only through one integer of at
        most 16 values (a 4-bit weight unpacked from its byte: q4_1's d * q + m), its table: the same expression of the
        lane index in place of that integer, each lane the value at its index, built where its other operands are (a
        block's scale and min, once per block). `look_up` then replaces the conversion and arithmetic of every lane by
        one permute of the table. Same operations on the same values: the same bits. With AVX-512's 16 float lanes;
        q4_1 x (576) @ W.T (576, 576), one thread, in L2: 28.3 us -> 23.0-24.1. `bodies` are a sum's (lane_sum) or a
        vector store's value (render_llvm.vector_store: a block_matmul tile's fill)."""
        if self.width != TABLE_ENTRIES or not self.permutes:
            return {}
        tables, seen = {}, set()
        lane = self.lane

        def visit(n: UOp):
            if n not in self.laned or n in seen:
                return
            seen.add(n)
            index = self.four_bit_index(n) if n.dtype == dtypes.float32 and n.op not in (Ops.CAST, Ops.LOAD) \
                else None
            if index is None:
                for x in n.src:
                    visit(x)
                return
            tables[n] = self.adopt(n.substitute({index: UOp(Ops.CAST, index.dtype, (lane,))}))
            self.indices[n] = index
        for body in bodies:
            visit(body)
        return tables

    def four_bit_index(self, u: UOp) -> UOp | None:
        """The one lane-dependent integer below `u` through which `u` depends on the lane, when it takes at most
        TABLE_ENTRIES values from 0 (x & 15, or a range analysis' bound), else None."""
        found, stack, seen = set(), list(u.src), set()
        while stack:
            n = stack.pop()
            if n in seen or n not in self.laned:
                continue
            seen.add(n)
            if n.op in (Ops.LOAD, Ops.RANGE, Ops.REDUCE):  # (not a function of a loaded integer: nothing to gain)
                return None
            masked = n.op is Ops.AND and any(x.op is Ops.CONST and 0 <= x.arg < TABLE_ENTRIES for x in n.src)
            if n.dtype.is_int and (masked or 0 <= n.vmin <= n.vmax < TABLE_ENTRIES):
                found.add(n)
            else:
                stack.extend(n.src)
        return found.pop() if len(found) == 1 else None

    def adopt(self, u: UOp) -> UOp:
        """`u`, a node made here, with its nodes' ranges and lane dependence recorded as the AST's are."""
        for n in u.toposort():
            if n not in self.ranges:
                self.ranges[n] = frozenset().union(*(self.ranges[x] for x in n.src))
                if any(x in self.laned for x in n.src):
                    self.laned.add(n)
        return u

    def look_up(self, u: UOp, table: UOp):
        """`u` (see lookup_tables) rendered in this scope as its table permuted by its 4-bit index."""
        vi = f"<{self.width} x i32>"
        nibble = _nibble_of_byte(self.indices[u])
        if nibble is not None:  # the byte widened once for both of its nibbles, shifted as 32-bit lanes
            byte, shift = nibble
            index = self.op(f"zext <{self.width} x i8> {self.vector(byte, self.value(byte))} to {vi}")
            if shift is not None:
                by = self.op(f"zext <{self.width} x i8> {self.vector(shift, self.value(shift))} to {vi}")
                index = self.op(f"lshr {vi} {index}, {by}")
        else:
            index = self.value(self.indices[u])
            it = reg_type(self.indices[u].dtype)
            if it != "i32":
                index = self.op(f"{'zext' if it in ('i8', 'i16') else 'trunc'} <{self.width} x {it}> {index} to {vi}")
        vt = f"<{self.width} x float>"
        self.scopes[-1][u] = self.call(PERMUTE, vt, [(vt, self.value(table)), (vi, index)])

    def bfloat16_pairs(self, products: list[UOp], pair: UOp) -> dict[UOp, str]:
        """Per widened bfloat16 load of `products` (optimize.py's paired reduction), its values at pair steps 0
        and 1 interleaved, lane l's two at 2l and 2l + 1, as vdpbf16ps reads them (<32 x bfloat>)."""
        widened = list(dict.fromkeys(s for x in products for s in x.src))
        halves = {s: [] for s in widened}
        for step in range(2):
            self.scopes.append({pair: str(step)})
            for s in widened:
                halves[s].append(self.lane_bits(s.src[0]))
            self.scopes.pop()
        vt, lanes = f"<{self.width} x i16>", ", ".join(f"i32 {k // 2 + (k % 2) * self.width}" for k in range(2 * self.width))
        out = {}
        for s, (even, odd) in halves.items():
            both = self.op(f"shufflevector {vt} {even}, {vt} {odd}, <{2 * self.width} x i32> <{lanes}>")
            out[s] = self.op(f"bitcast <{2 * self.width} x i16> {both} to {DOT_PAIRS}")
        return out

    def lane_bits(self, load: UOp) -> str:
        """A bfloat16 load's bits as a vector of the kernel's lanes (splatted when it does not depend on the lane)."""
        if load in self.laned:
            self.vec = self.width
            try:
                return self.vector_load(load, widened=False)
            finally:
                self.vec = 0
        bits = self.op(f"load i16, ptr {self.address(load.src[0], self.value(load.src[1]))}")
        vt = f"<{self.width} x i16>"
        one = self.op(f"insertelement {vt} poison, i16 {bits}, i64 0")
        return self.op(f"shufflevector {vt} {one}, {vt} poison, <{self.width} x i32> zeroinitializer")
