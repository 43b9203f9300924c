"""Warp-specialised tiles on Hopper: the body a 128 x 128 tile of 16-bit operands (render_fragments.py) runs where
the GPU's compiler is CUDA's for sm_90a (PJ_WARP_SPECIALISED: render_cuda.WARP_SPECIALISED_ARCH), the tile's other
variants elsewhere, in the same launch (the same 256 work-items, two tiles a multiprocessor).

Its two warpgroups take one role each. The first (the producer) copies slices of both operands, WS_DEPTH deep
(128-byte rows, the 128-byte swizzle), into a ring of WS_STAGES stages, each work-item its chunks as
fragment_copies.py copies them (16-byte cp.async where it can, else element by element); the second (the consumer)
owns the whole tile, 2 x 64 rows of wgmma m64n128k16 (128 float32 accumulators a work-item). They synchronise on
mbarriers rather than barriers of the whole group: the producer waits for a stage to be `empty`, copies into it
and arrives on its `full` barrier twice a work-item (once as its copies land: cp.async.mbarrier.arrive.noinc; once
after its element-by-element stores and a proxy fence); the consumer waits for `full`, fences (the copies were
written through the generic proxy, wgmma reads through the async one), issues the slice's instructions, waits for
all but that group and releases the previous slice's stage (one arrival a warp). setmaxnreg moves registers from
the producer to the consumer (the launch's 128 a work-item: PRODUCER_REGISTERS and CONSUMER_REGISTERS).

On an H100 (benchmarks.gpu_low_precision's rows, each variant in its own process on one machine, before the grid's
banded order), bf16 4096^3 and 8192^3 ran at 384 and 488 TFLOP/s (torch 683 and 773), f16 at 399 and 461, against
385 / 452 and 383 / 430 for the tiles' other variants; with 40 / 216 registers 355 / 420 (spilling). A standalone
prototype of this geometry (cp.async producer, packed stores, banded order) reached 491-530; bulk tensor copies (TMA)
with 128 x 256 tiles and two consumers of m64n256 657-697, 0.87-0.92x cuBLAS in the same process: they need a tensor
map per operand and launch, not done.
"""
from __future__ import annotations

from ..uop import Ops, simplify
from .fragment_copies import emit_chunk_starts, emit_slice_copy
from .render_fragments import FRAGMENT_THREADS, GROUP_M, KINDS, WARP, Contraction, _WarpgroupTile, uses_wgmma
from .render_tiles import _extent

WS_DEPTH = 64             # k of a slice, 16-bit elements (128-byte rows)
WS_STAGES = 3             # slices in local memory: 3 x 32 KB, two tiles a multiprocessor (228 KB on Hopper)
# registers a work-item after setmaxnreg: the two sum to twice the launch's 128 (ptxas for sm_90a: no spills at
# 64 / 192, 36-88 bytes of the producer's at 56 / 200 and 40 / 216)
PRODUCER_REGISTERS = 64
CONSUMER_REGISTERS = 192
TEST = "PJ_WARP_SPECIALISED"


def warp_specialised(c: Contraction) -> bool:
    """Whether the tile has the warp-specialised variant: 16-bit operands on the warpgroup instructions, two
    warpgroups (one producer, one consumer of the whole tile: at most 128 accumulators a work-item)."""
    return (uses_wgmma(c) and KINDS[c.fragments].bytes == 2 and c.threads == 2 * FRAGMENT_THREADS and c.splits == 1 and
            c.tm % GROUP_M == 0 and c.tm * c.tn <= 128 * FRAGMENT_THREADS)


