"""The CUDA C dialect of the C-style renderer (render_c.py): a kernel AST -> one `extern "C" __global__`
function, compiled with NVRTC by the cuda device.

ABI: `__global__ void name(T0 *buf0, ..., long long v_<var>, ...)`. Every kernel declares its block size
with `__launch_bounds__` (the runtime reads it back as the function's maximum threads per block).
float16 is stored as 16-bit integers and converted with PTX `cvt` (no cuda_fp16.h needed), bfloat16 as its
bits (render_c.py's integer conversions, bit-equal to ml_dtypes); infinities
and NaNs are spelled as bit patterns (NVRTC has no math.h macros).
"""
from __future__ import annotations

import attrs

from ..uop import DType, UOp, dtypes
from . import c_helpers
from .gpu_launch import launch
from .kernel import KernelSource
from .optimize import Blocking
from .c_dialect import ALIGN, Dialect
from .render_c import render_c

ELEMENTWISE_GROUP = 256   # threads per block of kernels that are not grouped reductions
ITEMS_PER_THREAD = 4      # outputs per thread of those (a block's width apart: coalesced, more loads in flight)

# float16 conversions through libdevice's functions (cvt instructions NVVM sees), not inline PTX: NVVM merges no loads
# across an asm statement, so a run of quantized weights' bytes or float16 elements whose scales or elements were
# widened by asm was loaded an element at a time (a q4_1 matvec's 32 elements: 68 loads of 1-2 bytes; now 10 of 4
# bytes and 4 of 16, NVRTC 12.9, sm_90)
_LIBDEVICE_HALF = """extern "C" __device__ float __nv_half2float(unsigned short);
extern "C" __device__ unsigned short __nv_float2half_rn(float);"""
_HALF = _LIBDEVICE_HALF + "\n" + c_helpers.HALF_TO_FLOAT.format(
    func="__device__ __forceinline__ ", u16="unsigned short", u32="unsigned", nan_float="__uint_as_float(nan)",
    widen="f = __nv_half2float(h);") + """
__device__ __forceinline__ unsigned short pj_float_to_half(float f) { return __nv_float2half_rn(f); }"""
_ROUND_HALF = "__device__ __forceinline__ float pj_round_half(float x) { return pj_half_to_float(pj_float_to_half(x)); }"


# Hopper's programmatic dependent launch (PTX ISA: griddepcontrol, sm_90): a CUDA graph may launch a kernel before the
# kernel before it has finished (runtime/cuda_driver.Graph's programmatic edges), its blocks resident and waiting when
# that one ends instead of launched then. Every kernel first waits for the grids before it to complete, their memory
# visible (no access of global memory comes before), then lets the next one launch; its module's
# pj_waits_for_earlier_grids tells the runtime that it waits so (runtime/cuda_cubin.py). Elsewhere both are absent.
GRID_DEPENDENCY_ARCH = "defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900"
GRID_DEPENDENCY = f"""#if {GRID_DEPENDENCY_ARCH}
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif"""
GRID_DEPENDENCY_MARK = f"""#if {GRID_DEPENDENCY_ARCH}
extern "C" __constant__ unsigned pj_waits_for_earlier_grids = 1;
#endif"""

WGMMA_ARCH = "defined(__CUDA_ARCH_FEAT_SM90_ALL)"   # Hopper's arch-specific target (sm_90a): warpgroup matrix instructions
# ... compiled as CUDA (NVRTC, nvcc; not as the C++ of tests' CPU emulation): warp-specialised tiles, whose producer
# and consumer warpgroups synchronise on mbarriers (render_fragments_ws.py)
WARP_SPECIALISED_ARCH = f"{WGMMA_ARCH} && defined(__CUDACC__)"

