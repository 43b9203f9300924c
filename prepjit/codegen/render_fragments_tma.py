"""Hopper's wide tiles on bulk tensor copies: the body of a tile kernel whose launch has the "tma" variant
(gpu_launch.py decides it on the AST for the Hopper target: a 128 x 256 tile (gpu_launch.WIDE_COLUMNS) of 16-bit operands,
or of float32 ones under precision "tf32" both minor along k; render_tiles.Contraction.variant), compiled for sm_90a
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
(m64n256k8, four steps a slice). setmaxnreg gives the consumers CONSUMER_REGISTERS a work-item
and the producer PRODUCER_REGISTERS (the three sum to the multiprocessor's 65536 at most).

On an H100 (d6b0b53, torch 2.11 in the same process: benchmarks/results/gpu-h100-2026-12-06-tma.json) bf16 4096^3
ran at 488 TFLOP/s, 0.755x cuBLAS (the 128 x 128 warp-specialised tile before it: 0.574x), 8192^3 at 0.858x (0.642x);
float16 0.759x / 0.880x. (168 registers x 384 work-items, 192 KB of dynamic local memory: one tile a multiprocessor.)
"""
from __future__ import annotations

from .render_fragments import CHUNK_BYTES, KINDS, WARP, _staged, _WarpgroupTile
from .render_fragments_ws import emit_consumer, emit_producer_copies, emit_producer_starts
from .render_tiles import FRAGMENT_THREADS, GROUP_ROWS, Contraction
from .tensor_maps import MAX_DIM, MAX_STRIDE_BYTES, TensorMap, kernel_maps

ROW_BYTES = 128           # a slice's rows along k: the 128-byte swizzle's (64 16-bit elements, 32 float32 ones)
TMA_STAGES = 4            # slices in local memory: 4 x 48 KB of a 128 x 256 tile (227 KB on Hopper)
ROUNDERS = FRAGMENT_THREADS - WARP   # a tf32 tile's producer work-items that round its stages (all but the first warp)
PRODUCER_REGISTERS = 40   # registers a work-item after setmaxnreg (40 + 2 x 232 = 504 of 512 a work-item's share)
CONSUMER_REGISTERS = 232


def bulk_staged(c: Contraction) -> list:
    """Both operands of a tile of the bulk variant as staged: ROW_BYTES deep along k."""
    return _staged(c, ROW_BYTES // KINDS[c.fragments].bytes)


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
    """A rounder's share of stage st once its copies are in (`full`): every ROUNDERS-th 16-byte chunk of each
    operand's tile rounded to tf32 in place (the swizzle moves whole chunks: any order rounds every element), then
    fenced for the consumers' matrix reads and `ready` arrived on."""
    stages = TMA_STAGES
    r.emit(f"pj_mbar_wait(&full[st], (unsigned)(kt / {stages} % 2));")
    for s in staged:
        r.open_block(f"for (int q = lid - {WARP}; q < {s.chunks}; q += {ROUNDERS})", {})
        r.emit(f"uint4 *v = (uint4 *)&{s.name}s[st][0][0][0] + q, x = *v;")
        r.emit(" ".join(f"x.{e} = pj_round_{s.kind.ptx}(x.{e});" for e in "xyzw") + " *v = x;")
        r.close_block()
    r.emit("pj_fence_async_shared();")
    r.emit("pj_mbar_arrive(&ready[st]);")


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
    r.open_block(f"if (lid < {FRAGMENT_THREADS})", {})   # the producer
    r.emit(f"pj_setmaxnreg<{PRODUCER_REGISTERS}, false>();")
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
    emit_consumer(r, _WarpgroupTile(r, c, staged, rows=GROUP_ROWS, first=1), long, stages, CONSUMER_REGISTERS,
                  "ready" if rounds else "full", "copies")
    r.close_block()
