"""Checks that a kernel AST read from a file is one the scheduler could have made, before anything renders it.

The bounds proof reasons about a kernel's loads and stores in elements of its buffers; the renderers turn each
node into code by its op and dtype. Both assume the AST is well formed: a load reads its buffer's own dtype
through a DEFINE_GLOBAL, an index is an int64 expression, an ALU node's operands have its dtype. The scheduler
only builds such ASTs, so a plan it prepares is never checked; a saved plan's ASTs are data anyone can write,
so `check_kernel` and `check_int_expr` refuse (ValueError) any node outside that language: a float64 load from
a float32 buffer would read twice the bytes the proof counted.
"""
from __future__ import annotations

from ..uop import Ops, UOp, dtypes
from ..uop.ops import BINARY, COMPARISON, FMA_DTYPES, PRODUCT_PRECISIONS, REDUCE_OPS, UNARY

RANGE_KINDS = ("loop", "reduce", "serial")  # "lane" ranges are made by optimize.py, after a plan is saved
MAX_SLOTS = 1 << 12
_INT_EXPR_OPS = {Ops.CONST, Ops.DEFINE_VAR, Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.MIN,
                 Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR, Ops.WHERE, Ops.CAST}


def _int64(x) -> bool:
    return type(x) is int and -2**63 <= x < 2**63


def _check_leaf(u: UOp):
    if u.op is Ops.CONST:
        d = u.dtype
        ok = (type(u.arg) is bool if d is dtypes.bool else type(u.arg) is float if d.is_float
              else type(u.arg) is int and d.min() <= u.arg <= d.max())
        if not ok:
            raise ValueError(f"a {d.name} constant holds {u.arg!r:.40}")
    elif u.op is Ops.DEFINE_VAR:
        arg = u.arg
        if not (u.dtype is dtypes.int64 and isinstance(arg, tuple) and len(arg) == 3 and isinstance(arg[0], str)
                and arg[0].isidentifier() and _int64(arg[1]) and _int64(arg[2]) and arg[1] <= arg[2]):
            raise ValueError(f"not a var: {arg!r:.60}")
    elif u.op is Ops.DEFINE_GLOBAL:
        if type(u.arg) is not int or not 0 <= u.arg < MAX_SLOTS:
            raise ValueError(f"not a buffer slot: {u.arg!r:.40}")


