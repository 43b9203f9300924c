"""Runs CUDA C from the cuda renderer on the CPU, for tests on machines without a GPU: the kernel is compiled as
C++ (clang++) against a small shim (a block's threads as fibers of one OS thread, blocks in turn, __syncthreads a
barrier that passes the turn on, warp shuffles through a per-warp exchange), so the tile and row kernels' indexing
and synchronisation are checked against NumPy. A thread runs until it reaches a barrier, a warp on to the block's
barrier (its lanes taking turns at its shuffles), so an access that a missing barrier leaves unordered sees the other
thread's before or after: threads take turns in order in even blocks and in reverse order in odd ones, for both; local
memory starts a block as bytes 0xff (NaN, -1) or 0x7f (huge numbers), so a read before the block's write shows. The
tensor-core helpers (render_cuda's mma.sync, ldmatrix and cp.async) are replaced by C++ that follows the PTX ISA's
register layouts through the per-warp exchange (the matrix product in float32, summed in k order; tf32's m16n8k8
reads only its operands' tf32 bits and adds each product to the accumulator in k order; the copies synchronous, so
commit and wait do nothing). Compiled as for sm_90a
(`wgmma`), the warpgroup instructions (16-bit or tf32 elements, products added to the accumulators in k order) read
local memory through their matrix descriptors as the PTX ISA lays them out (start address, leading and stride byte
offsets, swizzle of the address bits), each when the work-item waits for its group (wgmma.wait_group: the latest
the hardware may read its operands): local arrays, the dynamic one too, live in one section whose start is local
address 0 (__cvta_generic_to_shared). A var is passed as its value (the launch size evaluated there); kernels that
use atomics are not covered. The shim is precompiled once (a clang++ PCH) and each kernel's library kept, by its
text, under the temporary folder, for the processes of a test session and later ones."""
from __future__ import annotations

import ctypes
import functools
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
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <sys/mman.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
struct pj_dim3 { unsigned x = 0, y = 0, z = 0; };
static pj_dim3 threadIdx, blockIdx, blockDim;
// a block's work-items are fibers of the launching thread, one running at a time until it reaches a barrier or
// leaves; a barrier passes the turn on (the next work-item in order, in reverse order in odd blocks, so an access
// that a missing barrier leaves unordered meets the other work-item's before and after in one of two blocks)
enum { PJ_MAX_THREADS = 1024, PJ_MAIN = PJ_MAX_THREADS, PJ_STACK = 256 << 10 };
static unsigned pj_threads, pj_live;
static bool pj_reverse;
static bool pj_left[PJ_MAX_THREADS];
static unsigned long long pj_progress;   // barrier arrivals and leavings: a round of turns without one is a deadlock
static char *pj_stacks;
static void pj_work_item();
#if defined(__x86_64__)
static void *pj_sp[PJ_MAX_THREADS + 1];
extern "C" void pj_switch(void **save, void *to);   // saves the callee-saved registers on this stack, takes `to`'s
asm(".text\n.p2align 4\npj_switch:\n push %rbp\n push %rbx\n push %r12\n push %r13\n push %r14\n push %r15\n"
    " mov %rsp, (%rdi)\n mov %rsi, %rsp\n pop %r15\n pop %r14\n pop %r13\n pop %r12\n pop %rbx\n pop %rbp\n ret\n");
