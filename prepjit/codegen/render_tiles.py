"""Tiled contractions for the C-style renderers: a kernel whose value is sum_k a(i, k) * b(k, j) (a matmul, batched
or not, with any elementwise work on the operands and on the result) becomes a work-group per TM x TN block of
outputs. The group stages TILE_K-deep slices of both operands in local memory, and each work-item accumulates
REG x REG outputs in registers: two runs of 4 rows half a tile apart by two runs of 4 columns, read from local
memory as 4-vectors (neighbouring work-items own neighbouring runs, so their stores are coalesced). The next slice
is loaded into registers while one is multiplied (its global loads are in flight during the arithmetic; on the
H200 this beat keeping 128 x 128 tiles to 128 registers for two groups per SM: 4096^3 38.8 against 37.8 TFLOP/s),
then stored into the other of two local copies of a slice (SIMT_STAGES: one barrier a slice, not two).
Each work-item loads runs of 4 consecutive elements along the axis an operand is contiguous in (one index
computation per run, loads the compiler can merge), or single elements where no axis is.

The tile shape is chosen per kernel (`tile_shape`): the largest of SHAPES that wastes little of its tiles on
padding and still gives MIN_GROUPS work-groups (enough to fill every multiprocessor of a large GPU several
times: 4096 x 384 outputs get 64 x 64 tiles, 384 groups rather than 96 of 128 x 128), else the one giving the
most groups. 128 x 128 tiles pay only with many waves of them: on the H200 (132 multiprocessors, one such
group each) MiniLM's 4096 x 1536 feed-forward (k = 384) ran in 133 us in 768 tiles of 128 x 64 against 155 us
in 384 of 128 x 128, its batched 128 x 128 attention scores in 18.7 against 29.8 us, while 4096^3 keeps its
1024 tiles of 128 x 128 (PREPJIT_TUNE's timings, tune.py, which picks among these shapes on any GPU).

Where both operands are 16-bit floats widened to float32, or the contraction's precision is "tf32" or "bf16"
(`fragment_kind`), and the dialect has matrix instructions, the launch says so (`fragments`) and render_fragments.py
multiplies the slices on tensor cores instead of work-items' FMAs.

The rows (i) and columns (j) may each be several ranges (x @ w with x of shape (B, T, C): the rows are B x T),
flattened row-major. `match_contraction` finds the pattern; `emit_contraction` writes the kernel body through
the renderer, which renders the operand and result expressions with the ranges bound to the tile's indices.
"""
from __future__ import annotations

import math

import attrs

from ..uop import Ops, UOp, dtypes, simplify, sym_prod
from ..uop.uop import as_uop, render_python
from .tile_pairs import PAIR, match_pair

