"""Tiled contractions on tensor cores: the body of a tile kernel whose launch has `fragments` (gpu_launch.py decides
it on the AST: both operands 16-bit floats widened to float32, a dialect with `tensor_core_mma`).

A group of WARPS warps owns a TM x TN tile of outputs, each warp a quarter of it (64 x 64 of a 128 x 128 tile), in
float32 accumulators in registers. Both operands are staged in local memory as 16-bit values, SLICE_K deep along k
(two matrix-instruction steps), in `stages` buffers (as many as fit MAX_LOCAL_BYTES, at most MAX_STAGES): while the
group multiplies one slice, the next stages - 1 are in flight. Each operand's tile keeps the axis its memory is
contiguous in as the minor one (`Staged.minor`: "k", or "own" for its rows' or columns' axis), so the group copies
it in 16-byte chunks of 8 elements. The chunks of a tile row are swizzled (`Staged.chunk`: chunk c of row r is
stored at c ^ f(r)) so that the 8 rows a matrix load reads, at one chunk of each, fall in 8 distinct 16-byte bank
groups, and a full 16-byte chunk stays whole (copies and matrix loads address chunks only).

A chunk is copied by the dialect's asynchronous 16-byte copy (pj_cp_async16: cp.async, completed per slice with
commit/wait groups) where the operand is a plain load of 16-bit data along a unit stride whose index moves by a
fixed step per slice (each work-item's chunk addresses are computed once, then advanced), the chunk lies wholly in
range and its address is 16-byte aligned (checked at run time); otherwise its 8 elements are read and stored one by
one, the ones out of range as zeros (ragged edges, computed operands, unaligned views), which the barrier that
starts each slice's arithmetic orders as it orders the copies.

Fragments come from local memory by matrix loads (pj_ldmatrix_x4: ldmatrix .x4, .trans where the operand's minor
axis is its own), 4 8 x 8 matrices of 16-bit values a load, each lane giving one matrix row's address; the PTX
ISA's register layouts for m16n8k16 (g = lane / 4, t = lane % 4):
- A (16 x 16, row major): a0 = (row g, k 2t and 2t + 1), a1 = row g + 8, a2 = k + 8, a3 = both;
- B (16 x 8, column major): b0 = (k 2t and 2t + 1, column g), b1 = k + 8;
- C (16 x 8 floats): c0, c1 = (row g, columns 2t and 2t + 1), c2, c3 = row g + 8.
One load gives A's four registers (matrices: rows +0/+8 by k +0/+8) or the two registers of two neighbouring
8-column B fragments (matrices: k +0/+8 by columns +0/+8); the lane's matrix q = lane / 8 and row lane % 8 say
which address it gives (`_lane_offsets`).
"""
from __future__ import annotations

import attrs

from ..uop import Ops, UOp, dtypes, simplify
from .render_tiles import FRAGMENT_THREADS, Contraction, _extent, _static_multiple, _unit_stride

WARP = 32
WARPS = FRAGMENT_THREADS // WARP   # warps of a group, 2 x 2 over the tile
FRAG_M, FRAG_N, FRAG_K = 16, 8, 16   # one matrix instruction's outputs and depth
SLICE_K = 32                    # k of one staged slice: two matrix-instruction steps between barriers
CHUNK = 8                       # 16-bit elements of one 16-byte copy
MAX_STAGES = 4
MAX_LOCAL_BYTES = 48 * 1024     # the local memory a kernel may declare statically


def warp_tile(c: Contraction) -> tuple[int, int]:
    """A warp's outputs: half the tile's rows by half its columns (WARPS = 4)."""
    return c.tm // 2, c.tn // 2


