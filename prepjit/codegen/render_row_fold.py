"""A column row kernel's rows that one work-group computes together (row_plan.Rows.fold: a grouped-query attention's
query heads of one key/value head), for render_rows.py and render_softmax_rows.py.

Each row the work-group computes has a scope of its own (`row_scopes`) binding the fold range to the row's value;
the row's code is rendered in it (`each_row`), in the order one row's work-group would run it, so every sum adds
the same terms in the same order as that work-group's (the results are bit-identical). Where several rows' code
reads the same memory (a key row's element for each row's score, a value row's for each row's p @ V), the parts
no row's range reads are rendered once before the rows' (`render_shared`): their loads are made once for all rows.
A local array whose values depend on the fold range (a row's scores, its probabilities, its partials) has a row of
its own for each (`declare`, `array_at`: name[row][index]); others are the work-group's one.

Without a fold, `row_scopes` is one row of no scope of its own: the code is a row's work-group's, as it was.
"""
from __future__ import annotations

from ..uop import Ops, UOp


def row_scopes(r) -> list[dict | None]:
    """A scope for each row the work-group computes (its fold range bound to the row's value), or [None]: one row, no
    scope of its own."""
    fold = r.rows.fold
    if fold is None:
        return [None]
    return [{fold: r.literal(k, fold.dtype)} for k in range(fold.src[0].arg)]


def each_row(r, scopes: list, body, block: bool = True):
    """`body()` for each row of `scopes` (row_scopes'), in its scope. At the kernel's top level (`block` False) what a
    row's code renders stays in the row's scope, for its later code (its reductions' results); inside a C block
    (`block`), in a scope of its own above the row's, gone when the row's turn ends."""
    for scope in scopes:
        if scope is None:
            body()
            continue
        r.scopes.append(scope)
        if block:
            r.scopes.append({})
        body()
        r.scopes.pop()
        if block:
            r.scopes.pop()


def folds(r, x: UOp) -> bool:
    """Whether the value `x` depends on the row range the work-group folds."""
    fold = r.rows.fold
    return fold is not None and any(y is fold for y in x.toposort())


def array_at(r, x: UOp, name: str, index: str) -> str:
    """The element at `index` of the local array `name` holding the value `x` (for the row in scope, where `x`
    depends on the fold range)."""
    return f"{name}[{r.value(r.rows.fold)}][{index}]" if folds(r, x) else f"{name}[{index}]"


def declare(r, x: UOp, dtype_name: str, name: str, n: int):
    """Declare the local array `name` of `n` elements (a row of them for each row of the fold, where `x`, the
    value it holds, depends on the fold range)."""
    rows = f"{name}[{r.rows.fold.src[0].arg}]" if folds(r, x) else name
    r.locals.append(r.d.local_array.format(type=dtype_name, name=rows, n=n) + ";")


def render_shared(r, x: UOp, skip=()):
    """Where the work-group folds rows, render in the current scope the largest float parts of `x` that read memory,
    compute no reduction, and depend on no row of the fold (a key's or a value's element, masked): every row's code
    then reads them. Not inside `skip` (values bound in scope: local arrays)."""
    fold = r.rows.fold
    if fold is None:
        return
    flags: dict = {}   # value -> (reads the fold range, reads memory, computes a reduction)
    opaque = set(skip)   # (a row's values: its own code renders or binds them, never shared here nor walked into)
    for y in x.toposort():
        if y in opaque or y.op is Ops.REDUCE or y in r.rows.reduces:
            opaque.add(y)
            flags[y] = (True, False, True)
            continue
        below = [flags[s] for s in y.src]
        flags[y] = (y is fold or any(f[0] for f in below), y.op is Ops.LOAD or any(f[1] for f in below),
                    any(f[2] for f in below))
    seen, stack = set(), [x]
    while stack:
        y = stack.pop()
        if y in seen:
            continue
        seen.add(y)
        reads_fold, reads_memory, reduces = flags[y]
        if y.dtype.is_float and reads_memory and not reads_fold and not reduces:
            r.value(y)
        elif y not in opaque:
            stack.extend(reversed(y.src))
