"""The C-style renderer family: a kernel AST -> one GPU kernel function in a C dialect (OpenCL C, CUDA C).

The kernel's structure is decided here once for every dialect, so every change reaches every GPU
renderer; a `Dialect` (c_dialect.py; render_opencl.py, render_cuda.py) only spells things: type names, literal
suffixes, qualifiers, work-item ids, barriers, float16 storage, bit casts and math function names.
Parallelism: the loop ranges are flattened into one work-item index (the innermost range varies
fastest, so neighbouring work-items touch neighbouring memory); the launch size is the product of
the loop ends, an expression over the vars evaluated at replay.

The kernel's launch is decided before rendering, by the target's pass (gpu_launch.py), and read here from
the AST's LAUNCH node: row kernels (render_rows.py) give each row of a kernel whose reductions depend on only
some loop ranges a work-group (a projection of a var batch: a column a warp looping over the batch's rows,
render_batch_rows.py); contractions (render_tiles.py) are tiled through local memory. Elementwise
kernels on dialects with several items per work-item store runs of consecutive outputs (vector accesses).

ABI: `kernel void name(T0 *buf0, ..., int64 v_<var>, ...)`, vars in `var_names` order, then the tensor maps of a
tile of bulk copies (codegen/tensor_maps.py, in its order). float16 is
stored as 16-bit halves, bfloat16 as its bits in 16-bit unsigned ints (C has no bfloat16: the conversions are
integer code, rounding to nearest even with NaN kept quiet, bit-equal to ml_dtypes); both are computed in
float and rounded once per result; bool is
stored as one byte. Integer arithmetic wraps (computed in unsigned types), // and % floor like
NumPy (x // 0 == x % 0 == 0), float -> int casts saturate with NaN -> 0, max/min propagate NaN.
"""
from __future__ import annotations

import math
import re
from typing import Callable

from ..uop import DType, Ops, UOp, dtypes, sym_prod
from ..uop.ops import FMA_DTYPES
from ..uop.uop import as_uop
from . import c_helpers
from .attention_tiles import THREADS as ATTENTION_THREADS
from .attention_tiles import match_attention
from .c_dialect import Dialect
from .gpu_launch import launch_of
from .kernel import KernelSource, kernel_vars
from .render_attention import emit_attention
from .render_attention import launch_size as attention_size
from .render_batch_rows import emit_batch_rows
from .render_rows import emit_rows, reduce_together
from .render_softmax_rows import held_in_loop
from .row_plan import launch_size as row_launch_size
from .row_plan import loop_ranges, rows_of, run_length
from .render_fragments import emit_fragment_contraction
from .render_tiles import emit_contraction, match_contraction
from .render_tiles import launch_size as contraction_size
from .renderer import KernelRenderer, rounds_through_odd_float

_MATH = {Ops.EXP: "exp", Ops.EXP2: "exp2", Ops.LOG: "log", Ops.LOG2: "log2", Ops.SQRT: "sqrt", Ops.SIN: "sin",
         Ops.COS: "cos", Ops.TANH: "tanh", Ops.ERF: "erf", Ops.FLOOR: "floor", Ops.CEIL: "ceil",
         Ops.RINT: "rint", Ops.ABS: "fabs"}
_PLAIN_INT = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "/", Ops.MOD: "%"}
_INFIX = {Ops.CMPLT: "<", Ops.CMPEQ: "==", Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}
# ops NumPy has only for integers / only for floats (the front end casts before them): others are refused
INTEGER_ONLY = frozenset({Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.NOT, Ops.IDIV})
FLOAT_ONLY = frozenset(set(_MATH) - {Ops.ABS} | {Ops.POW, Ops.ATAN2, Ops.FMA, Ops.FDIV})

_UNSIGNED = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}  # a bitcast's bits, by size


def _wide_unsigned(dt: DType) -> DType:
    """The unsigned type integer arithmetic wraps in (no signed overflow, no promotion to int)."""
    return dtypes.uint64 if dt.itemsize == 8 else dtypes.uint32


def _identity(op: Ops, dt: DType):
    if op is Ops.ADD or op is Ops.OR:
        return 0
    if op is Ops.MUL or op is Ops.AND:
        return 1
    return dt.min() if op is Ops.MAX else dt.max()


