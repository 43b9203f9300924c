"""The LLVM IR renderer: a kernel AST -> one LLVM function for the cpu device.

ABI: `void name(ptr bufs, ptr vals, i64 start, i64 end)`: `bufs` holds the buffer pointers in
slot order, `vals` the int64 var values in `var_names` order, and [start, end) is the slice of
the outermost loop range this call computes (CPU threads split it); `end` is clamped to the
range, so (0, INT64_MAX) computes all of it. The body is an internal,
always-inlined function taking every buffer as a `noalias` pointer, so LLVM can vectorise.
float16 values live in registers as float and are rounded to half after each op, like NumPy.
"""
from __future__ import annotations

import struct

from ..uop import DType, Ops, UOp, dtypes
from .kernel import KernelSource, kernel_vars, parallel_range
from .renderer import KernelRenderer
from .target import CPUTarget, host_target

_LLTYPE = {"b": "i1", 1: "i8", 2: "i16", 4: "i32", 8: "i64"}
_FLOAT = {dtypes.float16: "float", dtypes.float32: "float", dtypes.float64: "double"}
_MATH = {Ops.EXP: "exp", Ops.EXP2: "exp2", Ops.LOG: "log", Ops.LOG2: "log2", Ops.SQRT: "sqrt", Ops.SIN: "sin",
         Ops.COS: "cos", Ops.FLOOR: "floor", Ops.CEIL: "ceil", Ops.RINT: "rint", Ops.ABS: "fabs"}
_LIBM = {Ops.TANH: "tanh", Ops.ERF: "erf"}
# float erf as inline IR (see erf_f32): polynomials fitted here by weighted least squares (relative error) in
# float64, ERF_SMALL for erf(x) / x in x^2 on |x| < ERF_SPLIT, ERFC_LARGE for erfc(x) * exp(x^2) in 1 / (1 + x)
# on [ERF_SPLIT, 4]; evaluated in float32 both stay within 1.1e-7 of erf (checked against math.erf)
ERF_SPLIT = 0.75
ERF_SMALL = (1.1283791664e+00, -3.7612623095e-01, 1.1283425430e-01, -2.6836746428e-02, 5.1182780692e-03,
             -6.7756679796e-04)
ERFC_LARGE = (7.5632245726e-06, 5.6376821453e-01, 5.7249391286e-01, 1.9664108223e-01, 2.4215965347e-01,
              -2.6973880287e+00, 4.3566408173e+00, -3.1297347554e+00, 9.0245898144e-01)


def function_attributes(target: CPUTarget) -> str:
    """x86 backends default to 256-bit vectors even where 512-bit ones exist; a register-blocked contraction's
    accumulators then need twice the registers and spill. So kernels ask for the target's full width."""
    return f'nounwind "prefer-vector-width"="{8 * target.vector_bytes}"'


def reg_type(dt: DType) -> str:
    """The LLVM type a value of `dt` has in registers."""
    return _FLOAT[dt] if dt.is_float else _LLTYPE["b" if dt == dtypes.bool else dt.itemsize]


def mem_type(dt: DType) -> str:
    """The LLVM type of `dt` in memory."""
    return "half" if dt == dtypes.float16 else "i8" if dt == dtypes.bool else reg_type(dt)


def const_literal(value, dt: DType) -> str:
    if dt == dtypes.bool:
        return "true" if value else "false"
    if dt.is_float:
        if dt != dtypes.float64:  # round to the storage precision first, then spell it as a double
            value = float(dt.np.type(value))
        return "0x%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]
    return str(int(value))


def _identity(op: Ops, dt: DType):
    if op is Ops.ADD or op is Ops.OR:
        return 0
    if op is Ops.MUL or op is Ops.AND:
        return 1
    if op is Ops.MAX:
        return dt.min()
    return dt.max()


def _loop_ranges(u: UOp) -> list[UOp]:
    return sorted({r for r in u.toposort() if r.op is Ops.RANGE and r.arg[1] in ("loop", "serial")},
                  key=lambda r: r.arg[0])


