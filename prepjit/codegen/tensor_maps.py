"""Tensor maps: how a Hopper tile kernel's bulk tensor copies (TMA: cp.async.bulk.tensor) read an operand, decided on
the launched AST (render_fragments_tma.py renders the copies, runtime/cuda_tensor_maps.py encodes each map on the
host per launch: cuTensorMapEncodeTiled).

An operand has a map where it is a plain load of the tile's kind (16-bit, or float32 under tf32) whose index is
affine in the tile's ranges over a single own range, k and the batch ranges, unit-strided along the minor axis of its
local tile (render_fragments.Staged.minor): index = offset + inner + outer x stride + sum of batch x its stride, the
offset and strides expressions of the vars alone. The map is that index's view of the buffer: dims (inner extent,
outer extent, each batch range's end), its strides in elements, a box of one stage's block (the swizzle's 128-byte
rows, 64 16-bit or 32 float32 elements, by the block's rows). It reads nothing the AST's load does not: an element
the map reads at coordinates inside its dims is the load's at those ranges' values, which lie within the ranges'
ends, and the hardware fills coordinates past the dims with zeros. So the bounds proof of the launched AST
(bounds.py) covers its copies too.

A map is usable at run time where its start address is 16-byte aligned, its strides in bytes are multiples of 16 and
below 2^40 and its dims between 1 and 2^31 - 1 (`TensorMap.usable`: the runtime encodes the map only then, the kernel tests the
same and copies that operand's chunks itself otherwise).
"""
from __future__ import annotations

import attrs

from ..uop import DType, Ops, UOp, simplify
from ..uop.uop import as_uop
from .gpu_launch import BULK_VARIANT, launch_of
from .render_tiles import Contraction, match_contraction

MAX_STRIDE_BYTES = 1 << 40
MAX_DIM = (1 << 31) - 1   # (a copy's coordinates are signed 32-bit)
MAX_BATCH_DIMS = 3         # a map has at most 5 dimensions: inner, outer and up to 3 batch ranges


@attrs.frozen
class TensorMap:
    """One operand's tensor map: buffer `buffer` (its DEFINE_GLOBAL number) of `dtype`, from element `offset`,
    dims (innermost first) and strides (elements, of every dim but the first), a box of `box` elements (inner,
    outer; 1 along batch dims); `name` the operand's local tile (A or B); `coords`: the ranges whose value is each
    batch dim's coordinate."""
    name: str
    buffer: int
    dtype: DType
    offset: UOp
    dims: tuple
    strides: tuple
    box: tuple
    coords: tuple = ()

    def values(self) -> tuple:
        """The expressions the runtime evaluates per launch: offset, dims, strides."""
        return (self.offset, *self.dims, *self.strides)

    def usable(self, address: int, values: tuple) -> bool:
        """Whether the map can be encoded at buffer `address` and its `values` (`values()`, evaluated): start
        16-byte aligned, strides multiples of 16 bytes below MAX_STRIDE_BYTES, dims in [1, MAX_DIM] (the runtime,
        handed the map, encodes it only then; the kernel tests the same)."""
        offset, dims, strides = values[0], values[1:1 + len(self.dims)], values[1 + len(self.dims):]
        size = self.dtype.itemsize
        return ((address + offset * size) % 16 == 0 and all(0 < d <= MAX_DIM for d in dims) and
                all(0 < s * size < MAX_STRIDE_BYTES and s * size % 16 == 0 for s in strides))


def _coefficient(index: UOp, r: UOp) -> UOp | None:
    """How much `index` moves as range `r` steps by one, where that is the same everywhere (no range in it)."""
    step = simplify(index.substitute({r: r + 1}) - index)
    return None if any(x.op is Ops.RANGE for x in step.toposort()) else step


def operand_map(c: Contraction, s) -> TensorMap | None:
    """The tensor map of staged operand `s` (render_fragments.Staged: 128-byte rows), or None where it has none."""
    load = s.direct
    if load is None or len(s.own) != 1 or load.src[0].op is not Ops.DEFINE_GLOBAL:
        return None
    index, own, k = load.src[1], s.own[0], c.k
    used = {x for x in index.toposort() if x.op is Ops.RANGE}
    batch = tuple(b for b in c.batch if b in used)
    if used - {own, k, *batch} or len(batch) > MAX_BATCH_DIMS:
        return None
    steps = {r: _coefficient(index, r) for r in (own, k, *batch)}
    if any(v is None for v in steps.values()):
        return None
    offset = simplify(index.substitute({r: as_uop(0) for r in steps}))
    rest = simplify(index - offset - sum((r * steps[r] for r in steps), as_uop(0)))
    if not (rest.op is Ops.CONST and rest.arg == 0):   # (not affine: no map)
        return None
    inner, outer = (k, own) if s.minor == "k" else (own, k)
    if not (steps[inner].op is Ops.CONST and steps[inner].arg == 1):
        return None
    blocks, rows, length = s.shape
    return TensorMap(s.name, load.src[0].arg, load.dtype, offset,
                     (inner.src[0], outer.src[0], *(b.src[0] for b in batch)),
                     (steps[outer], *(steps[b] for b in batch)), (length, rows), batch)


def kernel_maps(c: Contraction, staged: list) -> dict:
    """{operand name: its tensor map or None} of a tile of the bulk variant (`staged`: its operands)."""
    return {s.name: operand_map(c, s) for s in staged}


def tensor_maps(ast: UOp) -> tuple:
    """The tensor maps a launched kernel takes as its last parameters, in order (none but for a tile of the bulk
    variant)."""
    decided = launch_of(ast)
    if decided is None or decided[0] != "tile" or decided[-1] != BULK_VARIANT:
        return ()
    from .render_fragments_tma import bulk_staged   # (which renders these maps' copies; imported here, where a
    # kernel has maps: the cpu's first call needs none of its ~10 ms of imports)
    c = match_contraction(ast, tuple(decided[1:]))
    return tuple(m for m in kernel_maps(c, bulk_staged(c)).values() if m is not None)
