"""Which kernels of the C-style renderers are row kernels, and their shape (`Rows`: what gpu_launch.py launches and
render_rows.py renders): a kernel whose reductions depend on only some of its loop ranges (the rows: softmax's max
and sum, layernorm's mean and variance, fused into the kernel that broadcasts them along the other ranges, the
columns) gives each row a work-group.

Which kernels are row kernels (`row_plan`): those whose reductions run more than ROW_INLINE_MAX iterations and are
broadcast or read along their innermost range (a row in memory), and any whose reductions run more than
GROUP_REDUCE_MIN; shorter ones, those down a column (neighbouring outputs read neighbouring memory), and those with
more than MANY_OUTPUTS outputs and no columns (a thin matmul) run inline in each work-item. The group is the smallest
power of two from WARP to REDUCE_GROUP covering a row's work, counted in the runs the dialect's work-items take
(CUDA: 4 elements, so a softmax row of 128 is one warp's, no barrier; with 128 work-items, three quarters of them
would idle); where its partials combine through shuffles, the smallest multiple of WARP that does (a layernorm row of
384: 3 warps, not 4 with one idle). Where they do and the kernel has columns and at least WARP_ROWS_MIN rows (at their
most: a decode batch's), its ranges static and in whole runs, a row of at most WARP_ROW_RUNS runs a lane is a warp's
(`_short_rows`; the dialect's warp_rows a work-group): its lanes take several runs each, combined by shuffles only,
no barrier, and where the runs divide the row evenly its passes keep them in registers (share_passes). MiniLM's
layernorm of 384 over 4096 rows (3 runs a lane) took 3 warps and a barrier a reduction: 8.1 us on an H100, 1.2 TB/s.
Fewer rows keep a row's warps (a row's loads are issued together either way; a work-group a row spreads few rows over
more multiprocessors).

Matvec-shaped kernels (no columns, every reduction static, the rows' reductions reading memory along their range, at
least MATVEC_MIN_OUTPUTS outputs: a one-row projection) get a warp per output and MATVEC_WARPS outputs a work-group
when WARP_PER_OUTPUT is on (dialects with shuffles): each lane takes runs of LOAD_BYTES of the narrowest element its
reduction loads (8 16-bit floats, 4 float32: one 16-byte load each). A reduction no output depends on (a fused norm's
mean of squares) is then the whole work-group's (`Rows.uniform`), computed before the reductions that read it.
A row reduction over a quantized weight (pj.quant's blocks: its loads index its range k by k // 32, k % 16) is
first split at the weight's blocks (`split_matvec_blocks`, where the kernel is then matvec-shaped): a lane's run of
16 one-byte quants stays inside a block, its in-block offsets plain ranges, its block's scale one address a run.

A sum that reads a row's reductions and depends on columns they do not (a softmax's p @ V over its row's max and
sum: softmax_contraction.py) is a column reduction (`Rows.columns`): a row a work-group, whose work-items each take a
run of columns and a slice of its range (`Rows.column_runs`, `Rows.slices`). `share_passes` makes the ranges of a
row's passes one range where they read the same elements (`_one_range` for column reductions).

A projection of a var batch (a decode step's B sequences: one row range of a symbolic end, `batch_range`) whose
reductions each read a part no batch row indexes (a weight: `held_parts`) is a batch row kernel (`batch_plan`,
`Rows.batch`): a row of the other ranges (a column of the weight) a warp's or part of one (a work-group's without
shuffles), each work-item holding its share of the held parts in registers (at most HELD_MAX values, unpacked once),
then looping over BATCH_CHUNK rows of the batch, a few rows' sums combined and stored at a time: the weights are read
once per chunk of rows, not once per row, and no accumulator is kept for every row. Where the dialect shuffles and
the weight is wide (a model's head: its work-groups at one chunk of rows at least BLOCK_MIN_GROUPS), a column's lanes
own a block of neighbouring columns (`_block`), holding each one's parts, so that each row's element is loaded once
for all of them (the head at 64 rows read its 64 x 576 activations once per column). Narrower projections keep a
column a lane group: on an H100 (SmolLM2's paged step at 64 rows, fma sums) blocks growing with the batch took
gate/up 28.7 -> 36.4 us and qkv 15.6 -> 16.9 (o 21.6 -> 19.2, down equal), the step +0.15 ms, where the head's
blocks of 4 took 458 -> 329 us.

Where a column row kernel's rows differ along a range that its heavy loads do not read (a grouped-query attention's
query heads of one key/value head: the keys and values its positions read are the same for each), one work-group
computes every row along it (`Rows.fold`, `_fold_range`: at most FOLD_MAX rows whose local arrays fit
FOLD_LOCAL_BYTES), each key and value element loaded once for all of them (render_rows.py), each row's sums in the
order its own work-group would add them; only where the rows' least count (a var batch's smallest) leaves at least
FOLD_MIN_GROUPS work-groups folded, as the kernel serves every count of its var's range: on an H100, SmolLM2's paged
decode attention (3 kv heads of 3 query heads) took 40.3 -> 24.3 us folded at 64 sequences, 12.4 -> 17.0 at one (3
work-groups).

Reductions nested in a row's reduction that depend on its range (sum_j max_k x[i, j, k]) are not the row's
(`free_ranges`): each work-item computes them inline.
"""
from __future__ import annotations

