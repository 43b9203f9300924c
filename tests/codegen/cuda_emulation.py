"""Runs CUDA C from the cuda renderer on the CPU, for tests on machines without a GPU: the kernel is compiled as
C++ (clang++) against a small shim (one std::thread per CUDA thread of a block, blocks in turn, __syncthreads a
pthread barrier, warp shuffles through a per-warp exchange), so the tile and row kernels' indexing and
synchronisation are checked against NumPy. The tensor-core helpers (render_cuda's mma.sync, ldmatrix and cp.async)
are replaced by C++ that follows the PTX ISA's register layouts through the per-warp exchange (the matrix product in
float32, summed in k order; tf32's m16n8k8 reads only its operands' tf32 bits and adds each product to the
accumulator in k order; the copies synchronous, so commit and wait do nothing). Compiled as for sm_90a
(`wgmma`), the warpgroup instructions (16-bit or tf32 elements, products added to the accumulators in k order) read
local memory through their matrix descriptors as the PTX ISA lays them out (start address, leading and stride byte
offsets, swizzle of the address bits), each when the work-item waits for its group (wgmma.wait_group: the latest
the hardware may read its operands): local arrays, the dynamic one too, live in one section whose start is local
address 0 (__cvta_generic_to_shared). A var is passed as its value (the launch size evaluated there); kernels that
use atomics are not covered."""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile

import numpy as np

from prepjit.codegen.kernel import KernelSource
from prepjit.uop import eval_uop

