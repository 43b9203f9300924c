"""UOp: the one immutable, hash-consed node type of the IR, with symbolic-int operators and bounds."""
from __future__ import annotations

import functools
import importlib
import math
import threading
import weakref
from _weakref import _remove_dead_weakref
from typing import Any, Union

import attrs

from ..errors import TraceError
from .dtypes import DType, dtypes
from .ops import COMPARISON, Ops

_symbolic = _shape = None  # symbolic.py and shape.py, which build on UOp: _late imports them at their first use


def _late(name: str):
    """This package's module `name`, imported and kept as this module's `_name`: an import statement in a method
    cost ~2 us a call, ~60 ms of SmolLM2's first calls through UOp.shape, the operators and the bounds."""
    module = importlib.import_module(f"{__package__}.{name}")
    globals()["_" + name] = module
    return module


class _cached:
    """functools.cached_property without its lock: Python 3.11's takes one lock, shared by every node, around each
    first read (~0.4 us more a read; SmolLM2's first calls read 22.6k nodes' shapes and bounds first). A node's shape
    and bounds are pure: two threads computing one at once store the same value."""

    def __init__(self, fn):
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, node, owner=None):
        if node is None:
            return self
        value = node.__dict__[self.name] = self.fn(node)
        return value


KEPT_WALK = 1 << 11  # the largest toposort kept on its node (UOp.toposort)
_INTS = object()  # tags the key of a tuple of plain ints (a shape, an axis order): no other key holds it


def _arg_key(arg):
    """A key that tells apart args equal under ==, e.g. 0.0 / -0.0 and 1 / 1.0 / True."""
    if isinstance(arg, tuple):  # (a loop, not all(): node construction is hot)
        for a in arg:
            if type(a) is not int:
                return tuple([_arg_key(a) for a in arg])
        return (_INTS, arg)  # the common case, without a key per element
    if isinstance(arg, float):
        return ("f", repr(arg))
    if isinstance(arg, (bool, int)):
        return (type(arg).__name__, arg)
    return arg


def _order_arg(arg) -> tuple:
    """An arg as a type-tagged tuple: any two compare with < and the order is the same in every process."""
    if arg is None:
        return (0,)
    if isinstance(arg, bool):
        return (1, int(arg))
    if isinstance(arg, int):
        return (2, arg)
    if isinstance(arg, float):
        return (3, repr(arg))
    if isinstance(arg, str):
        return (4, arg)
    if isinstance(arg, tuple):
        return (5, tuple(_order_arg(a) for a in arg))
    if isinstance(arg, Ops):
        return (6, arg.name)
    return (7, type(arg).__name__, repr(arg))


def _arg_uops(arg) -> list:
    """The UOps inside an arg: in tuples and in attrs classes (a fori_loop's LoopInfo)."""
    if isinstance(arg, UOp):
        return [arg]
    if isinstance(arg, tuple):
        return [u for a in arg for u in _arg_uops(a)]
    if attrs.has(type(arg)):
        return [u for f in attrs.fields(type(arg)) for u in _arg_uops(getattr(arg, f.name))]
    return []


