"""The call reader of a prepared function: bind arguments, classify leaves (array / scalar var / static), read
and check var values.

A signature is the pytree structure + static values + static dims + dtypes (+ device, added by
the caller). `Signature` is compiled once per prepared function from its `vars`, `shapes` and static
arguments, and is the one reader of its calls:
- `read` (the full path) binds and flattens a call, checks ranks and static dims against `shapes`, and lists
  its var reads (var, value, where) in argument order;
- `check_reads` is the one check of a call's var values, on every path: that a var agrees everywhere it
  appears, then each var's bounds (`Var.check`);
- `light_key` and `full_key` map a positional call of common kinds (arrays, ints, strings, containers of arrays)
  to a cheap key (the concrete key) that fixes everything `read` decides but the scalar vars' values and the
  sizes of the var dims of the array arguments `shapes` gives: the fast path (replay.py) keeps, per such key,
  what `read` made of it, and reads only those vars anew, through `check_reads` when a precompiled test of the
  same reads fails.
"""
from __future__ import annotations

import inspect
import warnings

import attrs
import numpy as np

from ..errors import SignatureError
from ..runtime.array import Array
from ..tracing.pytree import flatten
from ..tracing.core import ArrayLeaf, VarLeaf
from ..uop import UOp, to_dtype
from ..uop.var import BoundVar, Var
from .containers import ARRAY_PARTS, NDARRAY_PARTS, ContainerKeys, key_part

def parse_dims(spec, vars_: dict[str, Var], where: str) -> tuple:
    """A shape spec ("n, 64", ("n", 64), (Var, None)) -> tuple of int | Var | None."""
    if isinstance(spec, str):
        spec = tuple(s.strip() for s in spec.strip("()").split(",") if s.strip())
    if not isinstance(spec, (tuple, list)):
        raise SignatureError(f"shapes[{where}] must be a tuple of dims or a string, got {spec!r}")
    dims = []
    for d in spec:
        if d is None or isinstance(d, Var):
            dims.append(d)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool):
            dims.append(int(d))
        elif isinstance(d, str) and d.lstrip("-").isdigit():
            dims.append(int(d))
        elif isinstance(d, str) and d in ("None", "_", "?"):
            dims.append(None)
        elif isinstance(d, str):
            if d not in vars_:
                raise SignatureError(f"shapes[{where}] names var {d!r}, which is not in vars {sorted(vars_)}")
            dims.append(vars_[d])
        else:
            raise SignatureError(f"shapes[{where}]: a dim must be an int, a var name, a Var or None, got {d!r}")
    return tuple(dims)


def _is_dims_spec(spec) -> bool:
    return isinstance(spec, str) or isinstance(spec, (tuple, list)) and all(
        d is None or isinstance(d, (int, str, Var, np.integer)) for d in spec)


def is_array_like(x) -> bool:
    """Whether an argument leaf is traced as an array: NumPy arrays and scalars (0-d arrays, np.float64 too,
    though it is also a Python float; NumPy's strings are strings), pj.Arrays, anything with __array__."""
    if isinstance(x, np.generic):
        return not isinstance(x, np.flexible)
    if isinstance(x, (bool, int, float, complex, str, bytes, type, np.dtype)) or x is None:
        return False  # a class (np.float32 has an unbound __array__) or a dtype is a static value
    return isinstance(x, (np.ndarray, Array)) or hasattr(x, "__array__")


@attrs.frozen
class CallInfo:
    key: tuple
    leaves: list           # ArrayLeaf | VarLeaf | static value, in order (for tracing)
    arrays: list           # the array arguments as contiguous NumPy arrays, in order
    var_values: dict       # name -> int
    descriptions: list     # (path, key part) for explaining retraces
    build_args: object     # leaf values -> (args, kwargs)
    var_sources: dict = attrs.field(factory=dict)  # name -> where its value was read ("pos", "x.shape[0]")
    shape_vars: frozenset = frozenset()            # vars some array's shape gives
    reads: tuple = ()      # (Var, value, where) for each var value the call gives, in argument order


