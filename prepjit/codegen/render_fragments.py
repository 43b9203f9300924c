"""Tiled contractions on tensor cores: the body of a tile kernel whose launch has `fragments` (gpu_launch.py decides
it on the AST, render_tiles.fragment_kind: both operands 16-bit floats widened to float32, or float32 operands of a
contraction whose precision is "tf32" or "bf16"; a dialect with `tensor_core_mma`). The fragments' `Kind` says what
they are multiplied in: bf16 or f16 (m16n8k16; a float32 operand under "bf16" is rounded to bfloat16 as it is
staged), or tf32 (m16n8k8 on float32 values staged as they are, rounded by cvt.rna.tf32.f32 as they are loaded into
fragments; wgmma m64nNk8 where both tiles are minor along k, which it cannot transpose, the work-items rounding the
chunks they copied in local memory first). The tiles' byte geometry is the same for every kind: below, "elements"
are 16-bit ones; a tf32 tile holds half as many float32 ones (slices 16 deep, chunks of 4, blocks of 32).

A group of warpgroups (four warps each: one per FRAGMENT_OUTPUTS outputs, render_tiles.fragment_threads: two for a
128 x 128 tile, 64 accumulators a work-item) owns a TM x TN tile of outputs in float32 accumulators in registers;
where a work-item holds at most RESIDENT_ACCUMULATORS, the kernel asks for RESIDENT_TILES tiles a multiprocessor
(`__launch_bounds__(threads, 2)`), so one tile's copies and barriers overlap another's arithmetic. On an H100, bf16
4096^3 in the same process: 383 TFLOP/s with four stages (64 KB), 363 with six, 259 with three (48 KB, static),
against 298 for one warpgroup of 128 accumulators, one tile a multiprocessor.
Two variants of the arithmetic are emitted, the GPU's compiler keeping one (PJ_WGMMA: the dialect's test for
Hopper's sm_90a target):
- where each warpgroup's share of the tile's rows (`group_rows`) is a multiple of GROUP_M and the GPU has them, each
  warpgroup issues wgmma m64nNk16 (N the tile's columns; m64nNk8 for tf32) on both operands in local memory, named
  by matrix descriptors (`_WarpgroupTile`, `Staged.descriptor`);
- else each warp multiplies its share of the tile (two rows of warps: 64 x 64 of 128 x 128) with mma.sync m16n8k16
  on fragments loaded by ldmatrix (`_WarpTiles`; sm_80 on, shuffles on older GPUs).
Both operands are staged in local memory as 16-bit values (fragment_staging.Staged: a local tile's geometry),
SLICE_K deep along k (32: two matrix-instruction steps, or 64: four), in `stages` buffers (`stages_for`: as many as
fit MAX_LOCAL_BYTES, at most MAX_STAGES; beyond STATIC_LOCAL_BYTES they are carved from dynamic local memory, whose
size the runtime reads from the module: runtime/cuda_cubin.py):
while the group multiplies one slice, the next `ahead` are being copied, stages - 1 of them, less
WGMMA_IN_FLIGHT for the warpgroup variant: with 1, the warpgroup issues slice kt's instructions and then waits for
all but that group (wgmma.wait_group 1), so the tensor cores have the next slice's work while the previous one
completes, and the stage a copy refills must be one whose instructions every warp waited for before the barrier.
Each operand's tile keeps the axis its memory is contiguous in as the minor one
(`Staged.minor`: "k", or "own" for its rows' or columns' axis), so the group copies it in 16-byte chunks of 8
elements: a k-minor tile is rows of SLICE_K elements (64 or 128 bytes), an own-minor one blocks of 64 elements along
its own axis, each SLICE_K rows of 128 bytes. The chunks of a tile row are swizzled (`Staged.chunk`: chunk
c of row r is stored at c ^ f(r)), exactly the 64- and 128-byte swizzles wgmma's descriptors name (the tiles
1024-byte aligned), so that the 8 rows a matrix load reads, at one chunk of each, fall in 8 distinct 16-byte bank
groups, and a full 16-byte chunk stays whole (copies and matrix loads address chunks only). wgmma reads local
memory through the async proxy: each work-item fences its copies and stores (fence.proxy.async) before the
barrier that starts a slice, and the group waits for all but its last WGMMA_IN_FLIGHT groups of instructions
before the next barrier (the oldest stage is refilled after it).

A tile of `splits` sets of work-items (gpu_launch.unpacked_tile: a weight unpacked from quantized blocks, whose
staging is the tile's work) splits k between them: set kset (each a tile's warpgroups, the work-item's `lid` its
place in its set) copies and multiplies slices kset, kset + splits, ... through stages of its own, every set
reaching every barrier (those past k's end are copied as zeros); at the end set 0 adds the others' accumulators
through local memory (fragment_results.py) and stores the tile.

Chunks are copied as fragment_copies.py says (16-byte cp.async where the operand allows, else element by element),
which the barrier that starts each slice's arithmetic orders as it orders the copies.
The tiles are taken in bands of RASTER_ROWS tile rows, down a band's rows and then across its columns, so the
work-groups running at once share their operands' slices in L2. Where CUDA compiles a 16-bit tile of two
warpgroups for Hopper, the tile is warp-specialised instead (render_fragments_ws.py: a producer warpgroup and a
consumer one on a ring of mbarriers, 64-deep slices).

Fragments come from local memory by matrix loads (pj_ldmatrix_x4: ldmatrix .x4, .trans where the operand's minor
axis is its own), 4 8 x 8 matrices of 16-bit values a load, each lane giving one matrix row's address; the PTX
ISA's register layouts for m16n8k16 (g = lane / 4, t = lane % 4):
- A (16 x 16, row major): a0 = (row g, k 2t and 2t + 1), a1 = row g + 8, a2 = k + 8, a3 = both;
- B (16 x 8, column major): b0 = (k 2t and 2t + 1, column g), b1 = k + 8;
- C (16 x 8 floats): c0, c1 = (row g, columns 2t and 2t + 1), c2, c3 = row g + 8.
One load gives A's four registers (matrices: rows +0/+8 by k +0/+8) or the two registers of two neighbouring
8-column B fragments (matrices: k +0/+8 by columns +0/+8); the lane's matrix q = lane / 8 and row lane % 8 say
which address it gives (`_lane_offsets`). tf32's m16n8k8 fragments are the same 16 x 8 and 8 x 8 shapes of 32-bit
values (`_load_fragments`), which non-transposed matrix loads give alike; an own-minor tf32 tile is read by one
plain load per register (a matrix load transposes 16-bit elements, not 32-bit ones).
"""
from __future__ import annotations

