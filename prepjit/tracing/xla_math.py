"""log1p and erfinv as XLA's CPU code computes them, rounding for rounding, so `pj.random.normal` equals
`jax.random.normal` bit for bit (float16, bfloat16 and float32 on every device, float64 where the device's log is
the C library's).

Read from the LLVM IR and machine code that jaxlib 0.10.2 emits on x86-64 (XLA_FLAGS=--xla_dump_to):
- erfinv (StableHLO's chlo.erf_inv expansion, M. Giles' approximations, "Approximating the erfinv function",
  GPU Computing Gems, 2011): w = -log1p(-x * x), coefficients selected per element by w's branch, one Horner
  polynomial whose steps `p * t + c` LLVM contracts into fused multiply-adds; +-inf at x = +-1.
- log1p (XLA's elemental emitter): for |x| < sqrt(2) - 1 Cephes' rational x - x**2 / 2 + x**3 * P(x) / Q(x)
  (Horner steps fused, P / Q, x**3 * (P / Q) in two rounded products, then x**2 * -0.5 fused in); otherwise
  log(1 + x): for float32 XLA's own log (Cephes' logf as Eigen's plog: frexp, a degree-8 polynomial in three
  interleaved Horner chains joined by x**3, exponent * ln 2 in two parts); for float64 the C library's log,
  which XLA calls and so does prepjit's cpu device (another device's log may round otherwise).

Every fused step is fused.fma (the FMA primitive: each backend's correctly rounded fma, rounded once whether or
not a backend would contract a plain a * b + c), every other step one plain op, rounded as XLA rounds it. XLA's CPU code flushes subnormal
inputs and results to zero and these keep them (normal's never are).
"""
from __future__ import annotations

import math

import numpy as np

from ..uop import DType, dtypes
from . import prims
from .fused import fma
from .numpy_math import (absolute, add, bitwise_and, equal, greater, less, log, multiply, right_shift, sqrt,
                         subtract, true_divide, where)
from .tracer import Tracer

# Giles' erfinv: per branch, polynomial coefficients (highest power first) in w - centre or sqrt(w) - centre
_ERFINV32 = ((5.0, 2.5, (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                         -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)),
             (None, 3.0, (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                          -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)))
_ERFINV64 = ((6.25, 3.125, (-3.6444120640178196996e-21, -1.685059138182016589e-19, 1.2858480715256400167e-18,
                            1.115787767802518096e-17, -1.333171662854620906e-16, 2.0972767875968561637e-17,
                            6.6376381343583238325e-15, -4.0545662729752068639e-14, -8.1519341976054721522e-14,
                            2.6335093153082322977e-12, -1.2975133253453532498e-11, -5.4154120542946279317e-11,
                            1.051212273321532285e-09, -4.1126339803469836976e-09, -2.9070369957882005086e-08,
                            4.2347877827932403518e-07, -1.3654692000834678645e-06, -1.3882523362786468719e-05,
                            0.0001867342080340571352, -0.00074070253416626697512, -0.0060336708714301490533,
                            0.24015818242558961693, 1.6536545626831027356)),
             (16.0, 3.25, (2.2137376921775787049e-09, 9.0756561938885390979e-08, -2.7517406297064545428e-07,
                           1.8239629214389227755e-08, 1.5027403968909827627e-06, -4.013867526981545969e-06,
                           2.9234449089955446044e-06, 1.2475304481671778723e-05, -4.7318229009055733981e-05,
                           6.8284851459573175448e-05, 2.4031110387097893999e-05, -0.0003550375203628474796,
                           0.00095328937973738049703, -0.0016882755560235047313, 0.0024914420961078508066,
                           -0.0037512085075692412107, 0.005370914553590063617, 1.0052589676941592334,
                           3.0838856104922207635)),
             (None, 5.0, (-2.7109920616438573243e-11, -2.5556418169965252055e-10, 1.5076572693500548083e-09,
                          -3.7894654401267369937e-09, 7.6157012080783393804e-09, -1.4960026627149240478e-08,
                          2.9147953450901080826e-08, -6.7711997758452339498e-08, 2.2900482228026654717e-07,
                          -9.9298272942317002539e-07, 4.5260625972231537039e-06, -1.9681778105531670567e-05,
                          7.5995277030017761139e-05, -0.00021503011930044477347, -0.00013871931833623122026,
                          1.0103004648645343977, 4.8499064014085844221)))

# Cephes' log1p rational for |x| < sqrt(2) - 1: numerator and denominator, highest power first
_LOG1P_P = (4.5270000862445199635215e-05, 4.9854102823193375972212e-01, 6.5787325942061044846969e+00,
            2.9911919328553073277375e+01, 6.0949667980987787057556e+01, 5.7112963590585538103336e+01,
            2.0039553499201281259648e+01)
_LOG1P_Q = (1.0, 1.5062909083469192043167e+01, 8.3047565967967209469434e+01, 2.2176239823732856465394e+02,
            3.0909872225312059774938e+02, 2.1642788614495947685003e+02, 6.0118660497603843919306e+01)
