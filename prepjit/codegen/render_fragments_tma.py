"""Hopper's wide tiles on bulk tensor copies: the body of a tile kernel whose launch has the "tma" variant
(gpu_launch.py decides it on the AST for the Hopper target: a 128 x 256 tile (gpu_launch.WIDE_COLUMNS) of 16-bit operands,
or of float32 ones under precision "tf32" with a minor along k; render_tiles.Contraction.variant), compiled for sm_90a
only.

Three warpgroups, one tile a multiprocessor. The first (the producer) fills a ring of TMA_STAGES stages of both
operands' slices of ROW_BYTES rows (64 deep for 16-bit operands, 32 for float32; the 128-byte swizzle:
render_fragments.Staged's layout, which the tensor maps' swizzle writes alike). An operand with a tensor map (tensor_maps.py: the kernel's last parameters,
encoded by the host per launch) is copied by one work-item, one bulk tensor copy a box, completing the bytes its
stage's `full` mbarrier expects; an operand without one (computed, gathered, its rows not 16-byte aligned: the
kernel tests what the host tested, TensorMap.usable) is copied by the producer's 128 work-items chunk by chunk
as render_fragments_ws.py's producer copies them (cp.async, arriving on `full` as they land, then their plain
stores fenced). The other two (the consumers) each own 64 rows of the tile, all its columns: wgmma
m64n256k16 from the stage (128 float32 accumulators a work-item), one group in flight, each warp
releasing the previous slice's stage on `empty`. A tf32 tile's stage is rounded in place first (wgmma would
drop the low bits of each float32 value, where the contraction rounds to nearest: pj_round_tf32) by the producer's
other three warps, `rounders`, once its copies are in, the consumers waiting on `ready` instead of `full`
(m64n256k8, four steps a slice); a tf32 b minor along its columns (a @ b), which wgmma cannot read (32-bit tiles
minor along k only), is transposed by them in place as it is rounded, a warp a 32 x 32 block (`_emit_transposes`).
setmaxnreg gives the consumers CONSUMER_REGISTERS a work-item and the producer PRODUCER_REGISTERS (the three sum to
the multiprocessor's 65536 at most; TRANSPOSER_REGISTERS where the rounders transpose).

On an H100 (d6b0b53, torch 2.11 in the same process: benchmarks/results/gpu-h100-2026-12-06-tma.json) bf16 4096^3
ran at 488 TFLOP/s, 0.755x cuBLAS (the 128 x 128 warp-specialised tile before it: 0.574x), 8192^3 at 0.858x (0.642x);
float16 0.759x / 0.880x. (168 registers x 384 work-items, 192 KB of dynamic local memory: one tile a multiprocessor.)
"""
from __future__ import annotations

import attrs

from .fragment_staging import CHUNK_BYTES
from .render_fragments import KINDS, WARP, _staged, _WarpgroupTile
from .render_fragments_ws import emit_consumer, emit_producer_copies, emit_producer_starts
from .render_tiles import FRAGMENT_THREADS, GROUP_ROWS, Contraction
from .tensor_maps import MAX_DIM, MAX_STRIDE_BYTES, TensorMap, kernel_maps

ROW_BYTES = 128           # a slice's rows along k: the 128-byte swizzle's (64 16-bit elements, 32 float32 ones)
TMA_STAGES = 4            # slices in local memory: 4 x 48 KB of a 128 x 256 tile (227 KB on Hopper)
ROUNDERS = FRAGMENT_THREADS - WARP   # a tf32 tile's producer work-items that round its stages (all but the first warp)
ROUND_AHEAD = 4           # 16-byte chunks a rounder reads before rounding and writing them (1: one at a time, each
                          # waiting on its own local-memory read: ~32 dependent reads a rounder a 48 KB stage, of a
                          # slice's ~1000 cycles of wgmma m64n256k8; 4 keep its 40 registers)
PRODUCER_REGISTERS = 40   # registers a work-item after setmaxnreg (40 + 2 x 232 = 504 of 512 a work-item's share)
CONSUMER_REGISTERS = 232
TRANSPOSER_REGISTERS = (88, 208)   # (producer, consumer) where the rounders transpose a tile (a lane holds a block's
                                   # row, 32 values; the consumers' 128 accumulators fit 208: no spills, nvcc 13)


