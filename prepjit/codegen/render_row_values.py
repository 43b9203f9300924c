"""What a row kernel's work-items compute once, and a shared row's elements (render_rows.py renders row kernels).

A row's values that no column gives (a layernorm's mean and 1 / sqrt(variance + eps), with their roundings) are
rendered once before the passes over its elements (`row_values`), not in each element's code: NVRTC did not merge the
copies (12 square roots a lane of a bfloat16 layernorm of 384).

A shared row (row_plan.share_passes: every pass over the columns' one range) binds each of a work-item's elements,
pass by pass, to a scope of its own that lives on from pass to pass (`bind_elements`, `_each_element`), so each
element is loaded once. A pass past the row's end for some lanes (a warp's row of 576 in runs of 4: the 5th, for 16
lanes) reads the row's last run there, its terms not added (`reduce_elements`) nor stored (`store_elements`). Each
pass loads every element's operands before its math (`_element_loads`): the bfloat16 roundings' branches between them
would split the loads of neighbouring elements into basic blocks of their own, which the compiler does not merge
into vector loads; for the same reason the output pass stores every element after every value is converted
(`_element_bits`).
"""
from __future__ import annotations

from ..uop import Ops, UOp, dtypes
from .row_plan import free_ranges, run_length

CHEAP = (Ops.DEFINE_GLOBAL, Ops.LOAD, Ops.CAST, Ops.CONST, Ops.RANGE)   # not worth a local array: a load, widened
ROW_VALUES_ONCE = True    # a row's values (its mean, 1 / sqrt(variance + eps)) computed once, not at each element
STORES_TOGETHER = True    # a shared row's stores side by side after every element's value (store_elements; False:
                          # each after its value, as before: a knob for timing, the same bits)


def bind_elements(r, first: str):
    """Bind a shared row's elements (`r.row_elements`): the work-item's first run at `first`, each later pass a
    group's runs on; a pass past the row for some lanes reads their row's last run (cg<p>, `_guard_name(p)` False)."""
    rows = r.rows
    per = run_length(list(rows.cols), rows.run)
    r.emit(f"const {r.long} c = {first};")
    names = r.unflatten("c", list(rows.cols))
    r.scopes[-1].update(names)
    r.aligned = r.aligned or per > 1
    col, step, end = rows.cols[0], rows.group * per, rows.cols[0].src[0].arg
    for p in range(rows.passes):
        if (p + 1) * step > end:
            r.emit(f"const bool {_guard_name(p)} = {names[col]} + {p * step} < {end};")
            r.emit(f"const {r.long} cg{p} = {_guard_name(p)} ? {names[col]} + {p * step} : {end - per};")
    r.row_elements = [{col: f"(cg{p} + {e})"} if (p + 1) * step > end else {col: f"({names[col]} + {p * step + e})"}
                      if per > 1 or p else {} for p in range(rows.passes) for e in range(per)]


def reduce_elements(r, u: UOp, acc: str):
    """Add the work-item's elements' terms of the row reduction `u` into `acc`: every element's loads first, then
    the terms, those of a pass past the row not added."""
    _each_element(r, lambda guard: [r.value(x) for x in _element_loads(u.src[0], r.rows.reduces)])
    _each_element(r, lambda guard: r.emit(f"{acc} = {_select(guard, r.accumulate(u, acc), acc)};"))


def store_elements(r, store: UOp):
    """Store the work-item's elements of the row: every element's loads first, then every value (a 16-bit float's
    bits too: `_element_bits`), then the stores side by side, those of a pass past the row not made."""
    _each_element(r, lambda guard: [r.value(x) for x in _element_loads(store.src[2], r.rows.reduces)])
    if not STORES_TOGETHER:
        _each_element(r, lambda guard: _guarded(r, guard, lambda: r.emit(r.store_line(store))))
        return
    bits = iter(_element_bits(r, store))
    _each_element(r, lambda guard: _guarded(r, guard, lambda: r.emit(r.store_line(store, next(bits)))))


