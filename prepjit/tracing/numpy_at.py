"""JAX's functional updates on traced arrays: `x.at[idx].set(v)`, `.add`, `.multiply`, `.min`, `.max`, `.get`.

`idx` is anything indexing takes (ints, vars, slices with steps, integer arrays, None, `...`); `v` is
broadcast to the shape `x[idx]` has and cast to x's dtype, as in JAX. Each update is one SCATTER
(scatter.py) over the positions `x[idx]` reads: a full slice is a dim of the updates, every other index
a per-position index array (for slices and ints, index arithmetic only; for integer arrays, their ids).
Repeated ids accumulate for add / multiply / min / max (np.add.at); for set, one of them wins.

`mode` says what an out-of-range id of an integer array does: None / "raise" (NumPy's indexing rule,
the project's default): the call raises IndexBoundError (a flag, as gathers do: tracing/checks.py);
"drop" (JAX's default for updates) or "promise_in_bounds": that update is skipped; "clip" / "wrap":
clamped / taken modulo the dim. Integer and slice indices follow indexing's rules (a var-dependent
int is a constraint checked on every call); a slice window whose length depends on vars is clipped at the
end as NumPy's is, and the updates must fit it (a constraint too: `_windows`).
"""
from __future__ import annotations

from ..errors import TraceError
from ..uop import Ops, UOp, as_uop, dtypes, simplify
from . import prims
from .checks import record_flag, require_cond
from .indexing import _is_int_like, _slice_spec, _text, constant_index, index_int, is_array_index
from .numpy_math import clip
from .numpy_index import in_range, index_ids, take
from .numpy_reduce import any as any_
from .scatter import scatter
from .tracer import Tracer

MODES = (None, "raise", "drop", "promise_in_bounds", "clip", "wrap")


class AtIndexer:
    """`x.at`: indexing it gives the update methods for those positions."""

    __slots__ = ("x",)

    def __init__(self, x: Tracer):
        self.x = x

    def __getitem__(self, idx) -> "AtRef":
        return AtRef(self.x, tuple(constant_index(k) for k in (idx if isinstance(idx, tuple) else (idx,))))


class AtRef:
    """`x.at[idx]`: each method returns a new array (x itself is unchanged)."""

    __slots__ = ("x", "key")

    def __init__(self, x: Tracer, key: tuple):
        self.x, self.key = x, key

    def get(self, mode=None, fill_value=None, **_hints):
        from .numpy_index import advanced_getitem
        if any(is_array_index(k) for k in self.key):
            return advanced_getitem(self.x, self.key, mode, fill_value)
        return self.x[self.key]

    def set(self, values, mode=None, **_hints):
        return update(self.x, self.key, values, None, mode)

    def add(self, values, mode=None, **_hints):
        return update(self.x, self.key, values, Ops.ADD, mode)

    def multiply(self, values, mode=None, **_hints):
        return update(self.x, self.key, values, Ops.MUL, mode)

    mul = multiply

    def min(self, values, mode=None, **_hints):
        return update(self.x, self.key, values, Ops.MIN, mode)

    def max(self, values, mode=None, **_hints):
        return update(self.x, self.key, values, Ops.MAX, mode)


def _expand(key: tuple, ndim: int) -> tuple:
    """`key` with `...` replaced by full slices and full slices appended for the dims it leaves out."""
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if n_real > ndim:
        raise IndexError(f"too many indices for array: array is {ndim}-dimensional, but {n_real} were indexed")
    if any(k is Ellipsis for k in key):
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        return key[:i] + (slice(None),) * (ndim - n_real) + key[i + 1:]
    return key + (slice(None),) * (ndim - n_real)