SHIM = r"""
#include <pthread.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <thread>
#include <vector>
struct pj_dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local pj_dim3 threadIdx, blockIdx;
static pj_dim3 blockDim;
static pthread_barrier_t pj_bar, pj_warp_bar[32];
static unsigned long long pj_xch[32][32];
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static __attribute__((section("pj_shared")))
#define __constant__
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __syncthreads() pthread_barrier_wait(&pj_bar)
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double f; memcpy(&f, &i, 8); return f; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
template <class T> static T __shfl_xor_sync(unsigned, T v, int o) {
  unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  pj_xch[w][lane] = bits;
  pthread_barrier_wait(&pj_warp_bar[w]);
  bits = pj_xch[w][lane ^ o];
  pthread_barrier_wait(&pj_warp_bar[w]);
  memcpy(&v, &bits, sizeof(T));
  return v;
}
static unsigned pj_frag[32][32][6];
static const unsigned short *pj_rows[32][32];
static inline float pj_bf16_value(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
#if defined(__x86_64__)
static inline float pj_f16_value(unsigned short h) { return _cvtsh_ss(h); }
#endif
template <float (*value)(unsigned short)>
static void pj_mma(float &c0, float &c1, float &c2, float &c3, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                   unsigned b0, unsigned b1) {
  unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned mine[6] = {a0, a1, a2, a3, b0, b1};
  memcpy(pj_frag[w][lane], mine, sizeof mine);
  pthread_barrier_wait(&pj_warp_bar[w]);
  auto half = [&](unsigned lane_of, int reg, int k) {
    unsigned bits = pj_frag[w][lane_of][reg];
    return value(k % 2 ? bits >> 16 : bits & 0xffff);
  };
  float *c[4] = {&c0, &c1, &c2, &c3};
  for (int e = 0; e < 4; e++) {
    int row = lane / 4 + (e >= 2) * 8, col = lane % 4 * 2 + e % 2;
    float sum = 0.0f;
    for (int k = 0; k < 16; k++)
      sum += half((row % 8) * 4 + k % 8 / 2, (row >= 8) + 2 * (k >= 8), k) * half(col * 4 + k % 8 / 2, 4 + (k >= 8), k);
    *c[e] += sum;
  }
  pthread_barrier_wait(&pj_warp_bar[w]);
}
static void pj_mma_k8_tf32(float &c0, float &c1, float &c2, float &c3, unsigned a0, unsigned a1, unsigned a2,
                           unsigned a3, unsigned b0, unsigned b1) {
  // m16n8k8 .tf32: A (row g, k t) in a0, row + 8 in a1, k + 4 in a2, both in a3; B (k t, column g) in b0, k + 4 in b1;
  // the instruction reads only an operand's tf32 bits (the low 13 ignored); products summed into C in k order
  unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned mine[6] = {a0, a1, a2, a3, b0, b1};
  memcpy(pj_frag[w][lane], mine, sizeof mine);
  pthread_barrier_wait(&pj_warp_bar[w]);
  auto tf32 = [&](unsigned lane_of, int reg) { return __uint_as_float(pj_frag[w][lane_of][reg] & 0xffffe000u); };
  float *c[4] = {&c0, &c1, &c2, &c3};
  for (int e = 0; e < 4; e++) {
    int row = lane / 4 + (e >= 2) * 8, col = lane % 4 * 2 + e % 2;
    for (int k = 0; k < 8; k++)
      *c[e] += tf32((row % 8) * 4 + k % 4, (row >= 8) + 2 * (k >= 4)) * tf32(col * 4 + k % 4, 4 + (k >= 4));
  }
  pthread_barrier_wait(&pj_warp_bar[w]);
}
template <bool trans>
static void pj_ldmatrix(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, const unsigned short *row) {
  unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4 * 2;
  pj_rows[w][lane] = row;
  pthread_barrier_wait(&pj_warp_bar[w]);
  unsigned *r[4] = {&r0, &r1, &r2, &r3};
  for (int q = 0; q < 4; q++) {
    unsigned lo = trans ? pj_rows[w][q * 8 + t][g] : pj_rows[w][q * 8 + g][t];
    unsigned hi = trans ? pj_rows[w][q * 8 + t + 1][g] : pj_rows[w][q * 8 + g][t + 1];
    *r[q] = lo | hi << 16;
  }
  pthread_barrier_wait(&pj_warp_bar[w]);
}
extern "C" char __start_pj_shared[] __attribute__((weak));   // local memory: the section's offsets its addresses
static inline unsigned __cvta_generic_to_shared(const void *p) { return (unsigned)((const char *)p - __start_pj_shared); }
template <class T> static T pj_described(unsigned long long desc, int mn, int k, bool mn_major) {
  // element (mn, k) of the operand a wgmma matrix descriptor names: 8-row groups SBO apart, rows of the swizzle's
  // width (K-major: rows along mn, k within a row; MN-major: rows along k, blocks of a row's elements LBO apart),
  // then the swizzle on the address: bits 4.. xor bits 7.. (3 of them for 128-byte rows, 2 for 64, 1 for 32)
  unsigned start = (desc & 0x3FFF) << 4, lbo = (desc >> 16 & 0x3FFF) << 4, sbo = (desc >> 32 & 0x3FFF) << 4;
  unsigned mode = desc >> 62, row = mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0, bits = mode == 1 ? 3 : 4 - mode;
  if (!row) abort();   // (interleaved tiles: not emulated)
  unsigned size = sizeof(T), per_row = row / size;
  unsigned at = mn_major ? (mn / per_row) * lbo + (k / 8) * sbo + (k % 8) * row + (mn % per_row) * size
                         : (mn / 8) * sbo + (mn % 8) * row + k * size;
  if (!mn_major && k >= (int)per_row) abort();
  at += start;
  at ^= (at >> 7 & ((1u << bits) - 1)) << 4;
  T v;
  memcpy(&v, __start_pj_shared + at, size);
  return v;
}
static inline float pj_tf32_value(unsigned x) { return __uint_as_float(x & 0xffffe000u); }   // (its tf32 bits only)
template <class T, float (*value)(T), int N, int K, bool TA, bool TB>
static void pj_wgmma_now(float *d, unsigned long long a, unsigned long long b) {
  // each work-item its own accumulators (warp w of the warpgroup rows 16w ..., PTX's D layout), read from local memory
  unsigned w = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  for (int i = 0; i < N / 2; i++) {
    int row = 16 * w + lane / 4 + 8 * (i % 4 / 2), col = 8 * (i / 4) + lane % 4 * 2 + i % 2;
    for (int k = 0; k < K; k++) d[i] += value(pj_described<T>(a, row, k, TA)) * value(pj_described<T>(b, col, k, TB));
  }
}
// wgmma is asynchronous: an instruction reads local memory and its accumulators when the work-item waits for its
// group (the latest the hardware may), so a kernel that refills a stage, or reads the accumulators, before the wait
// for the instructions reading them gets wrong results here
struct pj_pending_wgmma { void (*run)(float *, unsigned long long, unsigned long long); float *d; unsigned long long a, b;
                          int group; };
static thread_local std::vector<pj_pending_wgmma> pj_wgmma_pending;
static thread_local int pj_wgmma_groups;   // groups committed by the work-item
template <class T, float (*value)(T), int N, int K, bool TA, bool TB>
static void pj_wgmma(float *d, unsigned long long a, unsigned long long b) {
  pj_wgmma_pending.push_back({pj_wgmma_now<T, value, N, K, TA, TB>, d, a, b, pj_wgmma_groups});
}
static void pj_wgmma_drain(int left) {   // wgmma.wait_group: run the committed groups but the last `left`
  std::vector<pj_pending_wgmma> still;
  for (auto &p : pj_wgmma_pending)
    if (p.group < pj_wgmma_groups - left) p.run(p.d, p.a, p.b); else still.push_back(p);
  pj_wgmma_pending = still;
}
template <class T> static T __shfl_sync(unsigned, T v, int from) {
  unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  pj_xch[w][lane] = bits;
  pthread_barrier_wait(&pj_warp_bar[w]);
  bits = pj_xch[w][from];
  pthread_barrier_wait(&pj_warp_bar[w]);
  memcpy(&v, &bits, sizeof(T));
  return v;
}
template <class F> static void pj_launch(unsigned blocks, unsigned threads, F body) {
  blockDim.x = threads;
  pthread_barrier_t end;
  pthread_barrier_init(&pj_bar, nullptr, threads);
  pthread_barrier_init(&end, nullptr, threads);
  for (unsigned w = 0; w < threads / 32; w++) pthread_barrier_init(&pj_warp_bar[w], nullptr, 32);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; t++)
    pool.emplace_back([&, t] {
      threadIdx.x = t;
      for (unsigned b = 0; b < blocks; b++) {
        blockIdx.x = b; body(); pj_wgmma_pending.clear(); pj_wgmma_groups = 0; pthread_barrier_wait(&end);
      }
    });
  for (auto &th : pool) th.join();
}
"""