import attrs

from ..uop import Ops, simplify
from .fragment_copies import element_type, emit_copy_starts, emit_slice_copies
from .fragment_results import emit_results
from .fragment_staging import CHUNK_BYTES, Staged
from .render_tiles import (FRAGMENT_THREADS, GROUP_ROWS, Contraction, _extent, _static_multiple, _steps_by_one,
                           _unit_stride, unpacks_blocks)
from .tile_pairs import FRAG_N

WARP = 32
GROUP_WARPS = FRAGMENT_THREADS // WARP   # warps of a warpgroup
FRAG_M = 16                     # one matrix instruction's outputs: FRAG_M x FRAG_N (tile_pairs.FRAG_N)
GROUP_M = GROUP_ROWS            # rows of one warpgroup instruction (wgmma m64nNk16)
MAX_STAGES = 8                  # stages of a tile whose operands are copied (an H100, MiniLM b32 x t128 bf16: 4 -> 8
                                # took its 64 x 64 tiles to 8 stages, 128 x 64 to 5: the call 0.965 -> 0.927 ms, the
                                # same bits; 128 x 128 tiles keep 4 in 64 KB)
UNPACKED_STAGES = 4             # stages of one that unpacks quantized blocks as it stages them (unpacking its work)
STATIC_LOCAL_BYTES = 48 * 1024  # the local memory a kernel may declare statically (beyond it: dynamic local memory)
MAX_LOCAL_BYTES = 64 * 1024     # the local memory the stages may take, dynamically beyond 48 KB (sm_75 allows a block
                                # 64 KB, sm_80 163 KB, Hopper 227 KB; two 128 x 128 tiles of four stages fit an SM)
SLICE_K = 32                    # depth of one staged slice in 16-bit elements (32: 64-byte k-minor rows; 64: 128-byte)
WGMMA_IN_FLIGHT = 1             # warpgroup instruction groups left in flight while the next slice is issued (0 or 1)
RESIDENT_TILES = 2              # tiles a multiprocessor should hold at once where a work-item's accumulators are at
RESIDENT_ACCUMULATORS = 64      # most this many (the compiler keeps its registers within 65536 / (2 x 256): 128)
RESIDENT_THREADS = 512          # and the resident tiles' work-items at most this many (128 registers each)
RASTER_ROWS = 8                 # tile rows of a band of the grid's order (emit_fragment_contraction)
DESCRIPTORS_ONCE = True         # a warpgroup tile's stage-0 descriptors computed once, each slice's an offset from
                                # them (False: each from its address, as before; a knob for timing, the same bits)


