"""Rendering row kernels (row_plan.py decides which kernels are, and their `Rows`) through the C-style renderers
(render_c.py calls `emit_rows` for the kernel body and `reduce_together` for each of the row's reductions).

The group's work-items split each of the row's reductions (work-item `lid` takes iterations lid, lid + group,
..., or runs of consecutive ones where the dialect takes several items at a time), combine the partials so that
every work-item holds the row's value (warp shuffles where the dialect has them, then one barrier and the
warps' partials read from local memory in a fixed order; a local-memory tree otherwise), and then store the
row's columns a work-group's width apart. A reduction with no columns is a row of one output (work-item 0
stores it). A pass that each work-item makes at most UNROLLED_PASSES times (a static row) is straight-line code, not
a loop: the compiler issues its loads together, and where the passes share the columns' range (row_plan.share_passes:
a run a work-item, or a few a lane of a row of a warp), keeps the row's values in registers from one pass to the next.
The row's values that no column gives (a layernorm's mean and 1 / sqrt(variance + eps)) are computed once, before
the passes over its elements (render_row_values.py, which also renders a shared row's elements).

A matvec-shaped kernel's warps (a warp per output) combine their lanes by shuffles only. A reduction no output
depends on (a fused norm's mean of squares: uniform) is computed by the whole work-group of a kernel packing several
rows, once (its warps' partials combined through local memory after one barrier, in a fixed order, so every
work-group has the same value), before the warps past the last row leave. So are a matvec's operand parts that no
output depends on and that compute something (the normalised row, SiLU(gate) * up): into a local array of the row's
length (up to SHARED_OPERAND_BYTES in all; a warp's runs side by side, `_operand_at`), which every warp then reads,
after one more barrier.

A kernel with column reductions (a softmax's p @ V over its row's max and sum: softmax_contraction.py) computes the
parts of the row's reductions' operands that hold a reduction of their own (the scores) once into local memory, the
row's reductions over them, the column reductions' operand parts no column depends on (the probabilities) once into
local memory too (rows of at most SOFTMAX_ROW_MAX), then each column reduction's partials, the group's work-items
taking a run of columns and a slice of the range each (a warp's slices added by shuffles first where the dialect has
them), added in slice order where the columns are stored. Where the work-group computes several rows along a range
(row_plan.Rows.fold: a KV head's query heads), each phase runs for every row in turn at each element, the loads no
row reads made once (render_row_fold.py), the rows' reductions combined side by side (`combine_rows`).

Reductions nested in a row's reduction that depend on its range are computed inline by each work-item, so no barrier
is ever inside a loop whose trip count differs between work-items.
"""
from __future__ import annotations

import itertools
import math

from ..uop import DType, Ops, UOp, dtypes, sym_prod
from ..uop.uop import as_uop
from .render_row_fold import array_at, declare, each_row, folds, render_shared, row_scopes
from .render_row_values import CHEAP, bind_elements, largest_parts, reduce_elements, row_values, store_elements
from .render_softmax_rows import fill_by_teams, loop_over, one_sum, score_team, sums_together
from .row_plan import SHARED_OPERAND_BYTES, WARP, Rows, free_ranges, run_length, shuffles, warp_slices
from .softmax_contraction import SOFTMAX_ROW_MAX

UNROLLED_PASSES = 8       # a static row of at most this many runs per work-item is straight-line code, not a loop
POSITIONS_IN_FLIGHT = 8   # positions of a column reduction's slice a work-item loads at once (straight-line code)