_LOG1P_SMALL = 0.41421356237309504880  # sqrt(2) - 1

# Cephes' logf: log(1 + r) - r + r**2 / 2 = r**3 * (three chains of three coefficients each, joined by r**3)
_LOGF_CHAINS = ((7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1), (-1.2420140846e-1, 1.4249322787e-1,
                -1.6668057665e-1), (2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1))
_LN2_LOW, _LN2_HIGH = -2.12194440e-4, 0.693359375  # ln 2 in two parts: e * _LN2_HIGH is exact


def _c(value: float, dt: DType) -> Tracer:
    return Tracer(prims.cast(prims.to_tracer(value), dt).uop)


def _horner(coefficients, t: Tracer, p: Tracer | None = None) -> Tracer:
    """p * t + c for each coefficient c in turn, each step one fused multiply-add; p starts as the first."""
    dt = t.dtype
    if p is None:
        p, coefficients = _c(coefficients[0], dt), coefficients[1:]
    for c in coefficients:
        p = fma(p, t, c if isinstance(c, Tracer) else _c(c, dt), dt)
    return p


def _logf(y: Tracer) -> Tracer:
    """XLA's float32 log of y (Cephes' logf): y = m * 2**e with m in [sqrt(1/2), sqrt(2)), r = m - 1."""
    y = where(greater(y, np.finfo(np.float32).tiny), y, _c(np.finfo(np.float32).tiny, dtypes.float32))  # also NaN
    bits = y.view(dtypes.int32)  # frexp: y's exponent field and mantissa, y * 2**-exponent in [0.5, 1)
    halved = add(multiply(prims.cast(bitwise_and(bits, 0x7FFFFF), dtypes.float32), _c(2.0 ** -24, dtypes.float32)),
                 _c(0.5, dtypes.float32))
    exponent = add(prims.cast(subtract(right_shift(bits, 23), 127), dtypes.float32), _c(1.0, dtypes.float32))
    low = less(halved, _c(math.sqrt(0.5), dtypes.float32))
    r = add(subtract(halved, _c(1.0, dtypes.float32)), where(low, halved, _c(0.0, dtypes.float32)))
    exponent = subtract(exponent, where(low, _c(1.0, dtypes.float32), _c(0.0, dtypes.float32)))
    r2 = multiply(r, r)
    r3 = multiply(r2, r)
    first, second, third = (_horner(chain, r) for chain in _LOGF_CHAINS)
    tail = fma(fma(fma(first, r3, second, dtypes.float32), r3, third, dtypes.float32), r3,
               multiply(exponent, _c(_LN2_LOW, dtypes.float32)), dtypes.float32)
    # r - r**2 / 2 and exponent * ln2_high: products exact, so XLA's fused forms round as these plain ops
    return add(add(subtract(r, multiply(r2, _c(0.5, dtypes.float32))), tail),
               multiply(exponent, _c(_LN2_HIGH, dtypes.float32)))


def log1p(x: Tracer) -> Tracer:
    """log(1 + x) of float32 or float64 x as XLA's CPU code computes it (see the module)."""
    dt = x.dtype
    x2 = multiply(x, x)
    ratio = true_divide(_horner(_LOG1P_P, x), _horner(_LOG1P_Q, x))
    small = add(x, fma(x2, _c(-0.5, dt), multiply(multiply(x, x2), ratio), dt))
    y = add(x, _c(1.0, dt))
    large = _logf(y) if dt == dtypes.float32 else log(y)
    large = where(greater(y, 0), large, where(equal(y, 0), _c(-math.inf, dt), _c(math.nan, dt)))  # NaN too
    large = where(equal(y, math.inf), y, large)
    return where(less(absolute(x), _c(_LOG1P_SMALL, dt)), small, large)


def erfinv(x: Tracer) -> Tracer:
    """Giles' erfinv of float32 or float64 x in [-1, 1] as XLA computes it: +-inf at +-1."""
    dt = x.dtype
    table = _ERFINV64 if dt == dtypes.float64 else _ERFINV32
    w = -log1p(multiply(x, -x))
    root = sqrt(w)
    conditions = [less(w, _c(limit, dt)) for limit, _, _ in table[:-1]]
    t = subtract(root, _c(table[-1][1], dt))
    for i in reversed(range(len(conditions))):  # the first branch whose condition holds
        t = where(conditions[i], subtract(w if i == 0 else root, _c(table[i][1], dt)), t)
    # each branch's coefficients aligned at the constant term (a shorter one starts with zeros: p * t + 0 == 0)
    width = max(len(coefficients) for _, _, coefficients in table)
    padded = [(0.0,) * (width - len(coefficients)) + coefficients for _, _, coefficients in table]

    def coefficient(k: int) -> Tracer:
        value = _c(padded[-1][k], dt)
        for i in reversed(range(len(conditions))):
            value = where(conditions[i], _c(padded[i][k], dt), value)
        return value
    p = _horner([coefficient(k) for k in range(1, width)], t, coefficient(0))
    return where(equal(absolute(x), 1), multiply(x, _c(math.inf, dt)), multiply(p, x))