def _element_bits(r, store: UOp) -> list:
    """Each element's value, and where the store is a plain one of a 16-bit float held as its bits (render_c's
    sixteen_bits: bfloat16), those bits, each a name (None where the store converts it itself): every conversion before
    the first store, so that a run's stores are neighbours in one basic block, which the compiler merges into a vector
    store. (A conversion's NaN test is a branch: a store after each conversion was a block of its own, 12 two-byte
    stores a lane of MiniLM's bfloat16 LayerNorm of 384 where 3 runs of 4 are 8 bytes each.)"""
    val = store.src[2]
    convert = r.sixteen_bits(val.dtype) if len(store.src) == 3 and store.arg is None else None
    out = []

    def value(guard):
        v = r.value(val)
        out.append(r.let(dtypes.uint16, convert(v), "sb") if convert is not None else None)
    _each_element(r, value)
    return out


def row_values(r, x: UOp, held=frozenset()):
    """Render in the current scope the largest computed float parts of `x` that only the rows' ranges give (a
    layernorm's mean, its 1 / sqrt(variance + eps) with their roundings), not inside the `held` values (read from
    local memory): the passes over the row's elements then read them, where each element's code computed them again
    (NVRTC did not merge the copies: 12 square roots a lane of a bfloat16 layernorm of 384). Not with column reductions
    or a fold (their rows' scopes: render_row_fold.py)."""
    if not ROW_VALUES_ONCE or r.rows.columns or r.rows.fold is not None:
        return
    rows, reads, computes = set(r.rows.rows), {}, {}   # (each value's ranges, the row's reductions' as theirs alone)
    for y in x.toposort():
        if y in r.rows.reduces:
            reads[y], computes[y] = free_ranges(y), True
            continue
        inner = set().union(*(reads[z] for z in y.src))
        reads[y] = {y} if y.op is Ops.RANGE else inner - set(y.src[1:]) if y.op is Ops.REDUCE else inner
        computes[y] = y.op not in CHEAP or any(computes[z] for z in y.src)
    for y in largest_parts(x, lambda y: y.dtype.is_float and computes[y] and reads[y] <= rows,
                            skip=r.rows.reduces | set(held)):
        r.value(y)


def _element_loads(x: UOp, reduces) -> list[UOp]:
    """The loads `x` makes outside any reduction (the row's `reduces` and those nested in it), in walk order."""
    found, seen, stack = [], set(), [x]
    while stack:
        y = stack.pop()
        if y in seen or y.op is Ops.REDUCE or y in reduces:
            continue
        seen.add(y)
        if y.op is Ops.LOAD:
            found.append(y)
        stack.extend(reversed(y.src))
    return found


def _each_element(r, body):
    """Emit `body(guard)` for each of the work-item's run of elements in its scope (no C block: what one pass computes,
    the row's loads, stays in scope for the next); `guard` names the condition that the element's pass is inside the
    row (its lanes past it read their row's last run), else None."""
    per = run_length(list(r.rows.cols), r.rows.run)
    step, end = r.rows.group * per, r.rows.cols[0].src[0].arg
    for k, scope in enumerate(r.row_elements):
        p = k // per
        r.scopes.append(scope)
        body(_guard_name(p) if (p + 1) * step > end else None)
        r.scopes.pop()


def _guard_name(p: int) -> str:
    """The name of the condition that a shared row's pass `p` is inside the row (emit_rows)."""
    return f"cin{p}"


def _select(guard: str | None, value: str, otherwise: str) -> str:
    return value if guard is None else f"{guard} ? {value} : {otherwise}"


def _guarded(r, guard: str | None, emit):
    """`emit()` under `guard` (a C block of its own), or as it is where there is none."""
    if guard is None:
        emit()
        return
    r.open_block(f"if ({guard})", {})
    emit()
    r.close_block()


def largest_parts(root: UOp, part, skip=()) -> list[UOp]:
    """The outermost nodes of `root` for which `part(node)` holds (not searched inside), in visiting order; leaves
    and the nodes in `skip` are neither parts nor searched."""
    found, seen = [], set()

    def visit(x: UOp):
        if x.op in (Ops.LOAD, Ops.CONST, Ops.RANGE, Ops.DEFINE_GLOBAL) or x in seen or x in skip:
            return
        seen.add(x)
        if part(x):
            found.append(x)
            return
        for y in x.src:
            visit(y)
    visit(root)
    return found