static void pj_transfer(unsigned from, unsigned to) { pj_switch(&pj_sp[from], pj_sp[to]); }
static void pj_begin(unsigned t) {   // a fresh stack whose switch returns into pj_work_item, aligned as a call's
  void **sp = (void **)(pj_stacks + (t + 1) * (size_t)PJ_STACK);
  *--sp = nullptr;
  *--sp = (void *)pj_work_item;
  for (int r = 0; r < 6; r++) *--sp = nullptr;
  pj_sp[t] = sp;
}
#else
#include <ucontext.h>
static ucontext_t pj_uc[PJ_MAX_THREADS + 1];
static void pj_transfer(unsigned from, unsigned to) { swapcontext(&pj_uc[from], &pj_uc[to]); }
static void pj_begin(unsigned t) {
  getcontext(&pj_uc[t]);
  pj_uc[t].uc_stack = {pj_stacks + t * (size_t)PJ_STACK, 0, PJ_STACK};
  pj_uc[t].uc_link = nullptr;
  makecontext(&pj_uc[t], pj_work_item, 0);
}
#endif
static void pj_pass_turn(unsigned first, unsigned count) {   // to the next of work-items first ... that has not left
  unsigned from = threadIdx.x, to = from;                      // (the launch once none is left)
  if (!pj_live) return pj_transfer(from, PJ_MAIN);
  do to = first + (to - first + (pj_reverse ? count - 1 : 1)) % count; while (pj_left[to]);
  if (to != from) { threadIdx.x = to; pj_transfer(from, to); }
}
// a barrier's waiters pass the turn among themselves (a warp's among its lanes: a warp runs on to the block's
// barrier, as far ahead of the others as a missing barrier lets it)
struct pj_barrier { unsigned first, count, arrived, phase; };
static pj_barrier pj_bar, pj_warp_bar[32];
static void pj_wait(pj_barrier &b) {
  unsigned phase = b.phase;
  pj_progress++;
  if (++b.arrived == b.count) { b.arrived = 0; b.phase++; return; }
  for (;;) {
    unsigned long long seen = pj_progress;
    pj_pass_turn(b.first, b.count);
    if (b.phase != phase) return;
    if (pj_progress == seen) { fputs("cuda_emulation: deadlock (every work-item waits)\n", stderr); abort(); }
  }
}
static unsigned pj_frag[32][32][6];
static const unsigned short *pj_rows[32][32];
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
#define __syncthreads() pj_wait(pj_bar)
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double f; memcpy(&f, &i, 8); return f; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
template <class T> static T __shfl_xor_sync(unsigned, T v, int o) {
  unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  pj_xch[w][lane] = bits;
  pj_wait(pj_warp_bar[w]);
  bits = pj_xch[w][lane ^ o];
  pj_wait(pj_warp_bar[w]);
  memcpy(&v, &bits, sizeof(T));
  return v;
}
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
  pj_wait(pj_warp_bar[w]);
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
  pj_wait(pj_warp_bar[w]);
}
static void pj_mma_k8_tf32(float &c0, float &c1, float &c2, float &c3, unsigned a0, unsigned a1, unsigned a2,
                           unsigned a3, unsigned b0, unsigned b1) {
  // m16n8k8 .tf32: A (row g, k t) in a0, row + 8 in a1, k + 4 in a2, both in a3; B (k t, column g) in b0, k + 4 in b1;
  // the instruction reads only an operand's tf32 bits (the low 13 ignored); products summed into C in k order
  unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned mine[6] = {a0, a1, a2, a3, b0, b1};
  memcpy(pj_frag[w][lane], mine, sizeof mine);
  pj_wait(pj_warp_bar[w]);
  auto tf32 = [&](unsigned lane_of, int reg) { return __uint_as_float(pj_frag[w][lane_of][reg] & 0xffffe000u); };
  float *c[4] = {&c0, &c1, &c2, &c3};
  for (int e = 0; e < 4; e++) {
    int row = lane / 4 + (e >= 2) * 8, col = lane % 4 * 2 + e % 2;
    for (int k = 0; k < 8; k++)
      *c[e] += tf32((row % 8) * 4 + k % 4, (row >= 8) + 2 * (k >= 4)) * tf32(col * 4 + k % 4, 4 + (k >= 4));
  }
  pj_wait(pj_warp_bar[w]);
}
template <bool trans>
static void pj_ldmatrix(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, const unsigned short *row) {
  unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4 * 2;
  pj_rows[w][lane] = row;
  pj_wait(pj_warp_bar[w]);
  unsigned *r[4] = {&r0, &r1, &r2, &r3};
  for (int q = 0; q < 4; q++) {
    unsigned lo = trans ? pj_rows[w][q * 8 + t][g] : pj_rows[w][q * 8 + g][t];
    unsigned hi = trans ? pj_rows[w][q * 8 + t + 1][g] : pj_rows[w][q * 8 + g][t + 1];
    *r[q] = lo | hi << 16;
  }
  pj_wait(pj_warp_bar[w]);
}
extern "C" char __start_pj_shared[] __attribute__((weak));   // local memory: the section's offsets its addresses
extern "C" char __stop_pj_shared[] __attribute__((weak));
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
static std::vector<pj_pending_wgmma> pj_wgmma_pending[PJ_MAX_THREADS];
static int pj_wgmma_groups[PJ_MAX_THREADS];   // groups committed by each work-item
template <class T, float (*value)(T), int N, int K, bool TA, bool TB>
static void pj_wgmma(float *d, unsigned long long a, unsigned long long b) {
  unsigned t = threadIdx.x;
  pj_wgmma_pending[t].push_back({pj_wgmma_now<T, value, N, K, TA, TB>, d, a, b, pj_wgmma_groups[t]});
}
static void pj_wgmma_drain(int left) {   // wgmma.wait_group: run the committed groups but the last `left`
  std::vector<pj_pending_wgmma> still, &pending = pj_wgmma_pending[threadIdx.x];
  for (auto &p : pending)
    if (p.group < pj_wgmma_groups[threadIdx.x] - left) p.run(p.d, p.a, p.b); else still.push_back(p);
  pending = still;
}
template <class T> static T __shfl_sync(unsigned, T v, int from) {
  unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  pj_xch[w][lane] = bits;
  pj_wait(pj_warp_bar[w]);
  bits = pj_xch[w][from];
  pj_wait(pj_warp_bar[w]);
  memcpy(&v, &bits, sizeof(T));
  return v;
}
static void (*pj_body)();
static void pj_work_item() {   // a fiber's start: the kernel, then the turn passed on for good
  pj_body();
  pj_left[threadIdx.x] = true;
  pj_live--;
  pj_progress++;
  pj_pass_turn(0, pj_threads);
}
static void pj_launch(unsigned blocks, unsigned threads, void (*body)()) {
  if (threads > PJ_MAX_THREADS) abort();
  size_t bytes = threads * (size_t)PJ_STACK;   // (mapped for the launch alone: a process loads many kernels)
  pj_stacks = (char *)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (pj_stacks == MAP_FAILED) abort();
  for (unsigned t = 0; t < threads; t++) mprotect(pj_stacks + t * (size_t)PJ_STACK, 4096, PROT_NONE);   // guard pages
  blockDim.x = threads;
  pj_threads = threads;
  pj_bar = {0, threads, 0, 0};
  for (unsigned w = 0; w < threads / 32; w++) pj_warp_bar[w] = {32 * w, 32, 0, 0};
  pj_body = body;
  for (unsigned b = 0; b < blocks; b++) {
    blockIdx.x = b;
    // local memory starts a block as bytes 0xff (NaN floats, -1 integers) or 0x7f (huge numbers), two blocks each
    memset(__start_pj_shared, b / 2 % 2 ? 0x7f : 0xff, __stop_pj_shared - __start_pj_shared);
    pj_reverse = b % 2;
    pj_live = threads;
    for (unsigned t = 0; t < threads; t++) {
      pj_left[t] = false;
      pj_begin(t);
      pj_wgmma_pending[t].clear();
      pj_wgmma_groups[t] = 0;
    }
    threadIdx.x = pj_reverse ? threads - 1 : 0;
    pj_transfer(PJ_MAIN, threadIdx.x);
  }
  munmap(pj_stacks, bytes);
}
"""


_PTX = {  # the float16 conversions the cuda dialect spells in PTX or takes from libdevice, in C++ (x86-64's F16C:
    # nearest even); widening a NaN gives NVIDIA's canonical NaN (0x7fffffff, sign and payload dropped), as the PTX ISA
    # says cvt does
    'asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));': "f = (h & 0x7fffu) > 0x7c00u ? __uint_as_float(0x7fffffffu) "
                                                      ": _cvtsh_ss(h);",
    'extern "C" __device__ float __nv_half2float(unsigned short);':
        "static float __nv_half2float(unsigned short h) "
        "{ return (h & 0x7fffu) > 0x7c00u ? __uint_as_float(0x7fffffffu) : _cvtsh_ss(h); }",
    'extern "C" __device__ unsigned short __nv_float2half_rn(float);':
        "static unsigned short __nv_float2half_rn(float f) { return _cvtss_sh(f, 0); }",
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
    "pj_wgmma_commit": "static void pj_wgmma_commit() { pj_wgmma_groups[threadIdx.x]++; }",
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
    return SHIM + _kernel_cpp(source, tensor_cores, wgmma)


def _kernel_cpp(source: str, tensor_cores: bool, wgmma: bool) -> str:
    """host_source's text after the shim."""
    for ptx, cpp in _PTX.items():
        source = source.replace(ptx, cpp)
    # dynamic local memory: an array of the most a block may have, in the local memory's section
    source = source.replace("extern __shared__ __align__(1024) unsigned char pj_dynamic_local[];",
                            "__shared__ __align__(1024) unsigned char pj_dynamic_local[227 * 1024];")
    if tensor_cores:
        source = _HELPER.sub(lambda m: _emulated(m.group(1), m.group(0)), source)
    return ("#define __CUDA_ARCH_FEAT_SM90_ALL 1\n" if wgmma else "") + source