def _chunk_offsets(s) -> list | None:
    """For each of a producer work-item's chunks of `s` (chunk lid + n x FRAGMENT_THREADS), how far it is from its
    first (n = 0) for every work-item alike: (tile rows, blocks, own index, k), or None where that is not so (the
    first chunks of a row wrap unevenly) or where an operand's address is not that of its first chunk plus a step
    (`_delta`: several own ranges, an own offset could carry into the next)."""
    _, rows, length = s.shape
    per_row, threads = length // s.kind.chunk, FRAGMENT_THREADS
    if threads % per_row or rows % (threads // per_row) or (per_row * rows) % threads:
        return None
    out = []
    for n in range(s.chunks // threads):
        row, block = n * threads // per_row % rows, n * threads // (per_row * rows)
        own, k = (row, 0) if s.minor == "k" else (block * s.block, row)
        if own and len(s.own) != 1:
            return None
        out.append((row, block, own, k))
    return out


def _delta(s, c: Contraction, own: int, k: int):
    """How far (in elements) operand `s`'s address moves `own` along its own range and `k` along k, or None where
    that depends on where."""
    index = s.direct.src[1]
    moved = index.substitute({c.k: c.k + k, **({s.own[-1]: s.own[-1] + own} if own else {})})
    delta = simplify(moved - index)
    return None if any(x.op is Ops.RANGE for x in delta.toposort()) else delta


def _emit_chunk_alias(r, c: Contraction, s, n: int, rows: int, blocks: int, own: int, k: int):
    """Chunk n's place (the names emit_slice_copy reads: rowXn, colXn, blkXn, kXn, goXn, srcXn, okXn) from the
    first chunk's, `rows`, `blocks`, `own` and `k` further."""
    name, long, chunk = s.name, r.long, s.kind.chunk
    extent = r.value(_extent(s.own))
    r.emit(f"const int row{name}{n} = row{name}0 + {rows}, col{name}{n} = col{name}0, blk{name}{n} = blk{name}0 + "
           f"{blocks}, k{name}{n} = k{name}0 + {k};")
    r.emit(f"const {long} go{name}{n} = go{name}0 + {own};")
    if s.direct is None:
        return
    delta = _delta(s, c, own, k)
    inside = f"go{name}{n} < {extent}" if s.minor == "k" else f"go{name}{n} + {chunk} <= {extent}"
    mem = r.d.mem_type(s.direct.dtype)
    if delta is None:   # (its address computed anew)
        r.emit(f"const {mem} *src{name}{n};")
        r.open_block("", {c.k: f"k{name}{n}"})
        r.scopes[-1].update(r.unflatten(f"go{name}{n}", list(s.own)))
        r.emit(f"src{name}{n} = &buf{s.direct.src[0].arg}[{r.value(s.direct.src[1])}];")
        r.close_block()
        r.emit(f"const bool ok{name}{n} = {inside} && ((unsigned long long)src{name}{n} & 15) == 0 && "
               f"({r.value(s.step)}) % {chunk} == 0;")
        return
    r.emit(f"const {mem} *src{name}{n} = src{name}0 + ({r.value(delta)});")
    r.emit(f"const bool ok{name}{n} = {inside} && aligned{name} && ({r.value(delta)}) % {chunk} == 0;")


def emit_producer_starts(r, c: Contraction, staged: list) -> dict:
    """Before a producer warpgroup's loop: where each operand's first chunk of a work-item is (and whether its
    copies stay aligned), where its other chunks' places follow from it; {name: _chunk_offsets} of each."""
    offsets = {s.name: _chunk_offsets(s) for s in staged}
    for s in staged:
        if offsets[s.name] is not None:
            emit_chunk_starts(r, c, s, [("0", "lid")])
            if s.direct is not None:
                r.emit(f"const bool aligned{s.name} = ((unsigned long long)src{s.name}0 & 15) == 0 && "
                       f"({r.value(s.step)}) % {s.kind.chunk} == 0;")
    return offsets


def emit_producer_copies(r, c: Contraction, s, offsets: list | None):
    """A producer work-item's copies of its chunks of operand `s`'s slice kt into stage st (`offsets`:
    emit_producer_starts's for it)."""
    if offsets is not None:
        for n, (rows, blocks, own, k) in enumerate(offsets):
            r.open_block("", {})
            if n:   # (chunk 0's own names, computed before the loop)
                _emit_chunk_alias(r, c, s, n, rows, blocks, own, k)
            emit_slice_copy(r, c, s, "st", "kt", [(str(n), "")])
            r.close_block()
        return
    # chunk by chunk, its place computed anew (few registers: the producer has few)
    slot = [("", f"(lid + cn * {FRAGMENT_THREADS})")]
    r.emit("#pragma unroll 1")
    r.open_block(f"for (int cn = 0; cn < {s.chunks // FRAGMENT_THREADS}; cn++)", {})
    emit_chunk_starts(r, c, s, slot)
    emit_slice_copy(r, c, s, "st", "kt", slot)
    r.close_block()


def emit_warp_specialised(r, c: Contraction, staged: list):
    """The producer's and the consumer's loops (`staged`: both operands WS_DEPTH deep), after the tile's origin."""
    long, kk_end, stages = r.long, r.value(c.k.src[0]), WS_STAGES
    r.emit(f"const {long} slices = ({kk_end} + {WS_DEPTH - 1}) / {WS_DEPTH};")
    r.emit(f"__shared__ __align__(8) unsigned long long full[{stages}], empty[{stages}];")
    r.open_block("if (lid == 0)", {})
    r.emit(f"for (int s = 0; s < {stages}; s++) {{ pj_mbar_init(&full[s], {2 * FRAGMENT_THREADS}); "
           f"pj_mbar_init(&empty[s], {FRAGMENT_THREADS // WARP}); }}")
    r.close_block()
    r.emit(r.d.barrier)
    r.open_block(f"if (lid < {FRAGMENT_THREADS})", {})   # the producer
    r.emit(f"pj_setmaxnreg<{PRODUCER_REGISTERS}, false>();")
    offsets = emit_producer_starts(r, c, staged)
    r.open_block(f"for ({long} kt = 0; kt < slices; kt++)", {})
    r.emit(f"const int st = kt % {stages};")
    r.emit(f"pj_mbar_wait(&empty[st], (unsigned)(kt / {stages} % 2) ^ 1u);")
    for s in staged:
        emit_producer_copies(r, c, s, offsets[s.name])
    r.emit("pj_cp_async_mbar_arrive(&full[st]);")
    r.emit("pj_fence_async_shared();")   # (its element-by-element stores, before the consumer's matrix reads)
    r.emit("pj_mbar_arrive(&full[st]);")
    r.close_block()
    r.close_block()
    r.open_block("else", {})   # the consumer
    emit_consumer(r, _WarpgroupTile(r, c, staged, rows=c.tm), long, stages, CONSUMER_REGISTERS, "full")
    r.close_block()


def emit_consumer(r, tile, long: str, stages: int, registers: int, barrier: str, fence: str | None = None):
    """A consumer warpgroup's loop over the k slices: it raises its registers to `registers`, waits on `barrier`
    (the stage's copies landed), fences the generic proxy (copies written by threads, not bulk copies: always, or
    where `fence`, a C condition, holds), issues the slice's wgmma instructions, and releases the previous slice's
    stage on `empty` once they are done; then stores its tile."""
    r.emit(f"pj_setmaxnreg<{registers}, true>();")
    tile.declare()
    r.open_block(f"for ({long} kt = 0; kt < slices; kt++)", {})
    r.emit(f"const int st = kt % {stages};")
    r.emit(f"pj_mbar_wait(&{barrier}[st], (unsigned)(kt / {stages} % 2));")
    r.emit("pj_fence_async_shared();" if fence is None else f"if ({fence}) pj_fence_async_shared();")
    tile.issue()
    r.emit("pj_wgmma_wait<1>();")        # slice kt - 1's instructions are done: its stage may be refilled
    r.emit(f"if (kt > 0 && lane == 0) pj_mbar_arrive(&empty[(kt - 1) % {stages}]);")
    r.close_block()
    tile.store()