def _factors(x: UOp) -> tuple[UOp, UOp] | None:
    """The two factors of a product `x` (a MUL, or x ** 2, which is rendered as x * x), else None."""
    if x.op is Ops.MUL:
        return x.src[0], x.src[1]
    if x.op is Ops.POW and x.src[1].op is Ops.CONST and x.src[1].arg == 2:
        return x.src[0], x.src[0]
    return None


def _c_name(name: str) -> str:
    return "v_" + re.sub(r"\W", "_", name)


def _range_name(r: UOp) -> str:
    return f"r{r.arg[0]}" if r.arg[1] == "loop" else f"rr{r.arg[0]}"


class CStyleRenderer(KernelRenderer):
    def __init__(self, ast: UOp, dialect: Dialect):
        kind, *decided = launch_of(ast)
        super().__init__(ast)
        self.d = dialect
        self.lines: list[str] = []
        self.locals: list[str] = []
        self.helpers: dict[str, str] = {}
        self.index_memo: dict[UOp, bool] = {}
        self.depth = 1
        self.n = 0
        self.vars = [v.arg[0] for v in kernel_vars(ast)]
        self.contraction = match_contraction(ast, tuple(decided)) if kind == "tile" else None
        self.rows = rows_of(ast, *decided, batched=kind == "batch") if kind in ("rows", "batch") else None
        self.attention = match_attention(ast, *decided[:2]) if kind == "attention" else None
        self.items = decided[0] if kind == "items" else 1   # outputs per work-item of an elementwise launch
        self.row_elements: list[dict] = []   # a shared row's element scopes (render_rows.emit_rows)
        self.row_operands: dict = {}   # a row reduction -> [(its operand, the local array holding it)] (render_rows)
        self.long = dialect.ctype(dtypes.int64)
        self.aligned = False   # whether the kernel tells the compiler its buffers are ALIGN-byte aligned
        self.resident_groups = 1   # work-groups a multiprocessor should hold at once (render_fragments sets it)
        self.tensor_map_params: list[str] = []   # tensor maps the kernel takes after its vars (tensor_maps.py)
        self.loads_in_flight = False   # registers for many loads in flight, not for resident groups: a bound of one
        # resident group (render_rows sets it; else ptxas keeps ~32 registers and issues each load at its use)
        # names whose values are final where they are read: `let`s (each assigned once, where it is declared) and a
        # tile's accumulators once its results are stored (fragment_results.py)
        self.lets: set[str] = set()
        self.rounded_from: dict[str, str] = {}   # a 16-bit float value's name -> the final name it was rounded from

    def emit(self, line: str):
        self.lines.append("  " * self.depth + line)

    def let(self, dt: DType, expr: str, prefix="t") -> str:
        self.n += 1
        name = f"{prefix}{self.n}"
        self.emit(f"{self.d.ctype(dt)} {name} = {expr};")
        self.lets.add(name)
        return name

    def helper(self, name: str, text: str) -> str:
        self.helpers.setdefault(name, self.d.func + text)
        return name

    # ---- values (the shared parts are in KernelRenderer) ----
    def literal(self, value, dt: DType) -> str:
        return self.d.literal(value, dt)

    var_name = staticmethod(_c_name)

    exact_nan = True   # whether a rounding to bfloat16 gives ml_dtypes' NaN (the quiet NaN of its sign); off where no
    # rounded value's NaN bits can reach a stored value (render_attention's passes and probabilities), which take
    # the dialect's shorter rounding where it has one (Dialect.round_bfloat16_any)

    def round_to(self, v: str, dt: DType) -> str:
        """A float `v` rounded to the 16-bit float `dt` (kept as a float)."""
        if dt == dtypes.float16:
            self.half_helpers()
            self.helpers.setdefault("pj_round_half", self.d.round_half_helper)
            out = self.let(dt, f"pj_round_half({v})")
        elif self.exact_nan or not self.d.round_bfloat16_any:
            out = self.let(dt, f"{self.bfloat16_helpers()}round_bfloat16({v})")
        else:
            self.bfloat16_helpers()
            out = self.let(dt, f"{self.helper('pj_round_bfloat16_any', self.d.round_bfloat16_any)}({v})")
        if v in self.lets:
            self.rounded_from[out] = v
        return out

    def sixteen_bits(self, dt: DType) -> Callable[[str], str] | None:
        """Where a `dt` buffer holds its values' bits in 16-bit unsigned ints (bfloat16; float16 where the dialect
        stores it so: CUDA's `unsigned short`, not OpenCL's `half`), the expression of a `dt` value's bits (its
        argument: the value, a float); else None. Two neighbours' bits can be stored as one 32-bit word
        (fragment_results.py). A value rounded from a final name (`lets`) is converted from that float (the same
        bits, a NaN's too: converting an exact 16-bit float gives its own bits, so converting the rounded value only
        adds a second conversion and the widening between, ~8 instructions an element on an H100, which ptxas
        keeps)."""
        if dt not in (dtypes.bfloat16, dtypes.float16) or self.d.mem_type(dt) != self.d.ctype(dtypes.uint16):
            return None
        view = self.bit_view(dt, 0)   # (defines the conversions)
        return lambda v: view.format(v=self.rounded_from.get(v, v))

    def bfloat16_helpers(self, odd: bool = False) -> str:
        """Define the bfloat16 conversions (and with `odd`, pj_odd_float); their name prefix."""
        u16, u32 = self.d.types[dtypes.uint16], self.d.types[dtypes.uint32]
        self.helpers.setdefault("pj_bfloat16", c_helpers.BFLOAT16.format(
            func=self.d.func, u16=u16, u32=u32, bits_float=self.d.bits_float.format(v=f"({u32})b << 16"),
            float_bits=self.d.float_bits.format(v="x")))
        if odd:
            self.helpers.setdefault("pj_odd_float", c_helpers.ODD_FLOAT.format(
                func=self.d.func, u32=u32, float_bits=self.d.float_bits.format(v="x"),
                odd_float=self.d.bits_float.format(v="u")))
        return "pj_"

    def alu_node(self, u: UOp, srcs: list[str]) -> str:
        if u.dtype.is_int and u.op in _PLAIN_INT and self.is_exact(u):  # index math: C's operators are NumPy's here
            return self.let(u.dtype, f"{srcs[0]} {_PLAIN_INT[u.op]} {srcs[1]}")
        if u.op is Ops.POW and u.src[1].op is Ops.CONST and u.src[1].arg == 2:   # x ** 2 is x * x in NumPy too
            return self.let(u.dtype, f"{srcs[0]} * {srcs[0]}")
        return super().alu_node(u, srcs)

    def is_exact(self, u: UOp) -> bool:
        """Index math (no loaded data: bounds stay small) that cannot overflow, and for // and %,
        a non-negative dividend and a positive divisor."""
        if not self.is_index(u):
            return False
        if u.op in (Ops.IDIV, Ops.MOD):
            return u.src[0].vmin >= 0 and u.src[1].vmin > 0
        return u.dtype.min() <= u.vmin and u.vmax <= u.dtype.max() and u.dtype.itemsize >= 4

    def is_index(self, u: UOp) -> bool:
        if u not in self.index_memo:
            self.index_memo[u] = u.op in (Ops.RANGE, Ops.DEFINE_VAR, Ops.CONST) or \
                (u.op in _PLAIN_INT and all(self.is_index(x) for x in u.src))
        return self.index_memo[u]

    def alu(self, op: Ops, dt: DType, sdt: DType, s: list[str]) -> str:
        t, fl = self.d.ctype(dt), sdt.is_float
        if op in (INTEGER_ONLY if fl else FLOAT_ONLY):
            raise NotImplementedError(f"{self.d.language} renderer: {op} on {sdt} (NumPy has it only for "
                                      f"{'integers' if fl else 'floats'})")
        if op is Ops.WHERE:
            return self.let(dt, f"{s[0]} ? {s[1]} : {s[2]}")
        if op in (Ops.ADD, Ops.SUB, Ops.MUL):
            sym = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*"}[op]
            if fl or dt == dtypes.bool:
                return self.let(dt, f"{s[0]} {sym} {s[1]}")
            u = self.d.ctype(_wide_unsigned(dt))
            return self.let(dt, f"({t})(({u}){s[0]} {sym} ({u}){s[1]})")
        if op is Ops.FDIV:
            return self.let(dt, f"{s[0]} / {s[1]}")
        if op in (Ops.IDIV, Ops.MOD):
            return self.let(dt, f"{self.divmod_helper(op, sdt)}({s[0]}, {s[1]})")
        if op in (Ops.MAX, Ops.MIN):
            if sdt == dtypes.bool:
                return self.let(dt, f"{s[0]} {'||' if op is Ops.MAX else '&&'} {s[1]}")
            name = op.name.lower()
            if fl:  # NaN-propagating, like np.maximum / np.minimum
                fn = self.helper(f"pj_{name}_{sdt.name}", c_helpers.FMAX.format(t=t, name=name, n=sdt.name,
                                                                       fn=self.d.math(f"f{name}", sdt)))
                return self.let(dt, f"{fn}({s[0]}, {s[1]})")
            return self.let(dt, f"{s[0]} {'>' if op is Ops.MAX else '<'} {s[1]} ? {s[0]} : {s[1]}")
        if op is Ops.FMA and sdt not in FMA_DTYPES:  # a 16-bit float's float fma, rounded again, rounds twice
            raise NotImplementedError(f"{self.d.language} renderer: FMA on {sdt}")
        if op in (Ops.POW, Ops.ATAN2, Ops.FMA):  # C's fma: rounded once (OpenCL C and CUDA require it)
            return self.let(dt, f"{self.d.math(op.name.lower(), sdt)}({', '.join(s)})")
        if op in _INFIX:
            return self.let(dt, f"{s[0]} {_INFIX[op]} {s[1]}")
        if op in (Ops.SHL, Ops.SHR):
            return self.shift(op, dt, s[0], s[1])
        if op is Ops.NEG:
            return self.let(dt, f"-{s[0]}" if fl else f"({t})(0 - ({self.d.ctype(_wide_unsigned(dt))}){s[0]})")
        if op is Ops.NOT:
            return self.let(dt, f"!{s[0]}" if dt == dtypes.bool else f"({t})~{s[0]}")
        if op is Ops.ABS and not fl:  # abs(MIN) wraps to MIN, like NumPy
            if sdt.kind != "i":
                return s[0]
            u = self.d.ctype(_wide_unsigned(dt))
            return self.let(dt, f"{s[0]} < 0 ? ({t})(0 - ({u}){s[0]}) : {s[0]}")
        if op is Ops.SIGN:
            return self.sign(dt, s[0])
        if op in _MATH:
            return self.let(dt, f"{self.d.math(_MATH[op], sdt)}({s[0]})")
        raise NotImplementedError(f"{self.d.language} renderer: {op} on {dt}")

    def divmod_helper(self, op: Ops, dt: DType) -> str:
        """NumPy floor division / modulo: x // 0 == x % 0 == 0, no trap on MIN // -1; float mod takes b's sign."""
        t, name = self.d.ctype(dt), "idiv" if op is Ops.IDIV else "mod"
        if dt.is_float:
            text = c_helpers.FMOD.format(t=t, n=dt.name, fn=self.d.math("fmod", dt))
        elif dt.kind == "i":
            text = (c_helpers.IDIV_SIGNED if op is Ops.IDIV else c_helpers.MOD_SIGNED).format(
                t=t, n=dt.name, u=self.d.ctype(_wide_unsigned(dt)))
        else:
            text = c_helpers.DIVMOD_UNSIGNED.format(t=t, n=dt.name, name=name, sym="/" if op is Ops.IDIV else "%")
        return self.helper(f"pj_{name}_{dt.name}", text)

    def shift(self, op: Ops, dt: DType, a: str, b: str) -> str:
        t, bits = self.d.ctype(dt), dt.itemsize * 8
        out_of_range = f"({self.d.ctype(_wide_unsigned(dt))}){b} >= {bits}"  # negative amounts count as huge
        if op is Ops.SHL:
            return self.let(dt, f"{out_of_range} ? ({t})0 : ({t})({a} << {b})")
        fill = f"({t})({a} >> {bits - 1})" if dt.kind == "i" else f"({t})0"
        return self.let(dt, f"{out_of_range} ? {fill} : ({t})({a} >> {b})")

    def sign(self, dt: DType, x: str) -> str:
        t = self.d.ctype(dt)
        if dt == dtypes.bool:
            return x
        if dt.is_float:
            return self.let(dt, f"{x} != {x} ? {x} : ({t})({x} > 0) - ({t})({x} < 0)")
        if dt.kind == "u":
            return self.let(dt, f"({t})({x} > 0)")
        return self.let(dt, f"({t})(({x} > 0) - ({x} < 0))")

    def cast(self, v: str, src: DType, dst: DType) -> str:
        t = self.d.ctype(dst)
        if dst == dtypes.bool:
            return self.let(dst, f"{v} != 0")
        if src.is_float and not dst.is_float:  # saturating, NaN -> 0 (like llvm.fpto*i.sat)
            return self.let(dst, f"{self.saturate_helper(src, dst)}({v})")
        if rounds_through_odd_float(src, dst):
            wide = f"{self.sticky_double_helper(src)}({v})" if src.is_int and src.itemsize == 8 else f"(double){v}"
            return self.round_to(self.let(dst, f"{self.bfloat16_helpers(odd=True)}odd_float({wide})"), dst)
        if src.is_float and dst.is_float and self.d.ctype(src) == t:
            return self.round_to(v, dst) if dst.narrow else v
        if src.itemsize == dst.itemsize and src.is_int and dst.is_int and src.kind == dst.kind:
            return v
        out = self.let(dst, f"({t}){v}")
        return self.round_to(out, dst) if dst.narrow else out

    def bitcast(self, v: str, src: DType, dst: DType) -> str:
        """The bits of `v` read as `dst` (of `src`'s size): a float goes through its unsigned bits."""
        unsigned = _UNSIGNED[src.itemsize]
        if src.is_float:
            v = self.let(unsigned, self.bit_view(src, 0).format(v=v))
        if dst.is_float:
            return self.let(dst, self.bit_view(dst, 1).format(v=f"({self.d.ctype(unsigned)}){v}"))
        return self.let(dst, f"({self.d.ctype(dst)}){v}")

    def bit_view(self, dt: DType, way: int) -> str:
        """The format ({v}) of a `dt` value's unsigned bits (way 0) or of unsigned bits as a `dt` (way 1)."""
        if dt == dtypes.float32:
            return (self.d.float_bits, self.d.bits_float)[way]
        if dt == dtypes.bfloat16:
            return self.bfloat16_helpers() + ("float_to_bfloat16({v})", "bfloat16_to_float({v})")[way]
        if dt == dtypes.float16:
            self.half_helpers()
        return self.d.bit_views[dt][way]

    def half_helpers(self) -> None:
        """Define the dialect's float16 conversions, if they are helpers (loads, bit views and roundings call them)."""
        if self.d.bit_view_helper:
            self.helpers.setdefault("pj_half_bits", self.d.bit_view_helper)

    def sticky_double_helper(self, src: DType) -> str:
        """64-bit integer -> a double that pj_odd_float rounds as it would round the integer (llvm_ir.py's
        sticky_double)."""
        u = self.d.ctype(dtypes.uint64)
        text = c_helpers.STICKY_DOUBLE.format(n=src.name, t=self.d.ctype(src), u=u, us=self.d.ulong_suffix,
                                     negative="v < 0" if src.kind == "i" else "0")
        return self.helper(f"pj_sticky_double_{src.name}", text)

    def saturate_helper(self, src: DType, dst: DType) -> str:
        """float -> integer, truncating, clamped to the integer's range (the float bounds round outward)."""
        f = dtypes.float64 if src == dtypes.float64 else dtypes.float32
        lo, hi = float(f.np.type(dst.min())), float(f.np.type(dst.max()))
        text = c_helpers.SATURATE.format(t=self.d.ctype(dst), n=dst.name, fn=f.name, f=self.d.ctype(f),
                                lo=self.d.literal(lo, f), hi=self.d.literal(hi, f),
                                tmin=self.d.literal(dst.min(), dst), tmax=self.d.literal(dst.max(), dst))
        return self.helper(f"pj_sat_{dst.name}_{f.name}", text)

    # ---- memory ----
    def load(self, u: UOp) -> str:
        buf, idx = u.src[0], self.value(u.src[1])
        gate = self.value(u.src[2]) if len(u.src) > 2 else None
        if gate is not None:  # a gated-off load reads element 0 and yields 0
            idx = self.let(dtypes.int64, f"{gate} ? {idx} : 0")
        ptr = self.pointer(buf)
        if u.dtype == dtypes.float16:
            self.half_helpers()
            raw = self.d.load_half.format(ptr=ptr, idx=idx)
        elif u.dtype == dtypes.bfloat16:
            raw = f"{self.bfloat16_helpers()}bfloat16_to_float({ptr}[{idx}])"
        elif u.dtype == dtypes.bool:
            raw = f"{ptr}[{idx}] != 0"
        else:
            raw = f"{ptr}[{idx}]"
        if gate is not None:
            raw = f"{gate} ? {raw} : {self.d.literal(0, u.dtype)}"
        return self.let(u.dtype, raw, "ld")

    def pointer(self, buf: UOp) -> str:
        """A buffer's pointer, or a select of buffers' (BUFFER_SELECT: buffer_select.py) as a select of theirs."""
        if buf.op is not Ops.BUFFER_SELECT:
            return f"buf{buf.arg}"
        return f"({self.value(buf.src[0])} ? {self.pointer(buf.src[1])} : {self.pointer(buf.src[2])})"

    def store_line(self, u: UOp, bits: str | None = None) -> str:
        """One statement; a scatter's store is gated (src[3]) and may combine (arg: an atomic read-modify-write).
        `bits`: a plain store's value already converted to its bits (a name of `sixteen_bits`' expression)."""
        buf, idx, val = u.src[:3]
        i, v = self.value(idx), self.value(val)
        if bits is not None:
            line = f"buf{buf.arg}[{i}] = {bits};"
        elif u.arg is Ops.ADD and val.dtype in self.d.atomic_add:
            pragma, add = self.d.atomic_add[val.dtype]
            if pragma:
                self.helpers.setdefault(pragma, pragma)
            line = add.format(ptr=f"buf{buf.arg} + {i}", val=v) + ";"
        elif u.arg is not None:
            line = f"{self.atomic_helper(u.arg, val.dtype)}(buf{buf.arg} + {i}, {v});"
        elif val.dtype == dtypes.float16:   # (converted from the float it was rounded from, as sixteen_bits says)
            line = self.d.store_half.format(v=self.rounded_from.get(v, v), idx=i, ptr=f"buf{buf.arg}") + ";"
        elif val.dtype == dtypes.bfloat16:
            line = f"buf{buf.arg}[{i}] = {self.sixteen_bits(val.dtype)(v)};"
        else:
            cast = f"({self.d.ctype(dtypes.uint8)})" if val.dtype == dtypes.bool else ""
            line = f"buf{buf.arg}[{i}] = {cast}{v};"
        return f"if ({self.value(u.src[3])}) {{ {line} }}" if len(u.src) > 3 else line

    def atomic_helper(self, op: Ops, dt: DType) -> str:
        """`void pj_atomic_<op>_<dtype>(T *p, T v)`: *p = op(*p, v) atomically, a compare-and-swap loop on the
        element's bits (so float add, mul, min and max work alike); 4- and 8-byte elements only."""
        if dt.itemsize not in self.d.atomic_cas or dt.narrow:
            raise NotImplementedError(f"{self.d.language} renderer: a combining scatter into {dt.name} (atomics "
                                      f"need 4- or 8-byte elements)")
        pragma, cas = self.d.atomic_cas[dt.itemsize]
        t, bits = self.d.ctype(dt), self.d.ctype(dtypes.uint32 if dt.itemsize == 4 else dtypes.uint64)
        if op in (Ops.MAX, Ops.MIN) and dt.is_float:
            n = op.name.lower()  # NaN-propagating, like np.maximum.at
            fn = self.helper(f"pj_{n}_{dt.name}",
                             c_helpers.FMAX.format(t=t, name=n, n=dt.name, fn=self.d.math(f"f{n}", dt)))
            combined = f"{fn}(old.v, v)"
        elif op in (Ops.MAX, Ops.MIN):
            combined = f"old.v {'>' if op is Ops.MAX else '<'} v ? old.v : v"
        else:
            sym = "+" if op is Ops.ADD else "*"
            combined = f"old.v {sym} v" if dt.is_float else f"({t})(({bits})old.v {sym} ({bits})v)"
        name = f"pj_atomic_{op.name.lower()}_{dt.name}"
        ptr = self.d.global_ptr.format(const="", type=t, name="p")
        text = (f"void {name}({ptr}, {t} v) {{\n  union {{ {t} v; {bits} u; }} old, next;\n  old.v = *p;\n"
                f"  for (;;) {{\n    next.v = {combined};\n"
                f"    {bits} seen = {cas.format(ptr='p', cmp='old.u', val='next.u')};\n"
                f"    if (seen == old.u) break;\n    old.u = seen;\n  }}\n}}")
        if pragma:
            self.helpers.setdefault(pragma, pragma)
        return self.helper(name, text)

    # ---- loops and reductions ----
    def open_block(self, header: str, bindings: dict):
        self.emit(header + " {")
        self.depth += 1
        self.scopes.append(bindings)

    def close_block(self):
        self.scopes.pop()
        self.depth -= 1
        self.emit("}")

    def combine(self, op: Ops, dt: DType, acc: str, v: str) -> str:
        return self.alu(op, dt, dt, [acc, v])

    def accumulate(self, u: UOp, acc: str) -> str:
        """One step of the reduction `u` into its accumulator `acc`, its operand rendered here. On a dialect with
        fused sums (CUDA) a float32 / float64 sum of products (the operand a product of two values, widened from 16
        bits or unpacked as they may be) is fma(a, b, acc): the product and its add rounded once, as the CPU's
        vector reductions (llvm_reductions.py: contracted) and the float32 tiles do; one issue slot a product
        instead of two. Elementwise `a * b + c` stays rounded apart, as NumPy rounds it (runtime/cuda.py's
        --fmad=false). A product the kernel holds under a name whose factors it does not (local memory,
        registers) is added as it is."""
        x, dt = u.src[0], u.dtype
        factors = _factors(x)
        if self.d.fused_sums and u.arg is Ops.ADD and dt in FMA_DTYPES and factors is not None and \
                (self._rendered(x) is None or all(self._rendered(f) is not None for f in factors)):
            a, b = (self.value(f) for f in factors)
            return self.let(dt, f"{self.d.math('fma', dt)}({a}, {b}, {acc})")
        return self.combine(u.arg, dt, acc, self.value(x))

    def reduce(self, u: UOp) -> str:
        dt, ranges = u.dtype, list(u.src[1:])
        self.n += 1
        acc = f"acc{self.n}"
        self.emit(f"{self.d.ctype(dt)} {acc} = {self.d.literal(_identity(u.arg, dt), dt)};")
        if self.rows is not None and u in self.rows.reduces:
            acc = reduce_together(self, u, acc)
        else:
            for r in ranges:
                name = _range_name(r)
                self.open_block(f"for ({self.long} {name} = 0; {name} < {self.value(r.src[0])}; {name}++)", {r: name})
            self.scopes[-1].update(held_in_loop(self, u))
            self.emit(f"{acc} = {self.accumulate(u, acc)};")
            for _ in ranges:
                self.close_block()
        return self.round_to(acc, dt) if dt.narrow else acc

    def run_length(self, ranges: list[UOp]) -> int:
        """How many consecutive flat indices a work-item takes at a time (the launch's items where a run stays
        inside the last range)."""
        return run_length(ranges, self.items)

    def consecutive(self, flat: str, ranges: list[UOp], per: int, body: Callable[[], None]):
        """Bind `ranges` to the flat indices flat, ..., flat + per - 1 (the last range's digit plus 0 ... per - 1: the
        caller makes sure the run stays inside the last range) and emit `body` once for each, in its own scope,
        unrolled: neighbouring accesses the compiler can merge into vector loads and stores."""
        names = self.unflatten(flat, ranges)
        self.scopes[-1].update(names)
        if per == 1:
            body()
            return
        self.aligned = True
        last = ranges[-1]
        for e in range(per):
            self.open_block("", {last: f"({names[last]} + {e})"})
            body()
            self.close_block()

    def unflatten(self, flat: str, ranges: list[UOp]) -> dict:
        """Bind each range to its digit of a flat index (the last range varies fastest). The divisions are
        32-bit when the flat index fits (64-bit integer division is many times slower on GPUs)."""
        bindings, rest = {}, flat
        narrow = f"({self.d.ctype(dtypes.uint32)})" if math.prod(r.src[0].vmax for r in ranges) < 2**32 else ""
        for k, r in enumerate(reversed(ranges)):
            name = _range_name(r)
            if k == len(ranges) - 1:
                self.emit(f"{self.long} {name} = {rest};")
            else:
                end = self.value(r.src[0])
                self.emit(f"{self.long} {name} = {narrow}{rest} % {narrow}{end};")
                self.emit(f"{self.long} q{name} = {narrow}{rest} / {narrow}{end};")
                rest = f"q{name}"
            bindings[r] = name
        return bindings

    # ---- the kernel ----
    def group_size(self) -> int | None:
        """The work-group size the kernel declares, or None when the runtime chooses one."""
        if self.contraction is not None:
            return self.contraction.threads
        if self.attention is not None:
            return ATTENTION_THREADS
        return self.rows.size if self.rows else self.d.elementwise_group if self.d.always_bounded else None

    def kernel(self) -> tuple[str, UOp]:
        store = self.ast.src[0]
        ranges = loop_ranges(self.ast)
        outputs = as_uop(sym_prod(r.src[0] for r in ranges))
        if self.contraction is not None:
            (emit_fragment_contraction if self.contraction.fragments else emit_contraction)(self, self.contraction)
            return self.kernel_text(contraction_size(self.contraction))
        if self.attention is not None:
            emit_attention(self, self.attention)
            return self.kernel_text(attention_size(self.attention))
        if self.rows is not None:
            (emit_rows if self.rows.batch is None else emit_batch_rows)(self, store)
            return self.kernel_text(row_launch_size(self.rows))
        if self.items > 1:
            self.strided_outputs(store, ranges, outputs)
            return self.kernel_text((outputs + (self.items - 1)) // self.items)
        self.emit(f"const {self.long} gid = {self.d.global_id};")
        self.emit(f"if (gid >= {self.value(outputs)}) return;")
        self.scopes[-1].update(self.unflatten("gid", ranges))
        self.emit(self.store_line(store))
        return self.kernel_text(outputs)

    def strided_outputs(self, store: UOp, ranges: list[UOp], outputs: UOp):
        """Each work-item stores `self.items` outputs: consecutive ones where a run never crosses the last
        range's end (one range, or a last range of a constant end they divide), unrolled without checks where
        the whole run is in range, so the compiler merges neighbouring loads and stores into vector accesses
        (every buffer starts an allocation: aligned, as the kernel declares); otherwise a work-group's width
        apart (a group covers a contiguous run: coalesced)."""
        per, width = self.items, self.d.local_size
        count = self.value(outputs)
        if len(ranges) == 1 or self.run_length(ranges) == per:
            self.emit(f"const {self.long} base = ({self.d.group_id} * {width} + {self.d.local_id}) * {per};")
            self.open_block(f"if (base + {per} <= {count})", {})
            self.consecutive("base", ranges, per, lambda: self.emit(self.store_line(store)))
            self.close_block()
            self.open_block("else", {})
            self.open_block(f"for ({self.long} gid = base; gid < {count}; gid++)", {})
            self.scopes[-1].update(self.unflatten("gid", ranges))
            self.emit(self.store_line(store))
            self.close_block()
            self.close_block()
            return
        self.emit(f"const {self.long} base = {self.d.group_id} * ({width} * {per}) + {self.d.local_id};")
        self.emit("#pragma unroll")
        self.open_block(f"for (int e = 0; e < {per}; e++)", {})
        self.emit(f"const {self.long} gid = base + ({self.long})e * {width};")
        self.open_block(f"if (gid < {count})", {})
        self.scopes[-1].update(self.unflatten("gid", ranges))
        self.emit(self.store_line(store))
        self.close_block()
        self.close_block()

    def kernel_text(self, size: UOp) -> tuple[str, UOp]:
        """The whole kernel around the body emitted so far, and its launch size (work-items)."""
        dtype_of = {u.arg: u.dtype for u in self.ast.toposort() if u.op is Ops.DEFINE_GLOBAL}
        params = [self.d.global_ptr.format(const="" if i == 0 else "const ", type=self.d.mem_type(dt), name=f"buf{i}")
                  for i, dt in sorted(dtype_of.items())]
        params += [f"{self.long} {_c_name(v)}" for v in self.vars]
        params += [self.d.tensor_map_param.format(name=name) for name in self.tensor_map_params]
        group = self.group_size()
        resident = f", {self.resident_groups}" if self.resident_groups > 1 or self.loads_in_flight else ""
        bounds = self.d.bounds.format(n=group, resident=resident) if group else ""
        head = self.d.kernel_head.format(bounds=bounds, name=self.ast.arg, params=", ".join(params))
        if self.aligned:
            self.locals += [self.d.assume_aligned.format(name=f"buf{i}", const="" if i == 0 else "const ",
                                                         type=self.d.mem_type(dt)) for i, dt in sorted(dtype_of.items())]
        text = "\n".join(self.d.preamble(self.ast) + list(self.helpers.values()) +
                         [head + " {", *("  " + decl for decl in self.locals), *self.d.kernel_entry.splitlines(),
                          *self.lines, "}"]) + "\n"
        return text, size


def render_c(ast: UOp, dialect: Dialect) -> KernelSource:
    """The launched kernel `ast` (gpu_launch.launch: its LAUNCH node says how) in `dialect`."""
    r = CStyleRenderer(ast, dialect)
    source, size = r.kernel()
    group = r.group_size()
    return KernelSource(ast.arg, source, dialect.language, tuple(r.vars), (size,), (group,) if group else ())