TILE_K, REG, RUN = 16, 8, 4       # slice depth; outputs per work-item along each side; elements per vector run
SHAPES = ((128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (32, 128))   # (rows, columns) of a tile
MIN_GROUPS = 512                  # work-groups a tile shape should give (a GPU of 132 multiprocessors, 4 times)
MIN_FILL = 0.75                   # the least share of a tile's outputs that must be real (not padding)
MIN_SIDE = min(min(s) for s in SHAPES)   # rows and columns a contraction needs, at least, to be tiled
MAX_CHECKED_RUNS = 4096           # runs an index that is not a unit stride is checked at, at most
MIN_WARPS = 1536                  # warps a contraction should run in all: fewer (4096 x 384 outputs are 768 warps of
                                  # 8 x 8) and each tile's slice is split between SPLITS sets of warps
SPLITS = (1, 2, 4)                # how many sets of work-items may share a tile, each multiplying part of a slice
MAX_THREADS = 256                 # work-items of a group, at most
SIMT_STAGES = 2                   # local copies of a slice an FMA tile keeps (`emit_contraction`): 2, the next
                                  # slice stored into one while the other is multiplied (one barrier a slice); 1, as
                                  # before (two: before and after the arithmetic)
SIMT_RESIDENT_GROUPS = 1          # work-groups a multiprocessor should hold of an FMA tile (__launch_bounds__'s
                                  # second number where more than 1: 2 keeps 128 x 128's 256 work-items to 128
                                  # registers); a knob for timing
FRAGMENT_THREADS = 128            # work-items of a tile on tensor cores: 4 warps (render_fragments.py), a warpgroup
GROUP_ROWS = 64                   # rows of a warpgroup's matrix instructions (wgmma m64nNk16)
FRAGMENT_OUTPUTS = 64 * 128       # outputs a warpgroup keeps in its registers (64 float32 a work-item), at most:
                                  # a 128 x 128 tile takes two warpgroups, two tiles a multiprocessor (on an H100,
                                  # bf16 4096^3: 388 TFLOP/s with one group in flight, against 313 for one warpgroup
                                  # of 128 accumulators a work-item, 218 registers, one tile a multiprocessor)


def fragment_threads(tm: int, tn: int) -> int:
    """Work-items of a tm x tn tile on tensor cores: a warpgroup per FRAGMENT_OUTPUTS outputs (one at least)."""
    return FRAGMENT_THREADS * max(1, tm * tn // FRAGMENT_OUTPUTS)


@attrs.frozen
class Contraction:
    reduce: UOp          # the REDUCE(ADD) of a * b over one range k
    a: UOp               # depends on the row ranges i and k, not on the column ranges j
    b: UOp               # depends on j and k, not on i
    i: tuple             # the row ranges (flattened, the last fastest)
    j: tuple             # the column ranges
    k: UOp
    batch: tuple         # the other loop ranges (one work-group covers a single value of each)
    tm: int = 128        # rows of a tile
    tn: int = 128        # columns of a tile
    splits: int = 1      # sets of work-items per tile, each multiplying TILE_K / splits of every slice (on tensor
                         # cores: every splits-th slice, render_fragments.py)
    fragments: str | None = None   # what both operands are multiplied in on tensor cores (fragment_kind), or None
    variant: str | None = None     # "tma": Hopper's tile of bulk tensor copies (render_fragments_tma.py), or None
    pair: object = None            # a tile_pairs.Pair where the tile holds two sums (its columns virtual), or None

    @property
    def owners(self) -> int:
        """Work-items of one set: each owns REG x REG outputs of the tile."""
        return (self.tm // REG) * (self.tn // REG)

    @property
    def set_threads(self) -> int:
        """Work-items of one set: the owners, or on tensor cores the tile's warpgroups."""
        return fragment_threads(self.tm, self.tn) if self.fragments else self.owners

    @property
    def threads(self) -> int:
        if self.variant is not None:   # a producer warpgroup and a consumer one per GROUP_ROWS rows
            return FRAGMENT_THREADS * (1 + self.tm // GROUP_ROWS)
        return self.set_threads * self.splits


def _ranges(u: UOp) -> set:
    return {x for x in u.toposort() if x.op is Ops.RANGE}


def _most(ranges) -> int:
    return math.prod(r.src[0].vmax for r in ranges)


def _fill(m: int, n: int, s: tuple[int, int]) -> float:
    """The share of the outputs of m x n tiles of shape s that are real (not padding)."""
    return m * n / (-(-m // s[0]) * s[0] * -(-n // s[1]) * s[1])


def tile_shape(m: int, n: int, batch: int) -> tuple[int, int]:
    """(rows, columns) of the tiles of an m x n contraction repeated `batch` times (extents at the vars' maxima)."""
    def groups(s):
        return batch * -(-m // s[0]) * -(-n // s[1])

    full = [s for s in SHAPES if _fill(m, n, s) >= MIN_FILL] or [max(SHAPES, key=lambda s: _fill(m, n, s))]
    enough = [s for s in full if groups(s) >= MIN_GROUPS]
    return enough[0] if enough else max(full, key=groups)


def splits_for(groups: int, owners: int) -> int:
    """Sets of work-items per tile: the fewest that give MIN_WARPS warps in all (within MAX_THREADS a group)."""
    fit = [s for s in SPLITS if owners * s <= MAX_THREADS] or [1]   # (a tile for tensor cores only: no split)
    return next((s for s in fit if groups * owners * s >= MIN_WARPS * 32), fit[-1])


def tile_candidates(ast: UOp) -> list[tuple[int, int, int]]:
    """(rows, columns, splits) of each tiling worth timing for the kernel's contraction (PREPJIT_TUNE on a GPU):
    the policy's own first, then every other shape of SHAPES that wastes little of its tiles on padding, with
    each number of splits that fits MAX_THREADS; [] for a kernel that is no contraction."""
    c = match_contraction(ast)
    if c is None:
        return []
    m, n = _most(c.i), _most(c.j)
    fill = [s for s in SHAPES if _fill(m, n, s) >= MIN_FILL] or [(c.tm, c.tn)]
    chosen = [(c.tm, c.tn, c.splits)]
    for tm, tn in fill:
        owners = (tm // REG) * (tn // REG)
        chosen += [(tm, tn, s) for s in SPLITS if owners * s <= MAX_THREADS and (tm, tn, s) not in chosen]
    return chosen


def unpacks_blocks(operand: UOp) -> bool:
    """Whether `operand` is computed from integer loads: a weight unpacked from quantized blocks (pj.quant)."""
    return any(u.op is Ops.LOAD and u.dtype.is_int for u in operand.toposort())


def fragment_kind(c: Contraction) -> str | None:
    """What tensor cores may multiply `c`'s operands in, or None: the 16-bit float both are widened from (exactly);
    else what the contraction's precision allows its float32 operands (its product's arg, tracing/precision.py):
    "tf32", or "bfloat16" (the operands rounded to it) for "bf16" -- a weight unpacked from quantized blocks too
    (fragment_unpack.py), whose value "highest" keeps exact."""
    def narrow(x: UOp):
        return x.src[0].dtype if x.op is Ops.CAST and x.src[0].dtype in (dtypes.bfloat16, dtypes.float16) else None
    kind = narrow(c.a)
    if kind is not None and kind == narrow(c.b):
        return kind.name
    return {"tf32": "tf32", "bf16": "bfloat16"}.get(c.reduce.src[0].arg)


def match_contraction(ast: UOp, tile: tuple | None = None) -> Contraction | None:
    """The contraction this kernel computes, or None (float32 only, one reduce range, row and column ranges, and
    the rows and the columns each at least MIN_SIDE and k a slice deep at the vars' maxima: thinner ones stay
    reductions). Its tiles are `tile` (rows, columns, splits: one of `tile_candidates`, and a launch's fragments'
    dtype name where it has them, then its variant, then tile_pairs.PAIR where it holds two sums: `match_pair`),
    else the policy's."""
    if tile is not None and tile[-1] == PAIR:
        return match_pair(ast, tile)
    store = ast.src[0]
    reduces = [u for u in store.toposort() if u.op is Ops.REDUCE]
    if store.op is not Ops.STORE or len(reduces) != 1:
        return None
    red = reduces[0]
    if red.arg is not Ops.ADD or len(red.src) != 2 or red.dtype != dtypes.float32 or red.src[0].op is not Ops.MUL:
        return None
    k = red.src[1]
    loops = sorted((r for r in _ranges(store) if r.arg[1] == "loop"), key=lambda r: r.arg[0])
    for a, b in (red.src[0].src, reversed(red.src[0].src)):
        ra, rb = _ranges(a), _ranges(b)
        only_a = [r for r in loops if r in ra and r not in rb]
        only_b = [r for r in loops if r in rb and r not in ra]
        if a.dtype == b.dtype == dtypes.float32 and k in ra and k in rb and only_a and only_b \
                and not any(x.op is Ops.REDUCE for x in a.toposort() + b.toposort()):
            if min(_most(only_a), _most(only_b)) < MIN_SIDE or k.src[0].vmax < TILE_K:
                return None
            batch = tuple(r for r in loops if r not in only_a and r not in only_b)
            if tile is not None:
                tm, tn, splits, *more = tile   # (more: the fragments' kind, then the variant)
                return Contraction(red, a, b, tuple(only_a), tuple(only_b), k, batch, tm, tn, splits,
                                   *more)
            tm, tn = tile_shape(_most(only_a), _most(only_b), _most(batch))
            groups = _most(batch) * -(-_most(only_a) // tm) * -(-_most(only_b) // tn)
            return Contraction(red, a, b, tuple(only_a), tuple(only_b), k, batch, tm, tn,
                               splits_for(groups, (tm // REG) * (tn // REG)))
    return None


def _extent(ranges: tuple) -> UOp:
    return as_uop(sym_prod(r.src[0] for r in ranges))


def launch_size(c: Contraction) -> UOp:
    blocks = as_uop(sym_prod([r.src[0] for r in c.batch] + [(_extent(c.i) + (c.tm - 1)) // c.tm,
                                                            (_extent(c.j) + (c.tn - 1)) // c.tn]))
    return blocks * c.threads


def _loads_along(operand: UOp, r: UOp) -> list[UOp]:
    """The loads of `operand` whose index depends on range `r`."""
    return [x for x in operand.toposort() if x.op is Ops.LOAD and r in _ranges(x.src[1])]


def _unit_stride(index: UOp, r: UOp) -> bool:
    step = simplify(index.substitute({r: r + 1}) - index)
    return step.op is Ops.CONST and step.arg == 1


def _steps_by_one(index: UOp, r: UOp, run: int = RUN) -> bool:
    """Whether index(r + e) == index(r) + e for 0 <= e < `run` wherever r is a multiple of `run` (r's end a constant
    `run` divides): a unit stride, or one proven at every run's start (a head-merged operand: (k // 32) * 4096 +
    k % 32 steps by one inside every aligned run of 4, or of a tensor-core tile's chunk of 8)."""
    if _unit_stride(index, r):
        return True
    count = r.src[0].arg // run
    if count > MAX_CHECKED_RUNS:
        return False
    q = UOp.variable("pj_run", 0, count - 1)
    for e in range(1, run):
        delta = simplify(index.substitute({r: q * run + e}) - index.substitute({r: q * run}))
        if any(x.op is Ops.RANGE for x in delta.toposort()) or {v.arg[0] for v in delta.variables()} - {"pj_run"}:
            return False
        code = compile(render_python(delta), "<run>", "eval")
        if any(eval(code, {"math": math}, {"v": {"pj_run": at}}) != e for at in range(count)):
            return False
    return True


def _runs_ok(operand: UOp, r: UOp) -> bool:
    """Whether every load of `operand` along range `r` (one at least) reads runs of RUN consecutive elements."""
    loads = _loads_along(operand, r)
    return bool(loads) and all(_steps_by_one(ld.src[1], r) for ld in loads)


def _static_multiple(r: UOp, n: int) -> bool:
    end = r.src[0]
    return end.op is Ops.CONST and end.arg % n == 0


def _run_axis(operand: UOp, k: UOp, own: tuple) -> str | None:
    """Along which axis the work-items load runs of RUN elements of `operand`: "k", "own" (its row or column
    ranges' last), or None (single elements). A run must stay inside its range (a static end RUN divides)."""
    if _static_multiple(k, RUN) and _runs_ok(operand, k):
        return "k"
    if _static_multiple(own[-1], RUN) and _runs_ok(operand, own[-1]):
        return "own"
    return None


def _operands(c: Contraction):
    """(name, operand, its own ranges, its tile side, the axis its runs go along or None, the run length) of a and
    b; runs only where the group's work-items take the same number of them."""
    for name, operand, own, width in (("A", c.a, c.i, c.tm), ("B", c.b, c.j, c.tn)):
        axis = _run_axis(operand, c.k, own)
        if axis is not None and width * TILE_K // RUN % c.threads:
            axis = None
        yield name, operand, own, width, axis, 1 if axis is None else RUN


def _slot_place(c: Contraction, n: int, width: int, axis: str | None, per: int) -> tuple[str, str]:
    """(k offset in the slice, offset along the operand's own axis) of a work-item's register n of an operand."""
    slot = f"(lid + {n * c.threads})"
    if axis == "own":   # runs along the operand's own axis: consecutive slots go along it
        return f"{slot} / {width // per}", f"{slot} % {width // per} * {per}"
    return f"{slot} % {TILE_K // per} * {per}", f"{slot} / {TILE_K // per}"   # along k (or single elements)


def emit_loads(r, c: Contraction, regs: dict, k0: str):
    """Load the slice at k0 of both operands into the registers `regs` (name -> list of register names)."""
    long, kk_end = r.long, r.value(c.k.src[0])
    for name, operand, own, width, axis, per in _operands(c):
        extent = r.value(_extent(own))
        origin = "i0" if name == "A" else "j0"
        for n, reg in enumerate(regs[name]):
            lk, lo = _slot_place(c, n, width, axis, per)
            r.open_block("", {})
            r.emit(f"const {long} gk = {k0} + {lk}, go = {origin} + {lo};")
            r.emit(" ".join(f"{reg}[{e}] = 0.0f;" for e in range(per)))
            r.open_block(f"if (gk < {kk_end} && go < {extent})", {c.k: "gk", **r.unflatten("go", list(own))})
            bound = own[-1] if axis == "own" else c.k
            base = r.scopes[-1][bound]
            # an index that is no unit stride at the run's start, once: element e reads it + e (_steps_by_one proved
            # it; unit strides the compiler sees through, and merges the loads)
            starts = {ld.src[1]: r.value(ld.src[1]) for ld in _loads_along(operand, bound)
                      if not _unit_stride(ld.src[1], bound)} if per > 1 else {}
            for e in range(per):
                r.open_block("", {bound: f"({base} + {e})", **{i: f"({v} + {e})" for i, v in starts.items()}}
                             if per > 1 else {})
                r.emit(f"{reg}[{e}] = {r.value(operand)};")
                r.close_block()
            r.close_block()
            r.close_block()


def emit_stores(r, c: Contraction, regs: dict, stage: str | None = None):
    """Write the registers loaded by `emit_loads` into the local tiles As[k][row] and Bs[k][column] (of `stage`
    where they have several: As[stage][k][row])."""
    def cell(name, k, own):
        return f"{name}s[{k}][{own}]" if stage is None else f"{name}s[{stage}][{k}][{own}]"
    for name, operand, own, width, axis, per in _operands(c):
        for n, reg in enumerate(regs[name]):
            lk, lo = _slot_place(c, n, width, axis, per)
            if axis == "own":
                r.emit(" ".join(f"{cell(name, lk, f'{lo} + {e}')} = {reg}[{e}];" for e in range(per)))
            else:
                r.emit(" ".join(f"{cell(name, f'{lk} + {e}', lo)} = {reg}[{e}];" for e in range(per)))


def emit_tile_start(r, c: Contraction, element: str, stages: int = 1) -> tuple[str, str, str, dict]:
    """The part every tiled kernel begins with: the local tiles As and Bs (of C type `element`; As[k][row] and
    Bs[k][column], As[stage][k][row] where `stages` is more than one), the work-item's and the group's ids (lid,
    own, part, tx, ty, bid, i0, j0; the batch ranges bound) and the registers the slices are loaded into (of type
    `element` too); returns (m, n, k's end, {operand name: its registers})."""
    d, long = r.d, r.long
    m, n, kk_end = r.value(_extent(c.i)), r.value(_extent(c.j)), r.value(c.k.src[0])
    sx = c.tn // REG                  # work-items along a tile's columns
    for name, width in (("As", c.tm), ("Bs", c.tn)):
        # rows padded by one 4-vector: 16-byte aligned rows, and a run along k stores to banks 4 apart
        shape = f"{stages}][{TILE_K}][{width + RUN}" if stages > 1 else f"{TILE_K}][{width + RUN}"
        r.locals.append(d.local_array.format(type=element, name=name, n=shape) + ";")
    r.emit(f"const int lid = {d.local_id};")
    r.emit(f"const int own = lid % {c.owners}, part = lid / {c.owners};")   # part: which share of each slice
    r.emit(f"const int tx = own % {sx} * {RUN}, ty = own / {sx} * {RUN};")
    r.emit(f"const {long} bid = {d.group_id};")
    r.emit(f"const {long} nbn = ({n} + {c.tn - 1}) / {c.tn}, nbm = ({m} + {c.tm - 1}) / {c.tm};")
    r.emit(f"const {long} i0 = (bid / nbn) % nbm * {c.tm}, j0 = bid % nbn * {c.tn};")
    if c.batch:
        r.scopes[-1].update(r.unflatten("(bid / (nbn * nbm))", list(c.batch)))
    regs = {}
    for name, operand, own, width, axis, per in _operands(c):
        r.aligned |= per > 1   # (a run's first element is RUN-aligned: the compiler may merge its loads)
        regs[name] = [f"p{name}{x}" for x in range(width * TILE_K // (per * c.threads))]
        r.emit(" ".join(f"{element} {reg}[{per}];" for reg in regs[name]))
    return m, n, kk_end, regs


def emit_contraction(r, c: Contraction):
    """The kernel body, emitted through the C-style renderer `r` (its dialect spells ids, locals, barriers). The next
    slice is loaded into registers during the arithmetic; with SIMT_STAGES 2 the local tiles hold two copies of a
    slice, and the registers are stored into the one the arithmetic does not read, after it, so one barrier a slice
    orders the copies (a copy is stored only after the barrier that ends the arithmetic reading it); the loop takes
    two slices a step, one from each copy, so every local address is the same each step (a copy chosen at run time
    cost ~30 instructions a slice of 128 x 128's 1024 FMAs, nvcc 13 sm_90a). With 1, the registers are stored into
    the one copy between two barriers."""
    d, long, acc_t = r.d, r.long, r.d.ctype(dtypes.float32)
    stages = SIMT_STAGES
    r.resident_groups = SIMT_RESIDENT_GROUPS
    m, n, kk_end, regs = emit_tile_start(r, c, acc_t, stages)
    accs = [[f"acc{x}_{y}" for y in range(REG)] for x in range(REG)]
    for row in accs:
        r.emit(" ".join(f"{acc_t} {a} = 0.0f;" for a in row))
    emit_loads(r, c, regs, "0")
    if stages == 1:
        r.open_block(f"for ({long} k0 = 0; k0 < {kk_end}; k0 += {TILE_K})", {})
        emit_stores(r, c, regs)
        r.emit(d.barrier)
        _emit_slice(r, c, regs, accs, "k0", None)
        r.emit(d.barrier)
        r.close_block()
    else:
        emit_stores(r, c, regs, "0")
        r.emit(d.barrier)
        r.open_block(f"for ({long} k0 = 0; k0 < {kk_end}; k0 += {2 * TILE_K})", {})
        _emit_slice(r, c, regs, accs, "k0", 0)
        r.open_block(f"if (k0 + {TILE_K} < {kk_end})", {})
        _emit_slice(r, c, regs, accs, f"(k0 + {TILE_K})", 1)
        r.close_block()
        r.close_block()
    if c.splits > 1:
        _combine_parts(r, c, accs)
        r.open_block("if (part == 0)", {})
        _emit_results(r, c, accs, m, n)
        r.close_block()
        return
    _emit_results(r, c, accs, m, n)


def _emit_slice(r, c: Contraction, regs: dict, accs: list, k0: str, copy: int | None):
    """One slice's arithmetic from the local tiles (their copy `copy`, or the only one: None), the next slice's
    loads in flight during it; with a copy, the loaded registers then stored into the other copy, and a barrier."""
    d, fma, kk_end = r.d, r.d.math("fma", dtypes.float32), r.value(c.k.src[0])
    r.open_block(f"if ({k0} + {TILE_K} < {kk_end})", {})   # the next slice's loads, in flight during the arithmetic
    emit_loads(r, c, regs, f"({k0} + {TILE_K})")
    r.close_block()
    share = TILE_K // c.splits
    r.emit("#pragma unroll")
    r.open_block(f"for (int q = 0; q < {share}; q++)", {})
    r.emit(f"const int kk = part * {share} + q;")
    vec, at = d.vector4_load, "" if copy is None else f"[{copy}]"
    r.emit(f"const float4 a_lo = {vec.format(ref=f'As{at}[kk][ty]')}, "
           f"a_hi = {vec.format(ref=f'As{at}[kk][ty + {c.tm // 2}]')};")
    r.emit(f"const float4 b_lo = {vec.format(ref=f'Bs{at}[kk][tx]')}, "
           f"b_hi = {vec.format(ref=f'Bs{at}[kk][tx + {c.tn // 2}]')};")
    parts = [f"{v}.{comp}" for v in ("lo", "hi") for comp in "xyzw"]
    for x in range(REG):
        r.emit(" ".join(f"{accs[x][y]} = {fma}(a_{parts[x]}, b_{parts[y]}, {accs[x][y]});" for y in range(REG)))
    r.close_block()
    if copy is not None:   # (the other copy: every work-item's reads of it ended at the last barrier)
        r.open_block(f"if ({k0} + {TILE_K} < {kk_end})", {})
        emit_stores(r, c, regs, str(1 - copy))
        r.close_block()
        r.emit(d.barrier)


def _combine_parts(r, c: Contraction, accs: list):
    """Add the other sets' accumulators into set 0's, one set at a time through local memory (every work-item reaches
    every barrier)."""
    d, acc_t = r.d, r.d.ctype(dtypes.float32)
    r.locals.append(d.local_array.format(type=acc_t, name="Cs", n=f"{c.tm}][{c.tn}") + ";")
    cells = [(x, y, f"Cs[ty + {x % RUN + (c.tm // 2 if x >= RUN else 0)}][tx + {y % RUN + (c.tn // 2 if y >= RUN else 0)}]")
             for x in range(REG) for y in range(REG)]
    for other in range(1, c.splits):
        r.open_block(f"if (part == {other})", {})
        for x in range(REG):
            r.emit(" ".join(f"{cell} = {accs[x][y]};" for xx, y, cell in cells if xx == x))
        r.close_block()
        r.emit(d.barrier)
        r.open_block("if (part == 0)", {})
        for x in range(REG):
            r.emit(" ".join(f"{accs[x][y]} += {cell};" for xx, y, cell in cells if xx == x))
        r.close_block()
        r.emit(d.barrier)


def _emit_results(r, c: Contraction, accs: list, m: str, n: str):
    """Store the work-item's outputs: per row, two runs of RUN columns (bound as consecutive columns where the last
    column range's static end RUN divides, so the run is wholly in range or out, else checked one by one)."""
    store, long = r.ast.src[0], r.long
    runs = _static_multiple(c.j[-1], RUN)
    for x in range(REG):
        row = f"i0 + ty + {x % RUN + (c.tm // 2 if x >= RUN else 0)}"
        for half in range(2):
            col = f"j0 + tx + {c.tn // 2 * half}"
            cols = range(half * RUN, half * RUN + RUN)
            if runs:
                r.open_block(f"if ({row} < {m} && {col} < {n})", {})
                r.emit(f"const {long} oi = {row}, oj = {col};")
                r.scopes[-1].update({**r.unflatten("oi", list(c.i)), **r.unflatten("oj", list(c.j))})
                base = r.scopes[-1][c.j[-1]]
                for e, y in enumerate(cols):
                    r.open_block("", {c.j[-1]: f"({base} + {e})", c.reduce: accs[x][y]})
                    r.emit(r.store_line(store))
                    r.close_block()
                r.close_block()
                continue
            for e, y in enumerate(cols):
                r.open_block(f"if ({row} < {m} && {col} + {e} < {n})", {})
                r.emit(f"const {long} oi = {row}, oj = {col} + {e};")
                r.scopes[-1].update({**r.unflatten("oi", list(c.i)), **r.unflatten("oj", list(c.j)),
                                     c.reduce: accs[x][y]})
                r.emit(r.store_line(store))
                r.close_block()
