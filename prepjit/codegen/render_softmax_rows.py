"""A softmax row's scores filled by teams of lanes (render_rows.py's row arrays, on dialects with warp shuffles).

A decode attention kernel's row (softmax_contraction.py: a query head's work-group) first stores each position's
score, a dot product over the head's dimension (64), into local memory. Computed by one work-item a position, each
score is a serial chain of 64 loads and adds, and neighbouring work-items read key rows 128 bytes apart. Here a team
of `lanes` neighbouring lanes of a warp computes one position's score instead: each lane takes a run of `per`
consecutive elements of the key row (SCORE_LANE_BYTES of the narrowest element it loads: 16 bfloat16 values, two
16-byte loads), adds them in order, and the team adds its lanes' sums by shuffles (xor lanes/2, ..., 1); so a warp
reads whole key rows (coalesced), and a work-group of 256 fills 256 / lanes positions a pass. The reduction's
result is rounded as its own (`reduce`'s) would be, and the rest of the score (its scaling and roundings) is computed
from it as before; the first lane of the team stores it.

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
from .row_plan import WARP, shuffles

SCORE_LANE_BYTES = 32   # bytes of the narrowest element a lane of a score's team loads (two 16-byte loads)


def held_in_loop(r, u: UOp) -> dict:
    """The parts of the reduction `u`'s operand its row kernel holds in local memory (render_rows._nested_arrays), at
    the index its loop (open, its range bound in scope) is at: bindings for the loop's scope."""
    held = r.row_operands.get(u, []) if r.rows is not None else []
    return {y: f"{name}[{r.value(u.src[1])}]" for y, name in held}


def score_team(r, nested: list[UOp]) -> tuple[UOp, int, int] | None:
    """(the reduction, lanes a team, elements a lane) where a row array's value, computing the `nested` reductions
    where it is rendered, is filled by teams: one sum over one static range of at least two lanes' runs, on a dialect
    with shuffles; else None (a work-item a position)."""
    if r.d.shuffle_xor is None or len(nested) != 1:
        return None
    (n,) = nested
    if n.arg is not Ops.ADD or len(n.src) != 2 or n.src[1].src[0].op is not Ops.CONST or not shuffles(n.dtype):
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


def fill_by_teams(r, x: UOp, team: tuple[UOp, int, int], ranges: tuple, name: str, flat: str, at_position):
    """Store `x` at each flat index `flat` of `ranges` into the local array `name`, a team of lanes a position
    (`team`: score_team's), `at_position()` binding what the position's scope reads (the row's other arrays)."""
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
        at_position()
        dt = n.dtype
        acc = f"acc{r.n}"
        r.n += 1
        r.emit(f"{r.d.ctype(dt)} {acc} = {r.d.literal(0, dt)};")

        def element():
            r.scopes[-1].update(held_in_loop(r, n))
            r.emit(f"{acc} = {r.accumulate(n, acc)};")
        r.consecutive(f"{lane} * {per}" if per > 1 else lane, [n.src[1]], per, element)
        o = lanes // 2
        while o:
            other = r.let(dt, r.d.shuffle_xor.format(v=acc, o=o))
            r.emit(f"{acc} = {r.combine(n.arg, dt, acc, other)};")
            o //= 2
        r.scopes[-1][n] = r.round_to(acc, dt) if dt.narrow else acc
        r.emit(f"if ({lane} == 0 && {flat} < {count}) {name}[{flat}] = {r.value(x)};")
    r.consecutive(at, list(ranges), 1, position)
    r.close_block()