_WGMMA = {  # Hopper's warpgroup matrix instructions (PTX ISA, wgmma): operands in local memory named by matrix
    # descriptors (start address, leading and stride byte offsets, swizzle mode; each >> 4), float32 accumulators in
    # registers; issued asynchronously, fenced, committed and waited for by the warpgroup. Only called where
    # WGMMA_ARCH holds (kernels test PJ_WGMMA); elsewhere their bodies are empty
    "PJ_WGMMA": f"#if {WGMMA_ARCH}\n#define PJ_WGMMA 1\n#else\n#define PJ_WGMMA 0\n#endif",
    "pj_wgmma_desc": f"""__device__ __forceinline__ unsigned long long pj_wgmma_desc(const void *tile, unsigned lbo,
    unsigned sbo, unsigned swizzle) {{
  const unsigned long long start = (unsigned)__cvta_generic_to_shared(tile);
  return (start & 0x3FFFF) >> 4 | (unsigned long long)(lbo >> 4) << 16 | (unsigned long long)(sbo >> 4) << 32 |
         (unsigned long long)swizzle << 62;
}}""",
    # a descriptor whose start address is `units` x 16 bytes further (local memory < 256 KB: the 14-bit field never
    # carries), by one 32-bit add
    "pj_wgmma_desc_add": """__device__ __forceinline__ unsigned long long pj_wgmma_desc_add(unsigned long long desc,
    unsigned units) {
  return desc & 0xFFFFFFFF00000000ull | (unsigned)desc + units;
}""",
    **{name: f"""__device__ __forceinline__ void {name}() {{
#if {WGMMA_ARCH}
  asm volatile("{ptx}" ::: "memory");
#endif
}}""" for name, ptx in (("pj_wgmma_fence", "wgmma.fence.sync.aligned;"),
                        ("pj_wgmma_commit", "wgmma.commit_group.sync.aligned;"),
                        ("pj_fence_async_shared", "fence.proxy.async.shared::cta;"))},
    "pj_wgmma_wait": f"""template <int N> __device__ __forceinline__ void pj_wgmma_wait() {{
#if {WGMMA_ARCH}
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
#endif
}}""",
    "pj_wgmma_hold": """template <int N> __device__ __forceinline__ void pj_wgmma_hold(float *d) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i]) :: "memory");   // (no use of d moves above the wait)
}""",
    "PJ_WARP_SPECIALISED": f"#if {WARP_SPECIALISED_ARCH}\n#define PJ_WARP_SPECIALISED 1\n#else\n"
                           "#define PJ_WARP_SPECIALISED 0\n#endif",
    # mbarriers in local memory (PTX ISA: mbarrier): `count` arrivals complete a phase; a wait for `parity` returns
    # once the phase of that parity has completed (a fresh barrier's phase -1, parity 1, has)
    **{name: f"""__device__ __forceinline__ void {name}({args}) {{
#if {WARP_SPECIALISED_ARCH}
  asm volatile({ptx} :: "r"((unsigned)__cvta_generic_to_shared(bar)){more} : "memory");
#endif
}}""" for name, args, ptx, more in (
        ("pj_mbar_init", "unsigned long long *bar, unsigned count",
         '"mbarrier.init.shared::cta.b64 [%0], %1; fence.mbarrier_init.release.cluster;"', ', "r"(count)'),
        ("pj_mbar_arrive", "unsigned long long *bar", '"mbarrier.arrive.shared::cta.b64 _, [%0];"', ""),
        # one arrival (counted in the barrier's count: .noinc) once every cp.async the work-item issued has landed
        ("pj_cp_async_mbar_arrive", "unsigned long long *bar", '"cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];"',
         ""))},
    "pj_mbar_wait": f"""__device__ __forceinline__ void pj_mbar_wait(unsigned long long *bar, unsigned parity) {{
#if {WARP_SPECIALISED_ARCH}
  unsigned done;
  do {{
    asm volatile("{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }}"
                 : "=r"(done) : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(parity) : "memory");
  }} while (!done);
#endif
}}""",
    # a warpgroup's registers a work-item, lowered or raised (all its warps at once; sm_90a)
    "pj_setmaxnreg": f"""template <int N, bool RAISE> __device__ __forceinline__ void pj_setmaxnreg() {{
#if {WARP_SPECIALISED_ARCH}
  if (RAISE) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N));
  else asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N));
#endif
}}""",
    # d += a (64 x k) @ b (k x n), k 16 (16-bit) or 8 (tf32): {trans} the 16-bit kinds' ", ta, tb", 1 where the
    # operand's tile is major along m/n (else along k; tf32 tiles are always); {dlist} and {outs} spell the n / 2
    # accumulators d[0] ... (render_fragments.wgmma_helper fills them in)
    "pj_wgmma_{kind}_n{n}_{ta}{tb}": f"""__device__ __forceinline__ void pj_wgmma_{{kind}}_n{{n}}_{{ta}}{{tb}}(float *d,
    unsigned long long a, unsigned long long b) {{
#if {WGMMA_ARCH}
  asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{{scale}}, 0; "
               "wgmma.mma_async.sync.aligned.m64n{{n}}k{{k}}.f32.{{kind}}.{{kind}} {{dlist}}, %{{a}}, %{{b}}, p, 1, 1{{trans}}; }}"
               : {{outs}} : "l"(a), "l"(b), "r"(1));
#endif
}}""",
}