@attrs.frozen
class Kind:
    """What the operands are multiplied in: the instructions' type name, the bytes of one staged element (its float
    widened from 16 bits, or float32 for tf32: the tiles' byte geometry is the same), one instruction's depth,
    whether matrix loads and the warpgroup instructions can transpose its tiles (16-bit elements only: a tf32 tile
    minor along its own axis is read by plain loads, and has no warpgroup variant), and how a computed float32 value
    is staged (C: {v} the value)."""
    ptx: str
    bytes: int
    frag_k: int
    transposes: bool
    staged: str

    @property
    def chunk(self) -> int:
        """Elements of one 16-byte copy (and of one matrix row of a matrix load)."""
        return CHUNK_BYTES // self.bytes

    @property
    def slice_k(self) -> int:
        """k of one staged slice (SLICE_K 16-bit elements' bytes, a k-minor row: 64 or 128 bytes): two or four
        matrix-instruction steps between barriers."""
        return SLICE_K * 2 // self.bytes

    @property
    def own_block(self) -> int:
        """Elements along its own axis of one block of an own-minor tile (128-byte rows)."""
        return 128 // self.bytes


# a launch's `fragments` -> its Kind: 16-bit floats on m16n8k16 (and wgmma m64nNk16), float32 rounded to tf32
# (cvt.rna.tf32.f32) on m16n8k8 as its fragments are loaded, or on wgmma m64nNk8 in local memory once a slice is in
KINDS = {"bfloat16": Kind("bf16", 2, 16, True, "pj_float_to_bfloat16({v})"),
         "float16": Kind("f16", 2, 16, True, "pj_float_to_half({v})"), "tf32": Kind("tf32", 4, 8, False, "{v}")}


def warp_grid(c: Contraction) -> tuple[int, int]:
    """(rows, columns) of the tile's warps on mma.sync: two rows of them (2 x 2 for one warpgroup, 2 x 4 for two)."""
    return 2, c.set_threads // WARP // 2


def warp_tile(c: Contraction) -> tuple[int, int]:
    """A warp's outputs: its share of the tile's rows and columns (`warp_grid`)."""
    rows, cols = warp_grid(c)
    return c.tm // rows, c.tn // cols


def group_rows(c: Contraction) -> int:
    """Rows of the tile each warpgroup owns (all its columns), wgmma: the rows split between its warpgroups."""
    return c.tm // (c.set_threads // FRAGMENT_THREADS)


def uses_wgmma(c: Contraction) -> bool:
    """Whether the tile has a warpgroup-instruction variant: its rows a multiple of GROUP_M, and tiles the
    instruction can read (any, for a kind it transposes; else both minor along k)."""
    return group_rows(c) % GROUP_M == 0 and (KINDS[c.fragments].transposes or along_k(c))


def along_k(c: Contraction) -> bool:
    """Whether both operands' local tiles are minor along k (`Staged.minor`)."""
    return minors(c) == ["k", "k"]


def minors(c: Contraction) -> list[str]:
    """The minor axis of each operand's local tile, A's then B's: "k" or "own" (`Staged.minor`)."""
    return [s.minor for s in _staged(c)]


def _staged(c: Contraction, depth: int | None = None) -> list[Staged]:
    """Both operands as staged in slices `depth` deep (the kind's slice_k by default)."""
    kind, out = KINDS[c.fragments], []
    depth = depth or kind.slice_k
    for name, operand, own, width in (("A", c.a, c.i, c.tm), ("B", c.b, c.j, c.tn)):
        inner = operand.src[0] if operand.op is Ops.CAST else operand   # (a 16-bit load widened, or a float32 one)
        load = inner if inner.op is Ops.LOAD and len(inner.src) == 2 and inner.dtype.itemsize == kind.bytes else None
        runs_k = load is not None and (_unit_stride(load.src[1], c.k) or _static_multiple(c.k, kind.chunk) and
                                       _steps_by_one(load.src[1], c.k, kind.chunk))   # (a head-merged view's too)
        along_own = (load is not None and not runs_k and
                     _static_multiple(own[-1], kind.chunk) and _unit_stride(load.src[1], own[-1]))
        minor = "own" if along_own else "k"
        step = None
        if load is not None and (along_own or runs_k):
            step = simplify(load.src[1].substitute({c.k: c.k + depth}) - load.src[1])
            step = None if any(x.op is Ops.RANGE for x in step.toposort()) else step
        out.append(Staged(kind, name, operand, own, width, minor, load if step is not None else None, step, depth))
    return out