def emit_rows(r, store: UOp):
    """The kernel body, emitted through the C-style renderer `r`: the row's reductions together (every work-item
    reaches every barrier), then its columns (or, with none, the one output, stored by work-item 0)."""
    rows = r.rows
    count = as_uop(sym_prod(x.src[0] for x in rows.rows))
    if rows.pack > 1:   # a warp per row: the warp's lane is the row's work-item
        r.emit(f"const int tid = {r.d.local_id};")
        r.emit(f"const {r.long} gid = {r.d.group_id} * {rows.pack} + tid / {WARP};")
        r.emit(f"const int lid = tid & {WARP - 1};")   # (not tid % WARP: NVRTC then merged no 16-byte loads)
    else:
        r.emit(f"const {r.long} gid = {r.d.group_id};")
        r.emit(f"const int lid = {r.d.local_id};")
    r.scopes[-1].update(r.unflatten("gid", [x for x in rows.rows if x is not rows.fold]))
    if rows.shared:   # a work-item's runs, all passes: each element's scope lives on from pass to pass
        bind_elements(r, _first("lid", run_length(list(rows.cols), rows.run)))
    uniform = [u for u in rows.order if rows.uniform(u)]
    for u in uniform:   # the whole group's, before any warp leaves (their combines have a barrier)
        r.value(u)
    if rows.pack > 1 and not rows.cols:
        _shared_operands(r, [u for u in rows.order if u not in uniform])
    if rows.pack > 1:   # a warp past the last row leaves
        r.emit(f"if (gid >= {r.value(count)}) return;")
    scopes = row_scopes(r)   # (the rows of a fold, each in its own scope; else the row's)
    r.resident_groups = rows.resident_groups
    if rows.columns:   # the scores the row's reductions read, once into local memory
        _row_arrays(r, rows.order, rows.order, scopes)
    for u in rows.order:
        _reduce_rows(r, u, scopes)
    if rows.columns:   # the probabilities the column reductions read, then their partials
        _row_arrays(r, rows.columns, (), scopes)
        for u in rows.columns:
            _column_partials(r, u, scopes)
    if rows.cols:
        row_values(r, store.src[2])
    if rows.shared:
        store_elements(r, store)
        return
    if not rows.cols:
        line = r.store_line(store)
        r.emit(f"if (lid == 0) {line}")
        return
    cols = list(rows.cols)
    per = 1 if rows.columns else run_length(cols, rows.run)   # (a column's total reads a partial a slice: one a lane)

    def each_store():
        render_shared(r, store.src[2])
        each_row(r, scopes, lambda: r.emit(r.store_line(store)))
    _each_pass(r, "c", as_uop(sym_prod(c.src[0] for c in cols)), per, ("lid", rows.group),
               lambda: r.consecutive("c", cols, per, each_store))


def _row_arrays(r, reduces, pending, scopes):
    """Compute once per row into local memory (one array a value, a work-group's work-items splitting its elements)
    the parts of each reduction's operand that no column depends on (`_row_parts`), over ranges of at most
    SOFTMAX_ROW_MAX elements; the reductions then read them there (`row_operands`). A part another array holds over
    the same ranges is that array; a part reading one reads it there. One barrier after them. With a fold, each row
    of `scopes` (render_row_fold.py) at each element in turn."""
    known = {(_canonical(x), tuple(u.src[1:])): name for u, pairs in r.row_operands.items()
             if u not in r.rows.columns for x, name in pairs}
    made = False
    for u in reduces:
        ranges = tuple(u.src[1:])
        if math.prod(x.src[0].vmax for x in ranges) > SOFTMAX_ROW_MAX:
            continue
        held = r.row_operands.setdefault(u, [])
        for x in _row_parts(u, r.rows, pending):
            key = (_canonical(x), ranges)
            if key not in known:
                known[key] = _row_array(r, x, ranges, {k: n for (k, rs), n in known.items() if rs == ranges}, scopes)
                made = True
            held.append((x, known[key]))
    if made:
        r.emit(r.d.barrier)


def _canonical(x: UOp) -> UOp:
    """`x` with the ranges its reductions bind renumbered in the order they appear: two copies of one value whose
    reductions were lowered with ranges of their own (a softmax row's scores read by its max, its sum and its
    probabilities) are then one node."""
    bound = list(dict.fromkeys(r for y in x.toposort() if y.op is Ops.REDUCE for r in y.src[1:]))
    return x.substitute({r: UOp(Ops.RANGE, r.dtype, r.src, (-1 - k, r.arg[1])) for k, r in enumerate(bound)})


def _row_parts(u: UOp, rows: Rows, pending) -> list[UOp]:
    """The largest float parts of reduction `u`'s operand that no column depends on and that read none of the
    `pending` reductions (not computed yet): with pending ones, those that hold a reduction of their own (a softmax
    row's scores), else those that compute something (its probabilities)."""
    cols = set(rows.cols)

    def part(x: UOp) -> bool:
        inside = x.toposort()
        wanted = any(y.op is Ops.REDUCE for y in inside) if pending else any(
            y.dtype.is_float and y.op not in CHEAP for y in inside)
        return x.dtype.is_float and x not in rows.reduces and wanted and not free_ranges(x) & cols and not any(
            v in inside for v in pending)
    return largest_parts(u.src[0], part, skip=rows.reduces)   # (the row's reductions: values it computes)