# sm_80 on: a float rounded to bfloat16 (kept as a float) in one instruction where pj_round_bfloat16 takes ~8 (a NaN
# test first, to give ml_dtypes' quiet NaN of its sign where the instruction gives its canonical NaN): the pair (x, 0)
# packed (F2FP), whose 32 bits are x's bfloat16 widened (cvt.rn.bf16.f32 alone is an F2F, on the pipe of the
# exponentials and reciprocals, we believe: untimed)
_ROUND_BFLOAT16_ANY = """float pj_round_bfloat16_any(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(x), "f"(0.0f));
  return __uint_as_float(d);
#else
  return pj_round_bfloat16(x);
#endif
}"""
_TENSOR_CORES = {  # Ampere's and Hopper's (sm_80 and newer) warp-wide matrix, matrix-load and async-copy instructions;
    # older GPUs get the same results from shuffles and plain copies (correct, not fast: no tensor cores there)
    "pj_widen_{kind}": """__device__ __forceinline__ float pj_widen_{kind}(unsigned bits) {
  float f;
  unsigned short h = bits;
  if ("{kind}"[0] == 'b') return __uint_as_float(bits << 16);
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}""",
    "pj_mma_{kind}": """__device__ __forceinline__ void pj_mma_{kind}(float &c0, float &c1, float &c2, float &c3, unsigned a0,
    unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};" : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  for (int q = 0; q < 4; q++) {   // k pairs 2q and 2q + 1 (and + 8): from lane g * 4 + q (A), column * 4 + q (B)
    const unsigned x0 = __shfl_sync(0xffffffffu, a0, g * 4 + q), x1 = __shfl_sync(0xffffffffu, a1, g * 4 + q),
                   x2 = __shfl_sync(0xffffffffu, a2, g * 4 + q), x3 = __shfl_sync(0xffffffffu, a3, g * 4 + q),
                   y0 = __shfl_sync(0xffffffffu, b0, 8 * t + q), y1 = __shfl_sync(0xffffffffu, b1, 8 * t + q),
                   z0 = __shfl_sync(0xffffffffu, b0, 8 * t + 4 + q), z1 = __shfl_sync(0xffffffffu, b1, 8 * t + 4 + q);
    for (int h = 0; h < 32; h += 16) {
      const float p0 = pj_widen_{kind}(x0 >> h), p1 = pj_widen_{kind}(x1 >> h), p2 = pj_widen_{kind}(x2 >> h),
                  p3 = pj_widen_{kind}(x3 >> h), u0 = pj_widen_{kind}(y0 >> h), u1 = pj_widen_{kind}(y1 >> h),
                  v0 = pj_widen_{kind}(z0 >> h), v1 = pj_widen_{kind}(z1 >> h);
      c0 += p0 * u0 + p2 * u1; c1 += p0 * v0 + p2 * v1; c2 += p1 * u0 + p3 * u1; c3 += p1 * v0 + p3 * v1;
    }
  }
#endif
}""",
    # float32 rounded to tf32 (cvt.rna: to nearest, ties away from zero; the low 13 bits zero) on m16n8k8; its
    # fragments are loaded as 32-bit words and rounded once each (pj_round_tf32)
    "pj_round_tf32": """__device__ __forceinline__ unsigned pj_round_tf32(unsigned x) {
#if __CUDA_ARCH__ >= 800
  unsigned y;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(y) : "f"(__uint_as_float(x)));
  return y;
#else
  return (x & 0x7f800000u) == 0x7f800000u ? x : (x + 0x1000u) & 0xffffe000u;   // (infinities and NaNs kept)
#endif
}""",
    "pj_widen_tf32": """__device__ __forceinline__ float pj_widen_tf32(unsigned bits) {
  return __uint_as_float(bits);
}""",
    "pj_mma_tf32": """__device__ __forceinline__ void pj_mma_tf32(float &c0, float &c1, float &c2, float &c3,
    unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};" : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  for (int k = 0; k < 8; k++) {   // in k order: A's (row, k) from lane 4 row + k % 4, B's (k, column) 4 column + k % 4
    const int q = k % 4;
    const unsigned x0 = __shfl_sync(0xffffffffu, k < 4 ? a0 : a2, g * 4 + q),
                   x1 = __shfl_sync(0xffffffffu, k < 4 ? a1 : a3, g * 4 + q),
                   y0 = __shfl_sync(0xffffffffu, k < 4 ? b0 : b1, 8 * t + q),
                   y1 = __shfl_sync(0xffffffffu, k < 4 ? b0 : b1, 8 * t + 4 + q);
    const float p0 = pj_widen_tf32(x0), p1 = pj_widen_tf32(x1), u0 = pj_widen_tf32(y0), u1 = pj_widen_tf32(y1);
    c0 += p0 * u0; c1 += p0 * u1; c2 += p1 * u0; c3 += p1 * u1;
  }
#endif
}""",
    **{f"pj_ldmatrix_{name}": f"""__device__ __forceinline__ void pj_ldmatrix_{name}(unsigned &r0, unsigned &r1, unsigned &r2,
    unsigned &r3, const void *at) {{
#if __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x4{suffix}.shared.b16 {{%0, %1, %2, %3}}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"((unsigned)__cvta_generic_to_shared(at)));
#else
  const unsigned short *row = (const unsigned short *)at;
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4 * 2;
  unsigned *out[4] = {{&r0, &r1, &r2, &r3}};
  for (int q = 0; q < 4; q++) {{   // matrix q's rows come from lanes 8q ... 8q + 7
    const unsigned short *lo = (const unsigned short *)__shfl_sync(0xffffffffu, (unsigned long long)row,
                                                                   8 * q + {"t" if suffix else "g"});
    const unsigned short *hi = (const unsigned short *)__shfl_sync(0xffffffffu, (unsigned long long)row,
                                                                   8 * q + {"t + 1" if suffix else "g"});
    *out[q] = {"lo[g] | (unsigned)hi[g] << 16" if suffix else "lo[t] | (unsigned)hi[t + 1] << 16"};
  }}
#endif
}}""" for name, suffix in (("x4", ""), ("x4_trans", ".trans"))},
    "pj_cp_async16": """__device__ __forceinline__ void pj_cp_async16(void *dst, const void *src) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
#else
  *(uint4 *)dst = *(const uint4 *)src;
#endif
}""",
    "pj_cp_async_commit": """__device__ __forceinline__ void pj_cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;");
#endif
}""",
    "pj_cp_async_wait": """template <int N> __device__ __forceinline__ void pj_cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" :: "n"(N));
#endif
}""",
    **_WGMMA,
}