def _check_node(u: UOp):
    """One node of a kernel AST against its op's rule (sources already checked)."""
    op, src, d = u.op, u.src, u.dtype
    arity = {Ops.CONST: 0, Ops.DEFINE_VAR: 0, Ops.DEFINE_GLOBAL: 0, Ops.RANGE: 1, Ops.CAST: 1, Ops.BITCAST: 1,
             Ops.WHERE: 3, Ops.FMA: 3}
    n = 1 if op in UNARY else 2 if op in BINARY else arity.get(op)
    if n is not None and len(src) != n:
        raise ValueError(f"{op.name} takes {n} sources, not {len(src)}")
    if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.DEFINE_GLOBAL):
        _check_leaf(u)
    elif op is Ops.RANGE:
        if not (d is dtypes.int64 and src[0].dtype is dtypes.int64 and isinstance(u.arg, tuple) and len(u.arg) == 2
                and _int64(u.arg[0]) and u.arg[1] in RANGE_KINDS):
            raise ValueError(f"not a range: {u.arg!r:.40}")
    elif op in UNARY or op in BINARY:
        precision = op is Ops.MUL and d is dtypes.float32 and u.arg in PRODUCT_PRECISIONS
        if (u.arg is not None and not precision) or any(s.dtype is not src[0].dtype for s in src) or (
                d is not (dtypes.bool if op in COMPARISON else src[0].dtype)):
            raise ValueError(f"{op.name} of {[s.dtype.name for s in src]} is not {d.name}")
    elif op is Ops.WHERE:
        if u.arg is not None or src[0].dtype is not dtypes.bool or src[1].dtype is not d or src[2].dtype is not d:
            raise ValueError("a where's condition is not bool or its branches are not its dtype")
    elif op is Ops.FMA:
        if u.arg is not None or d not in FMA_DTYPES or any(s.dtype is not d for s in src):
            raise ValueError(f"FMA of {[s.dtype.name for s in src]} is not one of float32 or float64")
    elif op is Ops.CAST:
        if u.arg is not None:
            raise ValueError("a cast has an arg")
    elif op is Ops.BITCAST:
        if u.arg is not None or dtypes.bool in (d, src[0].dtype) or d.itemsize != src[0].dtype.itemsize:
            raise ValueError("a bitcast has an arg, or changes the size or reads a bool")
    elif op is Ops.REDUCE:
        if not (len(src) >= 2 and u.arg in REDUCE_OPS and src[0].dtype is d
                and all(r.op is Ops.RANGE and r.arg[1] == "reduce" for r in src[1:])):
            raise ValueError("not a reduction over reduce ranges")
    elif op in (Ops.LOAD, Ops.STORE):
        value = 2 if op is Ops.STORE else None
        n_fixed = 3 if op is Ops.STORE else 2
        if not (len(src) in (n_fixed, n_fixed + 1) and src[0].op is Ops.DEFINE_GLOBAL
                and src[1].dtype is dtypes.int64 and (len(src) == n_fixed or src[-1].dtype is dtypes.bool)
                and (src[value].dtype if op is Ops.STORE else d) is src[0].dtype
                and (d is dtypes.bool if op is Ops.STORE else u.arg is None)
                and (op is Ops.LOAD or u.arg is None or u.arg in REDUCE_OPS)):
            raise ValueError(f"a {op.name.lower()} of {d.name} that is not its buffer's ({src[0].dtype.name})"
                             if src and src[0].op is Ops.DEFINE_GLOBAL else f"not a {op.name.lower()}")
    else:
        raise ValueError(f"{op.name} has no place in a kernel AST")


def check_kernel(ast: UOp) -> list:
    """ValueError unless `ast` is a kernel: a SINK of stores to slot 0, every node well formed, one dtype per
    buffer slot (slots 0..k-1) and one DEFINE_VAR per var name. Returns the slots' dtypes."""
    if ast.op is not Ops.SINK or not isinstance(ast.arg, str) or not ast.src or any(
            s.op is not Ops.STORE for s in ast.src):
        raise ValueError("a kernel AST is a SINK of stores")
    slots, names = {}, {}
    for u in ast.toposort():
        if u is ast:
            continue
        _check_node(u)
        if u.op is Ops.DEFINE_GLOBAL and slots.setdefault(u.arg, u.dtype) is not u.dtype:
            raise ValueError(f"buffer slot {u.arg} has two dtypes")
        if u.op is Ops.STORE and u.src[0].arg != 0:
            raise ValueError("a kernel stores to a buffer other than its slot 0 (its output)")
        if u.op is Ops.DEFINE_VAR and names.setdefault(u.arg[0], u) is not u:
            raise ValueError(f"var {u.arg[0]!r} has two bounds in one kernel")
    if sorted(slots) != list(range(len(slots))):
        raise ValueError("a kernel's buffer slots are not numbered 0..k-1")
    return [slots[i] for i in range(len(slots))]


def check_int_expr(e: UOp, dtype=dtypes.int64) -> UOp:
    """`e` if it is an expression of vars and constants of `dtype` (a shape, launch size, loop bound or, with
    dtypes.bool, an index condition); ValueError otherwise."""
    if e.dtype is not dtype:
        raise ValueError(f"not a {dtype.name} expression")
    for u in e.toposort():
        if u.op not in _INT_EXPR_OPS or u.dtype not in (dtypes.int64, dtypes.bool):
            raise ValueError(f"{u.op.name} of {u.dtype.name} has no place in an integer expression")
        _check_node(u)
    return e
