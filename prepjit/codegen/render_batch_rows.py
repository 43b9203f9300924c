"""Rendering batch row kernels through the C-style renderers (row_plan.batch_plan decides which kernels are one,
gpu_launch.py launches them as ("batch", group, pack, run), render_c.py calls `emit_batch_rows` for the body): a
projection of a var batch of rows (a decode step's sequences) by a weight.

A warp's lanes (row_plan.batch_plan: all, half or a quarter of them; on a dialect without shuffles the whole
work-group) own a row of the other ranges (a column of the weight; MATVEC_WARPS warps a work-group, whose neighbouring
columns read the same rows of the batch) and a chunk of BATCH_CHUNK rows of the batch. Its work-items first compute
their share of each reduction's held parts (row_plan.held_parts: the weight unpacked from its blocks, or widened) into
registers, in runs as straight-line passes; then they loop over the chunk's rows, ROWS_IN_FLIGHT at a time: each
element's products for those rows, then their sums combined across the column's work-items (warp shuffles within the
column's lanes, the rows' steps interleaved; without shuffles a local-memory tree each, and a barrier ending the step,
before the trees' arrays are written again), and work-item 0 stores each row's output. The weights are read and
unpacked once a chunk, not once a row, and only the rows in flight have accumulators.
"""
from __future__ import annotations

import math

from ..uop import UOp, dtypes
from .render_rows import by_element, combine_group
from .row_plan import BATCH_CHUNK, WARP, held_parts, run_length

ROWS_IN_FLIGHT = 4   # rows of a chunk a warp computes together (their loads, sums and combines interleaved)


def emit_batch_rows(r, store: UOp):
    """The kernel body through the C-style renderer `r`: the work-item's held values, then the loop over its chunk
    of the batch's rows, ROWS_IN_FLIGHT at a time and the rest one at a time (a batch of one computes one row),
    storing each row's output. The columns of one warp loop over as many rows as the one of most (their combines are
    the warp's shuffles); a column past the last, or past its own rows, computes its last row again and stores
    nothing."""
    rows = r.rows
    columns = [x for x in rows.rows if x is not rows.batch]
    width = math.prod(x.src[0].arg for x in columns)   # (static: row_plan.batch_range)
    shared = WARP // rows.group if rows.pack > 1 else 1   # columns a warp (without shuffles: a work-group) computes
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
    r.emit(f"const {r.long} total = {width} * (({end} + {BATCH_CHUNK - 1}) / {BATCH_CHUNK});")
    r.emit("if (warp >= total) return;")   # (a warp past the last column of the last chunk)
    spans = [_span(r, f"warp + {k}" if k else "warp", width, end) for k in sorted({0, shared - 1})]
    r.emit(f"const {r.long} span = {spans[0] if len(spans) == 1 else f'{spans[0]} > {spans[1]} ? {spans[0]} : {spans[1]}'};")
    first, stop = _chunk(r, "gid", width, end)
    narrow = f"({r.d.ctype(dtypes.uint32)})"
    r.emit(f"const {r.long} col = {narrow}(gid < total ? gid : total - 1) % {narrow}{width};")
    r.scopes[-1].update(r.unflatten("col", columns))
    held = {u: _hold(r, u) for u in rows.order}
    _row_steps(r, store, held, first, stop, f"step + {ROWS_IN_FLIGHT} <= span", ROWS_IN_FLIGHT)
    _row_steps(r, store, held, first, stop, "step < span", 1, f"span / {ROWS_IN_FLIGHT} * {ROWS_IN_FLIGHT}")


def _row_steps(r, store: UOp, held: dict, first: str, stop: str, condition: str, count: int, start: str = "0"):
    """A loop over the column's rows from `start` while `condition`, `count` rows a step: their sums in flight
    together, each stored (a row past the column's reads its last row, and is not stored)."""
    rows = r.rows
    r.open_block(f"for ({r.long} step = {start}; {condition}; step += {count})", {})
    r.emit(f"const {r.long} rb = {first} + step;")
    batch = [f"rb{i}" for i in range(count)]
    for i, name in enumerate(batch):
        at = f"rb + {i}" if i else "rb"
        r.emit(f"const {r.long} {name} = {at} < {stop} ? {at} : {stop} - 1;")
    sums = {u: _row_sums(r, u, held[u], batch) for u in rows.order}
    for i, name in enumerate(batch):
        r.open_block("", {rows.batch: name, **{u: sums[u][i] for u in rows.order}})
        line = r.store_line(store)
        r.emit(f"if (lid == 0 && gid < total && {f'rb + {i}' if i else 'rb'} < {stop}) {line}")
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


def _hold(r, u: UOp) -> dict:
    """Compute the work-item's share of reduction `u`'s held parts into registers (declared before the passes,
    zero where a guarded pass runs past the range); {(pass, element, part): the register's name}."""
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
    _passes(r, u, hold)
    return names


def _row_sums(r, u: UOp, names: dict, batch: list[str]) -> list[str]:
    """Reduction `u` (a sum) of each row of the batch named in `batch`, in flight together (each element's products
    for every row, then the rows' combines interleaved), reading the `names` registers for its held parts, each
    combined across the row's work-items (each gets the total); rounded where its dtype is 16-bit."""
    dt = u.dtype
    accs = [f"acc{r.n}_{i}" for i in range(len(batch))]
    r.n += 1
    for acc in accs:
        r.emit(f"{r.d.ctype(dt)} {acc} = {r.d.literal(0, dt)};")

    def add(p: int, e: int):
        r.scopes[-1].update({x: name for (pp, ee, x), name in names.items() if (pp, ee) == (p, e)})
        for acc, row in zip(accs, batch):
            r.open_block("", {r.rows.batch: row})
            r.emit(f"{acc} = {r.combine(u.arg, dt, acc, r.value(u.src[0]))};")
            r.close_block()
    _passes(r, u, add)
    totals = _combine_rows(r, u.arg, dt, accs)
    return [r.round_to(t, dt) if dt.narrow else t for t in totals]


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
