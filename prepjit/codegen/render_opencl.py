"""The OpenCL C dialect of the C-style renderer (render_c.py): a kernel AST -> one `__kernel` function.

ABI: `__kernel void name(__global T0 *buf0, ..., long v_<var>, ...)`. float16 is stored as `half`, written through
the core `vstore_half_rte` built-in and read as its bits, widened by integer arithmetic (no cl_khr_fp16 needed),
bfloat16 as `ushort` bits; float64
needs cl_khr_fp64, requested with a pragma the device checks (also by a cast to bfloat16 from a 32- or 64-bit
integer, which rounds through a double: renderer.rounds_through_odd_float). Every kernel turns FP_CONTRACT off, so
`a * b + c` rounds twice as NumPy's does. Kernels that are not grouped leave the work-group size to the runtime.
"""
from __future__ import annotations

from ..uop import DType, Ops, UOp, dtypes
from . import c_helpers
from .gpu_launch import launch
from .kernel import KernelSource
from .optimize import Blocking
from .c_dialect import Dialect
from .render_c import render_c
from .row_plan import GROUP_REDUCE_MIN, REDUCE_GROUP, uses_grouped_reduce
from .renderer import rounds_through_odd_float

__all__ = ["GROUP_REDUCE_MIN", "OPENCL", "REDUCE_GROUP", "render_opencl", "uses_grouped_reduce"]

# a float16's bits widened by integer arithmetic (exact: a subnormal's 10 bits times 2^-24, a normal's exponent
# rebiased, infinity's kept): vload_half of the ushort `h` through a half pointer reads it as another type, which
# PoCL got wrong in a kernel with barriers (a batch row kernel whose epilogue widens a gathered Q8_0 row's scale:
# 25-50% errors at 5 rows or more, changing from run to run; test_a_gathered_q8_0_row_in_an_epilogue_equals_numpys)
_WIDEN_HALF = """uint e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  f = e == 0u ? (float)m * 0x1p-24f : as_float((e == 31u ? 0xffu : e + 112u) << 23 | m << 13);
  f = (h & 0x8000u) ? -f : f;"""
_HALF_BITS = """ushort pj_half_bits(float x) {
  ushort h;
  vstore_half_rte(x, 0, (__private half *)&h);
  return h;
}
""" + c_helpers.HALF_TO_FLOAT.format(func="", u16="ushort", u32="uint", nan_float="as_float(nan)", widen=_WIDEN_HALF)
_ROUND_HALF = "float pj_round_half(float x) { return pj_half_to_float(pj_half_bits(x)); }"   # needs _HALF_BITS


_INT64_ATOMICS = "#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable"
# OpenCL C lets a compiler fuse `a * b + c` into one rounding unless told not to (NVIDIA's does; PoCL's did not):
# NumPy rounds the product and the sum apart, and a fused multiply-add is the FMA op's, written as fma()
NO_CONTRACTION = "#pragma OPENCL FP_CONTRACT OFF"


def _pragmas(ast: UOp) -> list[str]:
    doubles = any(u.dtype == dtypes.float64 or u.op is Ops.CAST and rounds_through_odd_float(u.src[0].dtype, u.dtype)
                  for u in ast.toposort())
    return (["#pragma OPENCL EXTENSION cl_khr_fp64 : enable"] if doubles else []) + [NO_CONTRACTION]


def _cast_literal(dt: DType, name: str) -> str:
    return f"(({'double' if dt == dtypes.float64 else 'float'}){name})"


OPENCL = Dialect(
    language="opencl",
    types={dtypes.bool: "bool", dtypes.int8: "char", dtypes.int16: "short", dtypes.int32: "int",
           dtypes.int64: "long", dtypes.uint8: "uchar", dtypes.uint16: "ushort", dtypes.uint32: "uint",
           dtypes.uint64: "ulong", dtypes.float32: "float", dtypes.float64: "double"},
    half_type="half", long_suffix="L", ulong_suffix="UL",
    inf=lambda dt: _cast_literal(dt, "INFINITY"), nan=lambda dt: _cast_literal(dt, "NAN"),
    math=lambda name, dt: name,            # the built-ins are overloaded
    func="",
    kernel_head="{bounds}__kernel void {name}({params})",
    bounds="__attribute__((reqd_work_group_size({n}, 1, 1))) ",
    always_bounded=False, elementwise_group=0,
    global_ptr="__global {const}{type} *restrict {name}",
    global_id="get_global_id(0)", group_id="get_group_id(0)", local_id="get_local_id(0)",
    local_size="get_local_size(0)", items_per_thread=1, assume_aligned="",   # (one output per work-item)
    barrier="barrier(CLK_LOCAL_MEM_FENCE);", shuffle_xor=None,   # (sub-group shuffles are an extension)
    local_array="__local {type} {name}[{n}] __attribute__((aligned(16)))",
    vector4_load="*(__local const float4 *)&{ref}",
    load_half="pj_half_to_float(((__global const ushort *){ptr})[{idx}])", store_half="vstore_half_rte({v}, {idx}, {ptr})",
    round_half_helper=_ROUND_HALF, float_bits="as_uint({v})", bits_float="as_float({v})",
    bit_views={dtypes.float16: ("pj_half_bits({v})", "pj_half_to_float({v})"),
               dtypes.float64: ("as_ulong({v})", "as_double({v})")}, bit_view_helper=_HALF_BITS,
    atomic_add={dtypes.int32: ("", "atomic_add({ptr}, {val})"), dtypes.uint32: ("", "atomic_add({ptr}, {val})"),
                dtypes.int64: (_INT64_ATOMICS, "atom_add({ptr}, {val})"),
                dtypes.uint64: (_INT64_ATOMICS, "atom_add({ptr}, {val})")},   # float adds: the CAS loop
    atomic_cas={4: ("", "atomic_cmpxchg((volatile __global uint *){ptr}, {cmp}, {val})"),
                8: (_INT64_ATOMICS,
                    "atom_cmpxchg((volatile __global ulong *){ptr}, {cmp}, {val})")},
    preamble=_pragmas,
)


def render_opencl(ast: UOp, tile: tuple[int, int, int] | None = None) -> KernelSource:
    """The kernel `ast` launched (gpu_launch.launch: tiled as `tile` says, else as the tile policy chooses) and
    rendered; a launched AST keeps its launch."""
    return render_c(launch(ast, OPENCL, Blocking(tile=tile)), OPENCL)