def _row_array(r, x: UOp, ranges: tuple, arrays: dict, scopes) -> str:
    """Store `x` at each flat index of `ranges` (a symbolic count too) into a local array of their largest count, the
    row's work-items splitting them, reading the `arrays` over the same ranges (value -> name) there, and the parts of
    its own reductions' operands that only the row and their range give (`_nested_arrays`); its name. A value
    computing one sum of its own (a score's dot product) is filled by teams of lanes where the dialect shuffles
    (render_softmax_rows.py); elsewhere, a fold's rows' sums in one loop of a work-item a position."""
    nested = _nested_reductions(r, x, arrays)
    team = score_team(r, nested)
    _nested_arrays(r, x, arrays, scopes)
    name, flat = f"row{r.n}", f"h{r.n}"
    r.n += 1
    declare(r, x, r.d.ctype(x.dtype), name, math.prod(y.src[0].vmax for y in ranges))
    held = {y: arrays[_canonical(y)] for y in x.toposort() if y is not x and y.op is not Ops.REDUCE and
            y.dtype.is_float and _canonical(y) in arrays}

    def at_position():
        r.scopes[-1].update({y: array_at(r, y, n, flat) for y, n in held.items()})
    rows = scopes if folds(r, x) else [None]
    if team is not None:
        fill_by_teams(r, x, team, ranges, name, flat, at_position, rows)
        return name

    def store():
        at_position()
        r.emit(f"{array_at(r, x, name, flat)} = {r.value(x)};")

    def body():
        render_shared(r, x, held)
        each_row(r, rows, store)
    n = one_sum(nested) if len(rows) > 1 else None   # (a fold's rows' sums in one loop: its loads made once)
    if n is not None:
        body = lambda: sums_together(r, x, n, name, flat, at_position, rows, 1, loop_over(r, n))   # noqa: E731
    _each_pass(r, flat, as_uop(sym_prod(y.src[0] for y in ranges)), 1, ("lid", r.rows.group),
               lambda: r.consecutive(flat, list(ranges), 1, body))
    return name


def _nested_reductions(r, x: UOp, arrays: dict) -> list[UOp]:
    """The reductions of one range (of at most SOFTMAX_ROW_MAX) `x` computes where it is rendered: not the row's
    (computed before) nor those inside the parts the `arrays` (canonical value -> name) hold."""
    found, seen, stack = [], set(), [x]
    while stack:
        y = stack.pop()
        if y in seen or y in r.rows.reduces or y is not x and y.op is not Ops.REDUCE and _canonical(y) in arrays:
            continue
        seen.add(y)
        if y.op is Ops.REDUCE and len(y.src) == 2 and y not in r.row_operands and \
                y.src[1].src[0].vmax <= SOFTMAX_ROW_MAX:
            found.append(y)
        stack.extend(y.src)
    return found


def _nested_arrays(r, x: UOp, arrays: dict, scopes):
    """Hold in local memory, once per row, the computed float parts of the operand of each reduction of one range `x`
    computes (`_nested_reductions`) that no range but the row's and that one gives (a query head's rotated row, read
    at each position's dot product); the reduction's loop reads them there (render_softmax_rows.held_in_loop). One
    barrier after them."""
    made = False
    for n in _nested_reductions(r, x, arrays):
        mine = set(r.rows.rows) | {n.src[1]}

        def part(y: UOp, n=n, mine=mine) -> bool:
            free, inside = free_ranges(y), y.toposort()
            return y.dtype.is_float and n.src[1] in free and free <= mine and any(
                z.dtype.is_float and z.op not in CHEAP for z in inside) and r.rows.reduces.isdisjoint(inside)
        found = largest_parts(n.src[0], part)[::-1]
        r.row_operands[n] = [(y, _row_array(r, y, (n.src[1],), {}, scopes)) for y in found]
        made = made or bool(found)
    if made:
        r.emit(r.d.barrier)


