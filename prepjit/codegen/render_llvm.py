"""The LLVM IR renderer: a kernel AST -> one LLVM function for the cpu device.

ABI: `void name(ptr bufs, ptr vals, i64 start, i64 end)`: `bufs` holds the buffer pointers in
slot order, `vals` the int64 var values in `var_names` order, and [start, end) is the slice of
the outermost loop range this call computes (CPU threads split it); `end` is clamped to the
range, so (0, INT64_MAX) computes all of it. The body is an internal,
always-inlined function taking every buffer as a `noalias` pointer, so LLVM can vectorise.
16-bit float values (float16, bfloat16) live in registers as float and are rounded once per result.

A kernel with a "lane" range (optimize.py: a register block's columns, W at a time; block_split.py: the
steps of a quantized weight's block, summed) is rendered with every value that depends on the lane as one
`<W x T>` vector: contiguous loads and stores along the lane are vector loads and stores, others gathers and
scatters, values that do not depend on it are splatted where a vector needs them, and the few operations with
no vector form here (integer division, libm calls) are computed lane by lane. A sum over the lane accumulates
vectors and adds their lanes up once (lane_sum).
"""
from __future__ import annotations

from ..uop import DType, Ops, UOp, dtypes, simplify
from ..uop.ops import FMA_DTYPES
from .kernel import KernelSource, kernel_vars, parallel_range
from .llvm_ir import InlineMath, const_literal, intrinsic_suffix, mem_type, reg_type
from .llvm_reductions import ROLLED, ReductionRendering
from .renderer import KernelRenderer, rounds_through_odd_float
from .target import CPUTarget, host_target

_MATH = {Ops.EXP: "exp", Ops.EXP2: "exp2", Ops.LOG: "log", Ops.LOG2: "log2", Ops.SQRT: "sqrt", Ops.SIN: "sin",
         Ops.COS: "cos", Ops.FLOOR: "floor", Ops.CEIL: "ceil", Ops.RINT: "rint", Ops.ABS: "fabs"}
_LIBM = {Ops.TANH: "tanh", Ops.ERF: "erf"}


def function_attributes(target: CPUTarget) -> str:
    """x86 backends default to 256-bit vectors even where 512-bit ones exist; a register-blocked contraction's
    accumulators then need twice the registers and spill. So kernels ask for the target's full width."""
    return f'nounwind "prefer-vector-width"="{8 * target.vector_bytes}"'


# operations computed lane by lane in a vector (no vector form rendered here)
_PER_LANE = {Ops.IDIV, Ops.MOD, Ops.ATAN2, Ops.SIGN}


def _by_constant(u: UOp) -> bool:
    """Whether `u` is an integer division or modulo by a positive constant or a shift by a constant: one
    instruction or a few (llvm_ir.positive_divmod, shift), on a scalar or a vector."""
    if u.op not in (Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR) or u.src[1].op is not Ops.CONST or u.dtype.is_float or \
            u.src[1].dtype.is_float or u.dtype == dtypes.bool:
        return False
    return u.op in (Ops.SHL, Ops.SHR) or u.src[1].arg > 0


def _below(topo: list[UOp], own) -> dict[UOp, frozenset]:
    """Per node of a children-first order, the union of `own(n)` (a frozenset, or None for none) over the nodes n
    under it, itself included (one pass: no walk per node)."""
    below: dict[UOp, frozenset] = {}
    empty = frozenset()
    for u in topo:
        out = own(u) or empty
        for s in u.src:
            if below[s]:
                out = out | below[s] if out else below[s]
        below[u] = out
    return below


def _laned(topo: list[UOp], lane: UOp) -> set[UOp]:
    """The nodes of a children-first order whose value depends on `lane`, one vector of its steps; a reduction
    over the lane (block_split.py: its steps summed) is one value."""
    out = {lane}
    for u in topo:
        if not (u.op is Ops.REDUCE and lane in u.src[1:]) and any(s in out for s in u.src):
            out.add(u)
    return out


def _pointer(buf: UOp) -> str:
    """The pointer of a kernel's buffer slot, or of an array of its own (DEFINE_LOCAL: operand_prologue.py)."""
    return f"%local{buf.arg[0]}" if buf.op is Ops.DEFINE_LOCAL else f"%buf{buf.arg}"


