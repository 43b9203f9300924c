"""Pointwise primitives: cast, bitcast and every ALU op (unary, binary, where, fma) on broadcast operands, with
NumPy's promotion, and their reverse-mode rules (JAX's: maximum/minimum split ties evenly, abs has slope 1 at 0)."""
from __future__ import annotations

import math

import numpy as np

from ...errors import TraceError
from ...uop import DType, Ops, UOp, dtypes, to_dtype
from ...uop.ops import FMA_DTYPES
from ..tracer import Tracer
from .core import broadcast_shapes, check_python_int_fits, result_dtype, to_tracer
from .movement import broadcast_to
from .registry import primitive


def cast(x: Tracer, dtype) -> Tracer:
    if x.uop.dtype is dtype:  # (the common case: a DType and the one it is)
        return x
    dtype = to_dtype(dtype)
    if x.dtype == dtype:
        return x
    if x.uop.op is Ops.CONST:  # fold now, with NumPy's conversion
        with np.errstate(all="ignore"):
            value = np.array(x.uop.arg, x.dtype.np).astype(dtype.np).item()
        return Tracer(UOp.const(value, dtype), weak=x.weak)
    return Tracer(UOp(Ops.CAST, dtype, (x.uop,)))


def bitcast(x: Tracer, dtype) -> Tracer:
    """`x`'s bits read as `dtype`, of the same size (NumPy's `x.view(dtype)`, jax.lax.bitcast_convert_type)."""
    dtype = to_dtype(dtype)
    if dtype.itemsize != x.dtype.itemsize or dtypes.bool in (dtype, x.dtype):
        raise TraceError(f"cannot view {x.dtype.name} as {dtype.name}: a traced view keeps the element size and "
                         f"reads no bool")
    if x.dtype == dtype:
        return x
    if x.uop.op is Ops.CONST:  # fold now, with NumPy's view
        return Tracer(UOp.const(np.array(x.uop.arg, x.dtype.np).view(dtype.np).item(), dtype))
    return Tracer(UOp(Ops.BITCAST, dtype, (x.uop,)))


def elementwise(op: Ops, *operands, dtype: DType | None = None, out_dtype: DType | None = None) -> Tracer:
    """Apply `op` to broadcast operands promoted to `dtype` (default: NumPy promotion)."""
    xs = [to_tracer(o) for o in operands]
    compute = dtype or result_dtype(*xs[-2:] if op is Ops.WHERE else xs)
    shape = broadcast_shapes(*[x.uop.shape for x in xs])
    srcs = []
    for i, x in enumerate(xs):
        if not (op is Ops.WHERE and i == 0):
            check_python_int_fits(x, compute)
            x = cast(x, compute)
        srcs.append(x.uop if x.uop.shape == shape else broadcast_to(x, shape).uop)
    out = out_dtype or (dtypes.bool if op in (Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE) else compute)
    weak = all(x.weak for x in (xs[1:] if op is Ops.WHERE else xs))
    return Tracer(UOp(op, out, tuple(srcs)), weak=weak)


def fma(a, b, c) -> Tracer:
    """a * b + c rounded once (a fused multiply-add: every backend's correctly rounded one) on broadcast operands
    promoted as NumPy does, to float32 or float64. 16-bit floats are refused: they are computed in float32 and
    rounded after each op, and a float32 FMA rounded again to 16 bits is not one rounding (fused.py builds theirs
    exactly from plain float32 ops)."""
    xs = [to_tracer(x) for x in (a, b, c)]
    dt = result_dtype(*xs)
    if dt not in FMA_DTYPES:
        raise TraceError(f"a fused multiply-add is for float32 or float64 operands, not {dt.name}")
    return elementwise(Ops.FMA, *xs, dtype=dt)


# ---------- reverse-mode rules ----------
# Every ALU node's sources share its shape and (but for WHERE's condition and comparisons' bool result) its
# dtype, so each rule is pointwise: ct times the partial derivative, in the node's dtype.

def _e(op: Ops, *xs) -> Tracer:
    return elementwise(op, *xs)


def _mul(a, b) -> Tracer:
    return _e(Ops.MUL, a, b)


def _zeros_like(x: Tracer) -> Tracer:
    return broadcast_to(Tracer(UOp.const(0.0, x.dtype)), x.uop.shape)


def _where(cond: Tracer, a, b) -> Tracer:
    return _e(Ops.WHERE, cond, a, b)


def _unary(op: Ops):
    """Decorator: `rule(ct, x, out) -> ct_x` as the vjp of a unary op."""
    def register(rule):
        primitive(op).def_vjp(lambda ct, node: (rule(ct, Tracer(node.src[0]), Tracer(node)),))
        return rule
    return register


def _binary(op: Ops):
    """Decorator: `rule(ct, a, b, out) -> (ct_a, ct_b)` as the vjp of a binary op."""
    def register(rule):
        primitive(op).def_vjp(lambda ct, node: rule(ct, Tracer(node.src[0]), Tracer(node.src[1]), Tracer(node)))
        return rule
    return register