import math

import attrs

from ..uop import DType, Ops, UOp, sym_prod
from ..uop.uop import as_uop
from .block_split import split_at_blocks

REDUCE_GROUP = 256        # the largest work-group of a row kernel (a power of two, a multiple of WARP)
GROUP_REDUCE_MIN = 256    # reductions of more iterations than this always get a work-group per row
ROW_INLINE_MAX = 16       # broadcast or row-contiguous reductions of more iterations than this get one
WARP = 32                 # the smallest work-group of a row kernel (a warp: shuffles need all its lanes)
WARP_ROW_RUNS = 8         # runs a lane of a row of a warp may take (1024 elements in CUDA's runs of 4: LayerNorm's 384
                          # is 3 a lane, RMSNorm's 576 4.5; all of a lane's loads straight-line code, UNROLLED_PASSES)
WARP_ROWS_MIN = 1024      # rows (at their most) from which rows of up to WARP_ROW_RUNS runs a lane get a warp each
                          # (4 a work-group: 256 work-groups at least). H200: MiniLM's LayerNorm of 384 over 4096
                          # rows 9.5 -> 7.4 us, but SmolLM2's RMSNorm of 576 over a decode batch of 64 rows (16
                          # work-groups of 4 warps, not 64 of 5) 6.0 -> 7.9 us in float32, 5.7 -> 6.5 in bfloat16
