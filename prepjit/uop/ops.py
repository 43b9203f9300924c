"""The operations of the IR, from traced array ops down to kernel loads and stores."""
from enum import Enum, auto

from .dtypes import dtypes


class Ops(Enum):
    # leaves
    CONST = auto()          # arg: Python value
    DEFINE_VAR = auto()     # arg: (name, min, max); an int64 symbolic variable
    INPUT = auto()          # traced only; arg: (input number, shape)
    DEFINE_GLOBAL = auto()  # kernel only; arg: buffer slot; dtype: element dtype
    DEFINE_LOCAL = auto()   # kernel only (the cpu's operand prologue); arg: (number, elements): an array of the
                            # kernel's own, one per call (codegen/operand_prologue.py); dtype: element dtype
    IOTA = auto()           # traced only; arg: (shape, axis); element = its index along axis
    RANGE = auto()          # kernel only; src: (end,); arg: (axis, "loop" | "reduce" | "serial"); a serial loop
                            # is never split over CPU threads (a scatter whose updates may collide); a "lane"
                            # range is no loop: the llvm renderer computes it as one vector (optimize.py)
    # unary
    NEG = auto(); NOT = auto(); ABS = auto(); SIGN = auto()
    EXP = auto(); EXP2 = auto(); LOG = auto(); LOG2 = auto(); SQRT = auto()
    SIN = auto(); COS = auto(); TANH = auto(); ERF = auto()
    FLOOR = auto(); CEIL = auto(); RINT = auto()
    # binary
    ADD = auto(); SUB = auto(); MUL = auto(); FDIV = auto(); IDIV = auto(); MOD = auto()
    MAX = auto(); MIN = auto(); POW = auto(); ATAN2 = auto()  # ATAN2(y, x): libm's atan2
    CMPLT = auto(); CMPEQ = auto(); CMPNE = auto()
    AND = auto(); OR = auto(); XOR = auto(); SHL = auto(); SHR = auto()
    # ternary
    WHERE = auto()
    FMA = auto()            # FMA(a, b, c): a * b + c rounded once, in FMA_DTYPES (tinygrad's MULACC)
    CAST = auto()           # dtype: target
    BITCAST = auto()        # dtype: target, of the source's size (not bool): the same bits read as that dtype
    # movement (traced graphs only)
    RESHAPE = auto()        # arg: new shape
    PERMUTE = auto()        # arg: axis order
    EXPAND = auto()         # arg: new shape
    SHRINK = auto()         # arg: ((start, step, size), ...) per dim
    PAD = auto()            # arg: ((before, after), ...) per dim
    GATHER = auto()         # traced only; src: (x, *indices); arg: per x dim ("dim", out dim) or ("index", j):
                            # out[i] = x[...], that dim read at i[out dim] or at indices[j][i] (wrapped, clamped)
    SCATTER = auto()        # traced only; src: (target, updates, *indices); arg: (dims as GATHER's, combine op or
                            # None): target with updates[i] set or combined into it (tracing/scatter.py)
    # reductions
    REDUCE_AXIS = auto()    # traced; arg: (reduce op, axes); the reduced dims become 1
    REDUCE = auto()         # kernel; src: (value, *reduce ranges); arg: reduce op
    # fori_loop (traced graphs only)
    CARRY = auto()          # placeholder for a loop carry inside the body; arg: (loop id, index, shape)
    LOOP = auto()           # src: initial carries; arg: LoopInfo
    LOOP_OUT = auto()       # src: (LOOP,); arg: carry index
    # kernels
    BUFFER_SELECT = auto()  # kernel only, a LOAD's buffer (the targets' passes: codegen/buffer_select.py); src:
                            # (cond, a, b), a and b each a DEFINE_GLOBAL or BUFFER_SELECT of one element dtype (its
                            # dtype): the load reads a where cond holds, else b, at its one index, which the bounds
                            # proof proves inside each of them (buffers_of)
    LOAD = auto()           # src: (buffer, index[, gate]); buffer: DEFINE_GLOBAL, DEFINE_LOCAL or BUFFER_SELECT
    STORE = auto()          # src: (DEFINE_GLOBAL, index, value[, gate]); arg: None, or an op: a read-modify-write
                            # buf[index] = op(buf[index], value) (a scatter's combine)
    SINK = auto()           # src: stores or traced outputs; arg: kernel name or None
    LAUNCH = auto()         # kernel only, a SINK's last src (a work-group target's pass, codegen/gpu_launch.py): how
                            # the kernel is launched: arg ("tile", rows, columns, splits) | ("rows", group, pack, run) |
                            # ("items", per work-item); the renderer follows it

    __hash__ = object.__hash__  # members are singletons; Enum's own hash (of the name, in Python) is slow


UNARY = {Ops.NEG, Ops.NOT, Ops.ABS, Ops.SIGN, Ops.EXP, Ops.EXP2, Ops.LOG, Ops.LOG2, Ops.SQRT,
         Ops.SIN, Ops.COS, Ops.TANH, Ops.ERF, Ops.FLOOR, Ops.CEIL, Ops.RINT}
BINARY = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.MIN, Ops.POW, Ops.ATAN2,
          Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR}
TERNARY = {Ops.WHERE, Ops.FMA}
ALU = UNARY | BINARY | TERNARY
ELEMENTWISE = ALU | {Ops.CAST, Ops.BITCAST}
COMPARISON = {Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE}
COMMUTATIVE = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.MIN, Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
MOVEMENT = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.SHRINK, Ops.PAD}
# every backend has a correctly rounded FMA of these; 16-bit floats are computed in float32 and rounded after each
# op, and a float32 FMA rounded again is not one rounding
FMA_DTYPES = (dtypes.float32, dtypes.float64)
REDUCE_OPS = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.MIN, Ops.AND, Ops.OR}
# the arg a float32 contraction's product (MUL) may carry: the reduced precision a device may multiply it in
# (tracing/precision.py; an exact product has none)
PRODUCT_PRECISIONS = ("tf32", "bf16")


def buffers_of(buffer) -> tuple:
    """The buffers an access through `buffer` (a LOAD's or STORE's src[0]) may touch: `buffer` itself, or each
    buffer a BUFFER_SELECT chooses from. Whatever reasons about an access's buffer (the bounds proof, a plan's
    in-place writes) reasons about each of them."""
    if buffer.op is not Ops.BUFFER_SELECT:
        return (buffer,)
    return buffers_of(buffer.src[1]) + buffers_of(buffer.src[2])