def check_reads(reads) -> tuple[dict, dict]:
    """The check of a call's var values that every path runs (the full read, the fast path's failures):
    `reads` are (Var, value, where) in argument order. A var read in several places must agree (SignatureError
    naming both places), then each var must be within its bounds (Var.check: VarBoundError naming the var, the
    value, the bounds and where it was read). Returns (name -> value, name -> where its value was first read)."""
    first: dict[str, tuple] = {}
    for var, value, where in reads:
        seen = first.setdefault(var.name, (var, value, where))
        if seen[1] != value:
            raise SignatureError(f"var {var.name!r} disagrees: {seen[2]} = {seen[1]} but {where} = {value}")
    for var, value, where in first.values():
        var.check(value, where)
    return {n: value for n, (_, value, _) in first.items()}, {n: where for n, (_, _, where) in first.items()}


class Signature:
    """How a prepared function reads its arguments, from `vars` and `shapes`."""

    def __init__(self, fn, vars_: dict[str, Var], shapes: dict, static_argnums=(), static_argnames=()):
        self.fn_name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "f")
        self.sig = inspect.signature(fn)
        self.params = list(self.sig.parameters.values())
        self.vars = vars_
        names = {p.name for p in self.params}
        for name in shapes:
            if name not in names:
                raise SignatureError(f"shapes names {name!r}, which is not a parameter of {self.fn_name}")
        self.shapes = shapes
        self.static = self.parameter_names(static_argnums, static_argnames, "static")
        for name in sorted(self.static & (set(shapes) | set(vars_))):
            raise ValueError(f"{name!r} is static (static_argnums / static_argnames) and also in "
                             f"{'shapes' if name in shapes else 'vars'}: a parameter is one or the other")
        self.scalar_vars = {n for n in vars_ if n in names and n not in shapes}
        # a call with positional arguments only reads the same way each time where the other parameters are
        # keyword-only with defaults (a functools.partial's keywords): such calls take the fast path (replay.py)
        self.positional = [p for p in self.params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.keyword_defaults = [(p.name, p.default) for p in self.params if p.kind is p.KEYWORD_ONLY]
        self.simple = all(p in self.positional or (p.kind is p.KEYWORD_ONLY and p.default is not p.empty)
                          for p in self.params)
        # (light_key) argument position -> the scalar var it gives; the positions of static parameters
        self.var_positions = {i: p.name for i, p in enumerate(self.params) if p.name in self.scalar_vars}
        self.static_positions = frozenset(i for i, p in enumerate(self.params) if p.name in self.static)
        used = self.scalar_vars | _spec_var_names(list(shapes.values()))
        self.unused_vars = [n for n in vars_ if n not in used]
        # (light_key) argument position -> (rank, the indices of its static dims) of an array whose `shapes` dims
        # name a var: its key part leaves out the var dims' sizes, which the fast path reads from its shape anew
        self.symbolic_positions = {i: spec for i, p in enumerate(self.params)
                                   if (spec := self._symbolic_dims(shapes.get(p.name), p.name)) is not None}
        # (light_key) argument position -> the ContainerKeys reading the containers passed there
        self._containers: dict[int, ContainerKeys] = {}
        # (read's cache) id of a dims spec in `shapes` -> (the spec, its parse_dims)
        self._parsed: dict[int, tuple] = {}
        for name in self.unused_vars:
            example = next((p.name for p in self.params if p.name not in vars_ and p.name not in self.static), "x")
            warnings.warn(f"{self.fn_name}: var {name!r} is declared in vars but no shapes spec uses it and no "
                          f"parameter is named {name!r}, so it stands for nothing: every new size traces a new plan. "
                          f"Name it in the dims it stands for, e.g. shapes={{{example!r}: ({name!r}, ...)}}",
                          stacklevel=4)  # (the prepare call: here, PreparedFunction, prepare or its decorator)

    def _symbolic_dims(self, spec, name: str) -> tuple | None:
        """(rank, static dim indices) of an array parameter whose dims spec names a var, else None (no spec, a
        pytree's spec, or a spec `read` refuses: its call goes through `read`, which raises)."""
        if spec is None or not _is_dims_spec(spec):
            return None
        try:
            dims = parse_dims(spec, self.vars, name)
        except SignatureError:
            return None
        if not any(isinstance(d, Var) for d in dims):
            return None
        return len(dims), tuple(i for i, d in enumerate(dims) if not isinstance(d, Var))

    def parameter_names(self, argnums, argnames, what: str) -> frozenset:
        """The parameters jax.jit-style `<what>_argnums` (positions) and `<what>_argnames` (names) pick."""
        argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums or ())
        argnames = (argnames,) if isinstance(argnames, str) else tuple(argnames or ())
        positional = [p.name for p in self.params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        out = set()
        for i in argnums:
            if isinstance(i, bool) or not isinstance(i, int) or not -len(positional) <= i < len(positional):
                raise ValueError(f"{what}_argnums {i!r} is not a positional parameter index of {self.fn_name} "
                                 f"(its positional parameters: {positional})")
            out.add(positional[i])
        for name in argnames:
            if name not in {p.name for p in self.params}:
                raise ValueError(f"{what}_argnames names {name!r}, which is not a parameter of {self.fn_name}")
            out.add(name)
        return frozenset(out)

    def bind(self, args, kwargs) -> list[tuple[str, object]]:
        if self.simple and not kwargs and len(args) == len(self.positional):
            return [(p.name, a) for p, a in zip(self.positional, args)] + self.keyword_defaults
        try:
            bound = self.sig.bind(*args, **kwargs)
        except TypeError as e:
            raise SignatureError(f"{self.fn_name}(): {e}") from None
        bound.apply_defaults()
        return list(bound.arguments.items())

    def _rebuilder(self, params: list[tuple[str, object]], counts: list[tuple]):
        def build(values):
            it = iter(values)
            arguments = {}
            for (name, _), (kind, tree) in zip(params, counts):
                arguments[name] = next(it) if kind in ("var", "static") else \
                    tree.unflatten([next(it) for _ in range(tree.num_leaves)])
            bound = inspect.BoundArguments(self.sig, arguments)
            return bound.args, bound.kwargs
        return build

    def read(self, args, kwargs) -> CallInfo:
        params = self.bind(args, kwargs)
        key, leaves, arrays, descriptions, structure, reads = [], [], [], [], [], []
        shape_vars: set[str] = set()
        for name, value in params:
            if name in self.scalar_vars:
                reads.append((self.vars[name], self._scalar_var(name, value), name))
                leaves.append(VarLeaf(self.vars[name].uop))
                key.append(("var",))
                descriptions.append((name, ("var",)))
                structure.append(("var", None))
                continue
            if name in self.static:  # the whole value, array-like or not, is part of the signature
                part = self._static(value, name, declared=True)
                leaves.append(value)
                key.append(part)
                descriptions.append((name, part))
                structure.append(("static", None))
                continue
            values, paths, tree = flatten(value, is_array_like, name, error=SignatureError)
            specs = self._leaf_specs(name, value)
            key.append(("tree", tree))
            structure.append(("tree", tree))
            for leaf, path in zip(values, paths):
                if is_array_like(leaf):
                    part, arr, shape = self._array(leaf, specs.get(path), path, reads)
                    shape_vars.update(v.arg[0] for d in shape if isinstance(d, UOp) for v in d.variables())
                    leaves.append(ArrayLeaf(to_dtype(arr.dtype), shape))
                    arrays.append(arr)
                else:
                    part = self._static(leaf, path)
                    leaves.append(leaf)
                key.append(part)
                descriptions.append((path, part))
        var_values, var_sources = check_reads(reads)
        return CallInfo(tuple(key), leaves, arrays, var_values, descriptions, self._rebuilder(params, structure),
                        var_sources, frozenset(shape_vars), tuple(reads))

    def light_key(self, args: tuple, device_name) -> tuple:
        """(the concrete key of a positional call but for its containers' array parts: each container's part its
        structure alone, the arguments with each container's arrays in its place, the spans (part index, start,
        stop) of each container's arrays among them), or (None, None, None) when an argument is not of a kind it
        keys. The concrete key (`full_key` of it) holds each array's dtype, shape and strides (a pj.Array's
        device), each container's key part (containers.py: its structure and its arrays' parts), each static
        value, and a marker for each scalar var (its value is read anew by every call): calls with the same key
        read the same through `read` but for the scalar vars' values; calls with the same light key and arrays of
        the same dtypes, shapes and strides in those spans have the same concrete key. An array argument whose
        `shapes` dims name a var (`symbolic_positions`) is keyed by its dtype, its static dims and whether it is
        C-contiguous (a pj.Array: its device, dtype and static dims) once its rank is the spec's: its var dims'
        sizes, like a scalar var's value, are read anew by every call (so one key serves every prompt length)."""
        parts = [device_name]
        containers = self._containers
        var_positions = self.var_positions
        static_positions = self.static_positions
        symbolic_positions = self.symbolic_positions
        flat = None   # the arguments with containers flattened, once there is one
        spans = []
        for i, a in enumerate(args):
            t = type(a)
            if static_positions and i in static_positions:  # keyed by value (static_argnums / static_argnames)
                if t not in (int, float, str, bool) and a is not None:
                    return None, None, None
                parts.append((t, a))
            elif i in symbolic_positions and (t is np.ndarray or t is Array):
                rank, static = symbolic_positions[i]
                shape = a.shape
                if len(shape) != rank:
                    return None, None, None  # (read raises)
                static_dims = tuple([shape[d] for d in static]) if static else ()
                parts.append((a.dtype, static_dims, a.flags.c_contiguous) if t is np.ndarray else
                             (t, a._device, a.dtype, static_dims))
            elif t is np.ndarray:
                parts.append(NDARRAY_PARTS(a))
            elif t is int:
                parts.append(int if i in var_positions else a)
            elif t is Array:
                parts.append(ARRAY_PARTS(a))
            elif t is str or t is bool or a is None:
                parts.append((t, a))
            elif t is dict or t is list or t is tuple:
                if flat is None:
                    flat = list(args[:i])
                keys = containers.get(i)
                if keys is None:
                    keys = containers.setdefault(i, ContainerKeys())
                got = keys(a)
                if got is None:
                    return None, None, None
                structure, leaves = got
                spans.append((len(parts), len(flat), len(flat) + len(leaves)))
                parts.append(structure)
                flat += leaves
                continue
            elif isinstance(a, np.generic) and not isinstance(a, np.flexible) and i not in var_positions:
                # a NumPy scalar is a 0-d array (is_array_like)
                if flat is None:
                    flat = list(args[:i])
                flat.append(np.asarray(a))
                parts.append((a.dtype, (), ()))
                continue
            else:
                return None, None, None
            if flat is not None:
                flat.append(a)
        return tuple(parts), (args if flat is None else tuple(flat)), spans

    def _scalar_var(self, name: str, value) -> int:
        if isinstance(value, BoundVar):
            if value.name != name:
                raise SignatureError(f"argument {name!r} got a BoundVar of var {value.name!r}")
            value = value.value
        if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
            value = value.item()
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise SignatureError(f"argument {name!r} is the var {name!r}: pass a Python int, got "
                                 f"{type(value).__name__}")
        return int(value)

    def _leaf_specs(self, name: str, value) -> dict:
        """path -> dims spec for each array leaf of parameter `name` that has one."""
        spec = self.shapes.get(name)
        out: dict = {}
        if spec is not None:
            self._match_spec(value, spec, name, out)
        return out

    def _match_spec(self, value, spec, path: str, out: dict):
        if spec is None:
            return
        if is_array_like(value) or not isinstance(value, (dict, list, tuple)):
            if not _is_dims_spec(spec):
                raise SignatureError(f"{path}: shapes gives a pytree spec {spec!r} but the argument is an array")
            out[path] = self._dims(spec, path)
            return
        if isinstance(value, dict):
            if not isinstance(spec, dict) or set(spec) - set(value):
                raise SignatureError(f"{path}: the argument's structure (dict with keys {list(value)}) does not fit "
                                     f"its shapes spec {spec!r}")
            for k in value:
                self._match_spec(value[k], spec.get(k), f"{path}[{k!r}]", out)
            return
        if not isinstance(spec, (list, tuple)) or len(spec) != len(value):
            raise SignatureError(f"{path}: the argument's structure ({type(value).__name__} of {len(value)}) does not "
                                 f"fit its shapes spec {spec!r}")
        for i, (v, s) in enumerate(zip(value, spec)):
            self._match_spec(v, s, f"{path}[{i}]", out)

    def _dims(self, spec, path: str) -> tuple:
        """parse_dims of a leaf's dims spec, parsed once per spec object when that is a string or a tuple (of
        ints, names, Vars and Nones: immutable, so it parses the same on every call; the table holds the
        object, so its id stays its own)."""
        if type(spec) is not str and type(spec) is not tuple:
            return parse_dims(spec, self.vars, path)
        parsed = self._parsed.get(id(spec))
        if parsed is None:
            parsed = self._parsed[id(spec)] = (spec, parse_dims(spec, self.vars, path))
        return parsed[1]

    def _array(self, leaf, dims, path: str, reads: list):
        if isinstance(leaf, Array) and leaf.is_deleted():
            raise leaf.deleted_error(path)
        arr = leaf if isinstance(leaf, Array) else np.asarray(leaf)
        try:
            dtype = to_dtype(arr.dtype)
        except TypeError as e:
            raise SignatureError(f"{path}: {e}") from None
        if isinstance(arr, np.ndarray) and not arr.dtype.isnative:  # kernels read native byte order
            arr = arr.astype(arr.dtype.newbyteorder("="))
        if isinstance(arr, np.ndarray) and not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        shape = arr.shape
        if dims is None:
            return ("array", dtype.name, shape), arr, shape
        if len(dims) != len(shape):
            raise SignatureError(f"{path} has rank {len(shape)} (shape {shape}), but shapes declares rank {len(dims)} "
                                 f"{_fmt_dims(dims)}")
        key_dims, trace_shape = [], []
        for i, (d, n) in enumerate(zip(dims, shape)):
            if isinstance(d, Var):
                reads.append((d, n, shape_read_where(path, i)))
                key_dims.append(d.name)
                trace_shape.append(d.uop)
            else:
                if isinstance(d, int) and d != n:
                    raise SignatureError(f"{path}.shape[{i}] is {n}, but shapes declares it static {d} "
                                         f"{_fmt_dims(dims)}")
                key_dims.append(n)
                trace_shape.append(n)
        return ("array", dtype.name, tuple(key_dims)), arr, tuple(trace_shape)

    @staticmethod
    def _static(leaf, path: str, declared: bool = False):
        if isinstance(leaf, slice):  # slices hash only from Python 3.12 on
            return ("static", "slice", tuple(Signature._static(v, path)[2] for v in (leaf.start, leaf.stop, leaf.step)))
        try:
            hash(leaf)
        except TypeError:
            if declared:
                raise SignatureError(f"{path} is static (static_argnums / static_argnames), so its value is part of "
                                     f"the signature and must be hashable, but a {type(leaf).__name__} is not: "
                                     "pass a tuple (or another hashable value), or drop it from the static "
                                     "arguments to trace it as an array") from None
            raise SignatureError(f"{path}: static argument of type {type(leaf).__name__} is not hashable; pass arrays "
                                 "as NumPy arrays and other values as ints, floats, strings or tuples") from None
        return ("static", type(leaf).__name__, repr(leaf) if isinstance(leaf, float) else leaf)


def shape_read_where(path: str, dim: int) -> str:
    """Where a var's value read from an array's shape comes from, as a call's reads and errors name it."""
    return f"{path}.shape[{dim}]"


def _spec_var_names(spec) -> set[str]:
    """The names a shapes spec (dims as a string, a tuple of dims, or a pytree of them) mentions."""
    if isinstance(spec, Var):
        return {spec.name}
    if isinstance(spec, str):
        return {d.strip() for d in spec.strip("()").split(",")}
    if isinstance(spec, dict):
        spec = list(spec.values())
    if isinstance(spec, (tuple, list)):
        return set().union(*map(_spec_var_names, spec))
    return set()


def _fmt_dims(dims) -> str:
    return "(" + ", ".join(d.name if isinstance(d, Var) else "None" if d is None else str(d) for d in dims) + ")"


def explain_retrace(old: list, new: list) -> str:
    """Why a call needed a new trace, given the descriptions of the closest old signature and the new one."""
    if not old:
        return "first call"
    if len(old) != len(new) or [p for p, _ in old] != [p for p, _ in new]:
        return "new argument structure"
    for (path, a), (_, b) in zip(old, new):
        if a == b:
            continue
        if a[0] == "array" and b[0] == "array":
            if a[1] != b[1]:
                return f"new dtype for {path} ({a[1]} -> {b[1]})"
            if len(a[2]) != len(b[2]):
                return f"new rank for {path} ({len(a[2])} -> {len(b[2])})"
            return f"new static shape for {path} ({a[2]} -> {b[2]})"
        if a[0] == "static" and b[0] == "static":
            return f"new static value for {path} ({a[2]} -> {b[2]})"
        return f"{path} changed kind ({a[0]} -> {b[0]})"
    return "new signature"


RETRACE_HINT_AFTER = 3  # distinct static shapes of one argument that make the retrace hint appear


def retrace_hint(fn_name: str, path: str, shapes: list[tuple], free_names: list[str]) -> str | None:
    """The advice for an argument at `path` traced with these `shapes` (its key dims: ints, or names of vars):
    which dims changed and the shapes spec that makes them symbolic, naming them from `free_names` (declared
    vars no spec uses) first; None while fewer than RETRACE_HINT_AFTER shapes of its latest rank were seen."""
    rank = len(shapes[-1])
    same_rank = list(dict.fromkeys(s for s in shapes if len(s) == rank))
    if len(same_rank) < RETRACE_HINT_AFTER:
        return None
    changed = [i for i in range(rank) if len({s[i] for s in same_rank}) > 1]
    fresh = iter(free_names + [n for n in ("n", "m", "k", "b", "t") + tuple(f"d{i}" for i in range(rank))
                               if n not in free_names])
    names = {i: next(fresh) for i in changed}
    dims = tuple(names.get(i, d) for i, d in enumerate(shapes[-1]))
    spec = "(" + ", ".join(repr(d) for d in dims) + ("," if rank == 1 else "") + ")"
    where = f"shapes={{{path!r}: {spec}}}" if path.isidentifier() else f"the dims {spec} for {path} in its shapes spec"
    new_vars = [n for n in names.values() if n not in free_names]
    bounds = f" with vars={{{', '.join(f'{n!r}: (1, MAX)' for n in new_vars)}}}" if new_vars else ""
    seen = ", ".join(str(tuple(s)) for s in same_rank[:6]) + (", ..." if len(same_rank) > 6 else "")
    changes = f"dim {changed[0]} changes" if len(changed) == 1 else f"dims {', '.join(map(str, changed))} change"
    return (f"{fn_name} traced a new plan for each of {len(same_rank)} shapes of {path} ({seen}): {changes}. "
            f"Make {'it' if len(changed) == 1 else 'them'} symbolic to replay one plan for every size: "
            f"{where}{bounds}" + (" (MAX: the largest size to support)" if bounds else ""))


def full_key(light: tuple, flat: tuple, spans: list) -> tuple:
    """The concrete key of a call's `Signature.light_key`: each container's structure joined by its arrays' parts."""
    if not spans:
        return light
    parts = list(light)
    for index, start, stop in spans:
        parts[index] = key_part(light[index], flat[start:stop])
    return tuple(parts)