# local memory beyond the 48 KB a kernel may declare statically: the launch must pass its size and allow it
# (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES); the runtime reads the size from the module's
# pj_dynamic_local_bytes (runtime/cuda_cubin.py)
DYNAMIC_LOCAL = """extern __shared__ __align__(1024) unsigned char pj_dynamic_local[];
extern "C" __constant__ unsigned pj_dynamic_local_bytes = {bytes};"""


def _bits(dt: DType, single: str, double: str) -> str:
    return f"__longlong_as_double({double}LL)" if dt == dtypes.float64 else f"__int_as_float({single})"


CUDA = Dialect(
    language="cuda",
    types={dtypes.bool: "bool", dtypes.int8: "signed char", dtypes.int16: "short", dtypes.int32: "int",
           dtypes.int64: "long long", dtypes.uint8: "unsigned char", dtypes.uint16: "unsigned short",
           dtypes.uint32: "unsigned int", dtypes.uint64: "unsigned long long", dtypes.float32: "float",
           dtypes.float64: "double"},
    half_type="unsigned short", long_suffix="LL", ulong_suffix="ULL",
    inf=lambda dt: _bits(dt, "0x7f800000", "0x7ff0000000000000"),
    nan=lambda dt: _bits(dt, "0x7fc00000", "0x7ff8000000000000"),
    math=lambda name, dt: name if dt == dtypes.float64 else name + "f",
    func="__device__ ",
    kernel_head='extern "C" __global__ void {bounds}{name}({params})',
    bounds="__launch_bounds__({n}{resident}) ",
    always_bounded=True, elementwise_group=ELEMENTWISE_GROUP,
    global_ptr="{const}{type} *__restrict__ {name}",
    global_id="(long long)blockIdx.x * blockDim.x + threadIdx.x", group_id="(long long)blockIdx.x",
    local_id="(int)threadIdx.x",
    local_size="blockDim.x", items_per_thread=ITEMS_PER_THREAD,
    assume_aligned=f"{{name}} = ({{const}}{{type}} *)__builtin_assume_aligned({{name}}, {ALIGN});",
    barrier="__syncthreads();", shuffle_xor="__shfl_xor_sync(0xffffffffu, {v}, {o})",
    local_array="__shared__ __align__(16) {type} {name}[{n}]", vector4_load="*(const float4 *)&{ref}",
    load_half="pj_half_to_float({ptr}[{idx}])", store_half="{ptr}[{idx}] = pj_float_to_half({v})",
    round_half_helper=_ROUND_HALF, float_bits="__float_as_uint({v})", bits_float="__uint_as_float({v})",
    bit_views={dtypes.float16: ("pj_float_to_half({v})", "pj_half_to_float({v})"),
               dtypes.float64: ("(unsigned long long)__double_as_longlong({v})",
                                "__longlong_as_double((long long){v})")},
    bit_view_helper="",
    atomic_add={dtypes.float32: ("", "atomicAdd({ptr}, {val})"), dtypes.float64: ("", "atomicAdd({ptr}, {val})"),
                dtypes.int32: ("", "atomicAdd({ptr}, {val})"), dtypes.uint32: ("", "atomicAdd({ptr}, {val})"),
                dtypes.uint64: ("", "atomicAdd({ptr}, {val})"),
                dtypes.int64: ("", "atomicAdd((unsigned long long *)({ptr}), (unsigned long long){val})")},
    atomic_cas={4: ("", "atomicCAS((unsigned int *){ptr}, {cmp}, {val})"),
                8: ("", "atomicCAS((unsigned long long *){ptr}, {cmp}, {val})")},
    preamble=lambda ast: [GRID_DEPENDENCY_MARK] + ([_HALF] if any(u.dtype == dtypes.float16 for u in ast.toposort())
                                                   else []),
    tensor_core_mma=_TENSOR_CORES, tile_array="__shared__ __align__(1024) {type} {name}[{n}]",
    dynamic_local=DYNAMIC_LOCAL,
    dynamic_tile_array="{type} (&{name})[{n}] = *({type} (*)[{n}])(pj_dynamic_local + {offset})",
    round_bfloat16_any=_ROUND_BFLOAT16_ANY,
    fused_sums=True,
    kernel_entry=GRID_DEPENDENCY,
)