def in_flight(c: Contraction) -> int:
    """Warpgroup instruction groups a tile leaves in flight as it issues the next slice's (WGMMA_IN_FLIGHT where it
    has the warpgroup variant)."""
    return WGMMA_IN_FLIGHT if uses_wgmma(c) else 0


def stages_for(c: Contraction) -> int:
    """Local buffers of slices: as many as fit MAX_LOCAL_BYTES, at most MAX_STAGES (UNPACKED_STAGES where an operand
    unpacks quantized blocks: render_tiles.unpacks_blocks), at least one more than the slices being multiplied (the
    one issued and those in flight) so one is always being copied. A tile's copies are latency-bound where its slices
    are small (64 x 64, 128 x 64: 8 and 12 KB), so more of them in flight pay; a tile that unpacks blocks computes
    its slices, and more stages would only take local memory from the tiles a multiprocessor holds."""
    per_stage = c.splits * sum(CHUNK_BYTES * s.chunks for s in _staged(c))   # (each set's stages its own)
    most = UNPACKED_STAGES if unpacks_blocks(c.a) or unpacks_blocks(c.b) else MAX_STAGES
    return max(2 + in_flight(c), min(most, MAX_LOCAL_BYTES // per_stage))


def _lane_offsets(s: Staged) -> tuple[str, str]:
    """(own, k) offsets of the row address lane `lane` gives to a matrix load of operand `s`'s fragment (q = lane / 8
    the matrix, lane % 8 its row): A's matrices go rows +8 first, B's k +8 first (the PTX layouts above)."""
    own_half, k_half = ("(lane / 8 % 2)", "(lane / 16)") if s.name == "A" else ("(lane / 16)", "(lane / 8 % 2)")
    if s.minor == "k":   # the local tile's rows are the operand's own axis (a matrix row is one chunk along k)
        return f"lane % 8 + 8 * {own_half}", f"{s.kind.chunk} * {k_half}"
    return f"8 * {own_half}", f"lane % 8 + 8 * {k_half}"


def _helpers(r, kind: str):
    """The dialect's tensor-core helpers for `kind`: those of every kind, those named for it, and the templates of
    the others ({kind} in their names) where it has no helper of its own by that name (the warpgroup instruction's
    are added per shape)."""
    helpers = r.d.tensor_core_mma
    for name, text in helpers.items():
        own = name.replace("{kind}", kind)
        named_for = name.rsplit("_", 1)[-1] if name.rsplit("_", 1)[-1] in (k.ptx for k in KINDS.values()) else kind
        if "{n}" in name or named_for != kind or (own != name and own in helpers):
            continue
        r.helpers.setdefault(own, text.replace("{kind}", kind))


def wgmma_helper(r, kind: Kind, n: int, ta: int, tb: int) -> str:
    """The name of the warpgroup instruction's helper for m64 x n x the kind's depth (operands' tiles transposed as
    ta, tb), added."""
    name = f"pj_wgmma_{kind.ptx}_n{n}_{ta}{tb}"
    fill = {"{kind}": kind.ptx, "{n}": str(n), "{k}": str(kind.frag_k),
            "{trans}": f", {ta}, {tb}" if kind.transposes else "", "{ta}": str(ta), "{tb}": str(tb),
            "{scale}": str(n // 2 + 2),
            "{a}": str(n // 2), "{b}": str(n // 2 + 1),
            "{dlist}": "{" + ", ".join(f"%{e}" for e in range(n // 2)) + "}",
            "{outs}": ", ".join(f'"+f"(d[{e}])' for e in range(n // 2))}
    text = r.d.tensor_core_mma["pj_wgmma_{kind}_n{n}_{ta}{tb}"]
    for key, value in fill.items():
        text = text.replace(key, value)
    r.helpers.setdefault(name, text)
    return name


def emit_fragment_contraction(r, c: Contraction):
    """The kernel body through the C-style renderer `r`, whose dialect spells the matrix and copy instructions: the
    warpgroup instructions where the GPU has them (PJ_WGMMA) and the tile's rows allow, else the warps' mma.sync;
    a 16-bit 128 x 128 tile warp-specialised where CUDA compiles it for Hopper (render_fragments_ws.py); a tile of
    the launch's "tma" variant on bulk tensor copies (render_fragments_tma.py)."""
    from . import render_fragments_ws as ws   # (which builds on this module's staging)
    d, long = r.d, r.long
    kind = KINDS[c.fragments].ptx
    r.resident_groups = RESIDENT_TILES if (c.tm * c.tn <= RESIDENT_ACCUMULATORS * c.set_threads and
                                           c.threads * RESIDENT_TILES <= RESIDENT_THREADS) else 1
    if kind == "bf16":
        r.bfloat16_helpers()
    _helpers(r, kind)
    m, n, kk_end = r.value(_extent(c.i)), r.value(_extent(c.j)), r.value(c.k.src[0])
    if c.variant is not None:   # Hopper's wide tiles on bulk tensor copies (render_fragments_tma.py)
        from . import render_fragments_tma as tma
        bulk = tma.bulk_staged(c)
        declare_tiles(r, [(bulk, tma.TMA_STAGES)])
    else:
        staged, stages = _staged(c), stages_for(c)
        wgmma = uses_wgmma(c)
        specialised = ws.warp_specialised(c) and "pj_mbar_wait" in d.tensor_core_mma
        ws_staged = _staged(c, ws.WS_DEPTH) if specialised else None
        declare_tiles(r, [(ws_staged, ws.WS_STAGES), (staged, stages)] if specialised else
                      [(staged, stages * c.splits)], ws.TEST)
    if c.splits > 1:   # lid: the work-item in its set kset (which multiplies every splits-th slice)
        r.emit(f"const int lid = {d.local_id} % {c.set_threads}, kset = {d.local_id} / {c.set_threads};")
    r.emit(f"const int {'' if c.splits > 1 else f'lid = {d.local_id}, '}lane = lid % {WARP}, fg = lane / 4, "
           f"ft = lane % 4 * 2;")
    r.emit(f"const {long} bid = {d.group_id};")
    r.emit(f"const {long} nbn = ({n} + {c.tn - 1}) / {c.tn}, nbm = ({m} + {c.tm - 1}) / {c.tm};")
    # tiles in bands of RASTER_ROWS tile rows, down each band's rows then across: the work-groups running at once
    # share their rows' and columns' operand slices in L2 (in row order, 8192^3's 264 resident 128 x 128 tiles span
    # every column of b: 128 MB of bf16, beyond an H100's 50 MB of L2; untimed alone)
    g = RASTER_ROWS
    r.emit(f"const {long} tile = bid % (nbn * nbm), first = tile / ({g} * nbn) * {g}, "
           f"band = nbm - first < {g} ? nbm - first : {g};")
    r.emit(f"const {long} i0 = (first + tile % ({g} * nbn) % band) * {c.tm}, j0 = tile % ({g} * nbn) / band * {c.tn};")
    if c.batch:
        r.scopes[-1].update(r.unflatten("(bid / (nbn * nbm))", list(c.batch)))
    if c.variant is not None:
        tma.emit_bulk_tile(r, c, bulk)
        return
    if specialised:
        r.lines.append(f"#if {ws.TEST}")
        ws.emit_warp_specialised(r, c, ws_staged)
        r.lines.append("#else")
    depth, sets = KINDS[c.fragments].slice_k, c.splits
    # slices: the set's (a set's slice kt is slice kt x sets + kset of k; those past k's end are copied as zeros);
    # its stages: kset x stages on
    r.emit(f"const {long} slices = ({kk_end} + {depth * sets - 1}) / {depth * sets};")
    first = f"kset * {stages} + " if sets > 1 else ""

    def slice_of(kt: str) -> str:
        return f"({kt}) * {sets} + kset" if sets > 1 else kt
    for s in staged:
        emit_copy_starts(r, c, s)
    group = _WarpgroupTile(r, c, staged) if wgmma else None
    warps = _WarpTiles(r, c, staged, kind)
    _variants(r, group, warps, "declare")

    def load_slice(stage: str, slice_: str):
        for s in staged:
            emit_slice_copies(r, c, s, stage, slice_)
    # slices copied ahead of the one multiplied: all but one stage, less the stages whose warpgroup instructions may
    # be in flight (every warp waited for all but the last in_flight groups before the barrier starting slice kt,
    # so the stage of slice kt - 1 - in_flight is free); the warps' variant (other GPUs) keeps all but one
    ahead, landed = str(stages - 1), str(stages - 2)   # (landed: copy groups left in flight as slice kt starts)
    if in_flight(c):
        r.lines += ["#if PJ_WGMMA", f"constexpr int ahead = {stages - 1 - in_flight(c)};", "#else",
                    f"constexpr int ahead = {stages - 1};", "#endif"]
        ahead, landed = "ahead", "ahead - 1"
    r.open_block(f"for (int s = 0; s < {ahead}; s++)", {})
    r.open_block("if (s < slices)", {})
    load_slice(f"{first}s", slice_of("s"))
    r.close_block()
    r.emit("pj_cp_async_commit();")   # (an empty group where there is no such slice: the waits count groups)
    r.close_block()
    r.open_block(f"for ({long} kt = 0; kt < slices; kt++)", {})
    r.emit(f"pj_cp_async_wait<{landed}>();")
    r.emit(f"const int st = {first}kt % {stages};")
    _variants(r, group, warps, "arrive")
    r.emit(d.barrier)        # slice kt is in local memory; every warp is done with the stage loaded next
    _variants(r, group, None, "issue")
    r.open_block(f"if (kt + {ahead} < slices)", {})
    r.emit(f"const int next = {first}(kt + {ahead}) % {stages};")
    load_slice("next", slice_of(f"kt + {ahead}"))
    r.close_block()
    r.emit("pj_cp_async_commit();")
    _variants(r, group, warps, "multiply")
    r.close_block()
    r.emit("pj_cp_async_wait<0>();")
    _variants(r, group, warps, "store")
    if specialised:
        r.lines.append("#endif")


def declare_tiles(r, variants: list, test: str | None = None):
    """The local tiles As and Bs (stages x blocks x rows x row length) of each (staged, stages) of `variants` (two:
    the first where the preprocessor's `test` holds): static arrays, or, where they pass STATIC_LOCAL_BYTES, arrays
    at 1024-byte aligned offsets of the dynamic local memory (the launch passes its size: the variant's)."""
    decls, dynamic_bytes = [], []
    for staged, stages in variants:
        sizes = [-(-stages * CHUNK_BYTES * s.chunks // 1024) * 1024 for s in staged]
        dynamic = sum(sizes) > STATIC_LOCAL_BYTES
        dynamic_bytes.append(sum(sizes) if dynamic else 0)
        decls.append([])
        for s, offset in zip(staged, (0, sizes[0])):
            blocks, rows, length = s.shape
            fill = {"type": element_type(r, s.kind), "name": f"{s.name}s",
                    "n": f"{stages}][{blocks}][{rows}][{length}"}
            decls[-1].append((r.d.dynamic_tile_array.format(**fill, offset=offset) if dynamic else
                              r.d.tile_array.format(**fill)) + ";")
    if any(dynamic_bytes):
        size = dynamic_bytes[0] if len(variants) == 1 else f"{test} ? {dynamic_bytes[0]} : {dynamic_bytes[1]}"
        r.helpers.setdefault("pj_dynamic_local", r.d.dynamic_local.format(bytes=size))
    r.locals += decls[0] if len(variants) == 1 else [f"#if {test}", *decls[0], "#else", *decls[1], "#endif"]


def _variants(r, group, warps, part: str):
    """Emit `part` of the warpgroup tile where PJ_WGMMA holds and of the warps' tiles elsewhere (either may be None:
    that variant has nothing there)."""
    if group is None:
        if warps is not None:
            getattr(warps, part)()
        return
    r.lines.append("#if PJ_WGMMA")
    getattr(group, part)()
    if warps is not None:
        r.lines.append("#else")
        getattr(warps, part)()
    r.lines.append("#endif")


class _WarpTiles:
    """Four warps each multiply a quarter of the tile with mma.sync m16n8k16, fragments by ldmatrix (sm_80 on)."""

    def __init__(self, r, c: Contraction, staged: list, kind: str):
        self.r, self.c, self.staged, self.kind = r, c, staged, kind
        self.wm, self.wn = warp_tile(self.c)
        self.fm, self.fn = self.wm // FRAG_M, self.wn // FRAG_N
        self.accs = {(x, y, e): f"acc{x}_{y}_{e}" for x in range(self.fm) for y in range(self.fn) for e in range(4)}

    def declare(self):
        r = self.r
        cols = warp_grid(self.c)[1]
        r.emit(f"const int wm = lid / {WARP} / {cols} * {self.wm}, wn = lid / {WARP} % {cols} * {self.wn};")
        for s, origin in zip(self.staged, ("wm", "wn")):
            if s.plain_loads:   # where the lane's element at (origin + 8j + g, k t) is in a stage, for j = 0 ... 3
                cells = [s.element("0", f"{origin} + {8 * j} + fg", "ft / 2") for j in range(4)]
                r.emit(" ".join(f"const int {s.name}lane{j} = (int)(&{cell} - &{s.name}s[0][0][0][0]);"
                                for j, cell in enumerate(cells)))
        for x in range(self.fm):
            r.emit(" ".join(f"float {self.accs[x, y, e]} = 0.0f;" for y in range(self.fn) for e in range(4)))

    def arrive(self):
        pass

    def multiply(self):
        r, (a, b), kind = self.r, self.staged, self.kind
        depth = a.kind.frag_k
        for step in range(a.depth // depth):
            r.open_block("", {})
            kk = step * depth
            for x in range(self.fm):
                _load_fragments(r, a, [f"a{x}_{e}" for e in range(4)], "wm", x * FRAG_M, kk)
            for y in range(0, self.fn, 2):
                _load_fragments(r, b, [f"b{y}_0", f"b{y}_1", f"b{y + 1}_0", f"b{y + 1}_1"], "wn", y * FRAG_N, kk)
            for x in range(self.fm):
                for y in range(self.fn):
                    outs = ", ".join(self.accs[x, y, e] for e in range(4))
                    r.emit(f"pj_mma_{kind}({outs}, a{x}_0, a{x}_1, a{x}_2, a{x}_3, b{y}_0, b{y}_1);")
            r.close_block()

    def store(self):
        """Each accumulator at its output (row g or g + 8, columns 2t and 2t + 1 of its fragment)."""
        cells = [(self.accs[x, y, e], f"wm + {x * FRAG_M + (8 if e >= 2 else 0)} + fg",
                  f"wn + {y * FRAG_N + e % 2} + ft")
                 for x in range(self.fm) for y in range(self.fn) for e in range(4)]
        emit_results(self.r, self.c, cells)


def _load_fragments(r, s: Staged, regs: list, origin: str, offset: int, kk: int):
    """Load the 4 registers `regs` of operand `s` at its rows or columns from `origin` + `offset` (the warp's first
    and a multiple of 8 past it) and k from `kk` of stage st: A's
    16 x depth fragment, or two neighbouring 8-column B fragments (the module docstring's layouts; for tf32's
    m16n8k8, t = lane % 4: a0 = (row g, k t), a1 = row g + 8, a2 = k t + 4, a3 = both; b0 = (k t, column g), b1 = k
    t + 4). A k-minor tile gives them by one matrix load (its 8 x 8 matrices of 16-bit values are 8 x 4 of 32-bit
    ones: lane 4g + t gets element t of row g, the layouts above); an own-minor one by a transposed matrix load of
    16-bit values, or one plain load per register of 32-bit ones (a matrix load cannot transpose those), at the
    lane's element for its 8-element group j (`_WarpTiles.declare`) plus a constant: 32 elements further along its
    own axis are one block further, 4 rows further along k keep the rows' swizzle (`Staged.chunk`). tf32 registers
    are then rounded (cvt.rna.tf32.f32)."""
    r.emit(f"unsigned {', '.join(regs)};")
    if not s.plain_loads:
        lane_own, lane_k = _lane_offsets(s)
        r.emit(f"pj_ldmatrix_{'x4' if s.minor == 'k' else 'x4_trans'}({', '.join(regs)}, "
               f"&{s.cell('st', f'{origin} + {offset} + {lane_own}', f'{kk} + {lane_k}')});")
    else:
        # A: register e at rows +8 (e odd), k +4 (e >= 2); B: fragment e // 2, k +4 (e odd)
        offsets = [(8 * (e % 2), 4 * (e // 2)) if s.name == "A" else (FRAG_N * (e // 2), 4 * (e % 2)) for e in range(4)]
        _, rows, length = s.shape
        assert s.block == length == s.kind.own_block, (s.block, length)
        cells = [f"(&{s.name}s[st][0][0][0])[{s.name}lane{(offset + o) // 8 % 4} + "
                 f"{(offset + o) // length * rows * length + (kk + k) * length}]" for o, k in offsets]
        r.emit(" ".join(f"{reg} = {r.d.float_bits.format(v=cell)};" for reg, cell in zip(regs, cells)))
    if s.kind.bytes == 4:
        r.emit(" ".join(f"{reg} = pj_round_{s.kind.ptx}({reg});" for reg in regs))


class _WarpgroupTile:
    """The group's four warps, one warpgroup, multiply the whole tile with wgmma m64nNk16 (N the tile's columns; k8 for
    tf32, whose work-items first round the chunks they copied), one instruction per GROUP_M rows and step, both
    operands read from the local tiles through matrix descriptors (sm_90a). Accumulators: warp w's lane holds, in acc
    x's register 4q + e, row 64x + 16w + g (+ 8 for e >= 2), column 8q + 2t + e % 2 (the PTX ISA's layout of a wgmma
    float32 accumulator)."""

    def __init__(self, r, c: Contraction, staged: list, rows: int | None = None, first: int = 0):
        self.r, self.c, self.staged = r, c, staged
        self.rows = rows or group_rows(c)   # (each warpgroup's share; or all of the tile's, its one consumer's)
        self.first = first                  # the warpgroup that owns the first rows (after a producer's: 1)
        self.blocks = self.rows // GROUP_M
        a, b = self.staged
        self.helper = wgmma_helper(self.r, a.kind, self.c.tn, int(a.minor == "own"), int(b.minor == "own"))

    def declare(self):
        r = self.r
        group = f"(lid / {FRAGMENT_THREADS} - {self.first})" if self.first else f"lid / {FRAGMENT_THREADS}"
        first = f"{group} * {self.rows}" if self.rows < self.c.tm else "0"
        r.emit(f"const int wg_m = {first}, wg_row = wg_m + lid / {WARP} % {GROUP_WARPS} * 16 + fg;")
        a, b = self.staged   # (stage 0's descriptors, once: each slice's are an offset from them)
        firsts = [f"wdA{x} = {a.descriptor(f'wg_m + {x * GROUP_M}')}" for x in range(self.blocks)]
        if DESCRIPTORS_ONCE:
            r.emit(f"const unsigned long long {', '.join(firsts)}, wdB = {b.descriptor('0')};")
        for x in range(self.blocks):
            r.emit(f"float wacc{x}[{self.c.tn // 2}] = {{}};")

    def arrive(self):
        r = self.r
        for s in self.staged:
            if s.kind.bytes == 4:   # tf32: the work-item rounds the chunks it copied (its copies are complete)
                for n in range(s.chunks // self.c.set_threads):
                    row = f"row{s.name}{n}"
                    r.open_block("", {})
                    r.emit(f"unsigned *ch = (unsigned *)&{s.name}s[st][blk{s.name}{n}][{row}]"
                           f"[{s.chunk(row, f'col{s.name}{n}')}];")
                    r.emit(" ".join(f"ch[{e}] = pj_round_{s.kind.ptx}(ch[{e}]);" for e in range(s.kind.chunk)))
                    r.close_block()
        r.emit("pj_fence_async_shared();")   # (this work-item's copies and stores, before the matrix reads)

    def issue(self):
        r, (a, b) = self.r, self.staged
        r.emit("pj_wgmma_fence();")
        for step in range(a.depth // a.kind.frag_k):
            for x in range(self.blocks):
                if DESCRIPTORS_ONCE:
                    r.emit(f"{self.helper}(wacc{x}, pj_wgmma_desc_add(wdA{x}, {a.descriptor_offset('st', step)}), "
                           f"pj_wgmma_desc_add(wdB, {b.descriptor_offset('st', step)}));")
                else:
                    r.emit(f"{self.helper}(wacc{x}, {a.descriptor(f'wg_m + {x * GROUP_M}', 'st', step)}, "
                           f"{b.descriptor('0', 'st', step)});")
        r.emit("pj_wgmma_commit();")

    def multiply(self):
        # all but the last in_flight groups done before the next slice's barrier (the stage of the oldest is refilled
        # after it)
        self.r.emit(f"pj_wgmma_wait<{in_flight(self.c)}>();")

    def store(self):
        self.r.emit("pj_wgmma_wait<0>();")
        for x in range(self.blocks):
            self.r.emit(f"pj_wgmma_hold<{self.c.tn // 2}>(wacc{x});")
        cells = [(f"wacc{x}[{4 * q + e}]", f"{x * GROUP_M + (8 if e >= 2 else 0)} + wg_row", f"{8 * q + e % 2} + ft")
                 for x in range(self.blocks) for q in range(self.c.tn // 8) for e in range(4)]
        emit_results(self.r, self.c, cells)
