"""Encoder attention as one tensor-core kernel (issue 22): softmax(q @ k^T * scale + mask) @ v, whose softmax rows are
read by T queries a key (MAX_ROWS_A_VALUE and more: an encoder's, a prefill's), computed by one work-group per
(batch, head, block of BLOCK_ROWS queries) on mma.sync m16n8k16 (render_attention.py renders it). The queries of a
key head may be several row ranges (grouped-query heads: G x T), flattened row-major into the blocks.

The schedule (softmax_contraction.py, where the target asks for it: `Target.fuses_attention`) keeps such a softmax
inside its contraction's kernel when `fits` says the tile can hold it; the target's pass (gpu_launch.py) then
matches the kernel AST (`match_attention`) and records the launch ("attention", BLOCK_ROWS, KEY_BLOCK, kind), which
the renderer follows. The kernel is the AST's computation: p @ V (`context`, a REDUCE(ADD) over a key range of a
16-bit value widened times another) whose probabilities read the scores (`scores`: each a REDUCE(ADD) over a head
range of a 16-bit query times a 16-bit key, the same values over each key range it is read along) and the row's
reductions (`passes`: a max, a sum, each over a key range of the same end), in the order they read one another.
Every rounding of the graph stays where it is: each pass and the probabilities are the AST's own expressions,
evaluated at each score.

What a work-group stages in local memory (`local_bytes`): its block of queries and the whole head's keys and values
(every key of the row at the key range's largest value): three passes over the keys read them from there (the
row's max, its sum, then p @ V), none from memory again. Where they do not fit LOCAL_BYTES (long rows, wide heads)
the softmax keeps its three kernels. What the passes load for a key alone (`staged_loads`: a mask's bias of each
key) is staged there too, a value a key, where it fits beside them: each element then reads it from local memory,
not from global memory in the middle of a pass.
"""
from __future__ import annotations

import math

import attrs

from ..uop import Ops, UOp, dtypes
from .render_tiles import Contraction

BLOCK_ROWS = 64          # queries a work-group owns (4 warps of 16 rows: one warpgroup)
KEY_BLOCK = 64           # keys whose scores a warp holds in registers at a time (8 m16n8 tiles: 32 floats a lane)
THREADS = 128            # work-items of a group
LOCAL_BYTES = 48 * 1024  # local memory the staged queries, keys and values may take (static local memory)
SLICE = 32               # 16-bit elements of a staged slice along a contraction's k (render_fragments.SLICE_K)
MAX_HEAD = 128           # a score's summed elements (a head's dimension) and p @ V's columns, at most
COLUMN_STEP = 32         # p @ V's columns are a multiple of this (a stage of values is whole chunks for every lane)
KEEP_KEYS = 128          # keys (at the key range's largest) up to which a lane keeps a value of each of its scores
                         # from one pass for the next (`kept`): 2 rows x KEEP_KEYS / 4 keys = 64 registers
RESIDENT_GROUPS = 6      # work-groups a multiprocessor holds at once (__launch_bounds__(THREADS, 6): 80 registers a
                         # lane) unless a kernel's lane holds more (`resident_groups`): on an H100 (132 SMs) MiniLM's
                         # 768 groups (b32 t128 bf16) in one wave, its attention kernel 24.6 us against 29.7 at 4
                         # groups (128 registers, 1.45 waves), the same embeddings (lead, CUDA events, 6 layers). The
                         # grid against the device's multiprocessors is not known when the kernel is rendered: 6 is
                         # what fits MiniLM-sized grids in one wave on an H100 / H200; untimed elsewhere
NARROW_HEAD = 32         # a head's dimension and p @ V's columns up to which a lane keeping values across passes
                         # holds few enough registers beside them for 5 or 6 groups (`resident_groups`)
SIXTEEN_BITS = (dtypes.bfloat16, dtypes.float16)


