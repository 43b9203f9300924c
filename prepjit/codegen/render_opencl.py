"""The OpenCL C renderer: a kernel AST -> one `__kernel` function for the opencl device.

It renders the same lowered kernels as the LLVM renderer, with the same NumPy semantics.
Parallelism: the loop ranges are flattened into one work-item index (the innermost range varies
fastest, so neighbouring work-items touch neighbouring memory); the launch size is the product of
the loop ends, an expression over the vars evaluated at replay. A kernel whose reduction may run
long (more than GROUP_REDUCE_MIN iterations at the vars' maxima) gives each output a work-group of
REDUCE_GROUP work-items that split the reduction and combine partials in local memory; it declares
that size with `reqd_work_group_size`, so the runtime reads it off the compiled kernel.

ABI: `__kernel void name(__global T0 *buf0, ..., long v_<var>, ...)`, vars in `var_names` order.
float16 is stored as `half` through the core `vload_half`/`vstore_half_rte` built-ins (no
cl_khr_fp16 needed), computed in float and rounded to half after every op, like NumPy; bool is
stored as one byte. float64 needs cl_khr_fp64, requested with a pragma the device checks.
"""
from __future__ import annotations

import math
import re

from ..uop import DType, Ops, UOp, dtypes, sym_prod
from ..uop.uop import as_uop
from .kernel import KernelSource, kernel_vars
from .renderer import KernelRenderer

REDUCE_GROUP = 128        # work-items per output in a grouped reduction (a power of two)
GROUP_REDUCE_MIN = 256    # reductions of more iterations than this use a work-group per output

_CTYPE = {dtypes.bool: "bool", dtypes.int8: "char", dtypes.int16: "short", dtypes.int32: "int",
          dtypes.int64: "long", dtypes.uint8: "uchar", dtypes.uint16: "ushort", dtypes.uint32: "uint",
          dtypes.uint64: "ulong", dtypes.float16: "float", dtypes.float32: "float", dtypes.float64: "double"}
_MATH = {Ops.EXP: "exp", Ops.EXP2: "exp2", Ops.LOG: "log", Ops.LOG2: "log2", Ops.SQRT: "sqrt", Ops.SIN: "sin",
         Ops.COS: "cos", Ops.TANH: "tanh", Ops.ERF: "erf", Ops.FLOOR: "floor", Ops.CEIL: "ceil",
         Ops.RINT: "rint", Ops.ABS: "fabs"}
_PLAIN_INT = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "/", Ops.MOD: "%"}
_INFIX = {Ops.CMPLT: "<", Ops.CMPEQ: "==", Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}

_ROUND_HALF = """float pj_round_half(float x) {
  ushort h;
  vstore_half_rte(x, 0, (__private half *)&h);
  return vload_half(0, (__private const half *)&h);
}"""
_FMAX = "{t} pj_{name}_{t}({t} a, {t} b) {{ return (isnan(a) || isnan(b)) ? a + b : f{name}(a, b); }}"
_IDIV_SIGNED = """{t} pj_idiv_{t}({t} a, {t} b) {{
  if (b == 0) return 0;
  if (b == -1) return ({t})(0 - ({u})a);
  {t} q = a / b, r = a % b;
  return (r != 0 && ((r ^ b) < 0)) ? q - 1 : q;
}}"""
_MOD_SIGNED = """{t} pj_mod_{t}({t} a, {t} b) {{
  if (b == 0 || b == -1) return 0;
  {t} r = a % b;
  return (r != 0 && ((r ^ b) < 0)) ? r + b : r;
}}"""
_DIVMOD_UNSIGNED = "{t} pj_{name}_{t}({t} a, {t} b) {{ return b == 0 ? 0 : a {sym} b; }}"
_FMOD = """{t} pj_mod_{t}({t} a, {t} b) {{
  {t} r = fmod(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}"""


def ctype(dt: DType) -> str:
    """The OpenCL C type a value of `dt` has in registers (float16 computes in float)."""
    return _CTYPE[dt]


def mem_type(dt: DType) -> str:
    """The OpenCL C element type of a `dt` buffer."""
    return "half" if dt == dtypes.float16 else "uchar" if dt == dtypes.bool else ctype(dt)


def _wide_unsigned(dt: DType) -> str:
    """The unsigned type integer arithmetic wraps in (no signed overflow, no promotion to int)."""
    return "ulong" if dt.itemsize == 8 else "uint"