class UOp:
    """A node: `op` applied to `src` with a static `arg`, producing `dtype`.

    Equal nodes are the same object, so identity is equality and graphs hash cheaply.
    Integer UOps double as symbolic ints: `+ - * // %` and comparisons build simplified
    expressions; `vmin`/`vmax` are their interval bounds.
    """

    # _key, _poly, _simple: per-node caches of the sort key and of symbolic.py's polynomial and simplified form
    __slots__ = ("op", "dtype", "src", "arg", "_key", "_poly", "_simple", "__weakref__", "__dict__")
    _cache: dict = {}  # (op, dtype name, src, arg key) -> weak reference to the one live node (a dead one removes itself)

    def __new__(cls, op: Ops, dtype: DType = dtypes.index, src: tuple = (), arg: Any = None):
        key = (op, dtype.name, src, None if arg is None else _arg_key(arg))  # (a dtype is its name: hashed in C)
        ref = _nodes.get(key)
        node = None if ref is None else ref()
        if node is None:
            with _new_lock:  # threads building the same node get one object
                ref = _nodes.get(key)
                node = None if ref is None else ref()
                if node is None:
                    node = object.__new__(cls)
                    node.op, node.dtype, node.src, node.arg = op, dtype, src, arg
                    node._key = node._poly = node._simple = None
                    ref = _NodeRef(node, _forget)
                    ref.key = key
                    _nodes[key] = ref
        return node

    def __reduce__(self):
        return (UOp, (self.op, self.dtype, self.src, self.arg))

    def __repr__(self) -> str:
        return self.render()

    @property
    def key(self) -> tuple:
        """A canonical order of nodes (nested tuples, cached per node): structural, so the same in every
        process and independent of creation order; symbolic sums and products sort their terms by it."""
        if self._key is None:
            for node in self.postorder(lambda u: u._key is None):
                node._key = (node.op.value, node.dtype.name, _order_arg(node.arg), tuple(s._key for s in node.src))
        return self._key

    # ---- construction helpers ----
    @staticmethod
    def const(value, dtype: DType = dtypes.index) -> "UOp":
        if type(value) is int and dtype is dtypes.index:
            return _index_const(value)
        if dtype.is_float:
            value = float(value)
        elif dtype == dtypes.bool:
            value = bool(value)
        else:
            value = int(value)
        return UOp(Ops.CONST, dtype, (), value)

    @staticmethod
    def variable(name: str, vmin: int, vmax: int) -> "UOp":
        return UOp(Ops.DEFINE_VAR, dtypes.index, (), (name, int(vmin), int(vmax)))

    def alu(self, op: Ops, *others: "UOp", dtype: DType | None = None) -> "UOp":
        out = dtype or (dtypes.bool if op in COMPARISON else (others[-1].dtype if op is Ops.WHERE else self.dtype))
        return UOp(op, out, (self, *others))

    def cast(self, dtype: DType) -> "UOp":
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    # ---- walking ----
    def toposort(self) -> list["UOp"]:
        """Every node under this one (itself included), children first, each once (postorder's walk, unfiltered:
        graph walks are hot). Kept per node (a node never changes): codegen walks the same kernels and expressions
        again and again (SmolLM2's two first calls: 11087 walks of 1512 roots, 70% of the 332k nodes walked
        walked before; 0.37 s of the 2.95 s of CPU their planning took). The list is the caller's to change. What
        is kept leaves the node out (a node holding itself would live until a full collection, not die unused), and
        only a walk of at most KEPT_WALK nodes is kept: a larger one (a whole graph's) was never walked twice there,
        and a chain whose every node is walked once would keep memory growing as the square of its length."""
        below = self.__dict__.get("_below")
        if below is None:
            below = tuple(self._walk_below())
            if len(below) < KEPT_WALK:
                self.__dict__["_below"] = below
        return [*below, self]

    def _walk_below(self) -> list["UOp"]:
        """toposort without this node (its last)."""
        order, seen, stack = [], {self}, [(self, iter(self.src))]
        while stack:  # each entry: a node and its sources still to enter, so a node is appended once they are done
            node, sources = stack[-1]
            for s in sources:
                if s not in seen:
                    seen.add(s)
                    stack.append((s, iter(s.src)))
                    break
            else:
                stack.pop()
                order.append(node)
        order.pop()
        return order

    def postorder(self, todo) -> list["UOp"]:
        """The nodes `n` under this one (itself included) with `todo(n)`, children first, each once; the walk does
        not enter a node without `todo` (a cache filled below it), so it costs only the nodes still to do."""
        if not todo(self):
            return []
        order, seen, stack = [], {self}, [(self, iter(self.src))]
        while stack:
            node, sources = stack[-1]
            for s in sources:
                if s not in seen:
                    seen.add(s)
                    if todo(s):
                        stack.append((s, iter(s.src)))
                        break
            else:
                stack.pop()
                order.append(node)
        return order

    def depends_on(self, targets) -> bool:
        """Whether this traced node reads any of `targets` through its sources or the UOps inside args (symbolic
        shapes, slice starts, a loop's body): a slice `xs[t]` depends on `t` though `t` is no source. A loop's
        own counter and carries are bound inside its body: reading them there is no dependence on the same
        UOps elsewhere (two sequential loops whose counters have one name and bounds share the var UOp)."""
        seen, stack = set(), [self]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            if node in targets:
                return True
            seen.add(node)
            stack.extend(node.src)
            if node.op is Ops.LOOP:
                bound = {getattr(node.arg, "var", None), *getattr(node.arg, "carries", ())}
                free = [t for t in targets if t not in bound]
                if free and any(u.depends_on(free) for u in _arg_uops(node.arg) if u not in bound):
                    return True
            else:
                stack.extend(_arg_uops(node.arg))
        return False

    def variables(self) -> list["UOp"]:
        """The DEFINE_VARs reachable from this node, sorted by name (cached per node: a plan asks each kernel's
        AST at every launch it records)."""
        found = self.__dict__.get("_variables")
        if found is None:
            found = self.__dict__["_variables"] = tuple(
                sorted((u for u in self.toposort() if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg[0]))
        return list(found)

    def substitute(self, mapping: dict) -> "UOp":
        memo: dict = dict(mapping)
        for node in self.toposort():
            if node not in memo:
                src = tuple([memo[s] for s in node.src])
                memo[node] = node if src == node.src else UOp(node.op, node.dtype, src, node.arg)
        return memo[self]

    # ---- symbolic int algebra ----
    def _sym(self, op: Ops, other, reverse=False) -> "UOp":
        if isinstance(other, bool) or not isinstance(other, (int, UOp)):
            return NotImplemented
        other = other if isinstance(other, UOp) else UOp.const(other, self.dtype)
        a, b = (other, self) if reverse else (self, other)
        symbolic = _symbolic or _late("symbolic")
        return symbolic.fold_index_consts(op, a, b) or symbolic.simplify(a.alu(op, b))

    def __add__(self, o): return self._sym(Ops.ADD, o)
    def __radd__(self, o): return self._sym(Ops.ADD, o, True)
    def __sub__(self, o): return self._sym(Ops.SUB, o)
    def __rsub__(self, o): return self._sym(Ops.SUB, o, True)
    def __mul__(self, o): return self._sym(Ops.MUL, o)
    def __rmul__(self, o): return self._sym(Ops.MUL, o, True)
    def __floordiv__(self, o): return self._sym(Ops.IDIV, o)
    def __rfloordiv__(self, o): return self._sym(Ops.IDIV, o, True)
    def __mod__(self, o): return self._sym(Ops.MOD, o)
    def __rmod__(self, o): return self._sym(Ops.MOD, o, True)
    def __lt__(self, o): return self._sym(Ops.CMPLT, o)
    def __gt__(self, o): return self._sym(Ops.CMPLT, o, True)
    def __le__(self, o): return self._sym(Ops.CMPLT, o + 1 if isinstance(o, (int, UOp)) else o)
    def __ge__(self, o): return self._sym(Ops.CMPLT, o - 1 if isinstance(o, (int, UOp)) else o, True)
    def __neg__(self): return self * -1
    def eq(self, o): return self._sym(Ops.CMPEQ, o)
    def ne(self, o): return self._sym(Ops.CMPNE, o)
    def smax(self, o): return self._sym(Ops.MAX, o)
    def smin(self, o): return self._sym(Ops.MIN, o)
    __hash__ = object.__hash__

    def __bool__(self):
        if self.op is Ops.CONST:
            return bool(self.arg)
        raise TraceError(f"the truth value of the symbolic expression {self.render()} is not known while "
                         "tracing; use pnp.where for data-dependent choices, or make the value a static argument")

    def __index__(self):
        if self.op is Ops.CONST and self.dtype.is_int:
            return self.arg
        raise TraceError(f"symbolic value {self.render()} has no Python int while tracing; keep it symbolic "
                         "(shapes, slices and arithmetic accept it) or make it a static argument")

    __int__ = __index__

    @_cached
    def shape(self) -> tuple:
        """The array shape of a traced-graph node (ints, or UOps for symbolic dims)."""
        return (_shape or _late("shape")).shape_of(self)

    # ---- bounds ----
    @_cached
    def bounds(self) -> tuple:
        return _bounds(self)

    @property
    def vmin(self):
        return self.bounds[0]

    @property
    def vmax(self):
        return self.bounds[1]

    # ---- printing ----
    def render(self) -> str:
        """Infix text of a symbolic expression; other nodes print as op(...)."""
        op, s = self.op, self.src
        if op is Ops.CONST:
            return repr(self.arg)
        if op is Ops.DEFINE_VAR:
            return self.arg[0]
        if op is Ops.RANGE:
            return f"r{self.arg[0]}" if self.arg[1] == "loop" else f"rr{self.arg[0]}"
        infix = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<",
                 Ops.CMPEQ: "==", Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|", Ops.FDIV: "/"}
        if op in infix and len(s) == 2:
            return f"({s[0].render()}{infix[op]}{s[1].render()})"
        if op in (Ops.MAX, Ops.MIN):
            return f"{op.name.lower()}({s[0].render()}, {s[1].render()})"
        inner = ", ".join(x.render() for x in s)
        return f"{op.name}({inner}{', ' if inner and self.arg is not None else ''}{'' if self.arg is None else self.arg})"


sint = Union[int, UOp]
_nodes = UOp._cache


_new_lock = threading.Lock()


@functools.lru_cache(maxsize=4096)
def _index_const(value: int) -> UOp:
    """Index constants, the most built nodes, kept alive for reuse."""
    return UOp(Ops.CONST, dtypes.index, (), value)


class _NodeRef(weakref.ref):
    """The node cache's weak reference to a node, with the node's key (weakref.KeyedRef without its __new__ and
    __init__ in Python: 0.64 -> 0.24 us a node, ~10^5 nodes in a model's first call)."""
    __slots__ = ("key",)


def _forget(ref: _NodeRef, remove=_remove_dead_weakref, nodes=_nodes):
    """A node died: drop its entry if it is still dead (atomic: a newer node under the key stays). The defaults
    keep what it calls alive while the interpreter shuts down."""
    remove(nodes, ref.key)


def _bounds(u: UOp) -> tuple:
    """Interval bounds; integer bounds that could overflow the dtype widen to its whole range."""
    lo, hi = _raw_bounds(u)
    dt = u.dtype
    if dt.is_int and not (dt.min() <= lo and hi <= dt.max()):
        return (dt.min(), dt.max())
    return (lo, hi)


def _raw_bounds(u: UOp) -> tuple:
    dt = u.dtype
    if u.op is Ops.CONST:
        return (u.arg, u.arg)
    if u.op is Ops.DEFINE_VAR:
        return (u.arg[1], u.arg[2])
    if u.op is Ops.RANGE:
        return (0, max(0, u.src[0].vmax - 1))
    if dt == dtypes.bool and u.op not in (Ops.CONST,):
        if u.op in COMPARISON:
            return _compare_bounds(u)
        return (False, True)
    if not dt.is_int:
        return (dt.min(), dt.max())
    s = [x.bounds for x in u.src]
    if u.op in (Ops.ADD, Ops.SUB):  # intervals of the operands, sharpened by those of the polynomial
        lo, hi = (s[0][0] + s[1][0], s[0][1] + s[1][1]) if u.op is Ops.ADD else (s[0][0] - s[1][1], s[0][1] - s[1][0])
        symbolic = _symbolic or _late("symbolic")
        poly_min, poly_max = symbolic.poly_min, symbolic.poly_max
        p = symbolic.poly(u)
        if all(c > 0 for c in p.values()) and all(f.vmin >= 0 for m in p for f in m):
            return (lo, hi)  # positive terms of nonnegative factors: the intervals are exact
        return (max(lo, poly_min(p)), min(hi, poly_max(p)))
    if u.op is Ops.MUL:
        c = [a * b for a in s[0] for b in s[1]]
        return (min(c), max(c))
    if u.op is Ops.MAX:
        return (max(s[0][0], s[1][0]), max(s[0][1], s[1][1]))
    if u.op is Ops.MIN:
        return (min(s[0][0], s[1][0]), min(s[0][1], s[1][1]))
    if u.op is Ops.IDIV and s[1][0] > 0:
        c = [a // b for a in s[0] for b in s[1]]
        return (min(c), max(c))
    if u.op is Ops.MOD and s[1][0] > 0:
        if s[0][0] >= 0 and s[0][1] < s[1][0]:
            return s[0]
        return (0, s[1][1] - 1)
    if u.op is Ops.WHERE:
        return (min(s[1][0], s[2][0]), max(s[1][1], s[2][1]))
    if u.op is Ops.CAST and u.src[0].dtype.is_int or u.src and u.src[0].dtype == dtypes.bool and u.op is Ops.CAST:
        lo, hi = int(s[0][0]), int(s[0][1])
        if dt.min() <= lo and hi <= dt.max():
            return (lo, hi)
    return (dt.min(), dt.max())


def _compare_bounds(u: UOp) -> tuple:
    if not all(x.dtype.is_int for x in u.src):
        return (False, True)
    (a0, a1), (b0, b1) = u.src[0].bounds, u.src[1].bounds
    if u.op is Ops.CMPLT:
        return (a1 < b0, a0 < b1)  # always true / possibly true
    always_eq = a0 == a1 == b0 == b1
    never_eq = a1 < b0 or b1 < a0
    if u.op is Ops.CMPEQ:
        return (always_eq, not never_eq)
    return (never_eq, not always_eq)


def as_uop(x: sint) -> UOp:
    return x if isinstance(x, UOp) else UOp.const(x)


def as_int_if_const(x: sint) -> sint:
    return x.arg if isinstance(x, UOp) and x.op is Ops.CONST else x


def sym_prod(xs) -> sint:
    out: sint = 1
    for x in xs:
        out = out * x
    return as_int_if_const(out)


def eval_uop(u: UOp, values: dict[str, int]):
    """Evaluate an integer expression given var values (used at prepare time; replay uses compiled lambdas)."""
    return eval(compile(render_python(u), "<expr>", "eval"), {"math": math}, {"v": values})


def render_python(u: UOp, var=lambda name: f"v[{name!r}]") -> str:
    """Python source for an integer expression; `var(name)` spells a var (default: `v[name]`)."""
    op, s = u.op, u.src
    if op is Ops.CONST:
        return repr(u.arg)
    if op is Ops.DEFINE_VAR:
        return var(u.arg[0])
    py = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<",
          Ops.CMPEQ: "==", Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|"}
    if op in py:
        return f"({render_python(s[0], var)}{py[op]}{render_python(s[1], var)})"
    if op in (Ops.MAX, Ops.MIN):
        return f"{op.name.lower()}({render_python(s[0], var)}, {render_python(s[1], var)})"
    if op is Ops.WHERE:
        return f"({render_python(s[1], var)} if {render_python(s[0], var)} else {render_python(s[2], var)})"
    if op is Ops.CAST:
        return f"int({render_python(s[0], var)})"
    raise ValueError(f"cannot render {op} as a Python int expression")


def children_first(roots: list, children) -> list:
    """Every node reachable from `roots` through `children(node)`, children first, each once (for walks over
    more than a UOp's sources: loop bodies, or a graph cut at chosen nodes)."""
    order, done, entered, stack = [], set(), set(), list(reversed(roots))
    while stack:
        node = stack.pop()
        if node in done:
            continue
        if node in entered:
            done.add(node)
            order.append(node)
            continue
        entered.add(node)
        stack.append(node)
        stack.extend(c for c in reversed(children(node)) if c not in done)
    return order