_unary(Ops.NEG)(lambda ct, x, out: _e(Ops.NEG, ct))
_unary(Ops.ABS)(lambda ct, x, out: _where(_e(Ops.CMPLT, x, 0), _e(Ops.NEG, ct), ct))
_unary(Ops.EXP)(lambda ct, x, out: _mul(ct, out))
_unary(Ops.EXP2)(lambda ct, x, out: _mul(ct, _mul(out, math.log(2))))
_unary(Ops.LOG)(lambda ct, x, out: _e(Ops.FDIV, ct, x))
_unary(Ops.LOG2)(lambda ct, x, out: _e(Ops.FDIV, ct, _mul(x, math.log(2))))
_unary(Ops.SQRT)(lambda ct, x, out: _e(Ops.FDIV, _mul(ct, 0.5), out))
_unary(Ops.SIN)(lambda ct, x, out: _mul(ct, _e(Ops.COS, x)))
_unary(Ops.COS)(lambda ct, x, out: _e(Ops.NEG, _mul(ct, _e(Ops.SIN, x))))
_unary(Ops.TANH)(lambda ct, x, out: _mul(ct, _e(Ops.SUB, 1, _mul(out, out))))
_unary(Ops.ERF)(lambda ct, x, out: _mul(ct, _mul(2 / math.sqrt(math.pi), _e(Ops.EXP, _e(Ops.NEG, _mul(x, x))))))
_binary(Ops.ADD)(lambda ct, a, b, out: (ct, ct))
_binary(Ops.SUB)(lambda ct, a, b, out: (ct, _e(Ops.NEG, ct)))
_binary(Ops.MUL)(lambda ct, a, b, out: (_mul(ct, b), _mul(ct, a)))
_binary(Ops.FDIV)(lambda ct, a, b, out: (_e(Ops.FDIV, ct, b), _e(Ops.NEG, _e(Ops.FDIV, _mul(ct, a), _mul(b, b)))))
# C fmod (the float MOD): a - trunc(a / b) * b
_binary(Ops.MOD)(lambda ct, a, b, out: (ct, _mul(_e(Ops.NEG, ct), _trunc(_e(Ops.FDIV, _e(Ops.SUB, a, out), b)))))


def _trunc(x: Tracer) -> Tracer:
    return _where(_e(Ops.CMPLT, x, 0), _e(Ops.CEIL, x), _e(Ops.FLOOR, x))


def _balanced(ct: Tracer, x: Tracer, y: Tracer, out: Tracer) -> Tracer:
    """JAX's share of max/min's cotangent for operand x: all of it where x alone is the result, half on a tie."""
    x_is, y_is = _e(Ops.CMPEQ, x, out), _e(Ops.CMPEQ, y, out)
    half, one, zero = (Tracer(UOp.const(v, ct.dtype)) for v in (0.5, 1.0, 0.0))  # in ct's dtype, not float64
    return _mul(ct, _where(x_is, _where(y_is, half, one), zero))


for _op in (Ops.MAX, Ops.MIN):
    _binary(_op)(lambda ct, a, b, out: (_balanced(ct, a, b, out), _balanced(ct, b, a, out)))


@_binary(Ops.POW)
def _pow_vjp(ct: Tracer, a: Tracer, b: Tracer, out: Tracer):
    """As JAX: d/da = b * a**(b - 1) (0 where b == 0), d/db = log(a) * out (0 where a == 0)."""
    da = _where(_e(Ops.CMPEQ, b, 0), 0.0, _mul(b, _e(Ops.POW, a, _e(Ops.SUB, b, 1))))
    db = _mul(_e(Ops.LOG, _where(_e(Ops.CMPEQ, a, 0), 1.0, a)), out)
    return _mul(ct, da), _mul(ct, db)


@_binary(Ops.ATAN2)
def _atan2_vjp(ct: Tracer, y: Tracer, x: Tracer, out: Tracer):
    r2 = _e(Ops.ADD, _mul(x, x), _mul(y, y))
    return _e(Ops.FDIV, _mul(ct, x), r2), _e(Ops.NEG, _e(Ops.FDIV, _mul(ct, y), r2))


@primitive(Ops.WHERE).def_vjp
def _where_vjp(ct: Tracer, node: UOp):
    cond = Tracer(node.src[0])
    zeros = _zeros_like(ct)
    return None, _where(cond, ct, zeros), _where(cond, zeros, ct)


@primitive(Ops.FMA).def_vjp
def _fma_vjp(ct: Tracer, node: UOp):
    a, b, _ = (Tracer(s) for s in node.src)
    return _mul(ct, b), _mul(ct, a), ct


@primitive(Ops.CAST).def_vjp
def _cast_vjp(ct: Tracer, node: UOp):
    """Back to the source's float dtype; an integer or bool source gets none."""
    src = node.src[0]
    return (cast(ct, src.dtype) if src.dtype.is_float else None,)


for _op in (Ops.NOT, Ops.SIGN, Ops.FLOOR, Ops.CEIL, Ops.RINT, Ops.IDIV, Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE, Ops.AND,
            Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.BITCAST):
    primitive(_op)  # piecewise constant, integer or bits: no cotangent passes