def update(x: Tracer, key: tuple, values, combine, mode=None) -> Tracer:
    """x with the positions `x[key]` reads set to (combine None) or combined with `values` (see the module)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(repr(m) for m in MODES[1:])} (got {mode!r})")
    x = prims.to_tracer(x)
    key = _expand(key, x.ndim)
    arrays = any(is_array_index(k) for k in key)
    entries, m = [], 0  # per key entry: (kind, target dim, payload)
    for k in key:
        if k is None:
            entries.append(("new", None, None))
            continue
        dim = x.uop.shape[m]
        if isinstance(k, slice):
            entries.append(("slice", m, _slice_spec(k, dim)))
        elif arrays and (is_array_index(k) or _is_int_like(k)):
            entries.append(("array", m, _as_index_array(k, dim, m)))
        elif _is_int_like(k):
            entries.append(("int", m, index_int(k, dim, f"axis {m}")[0]))
        else:
            raise IndexError(f"only integers, slices, None, ... and integer arrays are valid indices, "
                             f"got {type(k).__name__}")
        m += 1
    shape, place = _result_shape(entries)
    shape, values = _windows(x, key, entries, place, shape, prims.to_tracer(values))
    values = _fit_values(values, shape, x)
    indices, dims = [], [None] * x.ndim
    batch = place.get("batch")
    for e, (kind, m, payload) in enumerate(entries):
        if kind == "new":
            continue
        if kind == "slice":
            n = place[e]
            start, step, size = payload
            if start == 0 and step == 1 and prims.dims_equal(size, x.uop.shape[m]):
                dims[m] = ("dim", n)
                continue
            iota = Tracer(UOp(Ops.IOTA, dtypes.int64, (), (shape, n)))
            at = iota if step == 1 else iota * step
            index = at + prims.to_tracer(start) if not (isinstance(start, int) and start == 0) else at
        elif kind == "int":
            index = prims.broadcast_to(prims.to_tracer(payload), shape)
        else:
            index = _placed(_checked(payload, x.uop.shape[m], mode, x), batch, place["first"], shape)
        dims[m] = ("index", len(indices))
        indices.append(prims.cast(index, dtypes.int64))
    return scatter(x, indices, dims, values, combine)


def _as_index_array(k, dim, m: int) -> Tracer:
    if is_array_index(k):
        return prims.to_tracer(k)
    start, _, _ = index_int(k, dim, f"axis {m}")  # an int next to index arrays: a 0-d index array (NumPy)
    return Tracer(start if isinstance(start, UOp) else UOp.const(start))


def _result_shape(entries: list) -> tuple[tuple, dict]:
    """The shape `x[key]` has, and where each entry's dim lands in it (entry position -> result dim; "batch":
    the broadcast shape of the index arrays, placed from result dim "first")."""
    arrays = [e for e, (kind, _, _) in enumerate(entries) if kind == "array"]
    rest = [e for e, (kind, _, _) in enumerate(entries) if kind in ("new", "slice")]
    sizes = {e: 1 if kind == "new" else payload[2] for e, (kind, _, payload) in enumerate(entries)
             if kind in ("new", "slice")}
    if not arrays:
        return tuple(sizes[e] for e in rest), {e: n for n, e in enumerate(rest)}
    batch = prims.broadcast_shapes(*[entries[e][2].uop.shape for e in arrays])
    adjacent = arrays == list(range(arrays[0], arrays[0] + len(arrays)))
    first = sum(1 for e in rest if e < arrays[0]) if adjacent else 0
    place = {"batch": tuple(batch), "first": first}
    for n, e in enumerate(rest):
        place[e] = n if n < first else n + len(batch)
    shape = tuple(sizes[e] for e in rest[:first]) + tuple(batch) + tuple(sizes[e] for e in rest[first:])
    return shape, place


def _windows(x: Tracer, key: tuple, entries: list, place: dict, shape: tuple, values: Tracer) -> tuple:
    """(shape, values) for slice windows whose length depends on vars (`x.at[pos:pos + k].set(v)`: the window
    x[pos:pos + k] has min(k, n - pos) positions, clipped at the end as NumPy's are): NumPy takes updates of
    length d for a window of length w when d == w or d == 1, so that is a constraint checked on every call
    (`_require_window`), and the window is written at the updates' length d (a window `a:a + d`, step 1, a >= 0:
    one of length 0 or 1 past the end writes nothing, as the scatter skips ids outside the axis), or at its
    own length w, the updates read at min(i, d - 1) (d == 1 broadcasts)."""
    dims = tuple(values.uop.shape)
    while len(dims) > len(shape) and isinstance(dims[0], int) and dims[0] == 1:
        dims = dims[1:]
    if len(dims) > len(shape):
        return shape, values  # _fit_values says why
    shape = list(shape)
    entry_at = {n: e for e, n in place.items() if isinstance(e, int)}
    for j in range(len(shape) - len(dims), len(shape)):
        size, d = shape[j], dims[j - len(shape) + len(dims)]
        e = entry_at.get(j)
        if e is None or entries[e][0] != "slice" or isinstance(d, int) and (d == 1 or isinstance(size, int)) \
                or prims.dims_equal(size, d):
            continue
        _, m, (start, step, _) = entries[e]
        if _require_window(x, m, key[e], size, d, values):
            entries[e], shape[j] = ("slice", m, (start, step, d)), d
            continue
        at = Tracer(UOp(Ops.IOTA, dtypes.int64, (), ((size,), 0)))
        values = take(values, at, axis=j - len(shape) + values.ndim, mode="clip")
    return tuple(shape), values


def _require_window(x: Tracer, m: int, s: slice, size, d, values: Tracer) -> bool:
    """Record that updates of length d fit the window `s` of axis m (of length `size`, clipped): d == size or
    d == 1. True for a window `a:a + d` (step 1, a >= 0), where that is a + d <= n or d <= 1."""
    n = x.uop.shape[m]
    bounds = ":".join("" if v is None else _text(prims.to_sint(v)) for v in (s.start, s.stop, s.step))
    bounds = bounds[:-1] if bounds.endswith(":") else bounds
    what = (f"the update x.at[{'..., ' if m else ''}{bounds}] (axis {m}) of x of shape {x.shape_str} with updates "
            f"of shape {values.shape_str} (NumPy: the updates must fit the window, clipped at the end)")
    a = 0 if s.start is None else prims.to_sint(s.start)
    exact = s.stop is not None and s.step in (None, 1) and (a if isinstance(a, int) else a.vmin) >= 0 \
        and prims.dims_equal(UOp.const(0) + prims.to_sint(s.stop) - a, d)
    fits, fits_text = (_le(UOp.const(0) + a + d, n), f"{_text(simplify(UOp.const(0) + a + d))} <= {_text(n)}") \
        if exact else (_eq(size, d), f"len(range({_text(n)})[{bounds}]) == {_text(d)}")
    one, one_text = (_le(d, 1), f"{_text(d)} <= 1") if exact else (_eq(d, 1), f"{_text(d)} == 1")
    require_cond(UOp(Ops.OR, dtypes.bool, (fits, one)), what, f"{fits_text} or {one_text}")
    return exact


def _le(a, b) -> UOp:
    return UOp(Ops.CMPLT, dtypes.bool, (as_uop(a), as_uop(b) + 1))


def _eq(a, b) -> UOp:
    return UOp(Ops.AND, dtypes.bool, (_le(a, b), _le(b, a)))


def _placed(ids: Tracer, batch: tuple, first: int, shape: tuple) -> Tracer:
    """Index array `ids` broadcast to the batch shape and placed at result dims [first, first + len(batch))."""
    after = len(shape) - first - len(batch)
    ids = prims.reshape(prims.broadcast_to(ids, batch), (1,) * first + tuple(batch) + (1,) * after)
    return prims.broadcast_to(ids, shape)


def _checked(ids: Tracer, dim, mode, x: Tracer) -> Tracer:
    """`ids` as int64 ids (numpy_index.index_ids) with `mode`'s out-of-range rule applied (or flagged, for
    None / "raise")."""
    ids = index_ids(ids, dim, mode == "wrap")
    if mode == "clip":
        return clip(ids, UOp.const(0) - dim, UOp.const(0) + dim - 1)
    if mode in (None, "raise"):
        record_flag(any_(~in_range(ids, dim)), f"an update of {x.shape_str} at an index array: an index is out of "
                                               "range (.at[...] updates take mode='drop', 'clip' or 'wrap' to choose "
                                               "otherwise)")
    return ids


def _fit_values(values: Tracer, shape: tuple, x: Tracer) -> Tracer:
    """`values` broadcast to the updated positions' shape (leading unit dims dropped, as NumPy's assignment
    does) and cast to x's dtype (a Python int must fit it)."""
    prims.check_python_int_fits(values, x.dtype)
    while values.ndim > len(shape) and isinstance(values.uop.shape[0], int) and values.uop.shape[0] == 1:
        values = prims.reshape(values, values.uop.shape[1:])
    try:
        values = prims.broadcast_to(values, shape)
    except TraceError:
        raise ValueError(f"cannot broadcast updates of shape {values.shape_str} to the indexed shape "
                         f"{prims.fmt_shape(shape)}") from None
    return prims.cast(values, x.dtype)