# Hopper's bulk tensor copies (PTX ISA: cp.async.bulk.tensor), sm_90a: a tensor map (CUtensorMap, encoded by the host:
# runtime/cuda_tensor_maps.py) is a 128-byte kernel parameter, 64-byte aligned (__grid_constant__: read in place); a
# copy of one box lands in local memory and completes `bytes` of the transaction the mbarrier expects
# (pj_mbar_expect_tx: an arrival that adds the bytes the phase waits for)
_BULK = {
    "pj_tensor_map": "struct __align__(64) pj_tensor_map { unsigned long long bits[16]; };",
    "pj_mbar_expect_tx": f"""__device__ __forceinline__ void pj_mbar_expect_tx(unsigned long long *bar, unsigned bytes) {{
#if {WARP_SPECIALISED_ARCH}
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
#endif
}}""",
    "pj_tma_load{rank}": f"""__device__ __forceinline__ void pj_tma_load{{rank}}(void *dst, const pj_tensor_map *map, {{coords}},
    unsigned long long *bar) {{
#if {WARP_SPECIALISED_ARCH}
  asm volatile("cp.async.bulk.tensor.{{rank}}d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {{coordlist}}], "
               "[%{{bar}}];" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(map), {{ins}},
               "r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
#endif
}}""",
}
CUDA_HOPPER = attrs.evolve(CUDA, bulk_copies=_BULK, tensor_map_param="const __grid_constant__ pj_tensor_map {name}")


def render_cuda(ast: UOp, tile: tuple | None = None, dialect: Dialect = CUDA) -> KernelSource:
    """The kernel `ast` launched (gpu_launch.launch: tiled as `tile` says, else as the tile policy chooses) and
    rendered in `dialect` (CUDA, or CUDA_HOPPER: with bulk tensor copies); a launched AST keeps its launch."""
    return render_c(launch(ast, dialect, Blocking(tile=tile)), dialect)
