"""The body of a fused attention kernel (attention_tiles.py decides it on the AST: the launch ("attention", rows, key
block, kind)), emitted through the C-style renderer on mma.sync m16n8k16 (render_fragments.py's fragments and
copies; shuffles on GPUs older than sm_80).

A work-group of four warps owns BLOCK_ROWS queries of one (batch, head), each warp 16 of them. It copies (cp.async
where it can: fragment_copies.py) its queries, and every key and value of the head, into local memory, zeros past
the key range's end; loads its warp's query fragments once; then makes one pass over the keys per row reduction of
the AST (a max, then a sum: no online rescaling, so each is the graph's value) and a last one for p @ V. Each pass
takes KEY_BLOCK keys at a time: their scores by mma into 32 float32 accumulators a lane (C layout: row g and g + 8,
keys 2t and 2t + 1 of each 8-key tile), every element of the pass's operand evaluated from its score (the AST's
expression, the score bound to its accumulator, the key and the query row bound to the element's), keys past the
end and query rows past theirs left out; a lane's partial values of its two rows are combined across the four
lanes holding a row (shuffles). Where the keys are at most KEEP_KEYS, a pass keeps, for each of the lane's scores,
the value the next part computes too (attention_tiles.Attention.kept: MiniLM's x = s * scale + bias for the sum,
exp(x - max) for the probabilities) in registers, the key blocks unrolled; the next pass reads it (its scores are
then not computed again: one exponential an element). The last pass evaluates the probabilities (rounded to the
16-bit float where the graph rounds them) and packs them, two keys a 32-bit register, straight into mma's A operand:
the C layout of two neighbouring 8-key tiles is the A layout of one 16-key step (FlashAttention-2's trick),
multiplied by the values' fragments (transposed matrix loads) into float32 accumulators of the context, rounded
once where they are stored (fragment_results.py). What the passes load for a key alone (attention_tiles'
Attention.staged: a mask's bias) is staged in local memory while the copies land. On sm_80 and newer the passes'
float32 max, their roundings to bfloat16 and the probabilities' packing are one instruction each (the C helpers' NaN
tests are left out where no NaN's bits can reach a stored value: _EXTREMUM, _PACK, and the renderer's roundings with
its `exact_nan` off: the dialect's round_bfloat16_any). The launch asks for Attention.resident_groups at once.
"""
from __future__ import annotations

import attrs

from ..uop import DType, Ops, UOp, dtypes, sym_prod
from ..uop.uop import as_uop
from .attention_tiles import SLICE, THREADS, Attention, key_loads
from .fragment_copies import element_type, emit_chunk_starts, emit_slice_copy
from .fragment_results import emit_results
from .render_fragments import KINDS, WARP, _helpers, _load_fragments, _staged
from .render_tiles import _extent

FRAG = 8        # keys or columns of one m16n8 tile
STEP = 16       # keys or head elements of one m16n8k16 step
_IDENTITY = {Ops.ADD: 0.0, Ops.MAX: float("-inf"), Ops.MIN: float("inf")}
# sm_80 on: the NaN-propagating max (min) of two floats in one instruction (FMNMX.NAN) where the C helper takes four
# (a NaN either way: the GPU's canonical one, its a + b too); the row passes' float32 max and min
_EXTREMUM = """float pj_{op}_nan(float a, float b) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float d;
  asm("{op}.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return (a != a || b != b) ? a + b : f{op}f(a, b);
#endif
}}"""
# sm_80 on: two floats rounded to a 16-bit float and packed (the low one first) in one instruction (F2FP) where the
# C helpers take ~5 a value: mma's A operand of two probabilities (a NaN stays a NaN; its sign and payload, which the
# helpers keep, do not reach the context: the mma's sums take them)
_PACK = """unsigned pj_pack_{ptx}x2(float lo, float hi) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned d;
  asm("cvt.rn.{ptx}x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#else
  return (unsigned){lo} | (unsigned){hi} << 16;
#endif
}}"""