FLAGS = ["-std=c++17", "-O1", "-w", *F16C, "-fPIC"]


@functools.cache
def _precompiled_shim(folder: str) -> str:
    """The shim as a precompiled header in `folder` (built once for the shim, FLAGS and the compiler): a kernel's
    compile reads it in a fraction of the time parsing the shim's system headers takes."""
    clang = os.path.realpath(shutil.which("clang++"))
    key = f"{SHIM}{FLAGS}{clang}{os.stat(clang).st_mtime_ns}"
    pch = os.path.join(folder, hashlib.sha256(key.encode()).hexdigest()[:24] + ".pch")
    if not os.path.exists(pch):
        _compile(["-x", "c++-header"], SHIM, pch)
    return pch


def _compile(args: list[str], text: str, out: str):
    """clang++ FLAGS `args` over `text`, to `out` (written whole or not at all: processes share the folder)."""
    part = f"{out}.{os.getpid()}"
    done = subprocess.run(["clang++", *FLAGS, *args, "-", "-o", part], input=text, text=True, capture_output=True)
    if done.returncode:
        raise RuntimeError(f"clang++ {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    os.replace(part, out)


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
    text = _kernel_cpp(src.source, tensor_cores, wgmma) + (
        f"\nstatic void **pj_args;\nstatic void pj_kernel() {{ void **a = pj_args; {src.name}({casts}); }}\n"
        'extern "C" void pj_run(void **a, unsigned blocks, unsigned threads) '
        "{ pj_args = a; pj_launch(blocks, threads, pj_kernel); }\n")
    folder = os.path.join(tempfile.gettempdir(), "prepjit-cuda-emulation")
    os.makedirs(folder, exist_ok=True)
    shim = _precompiled_shim(folder)
    lib = os.path.join(folder, hashlib.sha256((shim + text).encode()).hexdigest()[:24] + ".so")
    if not os.path.exists(lib):
        try:
            _compile(["-shared", "-include-pch", shim, "-x", "c++"], text, lib)
        except RuntimeError:   # a shim precompiled before a system header it read changed: built again, once
            _compile(["-x", "c++-header"], SHIM, shim)
            _compile(["-shared", "-include-pch", shim, "-x", "c++"], text, lib)
    run_fn = ctypes.CDLL(lib).pj_run
    run_fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_uint]
    threads = src.local_size[0]
    pointers = (ctypes.c_void_p * (len(buffers) + len(src.var_names)))(
        *[b.ctypes.data for b in buffers], *[var_values[v] for v in src.var_names])   # (a var: `(long long)a[i]`)
    run_fn(pointers, -(-eval_uop(src.global_size[0], var_values) // threads), threads)