def _padded(n: int, step: int) -> int:
    return -(-n // step) * step


def local_bytes(keys: int, head: int, columns: int) -> int:
    """Local memory of a work-group's staged queries (BLOCK_ROWS x head), keys (keys x head) and values (keys x
    columns), 16-bit, the keys padded to whole key blocks and the head to whole slices."""
    keys, head = _padded(keys, KEY_BLOCK), _padded(head, SLICE)
    return 2 * (BLOCK_ROWS * head + keys * head + keys * columns)


def fits(keys: int, head: int, columns: int) -> bool:
    """Whether a softmax row of `keys` (at most), scores summing `head` products and p @ V of `columns` outputs a row
    take the attention tile."""
    return 0 < head <= MAX_HEAD and 0 < columns <= MAX_HEAD and columns % COLUMN_STEP == 0 and \
        local_bytes(keys, head, columns) <= LOCAL_BYTES


@attrs.frozen
class Attention:
    """The fused attention kernel's parts (see the module): p @ V, the scores over its key range, every score node
    with the key range it is read along, the row's passes in order, the launch's rows and key block."""
    context: Contraction   # p @ V: a (the probabilities) by b (the values), k the key range, i the queries, j columns
    score: Contraction     # the scores over the context's key range: a the queries, b the keys, k the head range
    scores: tuple          # (score REDUCE, the key range it is read along) of every score node
    passes: tuple          # the row's reductions, each over a key range, in the order they read one another
    kind: str              # the 16-bit float's name (render_fragments.KINDS)
    kept: tuple = ()       # per pass: (as it computes it, as the next part reads it) the value of each score that the
                           # next part (pass, or the probabilities) computes too, or None (`_kept`)
    staged: tuple = ()     # the loads of a key alone staged in local memory, over the context's key range
    block_rows: int = BLOCK_ROWS
    key_block: int = KEY_BLOCK
    resident_groups: int = 1   # work-groups a multiprocessor should hold at once (`resident_groups`; 1: none asked)


def _narrow(x: UOp):
    """The 16-bit float `x` widens (a CAST of one to float32), or None."""
    return x.src[0].dtype if x.op is Ops.CAST and x.dtype == dtypes.float32 and x.src[0].dtype in SIXTEEN_BITS \
        else None


def _ranges(u: UOp) -> set:
    return {x for x in u.toposort() if x.op is Ops.RANGE}


def _outside_reductions(u: UOp) -> tuple[set, list]:
    """(the ranges `u` reads outside reductions, the reductions it reads, outermost ones only)."""
    ranges, reductions, seen, stack = set(), [], set(), [u]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op is Ops.REDUCE:
            reductions.append(n)
        elif n.op is Ops.RANGE:
            ranges.add(n)
        else:
            stack.extend(n.src)
    return ranges, reductions


def _score_parts(u: UOp, rows: frozenset, batch: frozenset):
    """(query operand, key operand, head range, key range) of a score node: a REDUCE(ADD) over one head range (of a
    static end) of a 16-bit query (of row ranges, the batch and the head) times a 16-bit key (of one key range, the
    batch and the head); or None."""
    if u.arg is not Ops.ADD or len(u.src) != 2 or u.src[0].op is not Ops.MUL or u.src[1].src[0].op is not Ops.CONST:
        return None
    head = u.src[1]
    for q, k in (u.src[0].src, reversed(u.src[0].src)):
        kind = _narrow(q)
        if kind is None or kind != _narrow(k) or any(x.op is Ops.REDUCE for x in q.toposort() + k.toposort()):
            continue
        rq, keys = _ranges(q), _ranges(k) - batch - {head}
        if rq & rows and rq <= rows | batch | {head} and len(keys) == 1 and not keys & rows:
            return q, k, head, next(iter(keys))
    return None


def match_attention(ast: UOp, block_rows: int = BLOCK_ROWS, key_block: int = KEY_BLOCK) -> Attention | None:
    """The attention kernel `ast` computes (see the module), or None."""
    store = ast.src[0]
    if store.op is not Ops.STORE or len(store.src) != 3:
        return None
    _, top = _outside_reductions(store.src[2])
    if len(top) != 1 or top[0].arg is not Ops.ADD or len(top[0].src) != 2 or top[0].src[0].op is not Ops.MUL:
        return None
    outer, key = top[0], top[0].src[1]
    loops = {r for r in _ranges(store) if r.arg[1] == "loop"}
    for a, b in (outer.src[0].src, reversed(outer.src[0].src)):
        kind = _narrow(a)
        if kind is None or kind != _narrow(b) or any(x.op is Ops.REDUCE for x in b.toposort()):
            continue
        ra, rb = _ranges(a) & loops, _ranges(b) & loops
        if not ra - rb or len(rb - ra) != 1 or not _ranges(b) <= loops | {key}:
            continue
        rows, (cols,) = frozenset(ra - rb), rb - ra
        found = _parts(outer, a, b, rows, cols, frozenset(loops - rows - {cols}), kind, block_rows, key_block)
        if found is not None:
            return found
    return None


def _parts(outer, a, b, rows, cols, batch, kind, block_rows, key_block) -> Attention | None:
    """The Attention of p @ V `outer` (a the probabilities, b the values), or None where a reduction inside is no
    score or row pass, a part reads what its pass does not own, or the tile cannot hold it."""
    key = outer.src[1]
    end = key.src[0]
    scores, passes = {}, []
    for u in a.toposort():
        if u.op is not Ops.REDUCE:
            continue
        parts = _score_parts(u, rows, batch)
        if parts is not None:
            scores[u] = parts
        elif len(u.src) == 2 and u.src[1].src[0] is end and u.arg in (Ops.MAX, Ops.ADD, Ops.MIN):
            passes.append(u)   # (in toposort order: a pass after those it reads)
        else:
            return None
    owned = [key] + [p.src[1] for p in passes]
    if len(set(owned)) != len(owned):
        return None
    for part, own in [(a, key)] + [(p.src[0], p.src[1]) for p in passes]:
        seen, inside = _outside_reductions(part)
        if not seen <= rows | batch | {own}:
            return None
        for u in inside:
            if (scores[u][3] is not own) if u in scores else u not in passes:
                return None
    base = [s for s, parts in scores.items() if parts[3] is key]
    if not base:
        return None
    q, k, head, _ = scores[base[0]]
    if any(s.substitute({key_range: key, h: head}) is not base[0] for s, (_, _, h, key_range) in scores.items()):
        return None   # (every score is the context's, read along another key range)
    columns = cols.src[0]
    if columns.op is not Ops.CONST or not fits(end.vmax, head.src[0].arg, columns.arg):
        return None
    order, queries = (tuple(sorted(x, key=lambda r: r.arg[0])) for x in (batch, rows))   # (flattened row-major)
    score = Contraction(base[0], q, k, queries, (key,), head, order, block_rows, key_block, 1, kind.name)
    context = Contraction(outer, a, b, queries, (cols,), key, order, block_rows, columns.arg, 1, kind.name)
    along = tuple((s, parts[3]) for s, parts in scores.items())
    parts = [(p.src[0], p.src[1]) for p in passes] + [(a, key)]
    kept = _kept(parts, along) if end.vmax <= KEEP_KEYS else ()
    staged = staged_loads(parts, queries, key)
    room = LOCAL_BYTES - local_bytes(end.vmax, head.src[0].arg, columns.arg)
    if sum(_padded(end.vmax, key_block) * u.dtype.itemsize for u in staged) > room:
        staged = ()
    groups = resident_groups(kept, head.src[0].arg, columns.arg, end.op is Ops.CONST and end.arg % key_block == 0)
    return Attention(context, score, along, tuple(passes), kind.name, kept, staged, block_rows, key_block, groups)


def resident_groups(kept: tuple, head: int, columns: int, whole: bool) -> int:
    """Work-groups a multiprocessor should hold at once: RESIDENT_GROUPS, fewer where a lane keeps a value of each of
    its scores across passes (`kept`) and holds more beside them: heads or p @ V's columns above NARROW_HEAD (their
    query fragments and context accumulators: 4 groups, 128 registers) or a key range's end that is no static
    multiple of the key block (the keys' guards: 5 groups, 96 registers). Bytes spilled (nvcc 13.0 sm_90a -Xptxas
    -v, .wgmma_scratch/s16_attn2_regs.py) at 6 / 5 / 4 groups: MiniLM's kernel (heads of 32, static T = 128) 140 /
    36 / 0; heads of 32 at a var T <= 128: 364 / 148 / 0; causal and grouped-query heads of 64 at a var T <= 128:
    672 and 664 / 376 and 440 / 56 and 96; heads of 32 at a var T <= 256 (none kept): 76 / 16 / 0. Timed for
    MiniLM's kernel only."""
    if not any(k is not None for k in kept):
        return RESIDENT_GROUPS
    if max(head, columns) > NARROW_HEAD:
        return min(RESIDENT_GROUPS, 4)
    return RESIDENT_GROUPS if whole else min(RESIDENT_GROUPS, 5)


def key_loads(operand: UOp, rows: tuple, stop: set = frozenset()) -> list:
    """The loads `operand` reads outside reductions (and `stop`) that no query row (`rows`) indexes: a key's alone."""
    seen, stack, out = set(), [operand], []
    while stack:
        n = stack.pop()
        if n in seen or n in stop:
            continue
        seen.add(n)
        if n.op is Ops.LOAD and not any(x in rows for x in n.toposort()):
            out.append(n)
        if n.op is not Ops.REDUCE:
            stack.extend(n.src)
    return out


def staged_loads(parts: list, rows: tuple, key: UOp) -> tuple:
    """Every part's (operand, key range) loads of a key alone, moved to the context's key range `key`, once each."""
    found = {}
    for operand, own in parts:
        for u in key_loads(operand, rows):
            found.setdefault(u.substitute({own: key}), None)
    return tuple(found)


def _kept(parts: list, along: tuple) -> tuple:
    """For each part (its operand, its key range) but the last: (the value as the part computes it, as the next part
    reads it) of the largest value of a score the part computes that the next part computes too (the part's expression
    moved to the next one's key range and scores: x = s * scale + bias of the max's pass is the sum's, exp(x - max) of
    the sum's the probabilities'); None where there is no single one. A lane keeps it in registers for each of its
    scores (KEEP_KEYS), so the next pass reads it rather than computing it again (the same expression of the same
    operands: the same value)."""
    out = []
    for (prev, k0), (nxt, k1) in zip(parts, parts[1:]):
        olds, news = [s for s, k in along if k is k0], [s for s, k in along if k is k1]
        moves = {**{s: news[0] for s in olds}, k0: k1} if olds and news else None
        mine = set(nxt.toposort())
        there = {u: moved for u in prev.toposort() if moves and (moved := u.substitute(moves)) in mine and
                 news[0] in moved.toposort()}
        tops = [u for u in there if not any(u in v.src for v in there)]
        out.append((tops[0], there[tops[0]]) if len(tops) == 1 else None)
    return tuple(out)


def attention_launch(ast: UOp, dialect, few: int) -> tuple | None:
    """The launch of a fused attention kernel on a dialect with tensor cores, where more than `few` queries read each
    key (softmax_contraction.MAX_ROWS_A_VALUE: fewer, a decode step's heads, are row kernels): ("attention",
    BLOCK_ROWS, KEY_BLOCK, kind), or None."""
    found = match_attention(ast, BLOCK_ROWS, KEY_BLOCK) if dialect.tensor_core_mma else None
    if found is None or math.prod(r.src[0].vmax for r in found.context.i) <= few:
        return None
    return "attention", found.block_rows, found.key_block, found.kind
