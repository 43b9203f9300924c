"""How a tensor-core tile's operands get into local memory (render_fragments.py, render_fragments_ws.py): each
work-item copies its chunks (16 bytes: 8 16-bit elements or 4 float32 ones) of an operand's slice into the stage's
swizzled tile (`Staged.chunk`).

A chunk is copied by the dialect's asynchronous 16-byte copy (pj_cp_async16: cp.async) where the operand is a plain
load of the staged kind's data along a unit stride (or in runs of a chunk along k: a head-merged view's (k // 32) *
4096 + k % 32) whose index moves by a fixed step per slice (each work-item's chunk addresses are computed once, then
advanced), the chunk lies wholly in range (along k tested per slice unless every slice is whole: `full_slices`) and
its address is 16-byte aligned (checked at run time); otherwise its elements are read and stored one by one, the ones
out of range as zeros (ragged edges, computed operands, unaligned views).

A tile's main loop (render_fragments.py) copies a direct operand's slices through `emit_copy_starts` and
`emit_slice_copies`: where its chunks go in a stage is computed once (the work-item's first chunk's offset, the others
a constant further: `chunk_offsets`), and one test a slice (okX: every chunk of the work-item may be copied whole,
and the slice lies inside k) chooses between the chunks' asynchronous copies alone and the chunk-by-chunk code above.
Where each chunk took its own test, branch and address (its swizzled place recomputed from the work-item's id), a
slice's copies were most of the loop's instructions, which bound the loop's issue: MiniLM's tiles (NVRTC 12.9,
sm_90a, the runtime's options) 203 -> 120 instructions a slice of 128 x 64 (4 wgmma m64n64k16), 141 -> 92 of 64 x 64
(2), for 162 -> 167 and 104-113 -> 121-124 registers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..uop import Ops, dtypes
from .fragment_unpack import emit_unpacked_chunk
from .render_tiles import Contraction, _extent

if TYPE_CHECKING:   # (render_fragments builds on this module)
    from .fragment_staging import Staged
    from .render_fragments import Kind

ONE_TEST_A_SLICE = True   # a tile's slices copied under one test (emit_slice_copies); False: a test a chunk, as before
                          # (a knob for timing the two on a GPU, the same bits either way)


def element_type(r, kind: Kind) -> str:
    """The C type of a staged element: a 16-bit float's bits, or the float32 value (rounded to tf32 once loaded)."""
    return r.d.types[dtypes.uint16 if kind.bytes == 2 else dtypes.float32]