_PTX = {  # the float16 conversions the cuda dialect spells in PTX, in C++ (x86-64's F16C: nearest even); widening
    # a NaN gives NVIDIA's canonical NaN (0x7fffffff, sign and payload dropped), as the PTX ISA says cvt does
    'asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));': "f = (h & 0x7fffu) > 0x7c00u ? __uint_as_float(0x7fffffffu) "
                                                      ": _cvtsh_ss(h);",
    'asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));': "h = _cvtss_sh(f, 0);",
}


F16C = ["-mf16c"] if platform.machine() in ("x86_64", "AMD64") else []


_TENSOR_CORES = {  # render_cuda's tensor-core helpers, by name, in C++ for the shim
    "pj_mma_bf16": "static void pj_mma_bf16(float &c0, float &c1, float &c2, float &c3, unsigned a0, unsigned a1, "
                   "unsigned a2, unsigned a3, unsigned b0, unsigned b1) "
                   "{ pj_mma<pj_bf16_value>(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1); }",
    "pj_mma_f16": "static void pj_mma_f16(float &c0, float &c1, float &c2, float &c3, unsigned a0, unsigned a1, "
                  "unsigned a2, unsigned a3, unsigned b0, unsigned b1) "
                  "{ pj_mma<pj_f16_value>(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1); }",
    "pj_mma_tf32": "static void pj_mma_tf32(float &c0, float &c1, float &c2, float &c3, unsigned a0, unsigned a1, "
                   "unsigned a2, unsigned a3, unsigned b0, unsigned b1) "
                   "{ pj_mma_k8_tf32(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1); }",
    "pj_ldmatrix_x4": "static void pj_ldmatrix_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, "
                      "const void *row) { pj_ldmatrix<false>(r0, r1, r2, r3, (const unsigned short *)row); }",
    "pj_ldmatrix_x4_trans": "static void pj_ldmatrix_x4_trans(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, "
                            "const void *row) { pj_ldmatrix<true>(r0, r1, r2, r3, (const unsigned short *)row); }",
    "pj_cp_async16": "static void pj_cp_async16(void *dst, const void *src) { memcpy(dst, src, 16); }",
    "pj_cp_async_commit": "static void pj_cp_async_commit() {}",
    "pj_cp_async_wait": "template <int N> static void pj_cp_async_wait() {}",
    **{name: f"static void {name}() {{}}" for name in ("pj_wgmma_fence", "pj_fence_async_shared")},
    "pj_wgmma_commit": "static void pj_wgmma_commit() { pj_wgmma_groups++; }",
    "pj_wgmma_wait": "template <int N> static void pj_wgmma_wait() { pj_wgmma_drain(N); }",
    "pj_wgmma_hold": "template <int N> static void pj_wgmma_hold(float *) {}",
}
_HELPER = re.compile(r"(?:template <int N> )?__device__ __forceinline__ void (pj_\w+)\(.*?\n\}", re.S)
_WGMMA = re.compile(r"pj_wgmma_(bf16|f16|tf32)_n(\d+)_([01])([01])")