MANY_OUTPUTS = 1 << 16    # reductions with more outputs than this (and no columns) run in a work-item each
WARP_PER_OUTPUT = True    # matvec-shaped row kernels get a warp per output (False: a work-group per output, as before)
MATVEC_WARPS = 4          # outputs (warps) a work-group of such a kernel packs (960 outputs: 240 groups, more SMs busy)
SHARED_OPERAND_BYTES = 32 * 1024  # local memory for the operands a matvec's work-group computes once (render_rows)
MATVEC_MIN_OUTPUTS = 256  # fewer outputs than this keep a work-group each (a warp each would leave the GPU idle)
LOAD_BYTES = 16           # a matvec lane's run: this many bytes of the narrowest element its reductions load
BATCH_CHUNK = 16          # rows of the batch a column's lanes in a batch row kernel loop over (64 rows: 4 chunks)
HELD_MAX = 64             # values a work-item of a batch row kernel holds in registers across its rows
COLUMN_LANES = (WARP, WARP // 2, WARP // 4)   # lanes a column of a batch row kernel may take (shuffles only)
SHORTEST_RUN = 4          # a batch row kernel's shortest run (a 16-byte load of a float32 row: shorter ones are
                          # not merged into vector loads)
BLOCK_COLUMNS = (4, 2)    # columns a lane group of a batch row kernel may own (the most that fits is taken)
BLOCK_HELD_MAX = 160      # values a work-item of a blocked batch row kernel holds for its columns (no spills, ptxas)
FOLD_MAX = 8              # rows along one range a column row kernel's work-group may compute together (0: one)
FOLD_LOCAL_BYTES = 40 * 1024   # local memory the folded rows' arrays may take (CUDA's static limit is 48 KB)
FOLD_MIN_GROUPS = 96      # work-groups a folded row kernel keeps at its rows' least count (SmolLM2's 3 kv heads: a
                          # batch of 32 sequences at least)
FOLD_RESIDENT = 2         # work-groups of a folded row kernel a multiprocessor should hold at once (its launch bounds:
                          # SmolLM2's attention, 256 work-items, 128 registers at 1 (nvcc 13, sm_90a), 109 at 2, 80 at
                          # 3, no spills; at B = 64 its 192 work-groups all resident on an H100's 132 at 2)
BLOCK_MIN_GROUPS = 264    # work-groups a blocked batch row kernel keeps at one chunk of rows (2 a multiprocessor of
                          # an H100: fewer would leave a one-row step's work on fewer of them, each doing more)


@attrs.frozen
class Rows:
    """A row kernel: a work-group of `group` work-items per value of the `rows` ranges."""

    reduces: frozenset   # the reductions every work-item of a row's group computes together
    order: tuple         # those, operands first
    rows: tuple          # the loop ranges they depend on
    cols: tuple          # the other loop ranges (each row's group stores all of them)
    group: int
    pack: int = 1        # rows per work-group: one warp each where a row's group is a warp, a batch row kernel's
                         # column part of one (shuffles only)
    run: int = 1         # consecutive elements a work-item takes at a time (where they divide the last range's end)
    columns: tuple = ()  # reductions of each column that read the row's reductions (a softmax's p @ V): in `reduces`
    batch: UOp | None = None   # the row range each warp loops over, its held parts in registers (batch_plan)
    block: int = 1       # neighbouring columns a batch row kernel's column lanes own (each row's loads read once)
    fold: UOp | None = None   # the row range whose every value a work-group computes (`_fold_range`), or None

    @property
    def column_runs(self) -> int:
        """Runs of columns (of `run_length` each) a column reduction's partials are split into."""
        return -(-math.prod(c.src[0].vmax for c in self.cols) // run_length(list(self.cols), self.run))

    @property
    def slices(self) -> int:
        """Slices of a column reduction's range the group's work-items take: the group's work-items cover each run of
        columns that many times."""
        return max(1, self.group // self.column_runs)

    @property
    def resident_groups(self) -> int:
        """Work-groups a multiprocessor should hold at once (1: none asked): FOLD_RESIDENT with a fold."""
        return FOLD_RESIDENT if self.fold is not None else 1

    @property
    def folded(self) -> int:
        """Rows a work-group computes together (`fold`'s extent; 1 without one)."""
        return self.fold.src[0].arg if self.fold is not None else 1

    @property
    def shared(self) -> bool:
        """Whether every pass (each reduction, the columns) is over the columns' one range (share_passes)."""
        return len(self.cols) == 1 and all(tuple(u.src[1:]) == self.cols for u in self.order)

    @property
    def passes(self) -> int:
        """Runs a work-item takes of a shared row (`shared`, share_passes): the end over the group's runs, rounded up
        (a warp's row of 576 in runs of 4: 5, the last for half its lanes)."""
        return -(-self.cols[0].src[0].arg // (self.group * run_length(list(self.cols), self.run)))

    @property
    def size(self) -> int:
        """The work-group's size."""
        return self.group * self.pack

    def uniform(self, u: UOp) -> bool:
        """Whether the whole work-group computes the reduction `u` once (no row depends on it, the group packs several
        rows and the passes are not shared): its work-items are then the group's, not a row's."""
        return self.pack > 1 and not self.shared and free_ranges(u).isdisjoint(self.rows)

    def team(self, u: UOp) -> tuple[str, int]:
        """(the work-item id's name, how many work-items) that compute the reduction `u` together."""
        return ("tid", self.size) if self.uniform(u) else ("lid", self.group)


def warp_slices(rows: Rows, shuffled: bool) -> int:
    """Neighbouring slices of a column reduction whose partials a warp adds by shuffles (`shuffled`: the dialect has
    them) before they are stored (render_rows._column_partials), pairwise, as `_column_total` adds them: the slices
    a warp's lanes take, where the column runs divide a warp and that many slices divide `slices`; else 1 (a row of
    partials a slice)."""
    runs = rows.column_runs
    per = WARP // runs if shuffled and WARP % runs == 0 else 1
    return per if per > 1 and rows.slices % per == 0 else 1


def loop_ranges(ast: UOp) -> list[UOp]:  # a scatter's serial loops are work-items too (its combines are atomic)
    return sorted({u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] in ("loop", "serial")},
                  key=lambda r: r.arg[0])


def _length(u: UOp) -> int:
    return math.prod(r.src[0].vmax for r in u.src[1:])


def free_ranges(u: UOp) -> set:
    """The ranges a reduction's value depends on: those it reads that no reduction inside it (itself included) binds."""
    inner = [x for x in u.toposort() if x.op in (Ops.RANGE, Ops.REDUCE)]
    bound = {r for x in inner if x.op is Ops.REDUCE for r in x.src[1:]}
    return {x for x in inner if x.op is Ops.RANGE} - bound


def _terms(idx: UOp) -> list[UOp]:
    return [t for x in idx.src for t in _terms(x)] if idx.op is Ops.ADD else [idx]


def _contiguous(u: UOp) -> bool:
    """Whether the reduction reads memory along its innermost range (a row: neighbouring work-items of a group
    read neighbouring elements)."""
    last = u.src[-1]
    return any(x.op is Ops.LOAD and last in _terms(x.src[1]) for x in u.src[0].toposort())


def run_length(ranges: list[UOp], items: int) -> int:
    """How many consecutive flat indices over `ranges` a work-item takes at a time: `items` where the last range's
    end is a constant they divide (a run never crosses it), else 1."""
    end = ranges[-1].src[0] if ranges else None
    return items if end is not None and end.op is Ops.CONST and end.arg % items == 0 else 1


def shuffles(dt: DType) -> bool:
    """Whether partials of `dt` combine through warp shuffles (where the dialect has them); others go through a
    local-memory tree, which needs a power-of-two group."""
    return dt.itemsize >= 4 or dt.narrow


def _hoisted(ast: UOp) -> tuple[list, tuple, tuple, tuple]:
    """(the reductions every work-item of a row's group would compute together, the loop ranges they depend on:
    the rows, the other loop ranges: the columns, the column reductions: those that read a row's reduction and
    depend on ranges it does not, the columns (a softmax's p @ V, reading the row's max and sum))."""
    loops = loop_ranges(ast)
    hoisted = [u for u in ast.toposort() if u.op is Ops.REDUCE and free_ranges(u) <= set(loops)]
    free = {u: free_ranges(u) for u in hoisted}
    columns = tuple(u for u in hoisted if u.arg is Ops.ADD and any(
        v is not u and free[v] and free[v] < free[u] and v in u.src[0].toposort() for v in hoisted))
    hoisted = [u for u in hoisted if u not in columns]
    rows = tuple(r for r in loops if any(r in free[u] for u in hoisted))
    return hoisted, rows, tuple(r for r in loops if r not in rows), columns


def _load_run(reductions) -> int:
    """LOAD_BYTES of the narrowest element `reductions` load (one 16-byte load: 8 16-bit floats, 4 float32)."""
    return max(1, LOAD_BYTES // min((x.dtype.itemsize for u in reductions for x in u.src[0].toposort()
                                     if x.op is Ops.LOAD), default=4))


def _matvec_run(hoisted: list, rows: tuple, cols: tuple, warp_rows: int) -> int | None:
    """A lane's run where the kernel is matvec-shaped and gets a warp per output (see the module's docstring), else
    None: LOAD_BYTES of the narrowest element its reductions load, halved until it divides every reduction's
    innermost end."""
    if not WARP_PER_OUTPUT or warp_rows <= 1 or cols or math.prod(r.src[0].vmax for r in rows) < MATVEC_MIN_OUTPUTS:
        return None
    if not all(shuffles(u.dtype) and all(r.src[0].op is Ops.CONST for r in u.src[1:]) for u in hoisted):
        return None
    if not all(_contiguous(u) for u in hoisted if not free_ranges(u).isdisjoint(rows)):
        return None
    run = _load_run(hoisted)
    while any(u.src[-1].src[0].arg % run for u in hoisted):
        run //= 2
    return run


def split_matvec_blocks(ast: UOp, warp_rows: int = 1) -> UOp:
    """`ast` with each row reduction's range split at the blocks of the quantized weight it reads
    (block_split.split_at_blocks: q4_1's weight k at (k // 32) * 20 + k % 16 + 4, shifted by (k % 32) // 16 * 4,
    over ranges (kb, kh, kl) of (k / 32, 2, 16) reads kb * 20 + kl + 4 shifted by kh * 4) where the kernel split so is
    matvec-shaped (`_matvec_run`): a lane's run is then the innermost range's (one block's neighbouring bytes, the
    block's scale at one address for the whole run), in the same flat order as before (the same sums); `ast` itself
    elsewhere."""
    hoisted, rows, cols, _ = _hoisted(ast)
    if cols or not rows:
        return ast
    axis = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE) + 1
    split = {}
    for u in hoisted:
        if len(u.src) != 2 or u.src[1].src[0].op is not Ops.CONST or free_ranges(u).isdisjoint(rows):
            continue
        body, ranges = split_at_blocks(u.src[0], u.src[1], axis)
        if len(ranges) > 1:
            split[u] = UOp(Ops.REDUCE, u.dtype, (body, *ranges), u.arg)
            axis = ranges[-1].arg[0] + 1
    if not split:
        return ast
    out = ast.substitute(split)
    return out if _matvec_run(*_hoisted(out)[:3], warp_rows) is not None else ast


