"""LLVM IR the LLVM renderer (render_llvm.py) builds kernels from: register and memory types, literals, the
conversions between a 16-bit float's memory and its float register (float16 through LLVM's `half`; bfloat16 as
integer IR on its bits: rounding to nearest even with NaN kept quiet, bit-equal to ml_dtypes, on every x86 level
and vectorisable), and the math it writes inline instead of calling libm or trapping: exp and erf on float (so
they vectorise), NumPy's integer floor division and modulo, shifts past the width, sign.

`InlineMath` is a mixin of the renderer: its methods emit through the renderer's `op`, `call`, `ty` (the type of
a value being rendered: a scalar, or a vector of the kernel's lanes), `const` and `intrinsic`; exp and erf work
on both, and so do shifts; integer division and modulo work on scalars (the renderer computes them lane by lane
in a vector).
"""
from __future__ import annotations

import struct

from ..uop import DType, Ops, dtypes

_LLTYPE = {"b": "i1", 1: "i8", 2: "i16", 4: "i32", 8: "i64"}
_FLOAT = {dtypes.float32: "float", dtypes.float64: "double"}
_MEMORY = {dtypes.float16: "half", dtypes.bfloat16: "i16", dtypes.bool: "i8"}  # bfloat16 as its bits

# float erf as inline IR (see erf_f32): polynomials fitted here by weighted least squares (relative error) in
# float64, ERF_SMALL for erf(x) / x in x^2 on |x| < ERF_SPLIT, ERFC_LARGE for erfc(x) * exp(x^2) in 1 / (1 + x)
# on [ERF_SPLIT, 4]; evaluated in float32 both stay within 1.1e-7 of erf (checked against math.erf)
ERF_SPLIT = 0.75
ERF_SMALL = (1.1283791664e+00, -3.7612623095e-01, 1.1283425430e-01, -2.6836746428e-02, 5.1182780692e-03,
             -6.7756679796e-04)
ERFC_LARGE = (7.5632245726e-06, 5.6376821453e-01, 5.7249391286e-01, 1.9664108223e-01, 2.4215965347e-01,
              -2.6973880287e+00, 4.3566408173e+00, -3.1297347554e+00, 9.0245898144e-01)


def reg_type(dt: DType) -> str:
    """The LLVM type a value of `dt` has in registers."""
    return _FLOAT[dt.compute] if dt.is_float else _LLTYPE["b" if dt == dtypes.bool else dt.itemsize]


def mem_type(dt: DType) -> str:
    """The LLVM type of `dt` in memory."""
    return _MEMORY.get(dt) or reg_type(dt)


def const_literal(value, dt: DType) -> str:
    if dt == dtypes.bool:
        return "true" if value else "false"
    if dt.is_float:
        if dt != dtypes.float64:  # round to the storage precision first, then spell it as a double
            value = float(dt.np.type(value))
        return "0x%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]
    return str(int(value))