def _column_partials(r, u: UOp, scopes):
    """The column reduction `u`'s partials: the row's work-items each take a run of columns and a slice of `u`'s range
    (every `slices`-th index), reading the row's arrays there, into a local array of a row of partials a slice
    (where a warp's lanes take neighbouring slices, row_plan.warp_slices, their partials added by shuffles first: a
    row a warp's slices); one barrier. `_column_total` adds a column's partials in slice order. A work-item takes
    POSITIONS_IN_FLIGHT of its slice's positions a step as straight-line code, those past the row reading its last
    position and adding nothing (a select, no branch): every position's loads first (`_position_loads`), then the
    sums, the kernel bounded to one resident work-group (`loads_in_flight`: ptxas keeps their registers; a fold's to
    Rows.resident_groups), so the loads are in flight together. A loop of one position a step (LLVM unrolls it with
    an exit before each copy) waited out a memory round trip a position (9 at 257 positions, 16 at 512; now 2). With
    a fold, each position's loads are made once and each row of `scopes` adds its products to sums of its own."""
    rows, ranges, cols = r.rows, list(u.src[1:]), list(r.rows.cols)
    per = run_length(cols, rows.run)
    width = rows.column_runs * per
    name, acc, flat = f"cp{r.n}", f"ca{r.n}_", f"ft{r.n}"
    r.n += 1
    dt = u.dtype.compute
    merged = warp_slices(rows, r.d.shuffle_xor is not None)
    declare(r, u, r.d.ctype(dt), name, rows.slices // merged * width)
    held = dict(r.row_operands.get(u, []))
    r.open_block(f"if (lid < {rows.slices * rows.column_runs})", {})
    r.emit(f"const int cj = lid / {rows.column_runs};")
    r.emit(f"const {r.long} cc = (lid % {rows.column_runs}) * {per};")
    accs = [[f"{acc}{e}" if len(scopes) == 1 else f"{acc}{j}_{e}" for e in range(per)] for j in range(len(scopes))]
    for names in accs:
        for a in names:
            r.emit(f"{r.d.ctype(dt)} {a} = {r.d.literal(0, dt)};")   # (a sum: row_plan._hoisted)
    count = r.value(as_uop(sym_prod(x.src[0] for x in ranges)))
    base = f"fb{r.n}"
    r.loads_in_flight = True
    r.open_block(f"for ({r.long} {base} = cj; {base} < {count}; {base} += {rows.slices * POSITIONS_IN_FLIGHT})", {})
    loaded, made = {}, {}   # (position k, element e, load) -> the variable holding it; those assigned so far

    def position(k: int, body):
        """`body(e)` for each element of the run at the work-item's k-th position of this step (past the row: its
        last), in a C block of its own, the ranges bound there and the loads made before."""
        r.open_block("", {})
        at = f"{base} + {k * rows.slices}" if k else base
        r.emit(f"const {r.long} {flat} = {f'{at} < {count} ? {at} : {count} - 1' if k else at};")
        r.scopes[-1].update(r.unflatten(flat, ranges))

        def element(e: int):
            r.scopes[-1].update({x: v for (kk, ee, x), v in made.items() if (kk, ee) == (k, e)})
            body(e, at)
        r.consecutive("cc", cols, per, by_element(per, element))
        r.close_block()

    for wave in _position_loads(u.src[0], set(ranges), {*held, *rows.reduces}):   # (every position's, a wave a time)
        for k in range(POSITIONS_IN_FLIGHT):
            for e in range(per):
                for x in wave:
                    loaded[k, e, x] = f"pl{r.n}_{k}_{e}_{len(loaded)}"
                    r.emit(f"{r.d.ctype(x.dtype)} {loaded[k, e, x]};")

        def load(e: int, at: str, k: int, wave=wave):
            for x in wave:
                r.emit(f"{loaded[k, e, x]} = {r.value(x)};")
        for k in range(POSITIONS_IN_FLIGHT):
            position(k, lambda e, at, k=k, load=load: load(e, at, k))
        made.update(loaded)
    r.n += 1

    def add(e: int, at: str, first: bool):
        render_shared(r, u.src[0], held)
        rows_left = iter(accs)

        def row():
            a = next(rows_left)[e]
            r.scopes[-1].update({x: array_at(r, x, n, flat) for x, n in held.items()})
            total = r.accumulate(u, a)
            r.emit(f"{a} = {total if first else f'{at} < {count} ? {total} : {a}'};")
        each_row(r, scopes, row)
    for k in range(POSITIONS_IN_FLIGHT):
        position(k, lambda e, at, k=k: add(e, at, not k))
    r.close_block()
    _store_partials(r, u, name, accs, merged, width, scopes)
    r.close_block()
    r.emit(r.d.barrier)
    r.row_operands[u] = [(u, name)]


def _store_partials(r, u: UOp, name: str, accs: list, merged: int, width: int, scopes):
    """Store each row's partials (`accs`: a row's, an element's) into the local array `name`, a row of them a slice:
    where `merged` neighbouring slices are a warp's (row_plan.warp_slices), added first by shuffles, pairwise (the
    lanes of slices xor 1, then of pairs xor 2, ...: `_column_total`'s order), their first slice's lane storing."""
    runs, dt = r.rows.column_runs, u.dtype.compute
    if merged > 1:
        o = runs
        while o < runs * merged:
            for names in accs:
                for a in names:
                    r.emit(f"{a} = {r.combine(u.arg, dt, a, r.let(dt, r.d.shuffle_xor.format(v=a, o=o)))};")
            o *= 2
        r.open_block(f"if (cj % {merged} == 0)", {})
    rows_left, slice_at = iter(accs), f"cj / {merged}" if merged > 1 else "cj"

    def row():
        for e, a in enumerate(next(rows_left)):
            r.emit(f"{array_at(r, u, name, f'{slice_at} * {width} + cc + {e}')} = {a};")
    each_row(r, scopes, row)
    if merged > 1:
        r.close_block()


def _position_loads(x: UOp, positions: set, held) -> list[list[UOp]]:
    """The loads `x` makes (not inside the `held` values: local arrays, the row's reductions) whose address reads the
    `positions` ranges, in waves: a load reading another's value (a value row through a block table's entry) a wave
    after it."""
    wave, ranges, seen = {}, {}, set()

    def visit(y: UOp):   # (operands first: a load's wave follows those of the loads its address reads)
        if y in seen or y in held:
            return
        seen.add(y)
        for z in y.src:
            visit(z)
        ranges[y] = {y} if y.op is Ops.RANGE else set().union(*(ranges.get(z, ()) for z in y.src))
        if y.op is Ops.LOAD and ranges[y] & positions:
            wave[y] = 1 + max((wave[z] for z in y.src[1].toposort() if z in wave), default=-1)
    visit(x)
    return [[y for y, w in wave.items() if w == level] for level in range(max(wave.values(), default=-1) + 1)]


def _column_total(r, u: UOp, acc: str) -> str:
    """Column reduction `u` at the columns bound in scope (and the row: a fold's): its partials (`_column_partials`)
    read together and added pairwise (neighbouring slices first, then those sums: a tree as deep as the slices'
    count's log, not a chain)."""
    rows, name = r.rows, r.row_operands[u][0][1]
    flat = "0"
    for c in rows.cols:
        flat = f"({flat}) * {c.src[0].arg} + {r.value(c)}"
    width = rows.column_runs * run_length(list(rows.cols), rows.run)
    at = r.let(dtypes.int32, flat, "col")
    dt = u.dtype.compute
    stored = rows.slices // warp_slices(rows, r.d.shuffle_xor is not None)   # (rows of partials: _store_partials)
    sums = [r.let(dt, array_at(r, u, name, f"{j * width} + {at}" if j else at), "cs") for j in range(stored)]
    while len(sums) > 1:
        sums = [r.combine(u.arg, dt, a, b) for a, b in zip(sums[::2], sums[1::2])] + sums[len(sums) & ~1:]
    r.emit(f"{acc} = {sums[0]};")
    return acc


def _operands(u: UOp) -> list[UOp]:
    """The largest computed parts of the row reduction `u`'s operand that no row depends on (a normalised row,
    SiLU(gate) * up): values of its range alone, each the same for every output."""
    mine = set(u.src[1:])

    def part(x: UOp) -> bool:
        free = free_ranges(x)
        return bool(free) and free <= mine and x.dtype.is_float and any(
            y.dtype.is_float and y.op not in CHEAP for y in x.toposort())
    return largest_parts(u.src[0], part)


def _shared_operands(r, reduces: list[UOp]):
    """Compute once per work-group, into local memory, each row reduction's operands that no row depends on
    (`_operands`; static ranges, SHARED_OPERAND_BYTES in all), which every warp then reads (one barrier),
    instead of each warp computing them again at each element."""
    room = SHARED_OPERAND_BYTES
    for u in reduces:
        ranges = list(u.src[1:])
        count = math.prod(x.src[0].vmax for x in ranges)
        operands = _operands(u)
        size = count * sum(x.dtype.itemsize for x in operands)
        if not all(x.src[0].op is Ops.CONST for x in ranges) or size > room:
            continue
        room -= size
        r.row_operands[u] = [(x, _shared_operand(r, x, ranges, count)) for x in operands]
    if any(r.row_operands.values()):
        r.emit(r.d.barrier)


def _shared_operand(r, x: UOp, ranges: list[UOp], count: int) -> str:
    """Store the value `x` at each of the `count` flat indices of `ranges` into a local array, the work-group's
    work-items splitting them; returns the array's name."""
    name, flat, per = f"op{r.n}", f"g{r.n}", run_length(ranges, r.rows.run)
    r.n += 1
    span = WARP * per if per > 1 else 1   # (`_operand_at` places whole spans of a warp's runs)
    r.locals.append(r.d.local_array.format(type=r.d.ctype(x.dtype), name=name, n=-(-count // span) * span) + ";")
    store = by_element(per, lambda e: r.emit(f"{name}[{_operand_at(flat, e, per)}] = {r.value(x)};"))
    _each_pass(r, flat, as_uop(count), per, ("tid", r.rows.size), lambda: r.consecutive(flat, ranges, per, store))
    return name


def _operand_at(flat: str, e: int, per: int) -> str:
    """Where element `e` of the run of `per` at flat index `flat` (a multiple of `per`) of a shared operand lies in
    its local array: element e of a warp's 32 runs side by side, e + 1 a warp's width on, so that a warp's load of
    one element of each lane's run reads one contiguous span, no two lanes in one bank (as runs lie in the row, a
    quantized matvec's 16 floats put 16 lanes in each bank at every load, bfloat16's 8 put 8)."""
    if per == 1:
        return f"{flat} + {e}"
    span = WARP * per
    return f"{flat} / {span} * {span} + {flat} / {per} % {WARP} + {e * WARP}"


def by_element(per: int, body):
    """A `consecutive` body that passes `body` the element's place in its run (consecutive emits it in that order)."""
    calls = itertools.count()
    return lambda: body(next(calls) % per)


def _first(lid: str, per: int) -> str:
    return lid if per == 1 else f"{lid} * {per}"


def _each_pass(r, flat: str, count: UOp, per: int, team: tuple[str, int], body):
    """Emit `body` for each of the work-item's runs (of `per`) of a row's `count` flat indices, split over the `team`
    (the work-item id's name, how many: a row's or the whole group's): straight-line code where the count is static
    and each work-item takes at most UNROLLED_PASSES runs (the compiler issues their loads together; with one run it
    keeps the row in registers across the passes and merges a run's loads), else a loop."""
    lid, group = team
    step = group * per
    if count.op is not Ops.CONST or count.arg > step * UNROLLED_PASSES:
        end = r.value(count)   # (a symbolic count's lines come before the pragma)
        r.emit("#pragma unroll 4" if per == 1 else "#pragma unroll 2")
        r.open_block(f"for ({r.long} {flat} = {_first(lid, per)}; {flat} < {end}; {flat} += {step})", {})
        body()
        r.close_block()
        return
    for p in range(-(-count.arg // step)):
        r.open_block("", {})
        r.emit(f"const {r.long} {flat} = {_first(lid, per)}{f' + {p * step}' if p else ''};")
        guarded = (p + 1) * step > count.arg
        if guarded:
            r.open_block(f"if ({flat} < {r.value(count)})", {})
        body()
        if guarded:
            r.close_block()
        r.close_block()


def reduce_together(r, u: UOp, acc: str) -> str:
    """The row's reduction `u` split over its team (the row's work-items, or a uniform one's: the group's) into
    `acc` (declared), combined; returns the result."""
    if u in r.rows.columns:
        return _column_total(r, u, acc)
    dt, ranges = u.dtype, list(u.src[1:])
    team = r.rows.team(u)
    row_values(r, u.src[0], {x for x, _ in r.row_operands.get(u, [])})
    if r.rows.shared:
        reduce_elements(r, u, acc)
        return combine_group(r, u.arg, dt, acc, team)
    flat, per = f"f{r.n}", run_length(ranges, r.rows.run)
    held = r.row_operands.get(u, [])   # (computed once: with rows packed, by _shared_operands, else _row_arrays)
    packed = r.rows.pack > 1

    def element(e: int):
        r.scopes[-1].update({x: array_at(r, x, name, _operand_at(flat, e, per) if packed else f"{flat} + {e}")
                             for x, name in held})
        r.emit(f"{acc} = {r.accumulate(u, acc)};")
    _each_pass(r, flat, as_uop(sym_prod(x.src[0] for x in ranges)), per, team,
               lambda: r.consecutive(flat, ranges, per, by_element(per, element)))
    return combine_group(r, u.arg, dt, acc, team)


def _reduce_rows(r, u: UOp, scopes: list):
    """The row reduction `u` of each row of `scopes` (a fold's: render_row_fold.py; else as `r.value` computes it):
    as reduce_together computes each alone, each row's terms in the same order, but together: one pass over the
    range for every row (the parts no row reads loaded once) and the rows' combines side by side (`combine_rows`:
    one barrier for all); each row's value bound in its scope."""
    if len(scopes) == 1:
        each_row(r, scopes, lambda: r.value(u), block=False)
        return
    from .render_c import _identity   # (render_c renders through this module)
    dt, ranges, team = u.dtype, list(u.src[1:]), r.rows.team(u)
    accs = [f"acc{r.n + k}" for k in range(len(scopes))]
    r.n += len(scopes)
    for acc in accs:
        r.emit(f"{r.d.ctype(dt)} {acc} = {r.d.literal(_identity(u.arg, dt), dt)};")
    flat, per = f"f{r.n}", run_length(ranges, r.rows.run)
    held = r.row_operands.get(u, [])

    def element(e: int):
        render_shared(r, u.src[0], {x for x, _ in held})
        rows_left = iter(accs)

        def row():
            acc = next(rows_left)
            r.scopes[-1].update({x: array_at(r, x, name, f"{flat} + {e}") for x, name in held})
            r.emit(f"{acc} = {r.accumulate(u, acc)};")
        each_row(r, scopes, row)
    _each_pass(r, flat, as_uop(sym_prod(x.src[0] for x in ranges)), per, team,
               lambda: r.consecutive(flat, ranges, per, by_element(per, element)))
    for scope, red in zip(scopes, combine_rows(r, u.arg, dt, accs, team)):
        scope[u] = r.round_to(red, dt) if dt.narrow else red


def combine_group(r, op: Ops, dt: DType, acc: str, team: tuple[str, int]) -> str:
    """Combine the team's partial accumulators; every work-item gets the result (in the same order)."""
    return combine_rows(r, op, dt, [acc], team)[0]


def combine_rows(r, op: Ops, dt: DType, accs: list[str], team: tuple[str, int]) -> list[str]:
    """`combine_group` for each row's accumulator of `accs` (a fold's rows: render_row_fold.py), each combined as
    alone, the rows' steps side by side, their barriers shared."""
    (lid, group), n = team, r.n
    parts = [f"part{n}" if k == 0 else f"part{n}_{k}" for k in range(len(accs))]
    if r.d.shuffle_xor is None or not shuffles(dt):
        for part, acc in zip(parts, accs):
            r.locals.append(r.d.local_array.format(type=r.d.ctype(dt), name=part, n=group) + ";")
            r.emit(f"{part}[{lid}] = {acc};")
        r.emit(r.d.barrier)
        r.open_block(f"for (int s = {group // 2}; s > 0; s >>= 1)", {})
        r.open_block(f"if ({lid} < s)", {})
        for part in parts:
            r.emit(f"{part}[{lid}] = {r.combine(op, dt, f'{part}[{lid}]', f'{part}[{lid} + s]')};")
        r.close_block()
        r.emit(r.d.barrier)
        r.close_block()
        return [r.let(dt, f"{part}[0]", "red") for part in parts]
    r.open_block(f"for (int o = {WARP // 2}; o > 0; o >>= 1)", {})  # within each warp
    for acc in accs:
        other = r.let(dt, r.d.shuffle_xor.format(v=acc, o="o"))
        r.emit(f"{acc} = {r.combine(op, dt, acc, other)};")
    r.close_block()
    if group == WARP:
        return list(accs)
    for part, acc in zip(parts, accs):
        r.locals.append(r.d.local_array.format(type=r.d.ctype(dt), name=part, n=group // WARP) + ";")
        r.emit(f"if (({lid} & {WARP - 1}) == 0) {part}[{lid} / {WARP}] = {acc};")
    r.emit(r.d.barrier)
    reds = []
    for part in parts:
        red = r.let(dt, f"{part}[0]", "red")
        for w in range(1, group // WARP):
            r.emit(f"{red} = {r.combine(op, dt, red, f'{part}[{w}]')};")
        reds.append(red)
    return reds