def row_plan(ast: UOp, items: int = 1, warp_rows: int = 1) -> Rows | None:
    """The row kernel this kernel becomes, or None (its reductions, if any, run inline in each work-item), for a
    dialect whose work-items take runs of `items` consecutive elements where they can (the group covers a row's
    work in runs: a row of 128 elements in runs of 4 is one warp's) and packs `warp_rows` rows of a warp each into
    a work-group (a dialect with shuffles: such rows need no barrier; work-groups of one warp would leave half of a
    multiprocessor's warp slots empty)."""
    hoisted, rows, cols, columns = _hoisted(ast)
    if not hoisted:
        return None
    if columns:
        return _column_plan(hoisted, rows, cols, columns, items, warp_rows > 1)
    longest = max(_length(u) for u in hoisted)
    if not cols and math.prod(r.src[0].vmax for r in rows) > MANY_OUTPUTS:
        return None   # enough outputs to fill the GPU with one work-item each
    if longest <= (ROW_INLINE_MAX if cols or any(_contiguous(u) for u in hoisted) else GROUP_REDUCE_MIN):
        return None
    run = _matvec_run(hoisted, rows, cols, warp_rows)
    if run is not None:
        return Rows(frozenset(hoisted), _uniform_first(hoisted, rows), rows, cols, WARP, MATVEC_WARPS, run)
    runs = [-(-_length(u) // run_length(list(u.src[1:]), items)) for u in hoisted]
    work = max(runs + [-(-math.prod(r.src[0].vmax for r in cols) // run_length(list(cols), items))])
    group = min(REDUCE_GROUP, max(WARP, 1 << (work - 1).bit_length()))
    shuffled = all(shuffles(u.dtype) for u in hoisted)   # (a local-memory tree is the whole group's: one row a group)
    if warp_rows > 1 and shuffled and _short_rows(hoisted, rows, cols, work, items):
        group = WARP   # a warp a row, its lanes taking several runs each: shuffles only, no barrier
    if warp_rows > 1 and group > WARP and shuffled:
        group = min(group, -(-work // WARP) * WARP)   # any number of warps combines: none of the group idles
    return Rows(frozenset(hoisted), _uniform_first(hoisted, rows), rows, cols, group,
                warp_rows if group == WARP and shuffled else 1, items)


def _short_rows(hoisted: list, rows: tuple, cols: tuple, work: int, items: int) -> bool:
    """Whether rows of `work` runs get a warp each (see the module's docstring): rows with columns, every reduction's
    range and the columns static and in whole runs of `items`, at most WARP_ROW_RUNS runs a lane, and at least
    WARP_ROWS_MIN rows (at the most of a symbolic count: a decode batch's)."""
    ranges = [list(u.src[1:]) for u in hoisted] + [list(cols)]
    return bool(cols) and all(r.src[0].op is Ops.CONST for rs in ranges for r in rs) and all(
        run_length(rs, items) == items for rs in ranges) and work <= WARP * WARP_ROW_RUNS and math.prod(
        r.src[0].vmax for r in rows) >= WARP_ROWS_MIN


def _column_plan(hoisted: list, rows: tuple, cols: tuple, columns: tuple, items: int,
                 shuffled: bool = False) -> Rows | None:
    """The row kernel of a kernel with column reductions (softmax_contraction.py): a row a work-group (the row's
    values live in local memory), covering each run of columns at least once; None (each work-item computes its
    outputs inline) where the columns are not static or more runs than the largest group. Where the dialect's
    work-items take runs (`items` > 1), a run is LOAD_BYTES of the narrowest element the column reductions load (a
    bfloat16 value row's 8 columns: one 16-byte load), so more slices of the positions share the group (p @ V over
    257 positions: 9 a work-item, not 17). Its rows along a range the heavy loads do not read are one work-group's
    (`_fold_range`; `shuffled`: the dialect's warps add their partials by shuffles, `warp_slices`)."""
    if not all(c.src[0].op is Ops.CONST for c in cols):
        return None
    if items > 1:
        items = _load_run(columns)
    probe = Rows(frozenset(hoisted), (), rows, cols, REDUCE_GROUP, 1, items, columns)
    work = max([probe.column_runs] + [_length(u) for u in (*hoisted, *columns)])
    group = min(REDUCE_GROUP, max(WARP, 1 << (work - 1).bit_length()))
    if probe.column_runs > group:
        return None
    plan = Rows(frozenset(hoisted) | frozenset(columns), _uniform_first(hoisted, rows), rows, cols, group, 1, items,
                columns)
    return attrs.evolve(plan, fold=_fold_range(plan, shuffled))


def _fold_range(rows: Rows, shuffled: bool) -> UOp | None:
    """The row range whose every row a column row kernel's work-group computes (see the module's docstring), or None:
    of the row ranges of a static end of 2 to FOLD_MAX that no heavy load reads (a load whose address reads the
    range of a column reduction, the row's positions: a key or value row, a block table's entry; share_passes made
    the scores' ranges those of p @ V), there being heavy loads, the longest (the innermost of equals) whose rows'
    local arrays (`local_bytes`) fit FOLD_LOCAL_BYTES and that leaves FOLD_MIN_GROUPS work-groups at the rows' least
    count (a var's smallest: the kernel serves its whole range)."""
    least = math.prod(r.src[0].vmin for r in rows.rows)
    fits = [r for r in _foldable(rows) if r.src[0].arg <= FOLD_MAX and least // r.src[0].arg >= FOLD_MIN_GROUPS
            and r.src[0].arg * local_bytes(rows, shuffled) <= FOLD_LOCAL_BYTES]
    return max(reversed(fits), key=lambda r: r.src[0].arg, default=None)


def _foldable(rows: Rows) -> list[UOp]:
    """The row ranges of a static end of at least 2 that no heavy load of the row kernel reads (`_fold_range`), in
    order; none where it has no heavy loads."""
    positions = {x for u in rows.columns for x in u.src[1:]}
    heavy = [ranges for u in rows.reduces for x in u.src[0].toposort() if x.op is Ops.LOAD
             and positions & (ranges := {y for y in x.src[1].toposort() if y.op is Ops.RANGE})]
    read = set().union(*heavy)
    return [r for r in rows.rows if heavy and r.src[0].op is Ops.CONST and r.src[0].arg >= 2 and r not in read]


def local_bytes(rows: Rows, shuffled: bool) -> int:
    """Local memory a column row kernel's row takes, about: its two arrays of float32 (the scores and the
    probabilities: softmax_contraction.py) at the row's largest length, its column reductions' partials."""
    longest = max(math.prod(x.src[0].vmax for x in u.src[1:]) for u in rows.reduces)
    partials = rows.slices // warp_slices(rows, shuffled) * rows.column_runs * run_length(list(rows.cols), rows.run)
    return 4 * (2 * longest + len(rows.columns) * partials)


def _uniform_first(hoisted: list, rows: tuple) -> tuple:
    """The reductions in the order they are computed: those no row depends on first (they read no row's value),
    each group operands first."""
    return tuple(sorted(hoisted, key=lambda u: not free_ranges(u).isdisjoint(rows)))


def rows_of(ast: UOp, group: int, pack: int, run: int, share: int = 1, batched: bool = False) -> Rows:
    """The row kernel a launch decided (gpu_launch.py: `group` work-items a row, `pack` rows a work-group, each
    work-item taking runs of `run` elements; `batched`: looping over the batch range, batch_plan, a row's lanes
    owning `share` columns (`block`); else a work-group computing `share` rows along its `fold` range)."""
    hoisted, rows, cols, columns = _hoisted(ast)
    plan = Rows(frozenset(hoisted) | frozenset(columns), _uniform_first(hoisted, rows), rows, cols, group, pack, run,
                columns, batch_range(rows) if batched else None, share if batched else 1)
    if batched or share == 1:
        return plan
    return attrs.evolve(plan, fold=[r for r in _foldable(plan) if r.src[0].arg == share][-1])


def batch_range(rows: tuple) -> UOp | None:
    """The batch of a kernel of these row ranges: the one of a symbolic end (a var: a decode step's sequences),
    where there are others (the columns of a weight), all static; else None."""
    var = [r for r in rows if r.src[0].op is not Ops.CONST]
    return var[0] if len(var) == 1 and len(rows) > 1 else None


def held_parts(u: UOp, batch: UOp) -> list[UOp]:
    """The largest float parts of reduction `u`'s operand that read its range but not the `batch` range (a weight,
    unpacked from its blocks or widened): what a batch row kernel's work-item holds in registers for every row."""
    mine = set(u.src[1:])
    return largest_float_parts(u, lambda free: batch not in free and bool(free & mine))


def row_parts(u: UOp, batch: UOp) -> list[UOp]:
    """The largest float parts of reduction `u`'s operand that read the `batch` range and no other loop range (a
    row's elements, loaded or widened): the same for every column of a batch row kernel's block."""
    others = {x for x in u.toposort() if x.op is Ops.RANGE} - set(u.src[1:]) - {batch}
    return largest_float_parts(u, lambda free: batch in free and not free & others)


def largest_float_parts(u: UOp, wanted) -> list[UOp]:
    """The largest float parts of reduction `u`'s operand whose free ranges `wanted` accepts, in walk order."""
    found, seen = [], set()

    def visit(x: UOp):
        if x in seen or x.op in (Ops.CONST, Ops.RANGE, Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR):
            return
        seen.add(x)
        if x.dtype.is_float and wanted(free_ranges(x)):
            found.append(x)
            return
        for y in x.src:
            visit(y)
    visit(u.src[0])
    return found


def batch_plan(ast: UOp, items: int = 1, warp_rows: int = 1) -> Rows | None:
    """The batch row kernel this kernel becomes (see the module's docstring), or None: where it has a batch
    (`batch_range`), no columns, and every reduction is a sum over static ranges that depends on every row range and
    holds parts (`held_parts`) of at most HELD_MAX values a work-item. Where the dialect shuffles (`warp_rows` > 1) a
    column is a warp's or part of one (`_lanes_and_run`: MATVEC_WARPS warps a work-group) taking the matvec's runs
    (`_matvec_run`) or shorter ones; otherwise a work-group's of the row plan's size, in runs of `items`."""
    hoisted, rows, cols, columns = _hoisted(ast)
    batch = batch_range(rows)
    if not hoisted or cols or columns or batch is None:
        return None
    if not all(u.arg is Ops.ADD and free_ranges(u) == set(rows) and all(r.src[0].op is Ops.CONST for r in u.src[1:])
               for u in hoisted):
        return None
    if warp_rows > 1:
        run = _matvec_run(hoisted, rows, cols, warp_rows)
        if run is None:
            return None
        group, run = _lanes_and_run(hoisted, batch, run)
        pack = MATVEC_WARPS * WARP // group
    else:
        work = max(-(-_length(u) // run_length(list(u.src[1:]), items)) for u in hoisted)
        run, group, pack = items, min(REDUCE_GROUP, max(WARP, 1 << (work - 1).bit_length())), 1
    for u in hoisted:
        held = _held_values(u, batch, group, run)
        if not held or held > HELD_MAX:
            return None
    block = _block(hoisted, rows, batch, group, run, pack) if warp_rows > 1 else 1
    return Rows(frozenset(hoisted), _uniform_first(hoisted, rows), rows, cols, group, pack, run, batch=batch,
                block=block)


def _block(hoisted: list, rows: tuple, batch: UOp, lanes: int, run: int, pack: int) -> int:
    """Neighbouring columns the `lanes` of a batch row kernel's column own (each row's element then loaded once
    for all of them, one product a column): the most of BLOCK_COLUMNS whose held values, every reduction's for each
    column, are at most BLOCK_HELD_MAX a lane, and whose work-groups (`pack` columns' lanes each) at one chunk of
    rows are at least BLOCK_MIN_GROUPS (the head's 49152 columns, not a 576-wide projection's: see the module's
    docstring); else 1. Each column's sums are the ones it computes alone, in the same order."""
    width = math.prod(r.src[0].arg for r in rows if r is not batch)
    held = sum(_held_values(u, batch, lanes, run) for u in hoisted)
    fits = [c for c in BLOCK_COLUMNS if c * held <= BLOCK_HELD_MAX and -(-width // (c * pack)) >= BLOCK_MIN_GROUPS]
    return max(fits, default=1)


def share_batch_ranges(ast: UOp, rows: Rows) -> UOp:
    """`ast` with the ranges of a batch row kernel's reductions of the same extents made one reduction's
    (`_one_range`): gate/up's two sums of a column then read their row's elements as the same values, which the
    renderer loads once for both (render_batch_rows: one pass)."""
    return _one_range(ast, rows)


def share_passes(ast: UOp, items: int = 1, warp_rows: int = 1) -> UOp:
    """`ast` with each row reduction's range replaced by the columns' range where every pass is static, over ranges of
    one extent, one run per work-item (softmax's row of 128 on CUDA) or, for rows of a warp each, a few runs per lane
    (`Rows.passes`: layernorm's row of 384 on CUDA, 3 runs of 4 a lane; rmsnorm's 576, 4.5, the last run half the
    lanes'): the passes then read the row's elements as the same values, which the renderer keeps from the first pass
    (in registers) for the others."""
    rows = row_plan(ast, items, warp_rows)
    if rows is not None and rows.columns:
        return _one_range(ast, rows)
    if rows is None or len(rows.cols) != 1:
        return ast
    col = rows.cols[0]
    end, step = col.src[0], rows.group * run_length([col], items)
    passes = WARP_ROW_RUNS if rows.pack > 1 else 1   # (a warp's row: its lanes' runs, the last maybe some lanes')
    if end.op is not Ops.CONST or passes == 1 and end.arg % step or end.arg > step * passes or any(
            len(u.src) != 2 or u.src[1].src[0].op is not Ops.CONST or u.src[1].src[0].arg != end.arg for u in rows.order):
        return ast
    return ast.substitute({u.src[1]: col for u in rows.order})


def _one_range(ast: UOp, rows: Rows) -> UOp:
    """`ast` with the row's and the column reductions' ranges of the same extents made the same ranges (a softmax
    row's max, sum and p @ V all over its positions; a paged one's over its blocks and their rows): the values each
    reads at a position are then the same nodes, which the row keeps in local memory once
    (render_rows._row_arrays)."""
    first: dict = {}
    for u in (*rows.order, *rows.columns):
        first.setdefault(tuple(r.src[0] for r in u.src[1:]), u.src[1:])
    return ast.substitute({old: new for u in (*rows.order, *rows.columns)
                           for old, new in zip(u.src[1:], first[tuple(r.src[0] for r in u.src[1:])]) if old is not new})


def uses_grouped_reduce(ast: UOp) -> bool:
    """Whether this kernel gives each row (or output) a work-group."""
    return row_plan(ast) is not None


def _held_values(u: UOp, batch: UOp, lanes: int, run: int) -> int:
    """Values a work-item of a batch row kernel holds in registers for reduction `u`: its held parts' share of the
    range, `lanes` work-items a column in runs of `run` (or the range's shorter run)."""
    per = run_length(list(u.src[1:]), run)
    return len(held_parts(u, batch)) * -(-_length(u) // (lanes * per)) * per


def _lanes_and_run(hoisted: list, batch: UOp, run: int) -> tuple[int, int]:
    """(lanes a column, their run) of a batch row kernel on a dialect with shuffles: of a warp, a half or a quarter of
    one (a warp then computes 1, 2 or 4 columns, each loaded row of the batch read once for all), in runs of `run` or
    a power of two below it, at least SHORTEST_RUN long; the one of least work an output, a row's passes (every
    pass's whole run: a pass past the range's end costs as much as a full one) and its combine's steps, per lane
    times the lanes, of those holding at most HELD_MAX values a lane; the most lanes, then the longest run, of
    equals. 576 elements: half a warp in runs of 4 (9 passes, 36 elements, no lane idle; a warp in runs of 16: 2
    passes, 32 elements, the second for 4 lanes)."""
    def slots(lanes: int, c: int) -> int:
        return max(-(-_length(u) // (lanes * c)) * c for u in hoisted)

    def held(lanes: int, c: int) -> int:
        return max(_held_values(u, batch, lanes, c) for u in hoisted)
    runs = [c for c in (run >> s for s in range(run.bit_length())) if c >= min(run, SHORTEST_RUN)]
    options = [(lanes, c) for lanes in COLUMN_LANES for c in runs if held(lanes, c) <= HELD_MAX]
    if not options:
        return WARP, run
    return min(options, key=lambda o: ((slots(*o) + o[0].bit_length() - 1) * o[0], -o[0], -o[1]))


def launch_size(rows: Rows) -> UOp:
    """Work-items of a row kernel's launch (a batch row kernel's: a block of rows of the other ranges per
    BATCH_CHUNK rows of the batch)."""
    count = as_uop(sym_prod([r.src[0] for r in rows.rows if r is not rows.batch and r is not rows.fold]))
    if rows.batch is not None:   # (its columns' count is static: batch_range)
        count = as_uop(-(-count.arg // rows.block)) * ((rows.batch.src[0] + (BATCH_CHUNK - 1)) // BATCH_CHUNK)
    return (count + (rows.pack - 1)) // rows.pack * rows.size if rows.pack > 1 else count * rows.group