def chunk_slots(c: Contraction, s: Staged) -> list[tuple[str, str]]:
    """(name suffix, chunk number) of each of the work-item's chunks of operand `s`: n and lid + n x the work-items
    of its set (each set copies its own slices), for n < s.chunks // c.set_threads."""
    assert s.chunks % c.set_threads == 0, (s.chunks, c.set_threads)
    return [(str(n), f"(lid + {n * c.set_threads})") for n in range(s.chunks // c.set_threads)]


def emit_chunk_starts(r, c: Contraction, s: Staged, slots: list | None = None):
    """Where each of the work-item's chunks of operand `s` (`slots`: chunk_slots's by default) goes and comes from,
    computed once: chunk n is block blkX_n's tile row rowX_n, element colX_n of it, at k offset kX_n and own
    index goX_n;
    for a direct operand its first slice's address srcX_n and whether it may be copied whole (okX_n: in range along
    its own axis, aligned, and the slice step keeps it aligned)."""
    long, name = r.long, s.name
    extent, origin = r.value(_extent(s.own)), "i0" if name == "A" else "j0"
    _, rows, length = s.shape
    chunk = s.kind.chunk
    per_row, along_k = length // chunk, s.minor == "k"
    for n, ch in slots or chunk_slots(c, s):
        row, col, blk, k, go = f"row{name}{n}", f"col{name}{n}", f"blk{name}{n}", f"k{name}{n}", f"go{name}{n}"
        r.emit(f"const int {row} = {ch} / {per_row} % {rows}, {col} = {ch} % {per_row} * {chunk}, "
               f"{blk} = {ch} / {per_row * rows}, {k} = {col if along_k else row};")
        r.emit(f"const {long} {go} = {origin} + {row if along_k else f'{blk} * {s.block} + {col}'};")
        if s.direct is None:
            continue
        inside = f"{go} < {extent}" if along_k else f"{go} + {chunk} <= {extent}"
        mem = r.d.mem_type(s.direct.dtype)
        r.emit(f"const {mem} *src{name}{n};")
        r.open_block("", {c.k: k})
        r.scopes[-1].update(r.unflatten(go, list(s.own)))
        r.emit(f"src{name}{n} = &buf{s.direct.src[0].arg}[{r.value(s.direct.src[1])}];")
        r.close_block()
        r.emit(f"const bool ok{name}{n} = {inside} && ((unsigned long long)src{name}{n} & 15) == 0 && "
               f"({r.value(s.step)}) % {chunk} == 0;")


def full_slices(c: Contraction, s: Staged) -> bool:
    """Whether every slice of operand `s` a tile copies lies wholly inside k: k's end is static and a multiple of the
    slices' depth, and the tile has one set of work-items (its copies stop at k's last slice; a tile whose sets split
    k copies slices past its end as zeros, render_fragments). A chunk's k range is then in range with no test."""
    end = c.k.src[0]
    return c.splits == 1 and end.op is Ops.CONST and end.arg % s.depth == 0


def emit_slice_copy(r, c: Contraction, s: Staged, stage: str, slice_: str, slots: list | None = None):
    """Copy operand `s`'s slice number `slice_` into local stage `stage`: each work-item its chunks (`slots`, as
    emit_chunk_starts's) of 16 bytes along the tile's minor axis, asynchronously where it can (see the module's
    docstring), else element by element."""
    long, kk_end, name, chunk = r.long, r.value(c.k.src[0]), s.name, s.kind.chunk
    extent, along_k = r.value(_extent(s.own)), s.minor == "k"
    for n, _ in slots or chunk_slots(c, s):
        row, col, go = f"row{name}{n}", f"col{name}{n}", f"go{name}{n}"
        r.open_block("", {})
        r.emit(f"const {long} gk = ({slice_}) * {s.depth} + k{name}{n};")
        r.emit(f"{element_type(r, s.kind)} *dst = &{name}s[{stage}][blk{name}{n}][{row}][{s.chunk(row, col)}];")

        def inside(e: int) -> str:   # whether the chunk's element e is in range
            return f"gk + {e} < {kk_end} && {go} < {extent}" if along_k else f"gk < {kk_end} && {go} + {e} < {extent}"
        if s.direct is None and emit_unpacked_chunk(r, c, s, "gk", go, extent, "dst"):   # (fragment_unpack.py)
            r.close_block()
            continue
        if s.direct is None:   # a computed operand (or float32 under "bf16"): each value as the kind stages it
            for e in range(chunk):
                gk, go_e = (f"gk + {e}", go) if along_k else ("gk", f"{go} + {e}")
                r.emit(f"dst[{e}] = 0;")
                r.open_block(f"if ({inside(e)})", {})
                r.open_block("", {c.k: f"({gk})"})
                r.scopes[-1].update(r.unflatten(f"({go_e})", list(s.own)))
                r.emit(f"dst[{e}] = {s.kind.staged.format(v=r.value(s.operand))};")
                r.close_block()
                r.close_block()
            r.close_block()
            continue
        # a plain load along a unit stride (inside the chunk: along k, or along the last own range, whose static
        # end a chunk divides, from a chunk start): element e is at src + e, its bits as stored
        r.emit(f"const {r.d.mem_type(s.direct.dtype)} *src = src{name}{n} + ({slice_}) * ({r.value(s.step)});")
        whole = "" if full_slices(c, s) else f" && {'gk + %d <= %s' % (chunk, kk_end) if along_k else 'gk < ' + kk_end}"
        r.open_block(f"if (ok{name}{n}{whole})", {})
        r.emit("pj_cp_async16(dst, src);")
        r.close_block()
        r.open_block("else", {})
        r.emit(" ".join(f"dst[{e}] = {inside(e)} ? src[{e}] : 0;" for e in range(chunk)))
        r.close_block()
        r.close_block()


def emit_copy_starts(r, c: Contraction, s: Staged):
    """emit_chunk_starts of operand `s`'s chunks (chunk_slots's), and for a direct operand, once: where its chunks go
    in a stage (dstX: the first's offset from the stage's first element, the others' a constant further where
    `chunk_offsets` gives them, else dstXn each), and whether every one may be copied whole (okX), which
    `emit_slice_copies` reads."""
    emit_chunk_starts(r, c, s)
    if s.direct is None or not ONE_TEST_A_SLICE:
        return
    name, slots, offsets = s.name, chunk_slots(c, s), chunk_offsets(c, s)
    for n, _ in slots[:1] if offsets is not None else slots:
        row, col = f"row{name}{n}", f"col{name}{n}"
        r.emit(f"const int dst{name}{'' if offsets is not None else n} = "
               f"(int)(&{name}s[0][blk{name}{n}][{row}][{s.chunk(row, col)}] - &{name}s[0][0][0][0]);")
    r.emit(f"const bool ok{name} = {' && '.join(f'ok{name}{n}' for n, _ in slots)};")


def chunk_offsets(c: Contraction, s: Staged) -> list[int] | None:
    """Elements from the work-item's first chunk of operand `s` in a stage to each of its chunks (chunk_slots's), the
    same for every work-item, or None where they are not (one chunk: none further). Chunk n is n x the set's
    work-items further in the row-major order of the stage's chunks: where the set's work-items cover whole rows of
    chunks and a stage's rows are a whole number of such groups, it is that many rows (and blocks) further in the same
    column, at the same swizzle where that is a multiple of 8 rows (`Staged.chunk`'s salts take a row's 3 low bits at
    most)."""
    _, rows, length = s.shape
    per_row, threads, count = length // s.kind.chunk, c.set_threads, len(chunk_slots(c, s))
    if count > 1 and (threads % per_row or rows % (threads // per_row) or threads // per_row % 8):
        return None
    return [q // rows * rows * length + q % rows * length for q in (n * threads // per_row for n in range(count))]


def emit_slice_copies(r, c: Contraction, s: Staged, stage: str, slice_: str):
    """Copy operand `s`'s slice number `slice_` into local stage `stage` (after `emit_copy_starts`): a direct
    operand's chunks by asynchronous copies alone where okX holds and the slice lies inside k (one test), else, as
    every computed operand's, by emit_slice_copy."""
    if s.direct is None or not ONE_TEST_A_SLICE:
        emit_slice_copy(r, c, s, stage, slice_)
        return
    kk_end, name, offsets = r.value(c.k.src[0]), s.name, chunk_offsets(c, s)
    whole = "" if full_slices(c, s) else f" && (({slice_}) + 1) * {s.depth} <= {kk_end}"
    r.open_block(f"if (ok{name}{whole})", {})
    r.emit(f"{element_type(r, s.kind)} *into = &{name}s[{stage}][0][0][0];")
    step = r.value(s.step)
    for n, _ in chunk_slots(c, s):
        at = f"dst{name} + {offsets[int(n)]}" if offsets is not None else f"dst{name}{n}"
        r.emit(f"pj_cp_async16(into + {at}, src{name}{n} + ({slice_}) * ({step}));")
    r.close_block()
    r.open_block("else", {})
    emit_slice_copy(r, c, s, stage, slice_)
    r.close_block()