def _loops(ranges) -> list[UOp]:
    """The loop (and serial) ranges among `ranges`, outermost first."""
    return sorted((r for r in ranges if r.arg[1] in ("loop", "serial")), key=lambda r: r.arg[0])


class _Renderer(ReductionRendering, KernelRenderer, InlineMath):
    def __init__(self, ast: UOp, target: CPUTarget):
        super().__init__(ast)
        self.attributes = function_attributes(target)
        self.open_ranges: list[UOp] = []  # the loop ranges open where the renderer is, outermost first
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.decls: set[str] = set()
        self.metadata: list[str] = []  # module-level metadata nodes (loop hints: close_loop)
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
        topo = ast.toposort()  # operands first
        self.n_bufs = 1 + max((u.arg for u in topo if u.op is Ops.DEFINE_GLOBAL), default=0)  # the slots it takes
        self.ranges = _below(topo, lambda u: frozenset((u,)) if u.op is Ops.RANGE else None)  # what each depends on
        lanes = [u for u in topo if u.op is Ops.RANGE and u.arg[1] == "lane"]
        if len(lanes) > 1:
            raise NotImplementedError(f"LLVM renderer: kernel {ast.arg} has {len(lanes)} lane ranges")
        self.lane = lanes[0] if lanes else None
        self.width = int(self.lane.src[0].arg) if lanes else 0
        self.permutes = target.vector_bytes == 64  # AVX-512 (64-byte vectors are zmm: llvm_cpu.py): vpermps
        self.indices: dict[UOp, UOp] = {}  # a value looked up in a table -> its 4-bit index (lookup_tables)
        self.vec = 0  # lanes of the value being rendered (0: a scalar)
        self.laned = _laned(topo, self.lane) if lanes else set()
        if lanes:
            self.scopes[0][self.lane] = "<" + ", ".join(f"i64 {k}" for k in range(self.width)) + ">"
        reduces = [u for u in topo if u.op is Ops.REDUCE]
        # Without reductions (a copy, a stack, a pack: memory-bound), a loop over a var's extent stays rolled: LLVM
        # unrolled it 4 times and a remainder around the inner loops' vectors (SmolLM2's prefill stacks of 30 layers'
        # K and V rows: 120 -> 40 ms of LLVM each, a pack 71 -> 51; the others' objects the same)
        self.var_loops_rolled, self.rolled = not reduces, set()
        # In any kernel a loop around a var's loop stays rolled: LLVM copied the vectorised nest inside (the work) for
        # each of a few constant steps or parallel rows (SmolLM2's prefill softmax, 3 heads: ~100 -> ~40 ms of LLVM)
        self.open_loops: list[str] = []  # the labels of the loops open where the renderer is, outermost first
        bound = _below(topo, lambda u: frozenset(u.src[1:]) if u.op is Ops.REDUCE else None)  # reductions' ranges
        for u in reduces:
            self.reduce_groups.setdefault((u.arg, u.dtype, u.src[1:]), []).append(u)
            self.reduce_loops[u] = set(_loops(self.ranges[u]))
            self.reduce_free[u] = set(self.ranges[u] - bound[u])
        if reduces and any(x.op is Ops.LOAD and x.src[0] in written for x in topo):
            first_use: dict[UOp, int] = {}  # per node, the index of the first store whose value uses it
            for i, st in enumerate(stores):  # what an earlier store uses is not walked again
                first_use.update((x, i) for x in st.postorder(lambda x: x not in first_use))
            stored_reads = _below(topo, lambda u: frozenset((u.src[0],)) if u.op is Ops.LOAD and u.src[0] in written
                                  else None)  # per node, the buffers the kernel stores that it loads
            for u in reduces:
                reads = stored_reads[u]
                if reads:  # the stores to those buffers before the first store that uses it (reuse.py)
                    first = first_use[u]
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

    def ty(self, dt: DType, memory: bool = False) -> str:
        """The LLVM type of a `dt` value being rendered: a scalar, or a vector of the kernel's lanes."""
        t = mem_type(dt) if memory else reg_type(dt)
        return f"<{self.vec} x {t}>" if self.vec else t

    def const(self, text: str, dt: DType) -> str:
        """A constant (LLVM literal `text`) of `dt`'s register type, splatted in a vector."""
        return f"splat ({reg_type(dt)} {text})" if self.vec else text

    def intrinsic(self, name: str, dt: DType) -> str:
        return f"llvm.{name}.{intrinsic_suffix(reg_type(dt), self.vec)}"

    def value(self, u: UOp) -> str:
        outer, self.vec = self.vec, (self.width if u in self.laned else 0)
        try:
            return super().value(u)
        finally:
            self.vec = outer

    def vector(self, u: UOp, text: str) -> str:
        """`u`'s rendered `text` as a vector of the kernel's lanes: as it is when it depends on the lane, else
        splatted (once per scope)."""
        if u in self.laned:
            return text
        t = reg_type(u.dtype)
        if u.op is Ops.CONST:
            return f"splat ({t} {text})"
        found = self._rendered(("splat", u))
        if found is None:
            vt = f"<{self.width} x {t}>"
            one = self.op(f"insertelement {vt} poison, {t} {text}, i64 0")
            found = self.scopes[-1][("splat", u)] = \
                self.op(f"shufflevector {vt} {one}, {vt} poison, <{self.width} x i32> zeroinitializer")
        return found

    def alu_node(self, u: UOp, srcs: list[str]) -> str:
        if self.vec:
            srcs = [self.vector(s, text) for s, text in zip(u.src, srcs)]
        if _by_constant(u):  # (a vector's too: no lane by lane division)
            if u.op in (Ops.SHL, Ops.SHR):
                return self.shift(u.op, u.dtype, *srcs, amount=u.src[1].arg)
            return self.divmod(u.op, u.src[0].dtype, *srcs, divisor=u.src[1].arg)
        if not self.vec:
            return super().alu_node(u, srcs)
        if u.op not in _PER_LANE and (u.op not in _LIBM or (u.op is Ops.ERF and reg_type(u.dtype) == "float")):
            return super().alu_node(u, srcs)
        lanes, out = self.vec, "poison"
        for k in range(lanes):
            parts = [self.op(f"extractelement {self.ty(s.dtype)} {v}, i64 {k}") for s, v in zip(u.src, srcs)]
            self.vec = 0
            one = super().alu_node(u, parts)
            self.vec = lanes
            out = self.op(f"insertelement {self.ty(u.dtype)} {out}, {reg_type(u.dtype)} {one}, i64 {k}")
        return out

    def alu(self, op: Ops, dt: DType, sdt: DType, s: list[str]) -> str:
        t, st = self.ty(dt), self.ty(sdt)
        fl, signed = sdt.is_float, sdt.kind == "i"
        if op is Ops.WHERE:
            return self.op(f"select {self.ty(dtypes.bool)} {s[0]}, {t} {s[1]}, {t} {s[2]}")
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
            return self.call(self.intrinsic(name, sdt), t, [(t, s[0]), (t, s[1])])
        if op is Ops.POW:
            return self.call(self.intrinsic("pow", dt), t, [(t, s[0]), (t, s[1])])
        if op is Ops.FMA and dt in FMA_DTYPES:  # llvm.fma: one rounding (vfmadd with FMA hardware, else libm's)
            return self.call(self.intrinsic("fma", dt), t, [(t, v) for v in s])
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
            return self.op(f"fneg {t} {s[0]}" if fl else f"sub {t} {self.const('0', dt)}, {s[0]}")
        if op is Ops.NOT:
            return self.op(f"xor {t} {s[0]}, {self.const('true' if dt == dtypes.bool else '-1', dt)}")
        if op is Ops.ABS and not fl:
            return s[0] if not signed else self.call(self.intrinsic("abs", dt), t, [(t, s[0]), ("i1", "false")])
        if op is Ops.SIGN:
            return self.sign(dt, s[0])
        if op is Ops.EXP and reg_type(dt) == "float":
            return self.exp_f32(s[0])
        if op is Ops.ERF and reg_type(dt) == "float":
            return self.erf_f32(s[0])
        if op in _MATH:
            return self.call(self.intrinsic(_MATH[op], dt), t, [(t, s[0])])
        if op in _LIBM:
            return self.call(_LIBM[op] + ("f" if t == "float" else ""), t, [(t, s[0])])
        raise NotImplementedError(f"LLVM renderer: {op} on {dt}")

    def cast(self, v: str, src: DType, dst: DType) -> str:
        st, dt_ = self.ty(src), self.ty(dst)
        if dst == dtypes.bool:
            zero = self.const(const_literal(0, src), src)
            return self.op(f"fcmp une {st} {v}, {zero}" if src.is_float else f"icmp ne {st} {v}, {zero}")
        if src == dtypes.bool:
            return self.op(f"uitofp {st} {v} to {dt_}" if dst.is_float else f"zext {st} {v} to {dt_}")
        if rounds_through_odd_float(src, dst):
            wide = self.sticky_double(v, src) if src.is_int else v
            return self.round_to(self.odd_float(wide, dtypes.float64), dst)
        if src.is_float and dst.is_float:
            if st == dt_:
                return self.round_to(v, dst) if dst.narrow else v
            out = self.op(f"{'fpext' if reg_type(dst) == 'double' else 'fptrunc'} {st} {v} to {dt_}")
            return self.round_to(out, dst) if dst.narrow else out
        if src.is_float:
            name = f"llvm.fpto{'s' if dst.kind == 'i' else 'u'}i.sat.{intrinsic_suffix(reg_type(dst), self.vec)}." \
                   f"{intrinsic_suffix(reg_type(src), self.vec)}"
            return self.call(name, dt_, [(st, v)])
        if dst.is_float:
            out = self.op(f"{'sitofp' if src.kind == 'i' else 'uitofp'} {st} {v} to {dt_}")
            return self.round_to(out, dst) if dst.narrow else out
        if src.itemsize == dst.itemsize:
            return v
        if src.itemsize > dst.itemsize:
            return self.op(f"trunc {st} {v} to {dt_}")
        return self.op(f"{'sext' if src.kind == 'i' else 'zext'} {st} {v} to {dt_}")

    def bitcast(self, v: str, src: DType, dst: DType) -> str:
        """The bits of `v` read as `dst` (of `src`'s size): through the memory types, where a 16-bit float is its
        bits (its float register value narrowed, exactly, and the result widened)."""
        raw = self.narrow(v, src) if src.narrow else v
        st, dt_ = self.ty(src, memory=True), self.ty(dst, memory=True)
        out = raw if st == dt_ else self.op(f"bitcast {st} {raw} to {dt_}")
        return self.widen(out, dst) if dst.narrow else out

    # ---- memory ----
    def address(self, buf: UOp, index: str) -> str:
        return self.op(f"getelementptr inbounds {mem_type(buf.dtype)}, ptr {self.pointer(buf)}, i64 {index}", "p")

    def pointer(self, buf: UOp) -> str:
        """The pointer of a buffer, or of a select of buffers (BUFFER_SELECT, buffer_select.py: a select of their
        pointers on its scalar condition, once per loop scope)."""
        if buf.op is not Ops.BUFFER_SELECT:
            return _pointer(buf)
        found = self._rendered(buf)
        if found is None:
            lanes, self.vec = self.vec, 0
            cond = self.value(buf.src[0])
            self.vec = lanes
            found = self.op(f"select i1 {cond}, ptr {self.pointer(buf.src[1])}, ptr {self.pointer(buf.src[2])}", "p")
            self.scopes[-1][buf] = found
        return found

    def lane_pointer(self, buf: UOp, index: UOp, gated: bool) -> tuple[str, bool]:
        """(the address of lane 0, True) when `index` steps by one along the lane, else (the lanes' addresses as
        a vector of pointers, False). A gated access's address may lie outside its buffer: no `inbounds`."""
        first = self.lane_start(index)
        inbounds = "" if gated else " inbounds"
        if first is not None:
            lanes, self.vec = self.vec, 0
            first = self.value(first)
            self.vec = lanes
            return self.op(f"getelementptr{inbounds} {mem_type(buf.dtype)}, ptr {self.pointer(buf)}, i64 {first}",
                           "p"), True
        offsets = self.vector(index, self.value(index))
        return self.op(f"getelementptr{inbounds} {mem_type(buf.dtype)}, ptr {self.pointer(buf)}, <{self.vec} x i64> "
                       f"{offsets}", "p"), False

    def lane_start(self, index: UOp) -> UOp | None:
        """`index` at lane 0 when it steps by one along the lane (lane + an expression free of it, as a register
        block's indices are), else None."""
        if index is self.lane:
            return UOp.const(0)
        if index.op is Ops.ADD and index in self.laned:
            a, b = index.src
            if b in self.laned:
                a, b = b, a
            if b not in self.laned:
                rest = self.lane_start(a)
                return None if rest is None else UOp(Ops.ADD, index.dtype, (rest, b))
        if index.op in (Ops.MIN, Ops.MAX) and index in self.laned:  # min(a + lane, b + lane) = min(a, b) + lane
            starts = [self.lane_start(x) for x in index.src]
            if None not in starts:
                return UOp(index.op, index.dtype, tuple(starts))
        step = simplify(index.substitute({self.lane: self.lane + 1}) - index)
        return simplify(index.substitute({self.lane: UOp.const(0)})) if step.op is Ops.CONST and step.arg == 1 else None

    def lane_mask(self, gate: UOp | None) -> str:
        return "splat (i1 true)" if gate is None else self.vector(gate, self.value(gate))

    def vector_load(self, u: UOp, widened: bool = True) -> str:
        """A load whose index or gate depends on the lane: a vector load (masked when gated), or a gather; a 16-bit
        float's bits as they are stored unless `widened`."""
        gate = u.src[2] if len(u.src) > 2 else None
        ptr, contiguous = self.lane_pointer(u.src[0], u.src[1], gate is not None)
        mt, vt, align = mem_type(u.dtype), self.ty(u.dtype, memory=True), max(1, u.dtype.itemsize)
        if contiguous and gate is None:
            raw = self.op(f"load {vt}, ptr {ptr}, align {align}")
        else:
            mask, kind = self.lane_mask(gate), "load" if contiguous else "gather"
            pt = "ptr" if contiguous else f"<{self.vec} x ptr>"
            raw = self.call(f"llvm.masked.{kind}.{intrinsic_suffix(mt, self.vec)}.{'p0' if contiguous else f'v{self.vec}p0'}",
                            vt, [(pt, ptr), ("i32", str(align)), (self.ty(dtypes.bool), mask), (vt, "zeroinitializer")])
        if u.dtype == dtypes.bool:
            return self.op(f"icmp ne {vt} {raw}, zeroinitializer")
        return self.widen(raw, u.dtype) if u.dtype.narrow and widened else raw

    def vector_store(self, u: UOp):
        """A store whose index, value or gate depends on the lane: a vector store (masked when gated) or a
        scatter."""
        buf, idx, val = u.src[:3]
        if u.arg is not None:
            raise NotImplementedError(f"LLVM renderer: a combining store across lanes in {self.ast.arg}")
        gate = u.src[3] if len(u.src) > 3 else None
        self.vec = self.width
        try:
            for n, table in self.lookup_tables([val]).items():  # a tile's unpacked 4-bit weights: one permute each
                self.look_up(n, table)
            if buf.op is Ops.DEFINE_LOCAL:
                self.prefetch_fill(val)
            v = self.vector(val, self.value(val))
            ptr, contiguous = self.lane_pointer(buf, idx, gate is not None)
            vt, align = self.ty(val.dtype, memory=True), max(1, val.dtype.itemsize)
            if val.dtype == dtypes.bool:
                v = self.op(f"zext {self.ty(val.dtype)} {v} to {vt}")
            elif val.dtype.narrow:
                v = self.narrow(v, val.dtype)
            if contiguous and gate is None:
                self.emit(f"store {vt} {v}, ptr {ptr}, align {align}")
                return
            kind = "store" if contiguous else "scatter"
            pt = "ptr" if contiguous else f"<{self.vec} x ptr>"
            name = f"llvm.masked.{kind}.{intrinsic_suffix(mem_type(val.dtype), self.vec)}.{'p0' if contiguous else f'v{self.vec}p0'}"
            args = [(vt, v), (pt, ptr), ("i32", str(align)), (self.ty(dtypes.bool), self.lane_mask(gate))]
            self.decls.add(f"declare void @{name}({', '.join(t for t, _ in args)})")
            self.emit(f"call void @{name}({', '.join(f'{t} {a}' for t, a in args)})")
        finally:
            self.vec = 0

    def load(self, u: UOp) -> str:
        if self.vec:
            return self.vector_load(u)
        buf, idx = u.src[0], self.value(u.src[1])
        gate = self.value(u.src[2]) if len(u.src) > 2 else None
        rt = reg_type(u.dtype)
        self.pointer(buf)  # (a select of buffers: before the branch, so that later reads in its scope may use it)
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
        elif u.dtype.narrow:
            raw = self.widen(raw, u.dtype)
        if gate is not None:
            self.emit(f"store {rt} {raw}, ptr {slot}")
            self.emit(f"br label %{label}.done")
            self.lines.append(f"{label}.done:")
            raw = self.op(f"load {rt}, ptr {slot}")
        return raw

    def store(self, u: UOp):
        """A store, branched around when gated; with an op (a scatter's combine) it reads the element first."""
        if u in self.laned:
            return self.vector_store(u)
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
                self.widen(old, val.dtype) if val.dtype.narrow else old
            v = self.alu(u.arg, val.dtype, val.dtype, [old, v])
        if val.dtype == dtypes.bool:
            v = self.op(f"zext i1 {v} to i8")
        elif val.dtype.narrow:
            v = self.narrow(v, val.dtype)
        self.emit(f"store {mt} {v}, ptr {ptr}")
        if len(u.src) > 3:
            self.emit(f"br label %{label}.done")
            self.lines.append(f"{label}.done:")

    # ---- loops ----
    def open_loop(self, r: UOp | None, start: str, end: str) -> tuple:
        if not end.lstrip("-").isdigit():  # a var's extent: the loops around it stay rolled
            self.rolled.update(self.open_loops)
        ptr = self.tmp("ctr")
        self.allocas.append(f"  {ptr} = alloca i64")
        self.emit(f"store i64 {start}, ptr {ptr}")
        label = self.tmp("L")[1:]
        self.open_loops.append(label)
        self.emit(f"br label %{label}.cond")
        self.lines.append(f"{label}.cond:")
        cur = self.op(f"load i64, ptr {ptr}", "r")
        self.emit(f"br i1 {self.op(f'icmp slt i64 {cur}, {end}')}, label %{label}.body, label %{label}.exit")
        self.lines.append(f"{label}.body:")
        self.scopes.append({} if r is None else {r: cur})
        return ptr, label, cur

    def close_loop(self, loop: tuple, hints: tuple[str, ...] = ()):
        """The end of a loop opened by open_loop; `hints` (LLVM loop metadata strings, e.g. ROLLED) are attached
        to its back edge."""
        ptr, label, cur = loop
        hints = hints or ((ROLLED,) if label in self.rolled else ())
        self.open_loops.pop()
        self.scopes.pop()
        self.emit(f"store i64 {self.op(f'add i64 {cur}, 1')}, ptr {ptr}")
        if not hints:
            self.emit(f"br label %{label}.cond")
        else:
            n = len(self.metadata)
            self.metadata += [f"!{n} = distinct !{{!{n}, !{n + 1}}}", f"!{n + 1} = !{{{', '.join(hints)}}}"]
            self.emit(f"br label %{label}.cond, !llvm.loop !{n}")
        self.lines.append(f"{label}.exit:")

    # ---- the function ----
    def open_range(self, r: UOp) -> tuple:
        self.open_ranges.append(r)
        if r is not self.prange:
            loop = self.open_loop(r, "0", self.value(r.src[0]))
            if self.var_loops_rolled and r.src[0].op is not Ops.CONST:
                self.rolled.add(loop[1])
            return loop
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

    def local_store(self, store: UOp):
        """A store into an array of the kernel's own, allocated on entry, in serial loops of its own (before the
        parallel loop: the kernel's first stores); a reduction it reads once per row (a batch row's mean of squares)
        is computed where the row's loop is open."""
        loops = []
        for r in _loops(self.ranges[store]):
            loops.append(self.open_loop(r, "0", self.value(r.src[0])))
            self.open_ranges.append(r)
            self.hoist_reductions()
        self.store(store)
        self.stores_done += 1
        while loops:
            self.open_ranges.pop()
            self.close_loop(loops.pop())

    def kernel(self) -> str:
        """The stores in order, each inside the loops of the ranges it depends on: consecutive stores share
        the loops their ranges have in common (outermost first), so stores over other ranges (a peeled tail)
        get loop nests of their own inside the shared ones. Every store is inside the parallel range but those
        into the kernel's own arrays filled once per call (local_store), which come first."""
        loops = []
        self.hoist_reductions()  # one-element reductions: a prologue, once per call (fused_reductions.py: PROLOGUE_MAX)
        for buf in dict.fromkeys(st.src[0] for st in self.ast.src if st.src[0].op is Ops.DEFINE_LOCAL):
            self.allocas.append(f"  {_pointer(buf)} = alloca [{buf.arg[1]} x {mem_type(buf.dtype)}], align 64")
        for store in self.ast.src:  # then the kernel's own arrays filled once per call (operand_prologue.py); one
            if store.src[0].op is not Ops.DEFINE_LOCAL or self.prange in self.ranges[store]:  # filled per step of
                break  # the parallel range (block_matmul.py's tile) comes in order with the rest
            self.local_store(store)
        if self.prange is None:  # a single element: run once, in the call whose slice holds index 0
            self.emit("%end.one = call i64 @llvm.smin.i64(i64 %end, i64 1)")
            self.decls.add("declare i64 @llvm.smin.i64(i64, i64)")
            loops.append(self.open_loop(None, "%start", "%end.one"))
        base = len(loops)
        for store in self.ast.src[self.stores_done:]:
            need = _loops(self.ranges[store])
            if store.src[0].op is Ops.DEFINE_LOCAL and self.open_ranges[:1] == [self.prange] and need[:1] != [
                    self.prange]:  # a row's array whose values read no range of the row (llvm_softmax.py): per step
                need = [self.prange] + need
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
                if r is not self.prange and store.src[0].op is Ops.DEFINE_LOCAL:  # a row array's fill
                    self.prefetch_positions(store, r)
                self.hoist_reductions()
            self.store(store)
            self.stores_done += 1
        while len(loops) > base:
            self.close_loop(loops.pop())
        if base:
            self.close_loop(loops.pop())
        name = self.ast.arg
        params = [f"ptr noalias %buf{i}" for i in range(self.n_bufs)] + [f"i64 %var_{v}" for v in self.vars]
        body = [f"define internal void @{name}_body({', '.join(params + ['i64 %start', 'i64 %end'])}) "
                f"alwaysinline {self.attributes} {{", "entry:", *self.allocas, *self.lines, "  ret void", "}"]
        wrap = [f"define void @{name}(ptr %bufs, ptr %vals, i64 %start, i64 %end) {self.attributes} {{", "entry:"]
        args = []
        for i in range(self.n_bufs):
            wrap.append(f"  %bp{i} = getelementptr ptr, ptr %bufs, i64 {i}")
            wrap.append(f"  %b{i} = load ptr, ptr %bp{i}")
            args.append(f"ptr %b{i}")
        for j, v in enumerate(self.vars):
            wrap.append(f"  %vp{j} = getelementptr i64, ptr %vals, i64 {j}")
            wrap.append(f"  %v{j} = load i64, ptr %vp{j}")
            args.append(f"i64 %v{j}")
        wrap += [f"  call void @{name}_body({', '.join(args + ['i64 %start', 'i64 %end'])})", "  ret void", "}"]
        metadata = [""] + self.metadata if self.metadata else []
        return "\n".join(sorted(self.decls) + [""] + body + [""] + wrap + metadata) + "\n"


def render_llvm(ast: UOp, target: CPUTarget | None = None) -> KernelSource:
    """The LLVM IR of a kernel, for `target` (by default this host's CPU)."""
    r = _Renderer(ast, target or host_target())
    source = r.kernel()
    size = (r.prange.src[0],) if r.prange is not None else (UOp.const(1),)
    return KernelSource(ast.arg, source, "llvm", tuple(r.vars), size)