def _emulated(name: str, text: str) -> str:
    """A tensor-core helper's C++ for the shim (a wgmma's from its name: kind, n, operands' majors), else `text`."""
    wgmma = _WGMMA.fullmatch(name)
    if wgmma:
        kind, n, ta, tb = wgmma.groups()
        element, k = ("unsigned", 8) if kind == "tf32" else ("unsigned short", 16)
        return (f"static void {name}(float *d, unsigned long long a, unsigned long long b) "
                f"{{ pj_wgmma<{element}, pj_{kind}_value, {n}, {k}, {ta}, {tb}>(d, a, b); }}")
    return _TENSOR_CORES.get(name, text)


def host_source(source: str, tensor_cores: bool = True, wgmma: bool = False) -> str:
    """The kernel's CUDA C as C++ for the shim (its inline PTX replaced): the tensor-core helpers emulated as the
    instructions, or (`tensor_cores` False) their own code for GPUs older than sm_80 (shuffles, plain copies); with
    `wgmma`, compiled as for sm_90a (its warpgroup instructions)."""
    for ptx, cpp in _PTX.items():
        source = source.replace(ptx, cpp)
    # dynamic local memory: an array of the most a block may have, in the local memory's section
    source = source.replace("extern __shared__ __align__(1024) unsigned char pj_dynamic_local[];",
                            "__shared__ __align__(1024) unsigned char pj_dynamic_local[227 * 1024];")
    if tensor_cores:
        source = _HELPER.sub(lambda m: _emulated(m.group(1), m.group(0)), source)
    return ("#define __CUDA_ARCH_FEAT_SM90_ALL 1\n" if wgmma else "") + SHIM + source


def available() -> bool:
    return shutil.which("clang++") is not None


def run(src: KernelSource, buffers: list[np.ndarray], tensor_cores: bool = True, wgmma: bool = False,
        var_values: dict | None = None):
    """Launch the kernel `src` over `buffers` (slot order; slot 0 is written), its vars at `var_values` (name ->
    int: the launch size evaluated there), its tensor-core helpers as `host_source` says."""
    var_values = var_values or {}
    assert src.language == "cuda" and set(src.var_names) == set(var_values)
    params = re.search(re.escape(src.name) + r"\((.*?)\) \{", src.source).group(1).split(", ")
    casts = ", ".join(f"({p.rsplit(' ', 1)[0].replace('__restrict__', '').strip()})a[{i}]" for i, p in enumerate(params))
    text = host_source(src.source, tensor_cores, wgmma) + ('\nextern "C" void pj_run(void **a, unsigned blocks, unsigned threads) '
                                f"{{ pj_launch(blocks, threads, [&] {{ {src.name}({casts}); }}); }}\n")
    folder = os.path.join(tempfile.gettempdir(), "prepjit-cuda-emulation")
    os.makedirs(folder, exist_ok=True)
    lib = os.path.join(folder, hashlib.sha256(text.encode()).hexdigest()[:24] + ".so")
    if not os.path.exists(lib):
        with tempfile.NamedTemporaryFile("w", suffix=".cpp", dir=folder, delete=False) as f:
            f.write(text)
        part = lib + f".{os.getpid()}"
        subprocess.run(["clang++", "-std=c++17", "-O1", "-w", *F16C, "-fPIC", "-shared", "-pthread", "-o", part, f.name],
                       check=True, capture_output=True)
        os.replace(part, lib)
        os.unlink(f.name)
    run_fn = ctypes.CDLL(lib).pj_run
    run_fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_uint]
    threads = src.local_size[0]
    pointers = (ctypes.c_void_p * (len(buffers) + len(src.var_names)))(
        *[b.ctypes.data for b in buffers], *[var_values[v] for v in src.var_names])   # (a var: `(long long)a[i]`)
    run_fn(pointers, -(-eval_uop(src.global_size[0], var_values) // threads), threads)