class InlineMath:
    """Inline math for the LLVM renderer (see the module docstring)."""

    def widen(self, raw: str, dt: DType) -> str:
        """A loaded 16-bit float `raw` (its memory type) as its float register value (exact)."""
        f, mem = self.ty(dtypes.float32), self.ty(dt, memory=True)
        if dt == dtypes.float16:
            return self.op(f"fpext {mem} {raw} to {f}")
        i = self.ty(dtypes.int32)
        wide = self.op(f"zext {mem} {raw} to {i}")
        high = self.op(f"shl {i} {wide}, {self.const('16', dtypes.int32)}")
        return self.op(f"bitcast {i} {high} to {f}")

    def narrow(self, v: str, dt: DType) -> str:
        """A float register value `v` rounded to the 16-bit float `dt`, in its memory type."""
        f, mem = self.ty(dtypes.float32), self.ty(dt, memory=True)
        if dt == dtypes.float16:
            return self.op(f"fptrunc {f} {v} to {mem}")
        i = self.ty(dtypes.int32)
        high = self.op(f"lshr {i} {self.bfloat16_bits(v)}, {self.const('16', dtypes.int32)}")
        return self.op(f"trunc {i} {high} to {mem}")

    def round_to(self, v: str, dt: DType) -> str:
        """A float register value `v` rounded to the 16-bit float `dt`, kept in a float register."""
        if dt == dtypes.float16:
            return self.widen(self.narrow(v, dt), dt)
        i = self.ty(dtypes.int32)
        kept = self.op(f"and {i} {self.bfloat16_bits(v)}, {self.const(str(-65536), dtypes.int32)}")
        return self.op(f"bitcast {i} {kept} to {self.ty(dtypes.float32)}")

    def bfloat16_bits(self, v: str) -> str:
        """The bits of float `v` rounded to bfloat16 in their high half (the low half is not cleared): round to
        nearest even by adding 0x7fff plus the kept part's lowest bit; a NaN becomes the quiet NaN of its sign
        (ml_dtypes' 0x7fc0 / 0xffc0), so no payload can round to infinity."""
        f, i, b = self.ty(dtypes.float32), self.ty(dtypes.int32), self.ty(dtypes.bool)
        n_ = lambda k: self.const(str(k), dtypes.int32)  # noqa: E731
        bits = self.op(f"bitcast {f} {v} to {i}")
        lowest_kept = self.op(f"and {i} {self.op(f'lshr {i} {bits}, {n_(16)}')}, {n_(1)}")
        rounded = self.op(f"add {i} {bits}, {self.op(f'add {i} {lowest_kept}, {n_(0x7FFF)}')}")
        quiet = self.op(f"or {i} {self.op(f'and {i} {bits}, {n_(-2**31)}')}, {n_(0x7FC00000)}")
        return self.op(f"select {b} {self.op(f'fcmp uno {f} {v}, {v}')}, {i} {quiet}, {i} {rounded}")

    def sticky_double(self, v: str, src: DType) -> str:
        """Integer `v` as a double that `odd_float` rounds as it would round `v`: `v` itself where a double holds
        it (magnitude below 2**53), else its bits but the lowest 11, those folded into one sticky bit (42 or more
        bits below the top one, beyond float's reach), so that no first rounding to double makes a tie."""
        d = self.ty(dtypes.float64)
        if src.itemsize < 8:
            return self.op(f"{'sitofp' if src.kind == 'i' else 'uitofp'} {self.ty(src)} {v} to {d}")
        i, b = self.ty(dtypes.int64), self.ty(dtypes.bool)
        n_ = lambda k: self.const(str(k), dtypes.int64)  # noqa: E731
        negative = self.op(f"icmp slt {i} {v}, {n_(0)}") if src.kind == "i" else None
        a = self.op(f"select {b} {negative}, {i} {self.op(f'sub {i} {n_(0)}, {v}')}, {i} {v}") if negative else v
        lost = self.op(f"icmp ne {i} {self.op(f'and {i} {a}, {n_(2047)}')}, {n_(0)}")
        folded = self.op(f"or {i} {self.op(f'lshr {i} {a}, {n_(11)}')}, {self.op(f'zext {b} {lost} to {i}')}")
        scale = self.const(const_literal(2048.0, dtypes.float64), dtypes.float64)
        scaled = self.op(f"fmul {d} {self.op(f'uitofp {i} {folded} to {d}')}, {scale}")
        big = self.op(f"icmp uge {i} {a}, {n_(2**53)}")
        out = self.op(f"select {b} {big}, {d} {scaled}, {d} {self.op(f'uitofp {i} {a} to {d}')}")
        return self.op(f"select {b} {negative}, {d} {self.op(f'fneg {d} {out}')}, {d} {out}") if negative else out

    def odd_float(self, v: str, src: DType) -> str:
        """A double `v` as float rounded to odd (toward zero, the lowest bit set when inexact), so that rounding
        it on to a 16-bit float rounds the double once (renderer.rounds_through_odd_float)."""
        f, d, i, b = self.ty(dtypes.float32), self.ty(src), self.ty(dtypes.int32), self.ty(dtypes.bool)
        n_ = lambda k: self.const(str(k), dtypes.int32)  # noqa: E731
        near = self.op(f"fptrunc {d} {v} to {f}")
        back = self.op(f"fpext {f} {near} to {d}")
        inexact = self.op(f"fcmp one {d} {back}, {v}")  # ordered: a NaN stays as it is
        fabs = self.intrinsic("fabs", src)
        outward = self.op(f"fcmp ogt {d} {self.call(fabs, d, [(d, back)])}, {self.call(fabs, d, [(d, v)])}")
        bits = self.op(f"bitcast {f} {near} to {i}")
        toward_zero = self.op(f"sub {i} {bits}, {self.op(f'zext {b} {outward} to {i}')}")
        odd = self.op(f"select {b} {inexact}, {i} {self.op(f'or {i} {toward_zero}, {n_(1)}')}, {i} {bits}")
        return self.op(f"bitcast {i} {odd} to {f}")

    def exp_f32(self, x: str) -> str:
        """exp on float as inline IR that vectorises (libm's expf does not): Cephes' range reduction
        x = n ln2 + r and degree-5 polynomial (about 1 ulp), scaled by 2^n as two exact powers of two so
        results stay right down to the denormals; NaN propagates, overflow gives inf, -inf gives 0."""
        f, i, b = self.ty(dtypes.float32), self.ty(dtypes.int32), self.ty(dtypes.bool)
        c = lambda v: self.const(const_literal(v, dtypes.float32), dtypes.float32)  # noqa: E731
        n_ = lambda v: self.const(str(v), dtypes.int32)  # noqa: E731
        x = self.op(f"select {b} {self.op(f'fcmp olt {f} {x}, {c(-104.0)}')}, {f} {c(-104.0)}, {f} {x}")
        x = self.op(f"select {b} {self.op(f'fcmp ogt {f} {x}, {c(89.0)}')}, {f} {c(89.0)}, {f} {x}")
        scaled = self.op(f"fadd {f} {self.op(f'fmul {f} {x}, {c(1.44269504088896341)}')}, {c(0.5)}")
        n = self.call(self.intrinsic("floor", dtypes.float32), f, [(f, scaled)])
        r = self.op(f"fsub {f} {x}, {self.op(f'fmul {f} {n}, {c(0.693359375)}')}")
        r = self.op(f"fsub {f} {r}, {self.op(f'fmul {f} {n}, {c(-2.12194440e-4)}')}")
        p = c(1.9875691500e-4)
        for coef in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
            p = self.op(f"fadd {f} {self.op(f'fmul {f} {p}, {r}')}, {c(coef)}")
        r2 = self.op(f"fmul {f} {r}, {r}")
        y = self.op(f"fadd {f} {self.op(f'fmul {f} {p}, {r2}')}, {r}")
        y = self.op(f"fadd {f} {y}, {c(1.0)}")
        finite_n = self.op(f"select {b} {self.op(f'fcmp uno {f} {n}, {n}')}, {f} {c(0.0)}, {f} {n}")
        k = self.op(f"fptosi {f} {finite_n} to {i}")  # in [-150, 129] once NaN is out of the way
        half = self.op(f"ashr {i} {k}, {n_(1)}")
        for part in (half, self.op(f"sub {i} {k}, {half}")):
            bits = self.op(f"shl {i} {self.op(f'add {i} {part}, {n_(127)}')}, {n_(23)}")
            y = self.op(f"fmul {f} {y}, {self.op(f'bitcast {i} {bits} to {f}')}")
        return y

    def horner(self, coefs: tuple, x: str) -> str:
        f = self.ty(dtypes.float32)
        c = lambda v: self.const(const_literal(v, dtypes.float32), dtypes.float32)  # noqa: E731
        acc = c(coefs[-1])
        for coef in coefs[-2::-1]:
            acc = self.op(f"fadd {f} {self.op(f'fmul {f} {acc}, {x}')}, {c(coef)}")
        return acc

    def erf_f32(self, x: str) -> str:
        """erf on float as inline IR that vectorises (libm's erff is a call per element): x * P(x^2) near 0,
        1 - exp(-x^2) * R(1 / (1 + |x|)) beyond, with the sign of x; |x| > 4 gives +-1, NaN propagates."""
        f, b = self.ty(dtypes.float32), self.ty(dtypes.bool)
        c = lambda v: self.const(const_literal(v, dtypes.float32), dtypes.float32)  # noqa: E731
        a = self.call(self.intrinsic("fabs", dtypes.float32), f, [(f, x)])
        a = self.op(f"select {b} {self.op(f'fcmp ogt {f} {a}, {c(4.0)}')}, {f} {c(4.0)}, {f} {a}")
        a2 = self.op(f"fmul {f} {a}, {a}")
        small = self.op(f"fmul {f} {a}, {self.horner(ERF_SMALL, a2)}")
        s = self.op(f"fdiv {f} {c(1.0)}, {self.op(f'fadd {f} {a}, {c(1.0)}')}")
        tail = self.op(f"fmul {f} {self.exp_f32(self.op(f'fneg {f} {a2}'))}, {self.horner(ERFC_LARGE, s)}")
        large = self.op(f"fsub {f} {c(1.0)}, {tail}")
        r = self.op(f"select {b} {self.op(f'fcmp olt {f} {a}, {c(ERF_SPLIT)}')}, {f} {small}, {f} {large}")
        return self.call(self.intrinsic("copysign", dtypes.float32), f, [(f, r), (f, x)])

    def divmod(self, op: Ops, dt: DType, a: str, b: str, divisor: int | None = None) -> str:
        """NumPy integer floor division / modulo: x // 0 == x % 0 == 0, and no trap on MIN // -1. A `divisor` known
        positive (a constant; `b` its literal, splatted in a vector) needs neither check: a power of two is a
        shift or a mask (floor semantics in two's complement), another divides once and corrects a negative
        remainder. Same results, a fraction of the IR (an index's floor division: 15 instructions -> 1 or 4)."""
        t = reg_type(dt)
        if divisor is not None and divisor > 0 and not dt.is_float:
            return self.positive_divmod(op, dt, a, b, divisor)
        if dt.is_float:  # only MOD reaches here: fmod with the sign of the divisor
            r = self.op(f"frem {t} {a}, {b}")
            nonzero = self.op(f"fcmp une {t} {r}, 0.0")
            signs_differ = self.op(f"xor i1 {self.op(f'fcmp olt {t} {r}, 0.0')}, {self.op(f'fcmp olt {t} {b}, 0.0')}")
            fix = self.op(f"and i1 {nonzero}, {signs_differ}")
            return self.op(f"select i1 {fix}, {t} {self.op(f'fadd {t} {r}, {b}')}, {t} {r}")
        zero = self.op(f"icmp eq {t} {b}, 0")
        if dt.kind != "i":
            safe = self.op(f"select i1 {zero}, {t} 1, {t} {b}")
            res = self.op(f"{'udiv' if op is Ops.IDIV else 'urem'} {t} {a}, {safe}")
            return self.op(f"select i1 {zero}, {t} 0, {t} {res}")
        minus1 = self.op(f"icmp eq {t} {b}, -1")
        safe = self.op(f"select i1 {self.op(f'or i1 {zero}, {minus1}')}, {t} 1, {t} {b}")
        q = self.op(f"sdiv {t} {a}, {safe}")
        r = self.op(f"srem {t} {a}, {safe}")
        signs_differ = self.op(f"icmp slt {t} {self.op(f'xor {t} {r}, {safe}')}, 0")
        adjust = self.op(f"and i1 {self.op(f'icmp ne {t} {r}, 0')}, {signs_differ}")
        if op is Ops.IDIV:
            q = self.op(f"sub {t} {q}, {self.op(f'zext i1 {adjust} to {t}')}")
            q = self.op(f"select i1 {minus1}, {t} {self.op(f'sub {t} 0, {a}')}, {t} {q}")
            return self.op(f"select i1 {zero}, {t} 0, {t} {q}")
        r = self.op(f"select i1 {adjust}, {t} {self.op(f'add {t} {r}, {safe}')}, {t} {r}")
        return self.op(f"select i1 {self.op(f'or i1 {zero}, {minus1}')}, {t} 0, {t} {r}")

    def positive_divmod(self, op: Ops, dt: DType, a: str, b: str, divisor: int) -> str:
        """`divmod` by a constant `divisor` > 0 (`b`: its literal, or its splat in a vector)."""
        t, i1, signed = self.ty(dt), self.ty(dtypes.bool), dt.kind == "i"
        if divisor & (divisor - 1) == 0:
            if op is Ops.MOD:
                return self.op(f"and {t} {a}, {self.const(str(divisor - 1), dt)}")
            shift = self.const(str(divisor.bit_length() - 1), dt)
            return self.op(f"{'ashr' if signed else 'lshr'} {t} {a}, {shift}")
        if not signed:
            return self.op(f"{'udiv' if op is Ops.IDIV else 'urem'} {t} {a}, {b}")
        r = self.op(f"srem {t} {a}, {b}")
        negative = self.op(f"icmp slt {t} {r}, {self.const('0', dt)}")  # a floor's remainder has the divisor's sign
        if op is Ops.MOD:
            return self.op(f"select {i1} {negative}, {t} {self.op(f'add {t} {r}, {b}')}, {t} {r}")
        return self.op(f"sub {t} {self.op(f'sdiv {t} {a}, {b}')}, {self.op(f'zext {i1} {negative} to {t}')}")

    def shift(self, op: Ops, dt: DType, a: str, b: str, amount: int | None = None) -> str:
        """A shift of a scalar or a vector (a quantized weight's nibbles: lanes of bytes), past the width as NumPy:
        0, or the sign for an arithmetic right shift. A constant `amount` within the width (`b` its literal) is
        one instruction."""
        t, i1, bits = self.ty(dt), self.ty(dtypes.bool), dt.itemsize * 8
        if amount is not None and 0 <= amount < bits:
            return self.op(f"{'shl' if op is Ops.SHL else 'ashr' if dt.kind == 'i' else 'lshr'} {t} {a}, {b}")
        zero = self.const("0", dt)
        out_of_range = self.op(f"icmp uge {t} {b}, {self.const(str(bits), dt)}")
        safe = self.op(f"select {i1} {out_of_range}, {t} {zero}, {t} {b}")
        if op is Ops.SHL:
            return self.op(f"select {i1} {out_of_range}, {t} {zero}, {t} {self.op(f'shl {t} {a}, {safe}')}")
        if dt.kind == "i":
            fill = self.op(f"ashr {t} {a}, {self.const(str(bits - 1), dt)}")
            return self.op(f"select {i1} {out_of_range}, {t} {fill}, {t} {self.op(f'ashr {t} {a}, {safe}')}")
        return self.op(f"select {i1} {out_of_range}, {t} {zero}, {t} {self.op(f'lshr {t} {a}, {safe}')}")

    def sign(self, dt: DType, x: str) -> str:
        t = reg_type(dt)
        if dt == dtypes.bool:
            return x
        if dt.is_float:
            pos = self.op(f"uitofp i1 {self.op(f'fcmp ogt {t} {x}, 0.0')} to {t}")
            neg = self.op(f"uitofp i1 {self.op(f'fcmp olt {t} {x}, 0.0')} to {t}")
            s = self.op(f"fsub {t} {pos}, {neg}")
            return self.op(f"select i1 {self.op(f'fcmp uno {t} {x}, 0.0')}, {t} {x}, {t} {s}")
        gt = "sgt" if dt.kind == "i" else "ugt"
        pos = self.op(f"zext i1 {self.op(f'icmp {gt} {t} {x}, 0')} to {t}")
        neg = self.op(f"zext i1 {self.op(f'icmp slt {t} {x}, 0')} to {t}") if dt.kind == "i" else "0"
        return self.op(f"sub {t} {pos}, {neg}")


_INTRINSIC_SUFFIX = {"float": "f32", "double": "f64", "half": "f16"}


def intrinsic_suffix(t: str, lanes: int) -> str:
    """An intrinsic's type suffix: f32, i64, v16f32..."""
    return (f"v{lanes}" if lanes else "") + _INTRINSIC_SUFFIX.get(t, t)
