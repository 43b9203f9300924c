"""What a C dialect spells (OpenCL C, CUDA C: render_opencl.py, render_cuda.py), for the C-style renderer
(render_c.py), which decides every kernel's structure itself: type names, literal suffixes, qualifiers, work-item
ids, barriers, 16-bit float storage, bit casts, math function names, tensor-core and copy helpers."""
from __future__ import annotations

import math
from typing import Callable

import attrs

from ..uop import DType, UOp, dtypes

ALIGN = 16                # bytes every buffer's start is aligned to (each is an allocation's start)


@attrs.frozen
class Dialect:
    """How one C dialect spells what the C-style renderer emits."""

    language: str
    types: dict                    # DType -> the register type (a 16-bit float's is its compute dtype's)
    half_type: str                 # the element type of float16 buffers
    long_suffix: str               # int64 literals
    ulong_suffix: str              # unsigned literals
    inf: Callable[[DType], str]    # +infinity of a float type (negated for -inf)
    nan: Callable[[DType], str]
    math: Callable[[str, DType], str]   # a C math function's name for a float type ("exp" -> "expf" in CUDA)
    func: str                      # qualifier of helper functions
    kernel_head: str               # format: {bounds}, {name}, {params}
    bounds: str                    # format: {n}, the declared work-group size; {resident}: ", groups" at once or ""
    always_bounded: bool           # whether every kernel declares its work-group size (CUDA) or grouped ones only
    elementwise_group: int         # the declared size of a kernel that is not grouped (when always_bounded)
    global_ptr: str                # format: {const}, {type}, {name}
    global_id: str
    group_id: str
    local_id: str
    local_size: str                # the work-group's width
    items_per_thread: int          # outputs each work-item of a kernel that is not grouped stores
    assume_aligned: str            # format: {name}, {const}, {type}: a statement declaring a buffer ALIGN-aligned
    barrier: str
    shuffle_xor: str | None        # format: {v}, {o}: `v` of the work-item whose lane is this one's xor o, or None
    local_array: str               # format: {type}, {name}, {n}
    vector4_load: str              # format: {ref}: the float4 at local-memory element `ref` (its index a
                                   # multiple of 4 in a local array whose rows are: 16-byte aligned)
    load_half: str                 # format: {ptr}, {idx} (a NaN keeps its sign and payload: c_helpers.HALF_TO_FLOAT)
    store_half: str                # format: {ptr}, {idx}, {v}
    round_half_helper: str         # defines `float pj_round_half(float)` (given bit_view_helper's definitions)
    float_bits: str                # format {v}: a float's bits as an unsigned int
    bits_float: str                # format {v}: an unsigned int's bits as a float
    bit_views: dict                # float16 / float64 -> (format {v}: a value's unsigned bits, format {v}: bits as
                                   # a value), for bitcasts; a float16 value is its float register value
    bit_view_helper: str           # defines what bit_views', load_half's and round_half_helper's float16
                                   # conversions call ("" for nothing)
    atomic_add: dict               # DType -> (a pragma it needs or "", format {ptr}, {val}): a native atomic add
    atomic_cas: dict               # element bytes -> (a pragma it needs or "", format {ptr}, {cmp}, {val}: an atomic
                                   # compare-and-swap of the unsigned bits at ptr, returning the old bits)
    preamble: Callable[[UOp], list[str]]   # lines before everything (extension pragmas)
    # helper name -> definition ({kind}: "bf16" or "f16"): pj_mma_{kind}, pj_ldmatrix_x4(_trans), pj_cp_async16,
    # pj_cp_async_commit, pj_cp_async_wait<N> (render_fragments.py); None: no tensor cores
    tensor_core_mma: dict | None = None
    tile_array: str | None = None  # format {type}, {name}, {n}: a local array of tensor-core tiles, 1024-byte aligned
                                   # (the period of the swizzles the matrix instructions read: render_fragments.py)
    dynamic_local: str | None = None   # format {bytes}: local memory beyond the static limit (the kernel's tiles),
                                       # declared with its size for the runtime (render_fragments.py)
    dynamic_tile_array: str | None = None   # format {type}, {name}, {n}, {offset}: a tile array in that memory
    # bulk tensor copies (Hopper's TMA: render_fragments_tma.py): helper name -> definition ({rank}: a copy's
    # dimensions), and the format ({name}) of a tensor map parameter; None: none
    bulk_copies: dict | None = None
    tensor_map_param: str | None = None
    # defines `float pj_round_bfloat16_any(float)` (after c_helpers.BFLOAT16): pj_round_bfloat16's value, but a NaN
    # any NaN, in fewer instructions, for a renderer whose `exact_nan` is off (render_c.round_to); "": none
    round_bfloat16_any: str = ""
    # whether a float32 / float64 reduction adds each product by fma() (render_c.accumulate): where the compiler
    # keeps it one instruction (CUDA); PoCL's work-group vectorizer leaves fma() scalar (an OpenCL sum of products
    # over neighbouring work-items' columns took 34 ms by fma(), 19 by a * b then + on this host's PoCL 3.0)
    fused_sums: bool = False
    # statements every kernel runs before its first access of global memory (CUDA: waiting for the grids launched
    # before it, where a CUDA graph launches it early: render_cuda.GRID_DEPENDENCY); "": none
    kernel_entry: str = ""

    def ctype(self, dt: DType) -> str:
        return self.types[dt.compute]

    def mem_type(self, dt: DType) -> str:
        """The element type of a `dt` buffer."""
        if dt == dtypes.float16:
            return self.half_type
        return self.types[{dtypes.bool: dtypes.uint8, dtypes.bfloat16: dtypes.uint16}.get(dt, dt)]

    def literal(self, value, dt: DType) -> str:
        if dt == dtypes.bool:
            return "true" if value else "false"
        if dt.is_float:
            value = float(dt.np.type(value)) if dt != dtypes.float64 else float(value)
            if math.isnan(value):
                return self.nan(dt)
            if math.isinf(value):
                return f"(-{self.inf(dt)})" if value < 0 else self.inf(dt)
            return f"{value.hex()}{'' if dt == dtypes.float64 else 'f'}"
        value = int(value)
        if dt == dtypes.int64:
            return f"(-9223372036854775807{self.long_suffix} - 1)" if value == -2**63 else f"{value}{self.long_suffix}"
        if dt == dtypes.int32 and value > -2**31:
            return str(value)
        return f"(({self.ctype(dt)}){value}{self.ulong_suffix if dt.is_unsigned else self.long_suffix})"