def bulk_staged(c: Contraction) -> list:
    """Both operands of a tile of the bulk variant as copied: ROW_BYTES deep along k; a tf32 operand minor along its
    own axis (a @ b's b: `transposed`) in blocks of 32 elements by 32 rows of k, swizzled as its bulk copies write
    them (its kind's `transposes` set: no register-a-load layout, render_fragments.Staged.plain_loads)."""
    staged = _staged(c, ROW_BYTES // KINDS[c.fragments].bytes)
    return [attrs.evolve(s, kind=attrs.evolve(s.kind, transposes=True)) if transposed(s) else s for s in staged]


def transposed(s) -> bool:
    """Whether staged operand `s` of a wide tile is transposed in local memory before the consumers read it: a tf32
    tile minor along its own axis (wgmma reads 32-bit tiles minor along k only)."""
    return s.minor == "own" and s.kind.bytes == 4


def read_staged(c: Contraction, staged: list) -> list:
    """The operands as the consumers' wgmma reads them: a `transposed` one minor along k (the same bytes: a block of
    32 own elements by 32 k rows becomes 32 rows of 32 k, the 128-byte swizzle kept)."""
    return [attrs.evolve(s, minor="k", kind=KINDS[c.fragments]) if transposed(s) else s for s in staged]


def _rounds(staged: list) -> bool:
    """Whether the stages are rounded in place before the consumers read them (tf32's 32-bit elements)."""
    return staged[0].kind.bytes == 4


def _usable(r, m: TensorMap) -> str:
    """The kernel's test of TensorMap.usable for map `m` (the host encodes it only where that holds)."""
    size = m.dtype.itemsize
    address = f"(unsigned long long)(buf{m.buffer} + ({r.value(m.offset)}))"
    dims = [f"({r.value(d)}) > 0 && ({r.value(d)}) <= {MAX_DIM}LL" for d in m.dims]
    strides = [f"({r.value(s)}) > 0 && ({r.value(s)}) * {size} < {MAX_STRIDE_BYTES}LL && ({r.value(s)}) * {size} % 16 == 0"
               for s in m.strides]
    return " && ".join([f"({address} & 15) == 0", *dims, *strides])


def _copy_helper(r, rank: int) -> str:
    """The name of the bulk tensor copy helper of `rank` coordinates, added."""
    name = f"pj_tma_load{rank}"
    text = r.d.bulk_copies["pj_tma_load{rank}"]
    fill = {"{rank}": str(rank), "{coords}": ", ".join(f"int c{e}" for e in range(rank)),
            "{coordlist}": "{" + ", ".join(f"%{e + 2}" for e in range(rank)) + "}", "{bar}": str(rank + 2),
            "{ins}": ", ".join(f'"r"(c{e})' for e in range(rank))}
    for key, value in fill.items():
        text = text.replace(key, value)
    r.helpers.setdefault(name, text)
    return name


def _emit_bulk_copies(r, c: Contraction, s, m: TensorMap):
    """Operand `s`'s slice kt into stage st by its map: one box (k-minor: depth x the tile's side) or one a block
    (own-minor: a block's 64 elements x depth)."""
    helper = _copy_helper(r, len(m.dims))
    origin = "i0" if s.name == "A" else "j0"
    batch = [f"(int)({r.value(b)})" for b in m.coords]
    blocks = s.shape[0]
    for b in range(blocks):
        inner, outer = (f"(int)(kt * {s.depth})", f"(int)({origin})") if s.minor == "k" else \
            (f"(int)({origin} + {b * s.block})", f"(int)(kt * {s.depth})")
        coords = ", ".join([inner, outer, *batch])
        r.emit(f"{helper}(&{s.name}s[st][{b}][0][0], &pj_map{s.name}, {coords}, &full[st]);")


def _emit_producer_loop(r, c: Contraction, staged: list, maps: dict, offsets: dict | None):
    """The producer's loop over the slices: work-item 0's bulk copies of the operands whose map is usable, and where
    `offsets` (emit_producer_starts's) are given, every work-item's chunks of the others (else there are none)."""
    long, stages = r.long, TMA_STAGES
    r.open_block(f"for ({long} kt = 0; kt < slices; kt++)", {})
    r.emit(f"const int st = kt % {stages};")
    r.emit(f"pj_mbar_wait(&empty[st], (unsigned)(kt / {stages} % 2) ^ 1u);")
    r.open_block("if (lid == 0)" if offsets is not None else "", {})
    tx = " + ".join(f"(map{s.name} ? {CHUNK_BYTES * s.chunks} : 0)" for s in staged)
    r.emit(f"pj_mbar_expect_tx(&full[st], {tx});")
    for s in staged:
        if maps[s.name] is not None:
            r.open_block(f"if (map{s.name})", {})
            _emit_bulk_copies(r, c, s, maps[s.name])
            r.close_block()
    r.close_block()
    if offsets is not None:
        for s in staged:
            r.open_block(f"if (!map{s.name})", {})
            emit_producer_copies(r, c, s, offsets[s.name])
            r.close_block()
        r.emit("pj_cp_async_mbar_arrive(&full[st]);")
        r.emit("pj_fence_async_shared();")   # (its element-by-element stores, before the consumers' matrix reads)
        r.emit("pj_mbar_arrive(&full[st]);")
        if _rounds(staged):
            r.open_block(f"if (lid >= {WARP})", {})
            _emit_rounding(r, staged)
            r.close_block()
    r.close_block()


def _emit_rounding(r, staged: list):
    """A rounder's share of stage st once its copies are in (`full`): every ROUNDERS-th 16-byte chunk of the tiles
    minor along k (A's chunks, then B's, one count) rounded to tf32 in place (the swizzle moves whole chunks: any
    order rounds every element), ROUND_AHEAD chunks read before any is rounded and written back; each `transposed`
    tile's blocks transposed and rounded a warp a block (`_emit_transposes`); then fenced for the consumers' matrix
    reads and `ready` arrived on."""
    stages, ahead = TMA_STAGES, ROUND_AHEAD
    r.emit(f"pj_mbar_wait(&full[st], (unsigned)(kt / {stages} % 2));")
    in_place = [s for s in staged if not transposed(s)]
    total, step = sum(s.chunks for s in in_place), ROUNDERS * ahead

    def chunk_at(q: str) -> str:   # (the stage's chunk q of the in-place tiles, counted A's first)
        first = in_place[0]
        if len(in_place) == 1:
            return f"(uint4 *)&{first.name}s[st][0][0][0] + ({q})"
        second = in_place[1]
        return (f"{q} < {first.chunks} ? (uint4 *)&{first.name}s[st][0][0][0] + ({q}) : "
                f"(uint4 *)&{second.name}s[st][0][0][0] + ({q} - {first.chunks})")
    r.open_block(f"for (int q0 = lid - {WARP}; q0 < {total}; q0 += {step})", {})
    tails = [bool(total % step) and (e + 1) * ROUNDERS > total % step for e in range(ahead)]   # (may pass the last)
    for e in range(ahead):
        q, tail = f"q0 + {e * ROUNDERS}", tails[e]
        r.emit(f"uint4 *v{e} = {chunk_at(q)}, x{e} = "
               f"{f'{q} < {total} ? *v{e} : make_uint4(0, 0, 0, 0)' if tail else f'*v{e}'};")
    for e in range(ahead):
        rounded = " ".join(f"x{e}.{c} = pj_round_tf32(x{e}.{c});" for c in "xyzw") + f" *v{e} = x{e};"
        r.emit(f"if (q0 + {e * ROUNDERS} < {total}) {{ {rounded} }}" if tails[e] else rounded)
    r.close_block()
    for s in staged:
        if transposed(s):
            _emit_transposes(r, s)
    r.emit("pj_fence_async_shared();")
    r.emit("pj_mbar_arrive(&ready[st]);")


def _emit_transposes(r, s):
    """The rounders' warps transpose operand `s`'s blocks of stage st in place, a warp a block in turn: lane l reads
    the block's row l (k = l: 32 own elements, eight 16-byte chunks), and after the warp's reads, writes its element
    n to row n of the block as read minor along k (`read_staged`), at k = l, rounded to tf32. Both layouts keep the
    128-byte swizzle (Staged.chunk: a chunk's index xor its row's 3 low bits; a block is 4 KB, 1024-byte aligned),
    so a read's 8 lanes of one row residue, and a write's 32 lanes of one row, fall in distinct banks."""
    blocks, rows, length = s.shape
    chunk, warps = s.kind.chunk, ROUNDERS // WARP
    assert rows == length == WARP, s.shape
    read_view, lane_k = attrs.evolve(s, minor="k"), f"lane / {chunk} * {chunk}"   # (the lane's k chunk, written)
    r.open_block(f"for (int b = lid / {WARP} - 1; b < {blocks}; b += {warps})", {})
    r.emit(f"unsigned *blk = (unsigned *)&{s.name}s[st][b][0][0];")
    r.emit(" ".join(f"const uint4 t{c} = *(uint4 *)(blk + lane * {length} + {s.chunk('lane', str(c * chunk))});"
                    for c in range(length // chunk)))
    r.emit("__syncwarp();")
    for c in range(length // chunk):
        r.emit(" ".join(f"blk[{n * length} + {read_view.chunk(str(n), lane_k)} + lane % {chunk}] = "
                        f"pj_round_tf32(t{c}.{e});" for n, e in ((c * chunk + j, 'xyzw'[j]) for j in range(chunk))))
    r.close_block()


def _emit_rounding_loop(r, staged: list):
    """The rounders' loop over the slices where one work-item copies them all (both operands by their maps)."""
    r.open_block(f"for ({r.long} kt = 0; kt < slices; kt++)", {})
    r.emit(f"const int st = kt % {TMA_STAGES};")
    _emit_rounding(r, staged)
    r.close_block()


def emit_bulk_tile(r, c: Contraction, staged: list):
    """The producer's and the consumers' loops (`staged`: both operands TMA_DEPTH deep, in TMA_STAGES stages
    declared), after the tile's origin (i0, j0, the batch ranges bound)."""
    long, kk_end, stages = r.long, r.value(c.k.src[0]), TMA_STAGES
    consumers = c.threads // FRAGMENT_THREADS - 1
    maps = kernel_maps(c, staged)
    for name in ("pj_tensor_map", "pj_mbar_expect_tx"):
        r.helpers.setdefault(name, r.d.bulk_copies[name])
    r.tensor_map_params += [f"pj_map{s.name}" for s in staged if maps[s.name] is not None]
    r.lines.append("#if !PJ_WARP_SPECIALISED")
    r.lines.append("#error a tile of bulk tensor copies compiles for sm_90a only")
    r.lines.append("#endif")
    depth, rounds = staged[0].depth, _rounds(staged)
    r.emit(f"const {long} slices = ({kk_end} + {depth - 1}) / {depth};")
    for s in staged:   # (uniform: every work-item takes the same branches)
        r.emit(f"const bool map{s.name} = {_usable(r, maps[s.name]) if maps[s.name] is not None else 'false'};")
    r.emit("const bool copies = !(mapA && mapB);   // (the producer's work-items copy an operand's chunks)")
    r.emit(f"__shared__ __align__(8) unsigned long long full[{stages}], empty[{stages}]"
           f"{f', ready[{stages}]' if rounds else ''};")
    r.open_block("if (lid == 0)", {})
    # full: the copying work-item's arrival with the bytes of its bulk copies, and where chunks are copied, each
    # producer work-item's two (its cp.async copies landed; its plain stores fenced); empty: each consumer warp's
    r.emit(f"for (int s = 0; s < {stages}; s++) {{ pj_mbar_init(&full[s], copies ? {1 + 2 * FRAGMENT_THREADS} : 1); "
           f"pj_mbar_init(&empty[s], {consumers * FRAGMENT_THREADS // WARP}); "
           f"{f'pj_mbar_init(&ready[s], {ROUNDERS}); ' if rounds else ''}}}")
    r.close_block()
    r.emit(r.d.barrier)
    producer, consumer = TRANSPOSER_REGISTERS if any(transposed(s) for s in staged) else \
        (PRODUCER_REGISTERS, CONSUMER_REGISTERS)
    r.open_block(f"if (lid < {FRAGMENT_THREADS})", {})   # the producer
    r.emit(f"pj_setmaxnreg<{producer}, false>();")
    r.open_block("if (!copies)", {})   # both operands by their maps: one work-item's loop
    r.open_block("if (lid == 0)", {})
    _emit_producer_loop(r, c, staged, maps, None)
    r.close_block()
    if rounds:
        r.open_block(f"else if (lid >= {WARP})", {})
        _emit_rounding_loop(r, staged)
        r.close_block()
    r.close_block()
    r.open_block("else", {})   # some chunk by chunk: every producer work-item's
    _emit_producer_loop(r, c, staged, maps, emit_producer_starts(r, c, staged))
    r.close_block()
    r.close_block()
    r.open_block("else", {})   # the consumers
    emit_consumer(r, _WarpgroupTile(r, c, read_staged(c, staged), rows=GROUP_ROWS, first=1), long, stages, consumer,
                  "ready" if rounds else "full", "copies")
    r.close_block()
