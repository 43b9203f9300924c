"""A softmax row's scores filled by teams of lanes (render_rows.py's row arrays, on dialects with warp shuffles).

A decode attention kernel's row (softmax_contraction.py: a query head, in its KV head's work-group) first stores
each position's score, a dot product over the head's dimension (64), into local memory. Computed by one work-item a
position, each score is a serial chain of 64 loads and adds, and neighbouring work-items read key rows 128 bytes
apart. Here a team of `lanes` neighbouring lanes of a warp computes one position's score instead: each lane takes a
run of `per` consecutive elements of the key row (SCORE_LANE_BYTES of the narrowest element it loads: 16 bfloat16
values, two 16-byte loads), adds them in order, and the team adds its lanes' sums by shuffles (xor lanes/2, ..., 1);
so a warp reads whole key rows (coalesced), and a work-group of 256 fills 256 / lanes positions a pass. The
reduction's result is rounded as its own (`reduce`'s) would be, and the rest of the score (its scaling and
roundings) is computed from it as before; the first lane of the team stores it. A work-group's rows of a fold
(render_row_fold.py: a KV head's query heads) fill their scores together (`sums_together`): each lane's key elements
loaded once, added to each row's sum; without shuffles, a work-item a position adds them in one loop for all rows.

Every lane of a warp must reach each shuffle: the passes run while the group's first position is in the row (a bound
every lane shares), a team past the row's end computing the row's last position again and storing nothing. The
order of a score's sum is fixed by the head's dimension alone (never by the batch a row is in).

`held_in_loop` binds the parts of a nested reduction's operand that the row kernel holds in local memory (the query
head's rotated row, the new key row) at the reduction's index, for the loop of render_c's `reduce` and for a team's
lanes here.
"""
from __future__ import annotations

from ..uop import Ops, UOp, sym_prod
from ..uop.uop import as_uop
from .render_row_fold import array_at, each_row, render_shared
from .row_plan import WARP, shuffles

SCORE_LANE_BYTES = 32   # bytes of the narrowest element a lane of a score's team loads (two 16-byte loads)


def held_in_loop(r, u: UOp) -> dict:
    """The parts of the reduction `u`'s operand its row kernel holds in local memory (render_rows._nested_arrays), at
    the index its loop (open, its range bound in scope) is at: bindings for the loop's scope."""
    held = r.row_operands.get(u, []) if r.rows is not None else []
    return {y: array_at(r, y, name, r.value(u.src[1])) for y, name in held}


def score_team(r, nested: list[UOp]) -> tuple[UOp, int, int] | None:
    """(the reduction, lanes a team, elements a lane) where a row array's value, computing the `nested` reductions
    where it is rendered, is filled by teams: one sum over one static range of at least two lanes' runs, on a dialect
    with shuffles; else None (a work-item a position)."""
    n = one_sum(nested)
    if r.d.shuffle_xor is None or n is None or not shuffles(n.dtype):
        return None
    extent = n.src[1].src[0].arg
    narrowest = min((y.dtype.itemsize for y in n.src[0].toposort() if y.op is Ops.LOAD), default=4)
    per = max(1, SCORE_LANE_BYTES // narrowest)
    while extent % per:
        per //= 2
    lanes = extent // per
    if lanes < 2 or lanes > WARP or lanes & (lanes - 1) or r.rows.group % lanes:
        return None
    return n, lanes, per


def fill_by_teams(r, x: UOp, team: tuple[UOp, int, int], ranges: tuple, name: str, flat: str, at_position,
                  scopes: list):
    """Store `x` at each flat index `flat` of `ranges` into the local array `name`, a team of lanes a position
    (`team`: score_team's), `at_position()` binding what the position's scope reads (the row's other arrays); for
    each row of `scopes` (render_row_fold.py: a fold's)."""
    n, lanes, per = team
    count = r.value(as_uop(sym_prod(y.src[0] for y in ranges)))
    k = r.n
    r.n += 1
    lane, base, at = f"tl{k}", f"tb{k}", f"tp{k}"
    r.emit(f"const int {lane} = lid % {lanes};")
    r.emit("#pragma unroll 4")
    r.open_block(f"for ({r.long} {base} = 0; {base} < {count}; {base} += {r.rows.group // lanes})", {})
    r.emit(f"const {r.long} {flat} = {base} + lid / {lanes};")
    r.emit(f"const {r.long} {at} = {flat} < {count} ? {flat} : {count} - 1;")   # (past the row: its last position)

    def position():
        sums_together(r, x, n, name, flat, at_position, scopes, lanes,
                      lambda element: r.consecutive(f"{lane} * {per}" if per > 1 else lane, [n.src[1]], per, element),
                      f"{lane} == 0 && {flat} < {count}")
    r.consecutive(at, list(ranges), 1, position)
    r.close_block()


def one_sum(nested: list[UOp]) -> UOp | None:
    """The one sum over one static range of `nested` (a score's dot product), or None."""
    if len(nested) != 1:
        return None
    (n,) = nested
    return n if n.arg is Ops.ADD and len(n.src) == 2 and n.src[1].src[0].op is Ops.CONST else None


def loop_over(r, n: UOp):
    """`elements` for sums_together: a work-item's loop over the whole range of the reduction `n`."""
    def elements(element):
        rng = n.src[1]
        name = f"rr{rng.arg[0]}"
        r.open_block(f"for ({r.long} {name} = 0; {name} < {r.value(rng.src[0])}; {name}++)", {rng: name})
        element()
        r.close_block()
    return elements


def sums_together(r, x: UOp, n: UOp, name: str, flat: str, at_position, scopes: list, lanes: int, elements,
                  guard: str | None = None):
    """Store `x` at the position `flat` (bound in scope) into the local array `name`, for each row of `scopes`: the
    sum `n` it computes (a score's dot product) accumulated for every row at each element `elements(element)` emits
    (a team lane's run: `lanes` of them added by shuffles, xor lanes/2, ..., 1; or the range in a loop), each
    element's parts no row reads loaded once for all rows (render_row_fold.render_shared), each row's terms in the
    order its own work-group adds them; stored where `guard` holds. `at_position()` binds what the position's scope
    reads."""
    dt = n.dtype
    accs = [f"acc{r.n + j}" for j in range(len(scopes))]
    r.n += len(scopes)
    for acc in accs:
        r.emit(f"{r.d.ctype(dt)} {acc} = {r.d.literal(0, dt)};")

    def element():
        render_shared(r, n.src[0], {y for y, _ in r.row_operands.get(n, [])})
        rows_left = iter(accs)

        def add():
            acc = next(rows_left)
            at_position()
            r.scopes[-1].update(held_in_loop(r, n))
            r.emit(f"{acc} = {r.accumulate(n, acc)};")
        each_row(r, scopes, add)
    elements(element)
    o = lanes // 2
    while o:
        for acc in accs:
            other = r.let(dt, r.d.shuffle_xor.format(v=acc, o=o))
            r.emit(f"{acc} = {r.combine(n.arg, dt, acc, other)};")
        o //= 2
    rows_left = iter(accs)

    def store():
        acc = next(rows_left)
        at_position()
        r.scopes[-1][n] = r.round_to(acc, dt) if dt.narrow else acc
        line = f"{array_at(r, x, name, flat)} = {r.value(x)};"
        r.emit(f"if ({guard}) {line}" if guard else line)
    each_row(r, scopes, store)