def emit_attention(r, at: Attention):
    """The kernel body through the C-style renderer `r`."""
    d, long = r.d, r.long
    kind = KINDS[at.kind]
    r.resident_groups = at.resident_groups
    if kind.ptx == "bf16":
        r.bfloat16_helpers()
    _helpers(r, kind.ptx)
    q_tile, k_tile = _staged(at.score)
    k_tile = attrs.evolve(k_tile, name="K")
    v_tile = attrs.evolve(_staged(at.context)[1], name="V")
    key_end = at.context.k.src[0]
    head_slices = -(-at.score.k.src[0].arg // SLICE)
    blocks = _blocks(at)
    per_block = at.key_block // SLICE                         # slices of values a key block
    for tile, stages in ((q_tile, head_slices), (k_tile, blocks * head_slices), (v_tile, blocks * per_block)):
        shape = "][".join(str(x) for x in (stages, *tile.shape))
        r.locals.append(d.tile_array.format(type=element_type(r, kind), name=f"{tile.name}s", n=shape) + ";")
    for n, u in enumerate(at.staged):
        r.locals.append(d.tile_array.format(type=d.ctype(u.dtype), name=f"L{n}s", n=blocks * at.key_block) + ";")
    m, keys = r.value(_extent(at.context.i)), r.value(key_end)
    r.emit(f"const int lid = {d.local_id}, lane = lid % {WARP}, fg = lane / 4, ft = lane % 4 * 2, "
           f"wm = lid / {WARP} * 16;")
    r.emit(f"const {long} bid = {d.group_id}, nbm = ({m} + {at.block_rows - 1}) / {at.block_rows};")
    r.emit(f"const {long} i0 = bid % nbm * {at.block_rows}, j0 = 0;")
    if at.context.batch:
        r.scopes[-1].update(r.unflatten("(bid / nbm)", list(at.context.batch)))
    r.emit(f"const int nkb = (int)(({keys} + {at.key_block - 1}) / {at.key_block});")
    r.emit("int st = 0;")
    _stage(r, at, q_tile, k_tile, v_tile, head_slices, per_block)
    for step in range(-(-at.score.k.src[0].arg // STEP)):
        r.emit(f"st = {step * STEP // SLICE};")
        _load_fragments(r, q_tile, [f"q{step}_{e}" for e in range(4)], "wm", 0, step * STEP % SLICE)
    parts = [(p.src[0], p.src[1]) for p in at.passes] + [(at.context.a, at.context.k)]
    if any(_row_loads(at, operand, ()) for operand, _ in parts):
        r.emit(" ".join(f"const bool row{h} = i0 + wm + fg + {8 * h} < {m};" for h in range(2)))
    kept = [k for k in at.kept if k is not None]
    for K in range(blocks if kept else 0):   # (each key block's kept values of the lane's scores)
        r.emit(" ".join(f"float kv{K}_{y}_{e} = 0.0f;" for y in range(at.key_block // FRAG) for e in range(4)))
    r.exact_nan = False   # (the passes' and the probabilities' roundings: every value an operand of arithmetic before
    # anything stored, the stored context mma's sums, so no NaN's bits reach it; the results' own, `_context`)
    done, arriving = {}, None   # each pass -> its per-row names; the value the last pass kept, as read now
    for n, row_pass in enumerate(at.passes):
        leaving = at.kept[n] if at.kept else None
        done[row_pass] = _row_pass(r, at, n, row_pass, done, arriving, leaving, k_tile, head_slices, keys)
        arriving = leaving[1] if leaving else None
    _context(r, at, done, arriving, k_tile, v_tile, head_slices, keys, kind)


def _stage(r, at: Attention, q_tile, k_tile, v_tile, head_slices: int, per_block: int):
    """Copy the group's queries, the head's keys (KEY_BLOCK at a time, a key block's slices stages kb x head_slices
    on) and its values (SLICE keys a stage) into local memory, groups of asynchronous copies: the queries and the
    keys, where the key blocks are unrolled (`_unrolled`) a group a key block (the first pass waits for each before
    its block: `_key_blocks`); the values, waited for before p @ V (`_context`). Wait for the queries and the first
    key block; the loads of a key alone (Attention.staged) are loaded into theirs meanwhile."""
    r.open_block("", {})
    emit_chunk_starts(r, at.score, q_tile)
    for s in range(head_slices):
        emit_slice_copy(r, at.score, q_tile, str(s), str(s))
    r.close_block()
    groups = _blocks(at) if _unrolled(at) else 1   # (of the keys)
    for K in range(groups):
        r.open_block("for (int kb = 0; kb < nkb; kb++)" if groups == 1 else f"if ({K} < nkb)", {})
        if groups > 1:
            r.emit(f"const int kb = {K};")
        r.emit(f"const {r.long} j0 = ({r.long})kb * {at.key_block};")
        emit_chunk_starts(r, at.score, k_tile)
        for s in range(head_slices):
            emit_slice_copy(r, at.score, k_tile, f"kb * {head_slices} + {s}", str(s))
        r.close_block()
        r.emit("pj_cp_async_commit();")
    r.open_block("", {})
    emit_chunk_starts(r, at.context, v_tile)
    r.open_block(f"for (int ks = 0; ks < nkb * {per_block}; ks++)", {})
    emit_slice_copy(r, at.context, v_tile, "ks", "ks")
    r.close_block()
    r.close_block()
    r.emit("pj_cp_async_commit();")
    for n, u in enumerate(at.staged):   # (a value a key, loaded while the copies land)
        r.open_block(f"for (int sj = lid; sj < {r.value(at.context.k.src[0])}; sj += {THREADS})", {at.context.k: "sj"})
        r.emit(f"L{n}s[sj] = {r.value(u)};")
        r.close_block()
    r.emit(f"pj_cp_async_wait<{groups}>();")   # (the queries and the first keys; the rest land during the passes)
    r.emit(r.d.barrier)


def _scores(r, at: Attention, k_tile, head_slices: int) -> list[list[str]]:
    """The scores of key block kb for the warp's 16 rows: accumulators s{y}_{e} of 8-key tile y."""
    tiles = at.key_block // FRAG
    names = [[f"s{y}_{e}" for e in range(4)] for y in range(tiles)]
    for row in names:
        r.emit(" ".join(f"float {a} = 0.0f;" for a in row))
    for step in range(-(-at.score.k.src[0].arg // STEP)):
        r.open_block("", {})
        r.emit(f"st = kb * {head_slices} + {step * STEP // SLICE};")
        for y in range(0, tiles, 2):
            _load_fragments(r, k_tile, [f"k{y}_0", f"k{y}_1", f"k{y + 1}_0", f"k{y + 1}_1"], "0", y * FRAG,
                            step * STEP % SLICE)
        for y in range(tiles):
            r.emit(f"pj_mma_{KINDS[at.kind].ptx}({', '.join(names[y])}, q{step}_0, q{step}_1, q{step}_2, q{step}_3, "
                   f"k{y}_0, k{y}_1);")
        r.close_block()
    return names


def _blocks(at: Attention) -> int:
    """Key blocks at the key range's largest."""
    return -(-at.context.k.src[0].vmax // at.key_block)


def _unrolled(at: Attention) -> bool:
    """Whether the key blocks are unrolled: where a lane keeps values across passes (in registers named by block)."""
    return any(k is not None for k in at.kept)


def _key_blocks(r, at: Attention, body, first: bool = False):
    """`body(K)` for each key block kb (its lane's first key kbase): a loop over them (K None), or, where the lane
    keeps values across passes (`_unrolled`), each block unrolled (K its number), those past the end skipped; in the
    `first` pass, each after its keys' copies (`_stage`: a group each; the values' group last)."""
    if not _unrolled(at):
        r.open_block("for (int kb = 0; kb < nkb; kb++)", {})
        r.emit(f"const {r.long} kbase = ({r.long})kb * {at.key_block} + ft;")
        body(None)
        r.close_block()
        return
    for K in range(_blocks(at)):
        r.open_block("", {})
        r.emit(f"const int kb = {K};")
        r.open_block("if (kb < nkb)", {})
        if first and K > 0:   # (blocks K + 1 on and the values may still be in flight)
            r.emit(f"pj_cp_async_wait<{_blocks(at) - K}>();")
            r.emit(r.d.barrier)
        r.emit(f"const {r.long} kbase = ({r.long})kb * {at.key_block} + ft;")
        body(K)
        r.close_block()
        r.close_block()


def _elements(r, at: Attention, operand: UOp, own: UOp, done: dict, keys: str, body, names, block, arriving,
              leaving, tiles: range):
    """For each score element of the 8-key `tiles` of key block kb (`block`: its number where values are kept) whose
    key is below the end (tested unless the end is a static multiple of the key block): `body(y, e)` in a scope
    binding the key range `own` to its key, the row ranges to its query row's (flattened row-major), the scores read
    along `own` to their accumulators `names` (None where `operand` reads none: `_block_scores`), the value the last
    pass kept (`arriving`) to its register, each pass done to its row's value; then the value `leaving` (as computed
    here) kept in the element's register for the next pass. What `operand` loads for a key alone (a mask's bias) is
    loaded once for the lane's two rows; a query row past the rows' end is left out where `operand` loads anything
    of a row (else its values are computed from the zeros staged there, and never stored). A load of a key alone
    staged in local memory (Attention.staged) is read from there."""
    stop, end = {arriving} - {None}, at.context.k.src[0]
    per_key, per_row = key_loads(operand, at.context.i, stop), _row_loads(at, operand, stop)
    staged = {u: n for n, u in enumerate(at.staged)}
    whole = end.op is Ops.CONST and end.arg % at.key_block == 0   # (every key of every block below the end)
    for y in tiles:
        for pair in range(2):
            key = f"(kbase + {FRAG * y + pair})"
            r.open_block("" if whole else f"if ({key} < {keys})", {own: key})
            for u in per_key:   # (from local memory where staged)
                n = staged.get(u.substitute({own: at.context.k}))
                r.scopes[-1][u] = r.value(u) if n is None else r.let(u.dtype, f"L{n}s[{key}]")
            for half in range(2):
                e = 2 * half + pair
                bind = {p: v[half] for p, v in done.items()}
                if names is not None:
                    bind.update({s: names[y][e] for s, along in at.scores if along is own})
                if arriving is not None:
                    bind[arriving] = f"kv{block}_{y}_{e}"
                r.open_block(f"if (row{half})" if per_row else "", bind)
                r.scopes[-1].update(r.unflatten(f"(i0 + wm + fg + {8 * half})", list(at.context.i)))
                body(y, e)
                if leaving is not None:
                    r.emit(f"kv{block}_{y}_{e} = {r.value(leaving[0])};")
                r.close_block()
            r.close_block()


def _block_scores(r, at: Attention, operand: UOp, own: UOp, arriving, k_tile, head_slices: int):
    """The scores of key block kb (`_scores`) where `operand` reads them (outside the value kept for it), or None."""
    return _scores(r, at, k_tile, head_slices) if _reads_scores(at, operand, own, {arriving} - {None}) else None


def _walk(u: UOp, stop: set):
    """The nodes `u` reads outside reductions (the reductions themselves included) and `stop`."""
    seen, stack = set(), [u]
    while stack:
        n = stack.pop()
        if n in seen or n in stop:
            continue
        seen.add(n)
        yield n
        if n.op is not Ops.REDUCE:
            stack.extend(n.src)


def _reads_scores(at: Attention, operand: UOp, own: UOp, stop: set) -> bool:
    return any(s in set(_walk(operand, stop)) for s, along in at.scores if along is own)


def _row_loads(at: Attention, operand: UOp, stop) -> bool:
    """Whether `operand` loads anything (outside reductions and `stop`) that a query row indexes."""
    return any(u.op is Ops.LOAD and _depends(u, at.context.i) for u in _walk(operand, set(stop)))


def _depends(u: UOp, ranges: tuple) -> bool:
    return any(x in ranges for x in u.toposort())


def _row_pass(r, at: Attention, n: int, row_pass, done: dict, arriving, leaving, k_tile, head_slices: int,
              keys: str) -> tuple:
    """One pass over the keys computing the row reduction `row_pass` for the lane's two rows; their names."""
    dt: DType = row_pass.dtype
    ident = r.d.literal(_IDENTITY[row_pass.arg], dt)
    parts = [f"red{n}_{h}" for h in range(2)]
    r.emit(" ".join(f"{r.d.ctype(dt)} {p} = {ident};" for p in parts))

    def add(y, e):
        part = parts[e // 2]
        r.emit(f"{part} = {_combine(r, row_pass.arg, dt, part, r.value(row_pass.src[0]))};")
    def block(K):
        names = _block_scores(r, at, row_pass.src[0], row_pass.src[1], arriving, k_tile, head_slices)
        _elements(r, at, row_pass.src[0], row_pass.src[1], done, keys, add, names, K, arriving, leaving,
                  range(at.key_block // FRAG))
    _key_blocks(r, at, block, first=n == 0)
    for p in parts:   # the four lanes of a row (lanes 4g ... 4g + 3) combined
        for o in (1, 2):
            r.emit(f"{p} = {_combine(r, row_pass.arg, dt, p, r.d.shuffle_xor.format(v=p, o=o))};")
    if dt.narrow:
        return tuple(r.round_to(p, dt) for p in parts)
    for p in parts:
        r.lets.add(p)
    return tuple(parts)


def _combine(r, op: Ops, dt: DType, acc: str, v: str) -> str:
    """`acc` combined with `v` by a row pass's `op`: a float32 max or min by _EXTREMUM's helper, else the
    renderer's."""
    if op not in (Ops.MAX, Ops.MIN) or dt != dtypes.float32:
        return r.combine(op, dt, acc, v)
    name = "max" if op is Ops.MAX else "min"
    return r.let(dt, f"{r.helper(f'pj_{name}_nan', _EXTREMUM.format(op=name))}({acc}, {v})")


def _context(r, at: Attention, done: dict, arriving, k_tile, v_tile, head_slices: int, keys: str, kind):
    """The last pass: each key block's probabilities (the AST's, from its scores or the value the last pass kept)
    packed into A fragments and multiplied by the values' fragments into the context's accumulators, then stored."""
    c = at.context
    r.emit("pj_cp_async_wait<0>();")   # (the values, copied during the row's passes)
    r.emit(r.d.barrier)
    cols = c.tn // FRAG
    outs = [[f"o{y}_{e}" for e in range(4)] for y in range(cols)]
    for row in outs:
        r.emit(" ".join(f"float {a} = 0.0f;" for a in row))
    u32 = r.d.ctype(dtypes.uint32)
    bits = r.sixteen_bits(c.a.src[0].dtype)
    pack = r.helper(f"pj_pack_{kind.ptx}x2", _PACK.format(ptx=kind.ptx, lo=bits("lo"), hi=bits("hi")))

    def block(K):
        names = _block_scores(r, at, c.a, c.k, arriving, k_tile, head_slices)
        for step in range(at.key_block // STEP):   # (a step's probabilities computed, packed and multiplied)
            r.open_block("", {})
            probs = [[f"p{y}_{e}" for e in range(4)] for y in (2 * step, 2 * step + 1)]
            r.emit(" ".join(f"float {p} = 0.0f;" for row in probs for p in row))

            def probability(y, e):   # (the float the probability is rounded from, rounded where packed)
                v = r.value(c.a.src[0])
                r.emit(f"p{y}_{e} = {r.rounded_from.get(v, v)};")
            _elements(r, at, c.a, c.k, done, keys, probability, names, K, arriving, None, range(2 * step, 2 * step + 2))
            lo, hi = probs
            pairs = ((lo[0], lo[1]), (lo[2], lo[3]), (hi[0], hi[1]), (hi[2], hi[3]))
            r.emit(f"const {u32} " + ", ".join(f"pa{e} = {pack}({x}, {y})" for e, (x, y) in enumerate(pairs)) + ";")
            r.emit(f"st = kb * {at.key_block // SLICE} + {step * STEP // SLICE};")
            for y in range(0, cols, 2):
                _load_fragments(r, v_tile, [f"v{y}_0", f"v{y}_1", f"v{y + 1}_0", f"v{y + 1}_1"], "0", y * FRAG,
                                step * STEP % SLICE)
            for y in range(cols):
                r.emit(f"pj_mma_{kind.ptx}({', '.join(outs[y])}, pa0, pa1, pa2, pa3, v{y}_0, v{y}_1);")
            r.close_block()
    _key_blocks(r, at, block)
    r.exact_nan = True   # (the results' roundings: stored)
    cells = [(outs[y][e], f"wm + {8 * (e // 2)} + fg", f"{FRAG * y + e % 2} + ft") for y in range(cols)
             for e in range(4)]
    emit_results(r, c, cells)


def launch_size(at: Attention) -> UOp:
    """Work-items of the launch: THREADS a group, a group per (batch, block of BLOCK_ROWS queries)."""
    rows = _extent(at.context.i)
    return as_uop(sym_prod([r.src[0] for r in at.context.batch] + [(rows + (at.block_rows - 1)) // at.block_rows])) \
        * THREADS
