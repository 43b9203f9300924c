"""What every kernel renderer shares: one rendered value per UOp per loop scope, 16-bit float rounding after
each op (float16 and bfloat16 are computed in float and every result is rounded once: the renderer's
`round_to`), and the dispatch of a kernel
AST node to the renderer's own hooks (`literal`, `var_name`, `load`, `reduce`, `cast`, `bitcast`, `alu`)."""
from __future__ import annotations

from ..uop import DType, Ops, UOp, dtypes

# 16-bit results that need no rounding: exact halves (CONST, LOAD), rounded by their hook (REDUCE, CAST, BITCAST),
# or one of their operands, already rounded (WHERE), or its negation (NEG)
_NOT_ROUNDED = (Ops.CONST, Ops.LOAD, Ops.REDUCE, Ops.CAST, Ops.BITCAST, Ops.WHERE, Ops.NEG)
_OWN_WALK = (Ops.LOAD, Ops.REDUCE)  # their hooks render their operands themselves (inside a loop, for a reduce)


def rounds_through_odd_float(src: DType, dst: DType) -> bool:
    """Whether a conversion from `src` to the 16-bit float `dst` goes through float rounded to odd (then rounded
    on, which rounds the exact value once): where going through float rounded to nearest could round twice, from
    float64, and to bfloat16 from an integer wider than float's 24-bit significand (one that float16 cannot hold
    exactly overflows to infinity however it is rounded). A renderer gives it the value as a double (an integer
    past double's 53 bits with its low bits folded into a sticky one); OpenCL then needs cl_khr_fp64."""
    return dst.narrow and (src == dtypes.float64 or dst == dtypes.bfloat16 and src.is_int and src.itemsize >= 4)


class KernelRenderer:
    def __init__(self, ast: UOp):
        self.ast = ast
        self.scopes: list[dict] = [{}]  # the innermost loop's values last; a loop's scope ends with it

    def value(self, u: UOp) -> str:
        found = self._rendered(u)
        if found is not None:
            return found
        for operand in self._operands_first(u):  # so `render` below finds its operands rendered: no deep recursion
            self.value(operand)
        out = self.render(u)
        if u.dtype.narrow and u.op not in _NOT_ROUNDED:
            out = self.round_to(out, u.dtype)
        self.scopes[-1][u] = out
        return out

    def _rendered(self, u: UOp) -> str | None:
        for scope in reversed(self.scopes):
            if u in scope:
                return scope[u]
        return None

    def _operands_first(self, u: UOp) -> list[UOp]:
        """The unrendered operands `render(u)` would reach through casts and ALU ops, in the order it would
        render them (depth first, operands left to right), found with an explicit stack."""
        order, seen, stack = [], set(), [(u, False)]
        while stack:
            node, done = stack.pop()
            if done:
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            if node.op not in _OWN_WALK:
                stack.extend((s, False) for s in reversed(node.src) if s not in seen and self._rendered(s) is None)
        return order[:-1]

    def render(self, u: UOp) -> str:
        op = u.op
        if op is Ops.CONST:
            return self.literal(u.arg, u.dtype)
        if op is Ops.DEFINE_VAR:
            return self.var_name(u.arg[0])
        if op is Ops.RANGE:
            raise RuntimeError(f"range {u.render()} used outside its loop")
        if op is Ops.LOAD:
            return self.load(u)
        if op is Ops.REDUCE:
            return self.reduce(u)
        if op is Ops.CAST:
            return self.cast(self.value(u.src[0]), u.src[0].dtype, u.dtype)
        if op is Ops.BITCAST:
            return self.bitcast(self.value(u.src[0]), u.src[0].dtype, u.dtype)
        return self.alu_node(u, [self.value(s) for s in u.src])

    def alu_node(self, u: UOp, srcs: list[str]) -> str:
        return self.alu(u.op, u.dtype, u.src[0].dtype if u.src else u.dtype, srcs)