class _Renderer(KernelRenderer):
    def __init__(self, ast: UOp, target: CPUTarget):
        super().__init__(ast)
        self.attributes = function_attributes(target)
        self.open_ranges: list[UOp] = []  # the loop ranges open where the renderer is, outermost first
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.decls: set[str] = set()
        self.n = 0
        self.vars = [v.arg[0] for v in kernel_vars(ast)]
        self.prange = parallel_range(ast)
        self.reduce_groups: dict = {}
        self.reduce_loops: dict[UOp, set] = {}  # the loop ranges each reduction's value depends on
        self.reduce_free: dict[UOp, set] = {}   # all the ranges it depends on that no reduction in it binds
        self.stores_done = 0
        self.waits: dict[UOp, int] = {}  # a reduction reading what the kernel stores: stores to render before it
        stores = list(ast.src)
        written = {st.src[0] for st in stores}
        for u in ast.toposort():  # operands first
            if u.op is Ops.REDUCE:
                self.reduce_groups.setdefault((u.arg, u.dtype, u.src[1:]), []).append(u)
                self.reduce_loops[u] = set(_loop_ranges(u))
                inner = [x for x in u.toposort() if x.op in (Ops.RANGE, Ops.REDUCE)]
                bound = {r for x in inner if x.op is Ops.REDUCE for r in x.src[1:]}
                self.reduce_free[u] = {x for x in inner if x.op is Ops.RANGE} - bound
                reads = {x.src[0] for x in u.toposort() if x.op is Ops.LOAD} & written
                if reads:  # the stores to those buffers before the first store that uses it (reuse.py)
                    first = next(i for i, st in enumerate(stores) if u in st.toposort())
                    self.waits[u] = max((i + 1 for i, st in enumerate(stores[:first]) if st.src[0] in reads), default=0)

    def tmp(self, prefix="t") -> str:
        self.n += 1
        return f"%{prefix}{self.n}"

    def emit(self, line: str):
        self.lines.append("  " + line)

    def op(self, rhs: str, prefix="t") -> str:
        name = self.tmp(prefix)
        self.emit(f"{name} = {rhs}")
        return name

    def call(self, fn: str, ret: str, args: list[tuple[str, str]]) -> str:
        self.decls.add(f"declare {ret} @{fn}({', '.join(t for t, _ in args)})")
        return self.op(f"call {ret} @{fn}({', '.join(f'{t} {v}' for t, v in args)})")

    # ---- values (the shared parts are in KernelRenderer) ----
    literal = staticmethod(const_literal)

    @staticmethod
    def var_name(name: str) -> str:
        return f"%var_{name}"

    def round_half(self, v: str) -> str:
        h = self.op(f"fptrunc float {v} to half")
        return self.op(f"fpext half {h} to float")

    def alu(self, op: Ops, dt: DType, sdt: DType, s: list[str]) -> str:
        t, st = reg_type(dt), reg_type(sdt)
        fl, signed = sdt.is_float, sdt.kind == "i"
        if op is Ops.WHERE:
            return self.op(f"select i1 {s[0]}, {t} {s[1]}, {t} {s[2]}")
        if op in (Ops.ADD, Ops.SUB, Ops.MUL):
            return self.op(f"{'f' if fl else ''}{op.name.lower()} {t} {s[0]}, {s[1]}")
        if op is Ops.FDIV:
            return self.op(f"fdiv {t} {s[0]}, {s[1]}")
        if op in (Ops.IDIV, Ops.MOD):
            return self.divmod(op, sdt, s[0], s[1])
        if op in (Ops.MAX, Ops.MIN):
            if sdt == dtypes.bool:
                return self.op(f"{'or' if op is Ops.MAX else 'and'} i1 {s[0]}, {s[1]}")
            name = ("maximum" if op is Ops.MAX else "minimum") if fl else \
                (("s" if signed else "u") + ("max" if op is Ops.MAX else "min"))
            return self.call(f"llvm.{name}.{'f32' if t == 'float' else 'f64' if fl else t}", t, [(t, s[0]), (t, s[1])])
        if op is Ops.POW:
            return self.call(f"llvm.pow.{'f32' if t == 'float' else 'f64'}", t, [(t, s[0]), (t, s[1])])
        if op is Ops.ATAN2:
            return self.call("atan2" + ("f" if t == "float" else ""), t, [(t, s[0]), (t, s[1])])
        if op in (Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE):
            if fl:
                cond = {Ops.CMPLT: "olt", Ops.CMPEQ: "oeq", Ops.CMPNE: "une"}[op]
                return self.op(f"fcmp {cond} {st} {s[0]}, {s[1]}")
            cond = {Ops.CMPLT: "slt" if signed else "ult", Ops.CMPEQ: "eq", Ops.CMPNE: "ne"}[op]
            return self.op(f"icmp {cond} {st} {s[0]}, {s[1]}")
        if op in (Ops.AND, Ops.OR, Ops.XOR):
            return self.op(f"{op.name.lower()} {t} {s[0]}, {s[1]}")
        if op in (Ops.SHL, Ops.SHR):
            return self.shift(op, dt, s[0], s[1])
        if op is Ops.NEG:
            return self.op(f"fneg {t} {s[0]}" if fl else f"sub {t} 0, {s[0]}")
        if op is Ops.NOT:
            return self.op(f"xor {t} {s[0]}, {'true' if dt == dtypes.bool else -1}")
        if op is Ops.ABS and not fl:
            return s[0] if not signed else self.call(f"llvm.abs.{t}", t, [(t, s[0]), ("i1", "false")])
        if op is Ops.SIGN:
            return self.sign(dt, s[0])
        if op is Ops.EXP and t == "float":
            return self.exp_f32(s[0])
        if op is Ops.ERF and t == "float":
            return self.erf_f32(s[0])
        if op in _MATH:
            return self.call(f"llvm.{_MATH[op]}.{'f32' if t == 'float' else 'f64'}", t, [(t, s[0])])
        if op in _LIBM:
            return self.call(_LIBM[op] + ("f" if t == "float" else ""), t, [(t, s[0])])
        raise NotImplementedError(f"LLVM renderer: {op} on {dt}")

    def exp_f32(self, x: str) -> str:
        """exp on float as inline IR that vectorises (libm's expf does not): Cephes' range reduction
        x = n ln2 + r and degree-5 polynomial (about 1 ulp), scaled by 2^n as two exact powers of two so
        results stay right down to the denormals; NaN propagates, overflow gives inf, -inf gives 0."""
        c = lambda v: const_literal(v, dtypes.float32)  # noqa: E731
        x = self.op(f"select i1 {self.op(f'fcmp olt float {x}, {c(-104.0)}')}, float {c(-104.0)}, float {x}")
        x = self.op(f"select i1 {self.op(f'fcmp ogt float {x}, {c(89.0)}')}, float {c(89.0)}, float {x}")
        scaled = self.op(f"fadd float {self.op(f'fmul float {x}, {c(1.44269504088896341)}')}, {c(0.5)}")
        n = self.call("llvm.floor.f32", "float", [("float", scaled)])
        r = self.op(f"fsub float {x}, {self.op(f'fmul float {n}, {c(0.693359375)}')}")
        r = self.op(f"fsub float {r}, {self.op(f'fmul float {n}, {c(-2.12194440e-4)}')}")
        p = c(1.9875691500e-4)
        for coef in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
            p = self.op(f"fadd float {self.op(f'fmul float {p}, {r}')}, {c(coef)}")
        r2 = self.op(f"fmul float {r}, {r}")
        y = self.op(f"fadd float {self.op(f'fmul float {p}, {r2}')}, {r}")
        y = self.op(f"fadd float {y}, {c(1.0)}")
        finite_n = self.op(f"select i1 {self.op(f'fcmp uno float {n}, {n}')}, float {c(0.0)}, float {n}")
        k = self.op(f"fptosi float {finite_n} to i32")  # in [-150, 129] once NaN is out of the way
        half = self.op(f"ashr i32 {k}, 1")
        for part in (half, self.op(f"sub i32 {k}, {half}")):
            bits = self.op(f"shl i32 {self.op(f'add i32 {part}, 127')}, 23")
            y = self.op(f"fmul float {y}, {self.op(f'bitcast i32 {bits} to float')}")
        return y

    def horner(self, coefs: tuple, x: str) -> str:
        c = lambda v: const_literal(v, dtypes.float32)  # noqa: E731
        acc = c(coefs[-1])
        for coef in coefs[-2::-1]:
            acc = self.op(f"fadd float {self.op(f'fmul float {acc}, {x}')}, {c(coef)}")
        return acc

    def erf_f32(self, x: str) -> str:
        """erf on float as inline IR that vectorises (libm's erff is a call per element): x * P(x^2) near 0,
        1 - exp(-x^2) * R(1 / (1 + |x|)) beyond, with the sign of x; |x| > 4 gives +-1, NaN propagates."""
        c = lambda v: const_literal(v, dtypes.float32)  # noqa: E731
        a = self.call("llvm.fabs.f32", "float", [("float", x)])
        a = self.op(f"select i1 {self.op(f'fcmp ogt float {a}, {c(4.0)}')}, float {c(4.0)}, float {a}")
        a2 = self.op(f"fmul float {a}, {a}")
        small = self.op(f"fmul float {a}, {self.horner(ERF_SMALL, a2)}")
        s = self.op(f"fdiv float {c(1.0)}, {self.op(f'fadd float {a}, {c(1.0)}')}")
        tail = self.op(f"fmul float {self.exp_f32(self.op(f'fneg float {a2}'))}, {self.horner(ERFC_LARGE, s)}")
        large = self.op(f"fsub float {c(1.0)}, {tail}")
        r = self.op(f"select i1 {self.op(f'fcmp olt float {a}, {c(ERF_SPLIT)}')}, float {small}, float {large}")
        return self.call("llvm.copysign.f32", "float", [("float", r), ("float", x)])

    def divmod(self, op: Ops, dt: DType, a: str, b: str) -> str:
        """NumPy integer floor division / modulo: x // 0 == x % 0 == 0, and no trap on MIN // -1."""
        t = reg_type(dt)
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

    def shift(self, op: Ops, dt: DType, a: str, b: str) -> str:
        t = reg_type(dt)
        bits = dt.itemsize * 8
        out_of_range = self.op(f"icmp uge {t} {b}, {bits}")
        safe = self.op(f"select i1 {out_of_range}, {t} 0, {t} {b}")
        if op is Ops.SHL:
            return self.op(f"select i1 {out_of_range}, {t} 0, {t} {self.op(f'shl {t} {a}, {safe}')}")
        if dt.kind == "i":
            fill = self.op(f"ashr {t} {a}, {bits - 1}")
            return self.op(f"select i1 {out_of_range}, {t} {fill}, {t} {self.op(f'ashr {t} {a}, {safe}')}")
        return self.op(f"select i1 {out_of_range}, {t} 0, {t} {self.op(f'lshr {t} {a}, {safe}')}")

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

    def cast(self, v: str, src: DType, dst: DType) -> str:
        st, dt_ = reg_type(src), reg_type(dst)
        if dst == dtypes.bool:
            return self.op(f"fcmp une {st} {v}, 0.0" if src.is_float else f"icmp ne {st} {v}, 0")
        if src == dtypes.bool:
            return self.op(f"uitofp i1 {v} to {dt_}" if dst.is_float else f"zext i1 {v} to {dt_}")
        if src.is_float and dst.is_float:
            if st == dt_:
                return self.round_half(v) if dst == dtypes.float16 else v
            out = self.op(f"{'fpext' if dt_ == 'double' else 'fptrunc'} {st} {v} to {dt_}")
            return self.round_half(out) if dst == dtypes.float16 else out
        if src.is_float:
            name = f"llvm.fpto{'s' if dst.kind == 'i' else 'u'}i.sat.{dt_}.{'f32' if st == 'float' else 'f64'}"
            return self.call(name, dt_, [(st, v)])
        if dst.is_float:
            out = self.op(f"{'sitofp' if src.kind == 'i' else 'uitofp'} {st} {v} to {dt_}")
            return self.round_half(out) if dst == dtypes.float16 else out
        if src.itemsize == dst.itemsize:
            return v
        if src.itemsize > dst.itemsize:
            return self.op(f"trunc {st} {v} to {dt_}")
        return self.op(f"{'sext' if src.kind == 'i' else 'zext'} {st} {v} to {dt_}")

    # ---- memory ----
    def address(self, buf: UOp, index: str) -> str:
        return self.op(f"getelementptr inbounds {mem_type(buf.dtype)}, ptr %buf{buf.arg}, i64 {index}", "p")

    def load(self, u: UOp) -> str:
        buf, idx = u.src[0], self.value(u.src[1])
        gate = self.value(u.src[2]) if len(u.src) > 2 else None
        rt = reg_type(u.dtype)
        if gate is not None:  # branch around the load: a gated-off load reads nothing (its buffer may be empty)
            slot, label = self.tmp("gl"), self.tmp("G")[1:]
            self.allocas.append(f"  {slot} = alloca {rt}")
            self.emit(f"store {rt} {const_literal(0, u.dtype)}, ptr {slot}")
            self.emit(f"br i1 {gate}, label %{label}.load, label %{label}.done")
            self.lines.append(f"{label}.load:")
        mt = mem_type(u.dtype)
        raw = self.op(f"load {mt}, ptr {self.address(buf, idx)}")
        if u.dtype == dtypes.bool:
            raw = self.op(f"icmp ne i8 {raw}, 0")
        elif u.dtype == dtypes.float16:
            raw = self.op(f"fpext half {raw} to float")
        if gate is not None:
            self.emit(f"store {rt} {raw}, ptr {slot}")
            self.emit(f"br label %{label}.done")
            self.lines.append(f"{label}.done:")
            raw = self.op(f"load {rt}, ptr {slot}")
        return raw

    def store(self, u: UOp):
        """A store, branched around when gated; with an op (a scatter's combine) it reads the element first."""
        buf, idx, val = u.src[:3]
        i, v = self.value(idx), self.value(val)
        if len(u.src) > 3:
            label = self.tmp("S")[1:]
            self.emit(f"br i1 {self.value(u.src[3])}, label %{label}.store, label %{label}.done")
            self.lines.append(f"{label}.store:")
        ptr, mt = self.address(buf, i), mem_type(val.dtype)
        if u.arg is not None:
            old = self.op(f"load {mt}, ptr {ptr}")
            old = self.op(f"icmp ne i8 {old}, 0") if val.dtype == dtypes.bool else \
                self.op(f"fpext half {old} to float") if val.dtype == dtypes.float16 else old
            v = self.alu(u.arg, val.dtype, val.dtype, [old, v])
            if val.dtype == dtypes.float16:
                v = self.round_half(v)
        if val.dtype == dtypes.bool:
            v = self.op(f"zext i1 {v} to i8")
        elif val.dtype == dtypes.float16:
            v = self.op(f"fptrunc float {v} to half")
        self.emit(f"store {mt} {v}, ptr {ptr}")
        if len(u.src) > 3:
            self.emit(f"br label %{label}.done")
            self.lines.append(f"{label}.done:")

    # ---- loops ----
    def open_loop(self, r: UOp | None, start: str, end: str) -> tuple:
        ptr = self.tmp("ctr")
        self.allocas.append(f"  {ptr} = alloca i64")
        self.emit(f"store i64 {start}, ptr {ptr}")
        label = self.tmp("L")[1:]
        self.emit(f"br label %{label}.cond")
        self.lines.append(f"{label}.cond:")
        cur = self.op(f"load i64, ptr {ptr}", "r")
        self.emit(f"br i1 {self.op(f'icmp slt i64 {cur}, {end}')}, label %{label}.body, label %{label}.exit")
        self.lines.append(f"{label}.body:")
        self.scopes.append({} if r is None else {r: cur})
        return ptr, label, cur

    def close_loop(self, loop: tuple):
        ptr, label, cur = loop
        self.scopes.pop()
        self.emit(f"store i64 {self.op(f'add i64 {cur}, 1')}, ptr {ptr}")
        self.emit(f"br label %{label}.cond")
        self.lines.append(f"{label}.exit:")

    def reduce(self, u: UOp) -> str:
        """`u` and every not yet rendered reduction over the same ranges (an upcast block) whose loops are
        open here, in one loop nest.

        A lone float sum is reassociated so LLVM vectorises its loop; a block's sums are not (its
        accumulators vectorise across the block instead) and fuse their multiply-adds.
        """
        here = set(self.open_ranges)
        group = [u] + [r for r in self.reduce_groups[(u.arg, u.dtype, u.src[1:])]
                       if r is not u and self.reduce_loops[r] <= here and not any(r in scope for scope in self.scopes)]
        t, block = reg_type(u.dtype), len(group) > 1
        accs = [self.tmp("acc") for _ in group]
        for acc in accs:
            self.allocas.append(f"  {acc} = alloca {t}")
            self.emit(f"store {t} {const_literal(_identity(u.arg, u.dtype), u.dtype)}, ptr {acc}")
        loops = [self.open_loop(r, "0", self.value(r.src[0])) for r in u.src[1:]]
        for r, acc in zip(group, accs):
            x = r.src[0]
            if block and u.arg is Ops.ADD and u.dtype.is_float and x.op is Ops.MUL:
                v = self.op(f"fmul contract {t} {self.value(x.src[0])}, {self.value(x.src[1])}")
            else:
                v = self.value(x)
            cur = self.op(f"load {t}, ptr {acc}")
            if u.arg is Ops.ADD and u.dtype.is_float:
                new = self.op(f"fadd {'contract' if block else 'reassoc'} {t} {cur}, {v}")
            else:
                new = self.alu(u.arg, u.dtype, u.dtype, [cur, v])
            self.emit(f"store {t} {new}, ptr {acc}")
        for loop in reversed(loops):
            self.close_loop(loop)
        outs = []
        for acc in accs:
            out = self.op(f"load {t}, ptr {acc}")
            outs.append(self.round_half(out) if u.dtype == dtypes.float16 else out)
        for r, out in zip(group[1:], outs[1:]):
            self.scopes[-1][r] = out
        return outs[0]

    # ---- the function ----
    def open_range(self, r: UOp) -> tuple:
        self.open_ranges.append(r)
        if r is not self.prange:
            return self.open_loop(r, "0", self.value(r.src[0]))
        self.emit(f"%end.clamped = call i64 @llvm.smin.i64(i64 %end, i64 {self.value(r.src[0])})")
        self.decls.add("declare i64 @llvm.smin.i64(i64, i64)")
        return self.open_loop(r, "%start", "%end.clamped")

    def hoist_reductions(self):
        """Render every reduction whose ranges are all open now, operands first, so that one broadcast along
        the loops still to open (a row's sum read by each of its elements) is computed once per row."""
        here = set(self.open_ranges)
        for u, free in self.reduce_free.items():
            if free <= here and not any(u in scope for scope in self.scopes) and \
                    self.waits.get(u, 0) <= self.stores_done:
                self.value(u)

    def kernel(self) -> str:
        """The stores in order, each inside the loops of the ranges it depends on: consecutive stores share
        the loops their ranges have in common (outermost first), so stores over other ranges (a peeled tail)
        get loop nests of their own inside the shared ones. Every store is inside the parallel range."""
        loops = []
        if self.prange is None:  # a single element: run once, in the call whose slice holds index 0
            self.emit("%end.one = call i64 @llvm.smin.i64(i64 %end, i64 1)")
            self.decls.add("declare i64 @llvm.smin.i64(i64, i64)")
            loops.append(self.open_loop(None, "%start", "%end.one"))
        base = len(loops)
        for store in self.ast.src:
            need = _loop_ranges(store)
            if self.prange is not None and (not need or need[0] is not self.prange):
                raise RuntimeError(f"a store of {self.ast.arg} is outside the parallel range")
            keep = 0
            while keep < min(len(need), len(self.open_ranges)) and need[keep] is self.open_ranges[keep]:
                keep += 1
            while len(self.open_ranges) > keep:
                self.open_ranges.pop()
                self.close_loop(loops.pop())
            if self.open_ranges:  # reductions that waited for the stores before this one
                self.hoist_reductions()
            for r in need[keep:]:
                loops.append(self.open_range(r))
                self.hoist_reductions()
            self.store(store)
            self.stores_done += 1
        while len(loops) > base:
            self.close_loop(loops.pop())
        if base:
            self.close_loop(loops.pop())
        n_bufs = 1 + max((u.arg for u in self.ast.toposort() if u.op is Ops.DEFINE_GLOBAL), default=0)
        name = self.ast.arg
        params = [f"ptr noalias %buf{i}" for i in range(n_bufs)] + [f"i64 %var_{v}" for v in self.vars]
        body = [f"define internal void @{name}_body({', '.join(params + ['i64 %start', 'i64 %end'])}) "
                f"alwaysinline {self.attributes} {{", "entry:", *self.allocas, *self.lines, "  ret void", "}"]
        wrap = [f"define void @{name}(ptr %bufs, ptr %vals, i64 %start, i64 %end) {self.attributes} {{", "entry:"]
        args = []
        for i in range(n_bufs):
            wrap.append(f"  %bp{i} = getelementptr ptr, ptr %bufs, i64 {i}")
            wrap.append(f"  %b{i} = load ptr, ptr %bp{i}")
            args.append(f"ptr %b{i}")
        for j, v in enumerate(self.vars):
            wrap.append(f"  %vp{j} = getelementptr i64, ptr %vals, i64 {j}")
            wrap.append(f"  %v{j} = load i64, ptr %vp{j}")
            args.append(f"i64 %v{j}")
        wrap += [f"  call void @{name}_body({', '.join(args + ['i64 %start', 'i64 %end'])})", "  ret void", "}"]
        return "\n".join(sorted(self.decls) + [""] + body + [""] + wrap) + "\n"


def render_llvm(ast: UOp, target: CPUTarget | None = None) -> KernelSource:
    """The LLVM IR of a kernel, for `target` (by default this host's CPU)."""
    r = _Renderer(ast, target or host_target())
    source = r.kernel()
    size = (r.prange.src[0],) if r.prange is not None else (UOp.const(1),)
    return KernelSource(ast.arg, source, "llvm", tuple(r.vars), size)