def const_literal(value, dt: DType) -> str:
    if dt == dtypes.bool:
        return "true" if value else "false"
    if dt.is_float:
        value = float(dt.np.type(value)) if dt != dtypes.float64 else float(value)
        suffix = "" if dt == dtypes.float64 else "f"
        if math.isnan(value):
            return f"(({ctype(dt)})NAN)"
        if math.isinf(value):
            return f"(({ctype(dt)}){'-' if value < 0 else ''}INFINITY)"
        return f"{value.hex()}{suffix}"
    value = int(value)
    if dt == dtypes.int64:
        return "(-9223372036854775807L - 1)" if value == -2**63 else f"{value}L"
    if dt == dtypes.int32 and value > -2**31:
        return str(value)
    return f"(({ctype(dt)}){value}{'UL' if dt.is_unsigned else 'L'})"


def _identity(op: Ops, dt: DType):
    if op is Ops.ADD or op is Ops.OR:
        return 0
    if op is Ops.MUL or op is Ops.AND:
        return 1
    return dt.min() if op is Ops.MAX else dt.max()


def _c_name(name: str) -> str:
    return "v_" + re.sub(r"\W", "_", name)


def _loop_ranges(ast: UOp) -> list[UOp]:
    return sorted({u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"}, key=lambda r: r.arg[0])


def _range_name(r: UOp) -> str:
    return f"r{r.arg[0]}" if r.arg[1] == "loop" else f"rr{r.arg[0]}"


def uses_grouped_reduce(ast: UOp) -> bool:
    """Whether a reduction of this kernel may run long enough to split it over a work-group."""
    return any(math.prod(r.src[0].vmax for r in u.src[1:]) > GROUP_REDUCE_MIN
               for u in ast.toposort() if u.op is Ops.REDUCE)


class _Renderer(KernelRenderer):
    def __init__(self, ast: UOp):
        super().__init__(ast)
        self.lines: list[str] = []
        self.locals: list[str] = []
        self.helpers: dict[str, str] = {}
        self.index_memo: dict[UOp, bool] = {}
        self.depth = 1
        self.n = 0
        self.vars = [v.arg[0] for v in kernel_vars(ast)]
        self.grouped = uses_grouped_reduce(ast)

    def emit(self, line: str):
        self.lines.append("  " * self.depth + line)

    def let(self, dt: DType, expr: str, prefix="t") -> str:
        self.n += 1
        name = f"{prefix}{self.n}"
        self.emit(f"{ctype(dt)} {name} = {expr};")
        return name

    def helper(self, name: str, text: str) -> str:
        self.helpers.setdefault(name, text)
        return name

    # ---- values (the shared parts are in KernelRenderer) ----
    literal = staticmethod(const_literal)
    var_name = staticmethod(_c_name)

    def round_half(self, v: str) -> str:
        return self.let(dtypes.float16, f"{self.helper('pj_round_half', _ROUND_HALF)}({v})")

    def alu_node(self, u: UOp, srcs: list[str]) -> str:
        if u.dtype.is_int and u.op in _PLAIN_INT and self.is_exact(u):  # index math: C's operators are NumPy's here
            return self.let(u.dtype, f"{srcs[0]} {_PLAIN_INT[u.op]} {srcs[1]}")
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
        t, fl = ctype(dt), sdt.is_float
        if op is Ops.WHERE:
            return self.let(dt, f"{s[0]} ? {s[1]} : {s[2]}")
        if op in (Ops.ADD, Ops.SUB, Ops.MUL):
            sym = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*"}[op]
            if fl or dt == dtypes.bool:
                return self.let(dt, f"{s[0]} {sym} {s[1]}")
            u = _wide_unsigned(dt)
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
                fn = self.helper(f"pj_{name}_{t}", _FMAX.format(t=t, name=name))
                return self.let(dt, f"{fn}({s[0]}, {s[1]})")
            return self.let(dt, f"{name}({s[0]}, {s[1]})")
        if op is Ops.POW:
            return self.let(dt, f"pow({s[0]}, {s[1]})")
        if op in _INFIX:
            return self.let(dt, f"{s[0]} {_INFIX[op]} {s[1]}")
        if op in (Ops.SHL, Ops.SHR):
            return self.shift(op, dt, s[0], s[1])
        if op is Ops.NEG:
            return self.let(dt, f"-{s[0]}" if fl else f"({t})(0 - ({_wide_unsigned(dt)}){s[0]})")
        if op is Ops.NOT:
            return self.let(dt, f"!{s[0]}" if dt == dtypes.bool else f"({t})~{s[0]}")
        if op is Ops.ABS and not fl:
            return s[0] if sdt.kind != "i" else self.let(dt, f"({t})abs({s[0]})")
        if op is Ops.SIGN:
            return self.sign(dt, s[0])
        if op in _MATH:
            return self.let(dt, f"{_MATH[op]}({s[0]})")
        raise NotImplementedError(f"OpenCL renderer: {op} on {dt}")

    def divmod_helper(self, op: Ops, dt: DType) -> str:
        """NumPy floor division / modulo: x // 0 == x % 0 == 0, no trap on MIN // -1; float mod takes b's sign."""
        t, name = ctype(dt), "idiv" if op is Ops.IDIV else "mod"
        if dt.is_float:
            text = _FMOD.format(t=t)
        elif dt.kind == "i":
            text = (_IDIV_SIGNED if op is Ops.IDIV else _MOD_SIGNED).format(t=t, u=_wide_unsigned(dt))
        else:
            text = _DIVMOD_UNSIGNED.format(t=t, name=name, sym="/" if op is Ops.IDIV else "%")
        return self.helper(f"pj_{name}_{t}", text)

    def shift(self, op: Ops, dt: DType, a: str, b: str) -> str:
        t, bits = ctype(dt), dt.itemsize * 8
        out_of_range = f"({_wide_unsigned(dt)}){b} >= {bits}"  # negative amounts count as huge, like LLVM
        if op is Ops.SHL:
            return self.let(dt, f"{out_of_range} ? ({t})0 : ({t})({a} << {b})")
        fill = f"({t})({a} >> {bits - 1})" if dt.kind == "i" else f"({t})0"
        return self.let(dt, f"{out_of_range} ? {fill} : ({t})({a} >> {b})")

    def sign(self, dt: DType, x: str) -> str:
        t = ctype(dt)
        if dt == dtypes.bool:
            return x
        if dt.is_float:
            return self.let(dt, f"isnan({x}) ? {x} : ({t})({x} > 0) - ({t})({x} < 0)")
        if dt.kind == "u":
            return self.let(dt, f"({t})({x} > 0)")
        return self.let(dt, f"({t})(({x} > 0) - ({x} < 0))")

    def cast(self, v: str, src: DType, dst: DType) -> str:
        t = ctype(dst)
        if dst == dtypes.bool:
            return self.let(dst, f"{v} != 0")
        if src.is_float and not dst.is_float:  # saturating, NaN -> 0 (like llvm.fpto*i.sat)
            return self.let(dst, f"convert_{t}_sat({v})")
        if src.is_float and dst.is_float and ctype(src) == t:
            return self.round_half(v) if dst == dtypes.float16 else v
        if src.itemsize == dst.itemsize and src.is_int and dst.is_int and src.kind == dst.kind:
            return v
        out = self.let(dst, f"({t}){v}")
        return self.round_half(out) if dst == dtypes.float16 else out

    # ---- memory ----
    def load(self, u: UOp) -> str:
        buf, idx = u.src[0], self.value(u.src[1])
        gate = self.value(u.src[2]) if len(u.src) > 2 else None
        if gate is not None:  # a gated-off load reads element 0 and yields 0
            idx = self.let(dtypes.int64, f"{gate} ? {idx} : 0")
        ptr = f"buf{buf.arg}"
        if u.dtype == dtypes.float16:
            raw = f"vload_half({idx}, {ptr})"
        elif u.dtype == dtypes.bool:
            raw = f"{ptr}[{idx}] != 0"
        else:
            raw = f"{ptr}[{idx}]"
        if gate is not None:
            raw = f"{gate} ? {raw} : {const_literal(0, u.dtype)}"
        return self.let(u.dtype, raw, "ld")

    def store_line(self, u: UOp) -> str:
        buf, idx, val = u.src
        i, v = self.value(idx), self.value(val)
        if val.dtype == dtypes.float16:
            return f"vstore_half_rte({v}, {i}, buf{buf.arg});"
        return f"buf{buf.arg}[{i}] = {'(uchar)' if val.dtype == dtypes.bool else ''}{v};"

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

    def reduce(self, u: UOp) -> str:
        dt, ranges = u.dtype, list(u.src[1:])
        self.n += 1
        acc = f"acc{self.n}"
        self.emit(f"{ctype(dt)} {acc} = {const_literal(_identity(u.arg, dt), dt)};")
        if self.grouped:  # work-item `lid` takes iterations lid, lid + REDUCE_GROUP, ...
            count, flat = self.value(as_uop(sym_prod(r.src[0] for r in ranges))), f"f{self.n}"
            self.open_block(f"for (long {flat} = lid; {flat} < {count}; {flat} += {REDUCE_GROUP})", {})
            self.scopes[-1].update(self.unflatten(flat, ranges))
        else:
            for r in ranges:
                name = _range_name(r)
                self.open_block(f"for (long {name} = 0; {name} < {self.value(r.src[0])}; {name}++)", {r: name})
        self.emit(f"{acc} = {self.combine(u.arg, dt, acc, self.value(u.src[0]))};")
        for _ in (ranges if not self.grouped else ranges[:1]):
            self.close_block()
        if self.grouped:
            acc = self.combine_group(u.arg, dt, acc)
        return self.round_half(acc) if dt == dtypes.float16 else acc

    def combine_group(self, op: Ops, dt: DType, acc: str) -> str:
        """Tree-combine the work-group's partial accumulators in local memory; every work-item gets the result."""
        part = f"part{self.n}"
        self.locals.append(f"__local {ctype(dt)} {part}[{REDUCE_GROUP}];")
        self.emit(f"{part}[lid] = {acc};")
        self.emit("barrier(CLK_LOCAL_MEM_FENCE);")
        self.open_block(f"for (int s = {REDUCE_GROUP // 2}; s > 0; s >>= 1)", {})
        self.open_block("if (lid < s)", {})
        self.emit(f"{part}[lid] = {self.combine(op, dt, f'{part}[lid]', f'{part}[lid + s]')};")
        self.close_block()
        self.emit("barrier(CLK_LOCAL_MEM_FENCE);")
        self.close_block()
        return self.let(dt, f"{part}[0]", "red")

    def unflatten(self, flat: str, ranges: list[UOp]) -> dict:
        """Bind each range to its digit of a flat index (the last range varies fastest)."""
        bindings, rest = {}, flat
        for k, r in enumerate(reversed(ranges)):
            name = _range_name(r)
            if k == len(ranges) - 1:
                self.emit(f"long {name} = {rest};")
            else:
                end = self.value(r.src[0])
                self.emit(f"long {name} = {rest} % {end};")
                self.emit(f"long q{name} = {rest} / {end};")
                rest = f"q{name}"
            bindings[r] = name
        return bindings

    # ---- the kernel ----
    def kernel(self) -> tuple[str, UOp]:
        store = self.ast.src[0]
        ranges = _loop_ranges(self.ast)
        outputs = as_uop(sym_prod(r.src[0] for r in ranges))
        if self.grouped:  # one work-group per output: every work-item reaches the barriers
            self.emit("const long gid = get_group_id(0);")
            self.emit("const int lid = get_local_id(0);")
        else:
            self.emit("const long gid = get_global_id(0);")
            self.emit(f"if (gid >= {self.value(outputs)}) return;")
        self.scopes[-1].update(self.unflatten("gid", ranges))
        line = self.store_line(store)
        self.emit(f"if (lid == 0) {line}" if self.grouped else line)
        dtype_of = {u.arg: u.dtype for u in self.ast.toposort() if u.op is Ops.DEFINE_GLOBAL}
        params = [f"__global {'' if i == 0 else 'const '}{mem_type(dt)} *restrict buf{i}"
                  for i, dt in sorted(dtype_of.items())]
        params += [f"long {_c_name(v)}" for v in self.vars]
        attr = f"__attribute__((reqd_work_group_size({REDUCE_GROUP}, 1, 1))) " if self.grouped else ""
        uses_double = any(u.dtype == dtypes.float64 for u in self.ast.toposort())
        head = ["#pragma OPENCL EXTENSION cl_khr_fp64 : enable"] if uses_double else []
        text = "\n".join(head + list(self.helpers.values()) +
                         [f"{attr}__kernel void {self.ast.arg}({', '.join(params)}) {{",
                          *("  " + decl for decl in self.locals), *self.lines, "}"]) + "\n"
        size = outputs * REDUCE_GROUP if self.grouped else outputs
        return text, size


def render_opencl(ast: UOp) -> KernelSource:
    r = _Renderer(ast)
    source, size = r.kernel()
    local = (REDUCE_GROUP,) if r.grouped else ()
    return KernelSource(ast.arg, source, "opencl", tuple(r.vars), (size,), local)
