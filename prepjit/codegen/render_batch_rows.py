"""Rendering batch row kernels through the C-style renderers (row_plan.batch_plan decides which kernels are one,
gpu_launch.py launches them as ("batch", group, pack, run, block), render_c.py calls `emit_batch_rows` for the body):
a projection of a var batch of rows (a decode step's sequences) by a weight.

A warp's lanes (row_plan.batch_plan: all, half or a quarter of them; on a dialect without shuffles the whole
work-group) own a block of `block` neighbouring rows of the other ranges (columns of the weight; MATVEC_WARPS warps a
work-group, whose neighbouring blocks read the same rows of the batch; `block` is more than 1 where the weight is
wide, a model's head: row_plan._block) and a chunk of BATCH_CHUNK rows of the batch.
Its work-items first compute their share of each reduction's held parts (row_plan.held_parts: the weight unpacked
from its blocks, or widened) for each column of the block into registers, in runs as straight-line passes; then they
loop over the chunk's rows, SUMS_IN_FLIGHT sums a step (rows x the block's columns x a column's sums; at least a
row): each element's loads that read no column once a row (the row's activation), its products for those rows and
every column of the block, then their sums combined across the block's work-items (warp shuffles within its lanes,
the sums' steps interleaved; without shuffles a local-memory tree each, and a barrier ending the step, before the
trees' arrays are written again), and work-item 0 stores each row's outputs. The weights are read and unpacked once
a chunk, not once a row; a row's element is loaded once for the block's columns, not once a column; each column's
sum is the one it computes alone, in the same order; only the rows in flight have accumulators. Sums over the same
ranges (gate/up's two a column) are computed in one pass, the row's loads once for both (`_together`).
"""
from __future__ import annotations

import math

from ..uop import UOp, dtypes
from .render_rows import by_element, combine_group
from .row_plan import BATCH_CHUNK, WARP, held_parts, row_parts, run_length

SUMS_IN_FLIGHT = 4   # sums a step of a chunk's rows computes together (rows x the block's columns x a column's
                     # sums: their loads, products and combines interleaved)