@attrs.frozen
class Staged:
    """How one operand is staged: its local tile `name` (A or B), the ranges it owns, their tile side, the minor axis
    of its local tile, and the plain 16-bit load it is (its LOAD node) with the step of its index from one slice to
    the next, where chunks may be copied asynchronously."""
    name: str
    operand: UOp
    own: tuple
    width: int
    minor: str
    direct: UOp | None
    step: UOp | None

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, row length in elements) of one stage of the local tile."""
        return (self.width, SLICE_K) if self.minor == "k" else (SLICE_K, self.width)

    @property
    def chunks(self) -> int:
        rows, length = self.shape
        return rows * length // CHUNK

    def chunk(self, row: str, minor: str) -> str:
        """The stored position of the chunk starting at element `minor` (a multiple of CHUNK) of tile row `row`: its
        chunk index xor the row's 3 bits (rows of 8 or more chunks), or of the row pair's 2 (rows of 4 chunks, two
        rows a 128-byte line)."""
        per_row = self.shape[1] // CHUNK
        salt = f"({row}) % 8" if per_row >= 8 else f"({row}) / 2 % 4"
        return f"(({minor}) / {CHUNK} ^ {salt}) * {CHUNK}"

    def cell(self, stage: str, own: str, k: str) -> str:
        """The element of the stage at (own, k), `k` (k-minor) or `own` (own-minor) a multiple of CHUNK."""
        row, minor = (own, k) if self.minor == "k" else (k, own)
        return f"{self.name}s[{stage}][{row}][{self.chunk(row, minor)}]"


def _staged(c: Contraction) -> list[Staged]:
    out = []
    for name, operand, own, width in (("A", c.a, c.i, c.tm), ("B", c.b, c.j, c.tn)):
        inner = operand.src[0]
        load = inner if operand.op is Ops.CAST and inner.op is Ops.LOAD and len(inner.src) == 2 else None
        along_own = (load is not None and not _unit_stride(load.src[1], c.k) and
                     _static_multiple(own[-1], CHUNK) and _unit_stride(load.src[1], own[-1]))
        minor = "own" if along_own else "k"
        step = None
        if load is not None and (along_own or _unit_stride(load.src[1], c.k)):
            step = simplify(load.src[1].substitute({c.k: c.k + SLICE_K}) - load.src[1])
            step = None if any(x.op is Ops.RANGE for x in step.toposort()) else step
        out.append(Staged(name, operand, own, width, minor, load if step is not None else None, step))
    return out


def stages_for(c: Contraction) -> int:
    per_stage = sum(2 * rows * length for rows, length in (s.shape for s in _staged(c)))
    return max(2, min(MAX_STAGES, MAX_LOCAL_BYTES // per_stage))


def _lane_offsets(s: Staged) -> tuple[str, str]:
    """(own, k) offsets of the row address lane `lane` gives to a matrix load of operand `s`'s fragment (q = lane / 8
    the matrix, lane % 8 its row): A's matrices go rows +8 first, B's k +8 first (the PTX layouts above)."""
    own_half, k_half = ("(lane / 8 % 2)", "(lane / 16)") if s.name == "A" else ("(lane / 16)", "(lane / 8 % 2)")
    if s.minor == "k":   # the local tile's rows are the operand's own axis
        return f"lane % 8 + 8 * {own_half}", f"8 * {k_half}"
    return f"8 * {own_half}", f"lane % 8 + 8 * {k_half}"


def emit_fragment_contraction(r, c: Contraction):
    """The kernel body through the C-style renderer `r`, whose dialect spells the matrix and copy instructions."""
    d, long = r.d, r.long
    u16 = d.types[dtypes.uint16]
    kind = "bf16" if c.fragments == "bfloat16" else "f16"
    if kind == "bf16":
        r.bfloat16_helpers()
    for name, text in d.tensor_core_mma.items():   # (the matrix instruction's is spelled per kind)
        r.helpers.setdefault(name.replace("{kind}", kind), text.replace("{kind}", kind))
    staged, stages = _staged(c), stages_for(c)
    wm, wn = warp_tile(c)
    fm, fn = wm // FRAG_M, wn // FRAG_N
    m, n, kk_end = r.value(_extent(c.i)), r.value(_extent(c.j)), r.value(c.k.src[0])
    for s in staged:
        rows, length = s.shape
        r.locals.append(d.local_array.format(type=u16, name=f"{s.name}s", n=f"{stages}][{rows}][{length}") + ";")
    r.emit(f"const int lid = {d.local_id}, lane = lid % {WARP}, fg = lane / 4, ft = lane % 4 * 2;")
    r.emit(f"const int wm = lid / {WARP} / 2 * {wm}, wn = lid / {WARP} % 2 * {wn};")
    r.emit(f"const {long} bid = {d.group_id};")
    r.emit(f"const {long} nbn = ({n} + {c.tn - 1}) / {c.tn}, nbm = ({m} + {c.tm - 1}) / {c.tm};")
    r.emit(f"const {long} i0 = (bid / nbn) % nbm * {c.tm}, j0 = bid % nbn * {c.tn};")
    if c.batch:
        r.scopes[-1].update(r.unflatten("(bid / (nbn * nbm))", list(c.batch)))
    r.emit(f"const {long} slices = ({kk_end} + {SLICE_K - 1}) / {SLICE_K};")
    for s in staged:
        _emit_chunk_starts(r, c, s)
    accs = {(x, y, e): f"acc{x}_{y}_{e}" for x in range(fm) for y in range(fn) for e in range(4)}
    for x in range(fm):
        r.emit(" ".join(f"float {accs[x, y, e]} = 0.0f;" for y in range(fn) for e in range(4)))

    def load_slice(stage: str, slice_: str):
        for s in staged:
            _emit_slice_copy(r, c, s, stage, slice_)
    r.open_block(f"for (int s = 0; s < {stages - 1}; s++)", {})
    r.open_block("if (s < slices)", {})
    load_slice("s", "s")
    r.close_block()
    r.emit("pj_cp_async_commit();")   # (an empty group where there is no such slice: the waits count groups)
    r.close_block()
    r.open_block(f"for ({long} kt = 0; kt < slices; kt++)", {})
    r.emit(f"pj_cp_async_wait<{stages - 2}>();")
    r.emit(d.barrier)        # slice kt is in local memory; every warp is done with the stage loaded next
    r.open_block(f"if (kt + {stages - 1} < slices)", {})
    r.emit(f"const int next = (kt + {stages - 1}) % {stages};")
    load_slice("next", f"kt + {stages - 1}")
    r.close_block()
    r.emit("pj_cp_async_commit();")
    r.emit(f"const int st = kt % {stages};")
    a, b = staged
    a_own, a_k = _lane_offsets(a)
    b_own, b_k = _lane_offsets(b)
    for step in range(SLICE_K // FRAG_K):
        r.open_block("", {})
        kk = step * FRAG_K
        for x in range(fm):
            r.emit(f"unsigned a{x}_0, a{x}_1, a{x}_2, a{x}_3;")
            r.emit(f"pj_ldmatrix_{'x4' if a.minor == 'k' else 'x4_trans'}(a{x}_0, a{x}_1, a{x}_2, a{x}_3, "
                   f"&{a.cell('st', f'wm + {x * FRAG_M} + {a_own}', f'{kk} + {a_k}')});")
        for y in range(0, fn, 2):
            r.emit(f"unsigned b{y}_0, b{y}_1, b{y + 1}_0, b{y + 1}_1;")
            r.emit(f"pj_ldmatrix_{'x4' if b.minor == 'k' else 'x4_trans'}(b{y}_0, b{y}_1, b{y + 1}_0, b{y + 1}_1, "
                   f"&{b.cell('st', f'wn + {y * FRAG_N} + {b_own}', f'{kk} + {b_k}')});")
        for x in range(fm):
            for y in range(fn):
                outs = ", ".join(accs[x, y, e] for e in range(4))
                r.emit(f"pj_mma_{kind}({outs}, a{x}_0, a{x}_1, a{x}_2, a{x}_3, b{y}_0, b{y}_1);")
        r.close_block()
    r.close_block()
    r.emit("pj_cp_async_wait<0>();")
    _emit_fragment_results(r, c, accs, fm, fn, m, n)


def _emit_chunk_starts(r, c: Contraction, s: Staged):
    """Where each of the work-item's chunks of operand `s` goes and comes from, computed once: chunk n (of
    s.chunks // FRAGMENT_THREADS) is tile row rowX_n, element colX_n of it, at k offset kX_n and own index goX_n;
    for a direct operand its first slice's address srcX_n and whether it may be copied whole (okX_n: in range along
    its own axis, aligned, and the slice step keeps it aligned)."""
    long, name = r.long, s.name
    extent, origin = r.value(_extent(s.own)), "i0" if name == "A" else "j0"
    per_row, along_k = s.shape[1] // CHUNK, s.minor == "k"
    assert s.chunks % FRAGMENT_THREADS == 0, (s.chunks, FRAGMENT_THREADS)
    for n in range(s.chunks // FRAGMENT_THREADS):
        ch = f"(lid + {n * FRAGMENT_THREADS})"
        row, col, k, go = f"row{name}{n}", f"col{name}{n}", f"k{name}{n}", f"go{name}{n}"
        r.emit(f"const int {row} = {ch} / {per_row}, {col} = {ch} % {per_row} * {CHUNK}, "
               f"{k} = {col if along_k else row};")
        r.emit(f"const {long} {go} = {origin} + {row if along_k else col};")
        if s.direct is None:
            continue
        inside = f"{go} < {extent}" if along_k else f"{go} + {CHUNK} <= {extent}"
        mem = r.d.mem_type(s.direct.dtype)
        r.emit(f"const {mem} *src{name}{n};")
        r.open_block("", {c.k: k})
        r.scopes[-1].update(r.unflatten(go, list(s.own)))
        r.emit(f"src{name}{n} = &buf{s.direct.src[0].arg}[{r.value(s.direct.src[1])}];")
        r.close_block()
        r.emit(f"const bool ok{name}{n} = {inside} && ((unsigned long long)src{name}{n} & 15) == 0 && "
               f"({r.value(s.step)}) % {CHUNK} == 0;")


def _emit_slice_copy(r, c: Contraction, s: Staged, stage: str, slice_: str):
    """Copy operand `s`'s slice number `slice_` into local stage `stage`: each work-item its chunks of CHUNK elements
    along the tile's minor axis, asynchronously where it can (see the module's docstring), else element by element."""
    long, u16, kk_end, name = r.long, r.d.types[dtypes.uint16], r.value(c.k.src[0]), s.name
    extent, along_k = r.value(_extent(s.own)), s.minor == "k"
    for n in range(s.chunks // FRAGMENT_THREADS):
        row, col, go = f"row{name}{n}", f"col{name}{n}", f"go{name}{n}"
        r.open_block("", {})
        r.emit(f"const {long} gk = ({slice_}) * {SLICE_K} + k{name}{n};")
        r.emit(f"{u16} *dst = &{name}s[{stage}][{row}][{s.chunk(row, col)}];")

        def inside(e: int) -> str:   # whether the chunk's element e is in range
            return f"gk + {e} < {kk_end} && {go} < {extent}" if along_k else f"gk < {kk_end} && {go} + {e} < {extent}"
        if s.direct is None:   # a computed operand: each element's value, rounded to the 16-bit float (exact)
            to_bits = "pj_float_to_bfloat16({v})" if c.fragments == "bfloat16" else "pj_float_to_half({v})"
            for e in range(CHUNK):
                gk, go_e = (f"gk + {e}", go) if along_k else ("gk", f"{go} + {e}")
                r.emit(f"dst[{e}] = 0;")
                r.open_block(f"if ({inside(e)})", {})
                r.open_block("", {c.k: f"({gk})"})
                r.scopes[-1].update(r.unflatten(f"({go_e})", list(s.own)))
                r.emit(f"dst[{e}] = {to_bits.format(v=r.value(s.operand))};")
                r.close_block()
                r.close_block()
            r.close_block()
            continue
        # a plain load along a unit stride (inside the chunk: along k, or along the last own range, whose static
        # end CHUNK divides, from a chunk start CHUNK divides): element e is at src + e, its bits as stored
        r.emit(f"const {r.d.mem_type(s.direct.dtype)} *src = src{name}{n} + ({slice_}) * ({r.value(s.step)});")
        r.open_block(f"if (ok{name}{n} && {'gk + %d <= %s' % (CHUNK, kk_end) if along_k else 'gk < ' + kk_end})", {})
        r.emit("pj_cp_async16(dst, src);")
        r.close_block()
        r.open_block("else", {})
        r.emit(" ".join(f"dst[{e}] = {inside(e)} ? src[{e}] : 0;" for e in range(CHUNK)))
        r.close_block()
        r.close_block()


def _emit_fragment_results(r, c: Contraction, accs: dict, fm: int, fn: int, m: str, n: str):
    """Store each accumulator at its output (row g or g + 8, columns 2t and 2t + 1 of its fragment), checked."""
    store, long = r.ast.src[0], r.long
    for x in range(fm):
        for y in range(fn):
            for e in range(4):
                row = f"i0 + wm + {x * FRAG_M + (8 if e >= 2 else 0)} + fg"
                col = f"j0 + wn + {y * FRAG_N + e % 2} + ft"
                r.open_block(f"if ({row} < {m} && {col} < {n})", {})
                r.emit(f"const {long} oi = {row}, oj = {col};")
                r.scopes[-1].update({**r.unflatten("oi", list(c.i)), **r.unflatten("oj", list(c.j)),
                                     c.reduce: accs[x, y, e]})
                r.emit(r.store_line(store))
                r.close_block()
