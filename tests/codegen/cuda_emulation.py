"""Runs CUDA C from the cuda renderer on the CPU, for tests on machines without a GPU: the kernel is compiled as
C++ (clang++) against a small shim (one std::thread per CUDA thread of a block, blocks in turn, __syncthreads a
pthread barrier, warp shuffles through a per-warp exchange), so the tile and row kernels' indexing and
synchronisation are checked against NumPy. The tensor-core helpers (render_cuda's mma.sync, ldmatrix and cp.async)
are replaced by C++ that follows the PTX ISA's register layouts through the per-warp exchange (the matrix product in
float32, summed in k order; the copies synchronous, so commit and wait do nothing). Static launch sizes only;
kernels that use atomics are not covered."""
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
from prepjit.uop import Ops

SHIM = r"""
#include <pthread.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
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
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(n)
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
      for (unsigned b = 0; b < blocks; b++) { blockIdx.x = b; body(); pthread_barrier_wait(&end); }
    });
  for (auto &th : pool) th.join();
}
"""


_PTX = {  # the float16 conversions the cuda dialect spells in PTX, in C++ (x86-64's F16C: nearest even)
    'asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));': "f = _cvtsh_ss(h);",
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
    "pj_ldmatrix_x4": "static void pj_ldmatrix_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, "
                      "const unsigned short *row) { pj_ldmatrix<false>(r0, r1, r2, r3, row); }",
    "pj_ldmatrix_x4_trans": "static void pj_ldmatrix_x4_trans(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, "
                            "const unsigned short *row) { pj_ldmatrix<true>(r0, r1, r2, r3, row); }",
    "pj_cp_async16": "static void pj_cp_async16(unsigned short *dst, const unsigned short *src) { memcpy(dst, src, 16); }",
    "pj_cp_async_commit": "static void pj_cp_async_commit() {}",
    "pj_cp_async_wait": "template <int N> static void pj_cp_async_wait() {}",
}
_HELPER = re.compile(r"(?:template <int N> )?__device__ __forceinline__ void (pj_\w+)\(.*?\n\}", re.S)


def host_source(source: str, tensor_cores: bool = True) -> str:
    """The kernel's CUDA C as C++ for the shim (its inline PTX replaced): the tensor-core helpers emulated as the
    instructions, or (`tensor_cores` False) their own code for GPUs older than sm_80 (shuffles, plain copies)."""
    for ptx, cpp in _PTX.items():
        source = source.replace(ptx, cpp)
    if tensor_cores:
        source = _HELPER.sub(lambda m: _TENSOR_CORES.get(m.group(1), m.group(0)), source)
    return SHIM + source


def available() -> bool:
    return shutil.which("clang++") is not None


def run(src: KernelSource, buffers: list[np.ndarray], tensor_cores: bool = True):
    """Launch the kernel `src` (static launch size, no vars) over `buffers` (slot order; slot 0 is written), its
    tensor-core helpers as `host_source` says."""
    assert src.language == "cuda" and not src.var_names and src.global_size[0].op is Ops.CONST
    params = re.search(re.escape(src.name) + r"\((.*?)\) \{", src.source).group(1).split(", ")
    casts = ", ".join(f"({p.rsplit(' ', 1)[0].replace('__restrict__', '').strip()})a[{i}]" for i, p in enumerate(params))
    text = host_source(src.source, tensor_cores) + ('\nextern "C" void pj_run(void **a, unsigned blocks, unsigned threads) '
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
    pointers = (ctypes.c_void_p * len(buffers))(*[b.ctypes.data for b in buffers])
    run_fn(pointers, -(-src.global_size[0].arg // threads), threads)