def emit_batch_rows(r, store: UOp):
    """The kernel body through the C-style renderer `r`: the work-item's held values for each column of its block,
    then the loop over its chunk of the batch's rows, SUMS_IN_FLIGHT sums a step and the rest one row at a time (a
    batch of one computes one row), storing each row's outputs. The blocks of one warp loop over as many rows as the
    one of most (their combines are the warp's shuffles); a block past the last, or past its own rows, computes its
    last row again and stores nothing, and a column past the last computes the last column and stores nothing."""
    rows = r.rows
    columns = [x for x in rows.rows if x is not rows.batch]
    width = math.prod(x.src[0].arg for x in columns)   # (static: row_plan.batch_range)
    blocks = -(-width // rows.block)
    shared = WARP // rows.group if rows.pack > 1 else 1   # blocks a warp (without shuffles: a work-group) computes
    if rows.pack > 1:
        r.emit(f"const int tid = {r.d.local_id};")
        r.emit(f"const {r.long} gid = {r.d.group_id} * {rows.pack} + tid / {rows.group};")
        r.emit(f"const int lid = tid % {rows.group};")
        r.emit(f"const {r.long} warp = {r.d.group_id} * {rows.pack} + tid / {WARP} * {shared};")
    else:
        r.emit(f"const {r.long} gid = {r.d.group_id};")
        r.emit(f"const int lid = {r.d.local_id};")
        r.emit(f"const {r.long} warp = gid;")
    end = r.value(rows.batch.src[0])
    r.emit(f"const {r.long} total = {blocks} * (({end} + {BATCH_CHUNK - 1}) / {BATCH_CHUNK});")
    r.emit("if (warp >= total) return;")   # (a warp past the last block of the last chunk)
    spans = [_span(r, f"warp + {k}" if k else "warp", blocks, end) for k in sorted({0, shared - 1})]
    r.emit(f"const {r.long} span = {spans[0] if len(spans) == 1 else f'{spans[0]} > {spans[1]} ? {spans[0]} : {spans[1]}'};")
    first, stop = _chunk(r, "gid", blocks, end)
    narrow = f"({r.d.ctype(dtypes.uint32)})"
    r.emit(f"const {r.long} col = {narrow}(gid < total ? gid : total - 1) % {narrow}{blocks}"
           f"{f' * {rows.block}' if rows.block > 1 else ''};")
    if rows.block == 1:
        r.scopes[-1].update(r.unflatten("col", columns))
        cols = [({}, None)]
    else:
        cols = [(_column(r, columns, j, width), f"col + {j} < {width}") for j in range(rows.block)]
    held = [{u: _hold(r, u, scope) for u in rows.order} for scope, _ in cols]
    count = max(1, SUMS_IN_FLIGHT // (rows.block * len(rows.order)))
    _row_steps(r, store, held, cols, first, stop, f"step + {count} <= span", count)
    if count > 1:
        _row_steps(r, store, held, cols, first, stop, "step < span", 1, f"span / {count} * {count}")


def _column(r, columns: list[UOp], j: int, width: int) -> dict:
    """Bind the column ranges to the digits of the block's `j`-th column (clamped to the last), under names of
    its own; the bindings."""
    flat = r.let(dtypes.int64, f"col + {j} < {width} ? col + {j} : {width - 1}", f"col{j}_")
    bindings, rest = {}, flat
    narrow = f"({r.d.ctype(dtypes.uint32)})"
    for k, x in enumerate(reversed(columns)):
        end = x.src[0].arg
        if k == len(columns) - 1:
            bindings[x] = rest
        else:
            bindings[x] = r.let(dtypes.int64, f"{narrow}{rest} % {narrow}{end}", f"c{j}_")
            rest = r.let(dtypes.int64, f"{narrow}{rest} / {narrow}{end}", f"c{j}_")
    return bindings


def _row_steps(r, store: UOp, held: list, cols: list, first: str, stop: str, condition: str, count: int,
               start: str = "0"):
    """A loop over the block's rows from `start` while `condition`, `count` rows a step: their sums for each
    column of the block (`cols`: its bindings and store condition) in flight together, each stored (a row past the
    block's reads its last row, and is not stored)."""
    rows = r.rows
    r.open_block(f"for ({r.long} step = {start}; {condition}; step += {count})", {})
    r.emit(f"const {r.long} rb = {first} + step;")
    batch = [f"rb{i}" for i in range(count)]
    for i, name in enumerate(batch):
        at = f"rb + {i}" if i else "rb"
        r.emit(f"const {r.long} {name} = {at} < {stop} ? {at} : {stop} - 1;")
    sums = {}
    for group in _together(rows.order):
        sums.update(_row_sums(r, group, held, [scope for scope, _ in cols], batch))
    for i, name in enumerate(batch):
        for j, (scope, inside) in enumerate(cols):
            r.open_block("", {**scope, rows.batch: name, **{u: sums[u][i][j] for u in rows.order}})
            line = r.store_line(store)
            guard = " && ".join(["lid == 0", "gid < total", f"rb + {i}" if i else "rb"]) + f" < {stop}"
            r.emit(f"if ({guard}{f' && {inside}' if inside else ''}) {line}")
            r.close_block()
    if r.d.shuffle_xor is None:   # (the next rows' trees write the arrays these rows' totals were read from)
        r.emit(r.d.barrier)
    r.close_block()


def _chunk(r, gid: str, width: int, end: str) -> tuple[str, str]:
    """Names of (the first row, the end of the rows) of the chunk of the flat column index `gid` (clamped to the
    last: a column past it reads the last chunk's)."""
    narrow = f"({r.d.ctype(dtypes.uint32)})"   # (32-bit division: a column and chunk count far below 2^32)
    first, stop = f"first{r.n}", f"stop{r.n}"
    r.n += 1
    r.emit(f"const {r.long} {first} = {narrow}({gid} < total ? {gid} : total - 1) / {narrow}{width} * {BATCH_CHUNK};")
    r.emit(f"const {r.long} {stop} = {first} + {BATCH_CHUNK} < {end} ? {first} + {BATCH_CHUNK} : {end};")
    return first, stop


def _span(r, gid: str, width: int, end: str) -> str:
    """Name of the number of rows in the chunk of the column `gid`."""
    first, stop = _chunk(r, gid, width, end)
    return r.let(dtypes.int64, f"{stop} - {first}", "span")


def _passes(r, u: UOp, body):
    """Emit `body(p, e)` for element e of the work-item's run in each pass p over reduction `u`'s static ranges
    (runs of the launch's length a work-item, the row's work-items side by side), straight-line code, a pass that
    runs past the range's end guarded."""
    ranges = list(u.src[1:])
    per = run_length(ranges, r.rows.run)
    total = math.prod(x.src[0].arg for x in ranges)
    step = r.rows.group * per
    for p in range(-(-total // step)):
        flat = f"k{r.n}"
        r.n += 1
        r.open_block("", {})
        r.emit(f"const {r.long} {flat} = lid{f' * {per}' if per > 1 else ''}{f' + {p * step}' if p else ''};")
        guarded = (p + 1) * step > total
        if guarded:
            r.open_block(f"if ({flat} < {total})", {})
        r.consecutive(flat, ranges, per, by_element(per, lambda e, p=p: body(p, e)))
        if guarded:
            r.close_block()
        r.close_block()


def _hold(r, u: UOp, scope: dict) -> dict:
    """Compute the work-item's share of reduction `u`'s held parts at the column bound in `scope` into registers
    (declared before the passes, zero where a guarded pass runs past the range); {(pass, element, part): the
    register's name}."""
    parts = held_parts(u, r.rows.batch)
    per = run_length(list(u.src[1:]), r.rows.run)
    total = math.prod(x.src[0].arg for x in u.src[1:])
    names = {}
    for p in range(-(-total // (r.rows.group * per))):
        for e in range(per):
            for i, x in enumerate(parts):
                names[p, e, x] = f"w{r.n}_{p}_{e}_{i}"
                r.emit(f"{r.d.ctype(x.dtype)} {names[p, e, x]} = {r.d.literal(0, x.dtype)};")
    r.n += 1

    def hold(p: int, e: int):
        for x in parts:
            r.emit(f"{names[p, e, x]} = {r.value(x)};")
    r.scopes.append(scope)
    _passes(r, u, hold)
    r.scopes.pop()
    return names


def _together(order) -> list[list[UOp]]:
    """The reductions in `order` in groups computed in one pass: sums of one dtype over the same ranges
    (row_plan.share_batch_ranges: gate/up's two sums of a column, whose row's loads are then the same)."""
    groups: dict = {}
    for u in order:
        groups.setdefault((tuple(u.src[1:]), u.arg, u.dtype), []).append(u)
    return list(groups.values())


def _row_sums(r, us: list[UOp], held: list[dict], cols: list[dict], batch: list[str]) -> dict:
    """Reductions `us` (sums of one dtype over the same ranges) of each row of the batch named in `batch` at each
    column of the block (`cols`: their bindings, `held`: each column's registers of each reduction's held parts), in
    flight together: each element's loads that read no column once a row (`row_plan.row_parts`), its products for every
    reduction, row and column, then the sums' combines interleaved, each across the row's work-items (each gets the
    total); rounded where the dtype is 16-bit. {reduction: [row][column]}."""
    dt, op = us[0].dtype, us[0].arg
    accs = {u: [[f"acc{r.n}_{k}_{i}_{j}" for j in range(len(cols))] for i in range(len(batch))]
            for k, u in enumerate(us)}
    if len(us) == 1 and len(cols) == 1:   # (the names a column's one sum always had)
        accs = {us[0]: [[f"acc{r.n}_{i}"] for i in range(len(batch))]}
    r.n += 1
    flat = [a for u in us for row in accs[u] for a in row]
    for acc in flat:
        r.emit(f"{r.d.ctype(dt)} {acc} = {r.d.literal(0, dt)};")
    shared = list(dict.fromkeys(x for u in us for x in row_parts(u, r.rows.batch))) \
        if len(cols) > 1 or len(us) > 1 else []

    def add(p: int, e: int):
        for i, row in enumerate(batch):
            r.open_block("", {r.rows.batch: row})
            for x in shared:   # (the row's loads, once for the block's columns and the reductions)
                r.value(x)
            for u in us:
                for acc, scope, names in zip(accs[u][i], cols, held):
                    mine = {x: name for (pp, ee, x), name in names[u].items() if (pp, ee) == (p, e)}
                    r.scopes.append({**scope, **mine})
                    r.emit(f"{acc} = {r.accumulate(u, acc)};")
                    r.scopes.pop()
            r.close_block()
    _passes(r, us[0], add)
    totals = dict(zip(flat, _combine_rows(r, op, dt, flat)))
    return {u: [[r.round_to(totals[a], dt) if dt.narrow else totals[a] for a in row] for row in accs[u]] for u in us}


def _combine_rows(r, op, dt, accs: list[str]) -> list[str]:
    """Each of the rows' partial accumulators `accs` combined across the row's work-items: by warp shuffles within
    the column's lanes, the rows' steps interleaved (batch_plan takes a dialect's shuffles only for sums of dtypes
    that shuffle, a column at most a warp); without shuffles each through render_rows.combine_group (a work-group a
    column)."""
    if r.d.shuffle_xor is None:
        return [combine_group(r, op, dt, acc, ("lid", r.rows.group)) for acc in accs]
    r.open_block(f"for (int o = {r.rows.group // 2}; o > 0; o >>= 1)", {})   # (within the column's lanes)
    others = [r.let(dt, r.d.shuffle_xor.format(v=acc, o="o")) for acc in accs]
    for acc, other in zip(accs, others):
        r.emit(f"{acc} = {r.combine(op, dt, acc, other)};")
    r.close_block()
    return accs
