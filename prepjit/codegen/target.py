"""The CPU that LLVM kernels are compiled for, as the facts the optimisation passes size blocks by.

`host_target()` reads them from the machine this process runs on: the vector width and number of
vector registers of the CPU the cpu device compiles for (llvm_cpu.py: the host's, or PREPJIT_CPU's),
the data cache sizes from the kernel's cache description, and whether it has AVX512_BF16's dot product
(vdpbf16ps) and AMX_BF16's tiles (tdpbf16ps, where Linux lets this process use them: amx_tiles.py). Passes take
a `CPUTarget` argument, so a test can ask what a kernel becomes on another host (`AVX2`, `AVX512`).
"""
from __future__ import annotations

import functools
import os

import attrs

from ..amx_tiles import amx_tiles_permitted
from ..llvm_cpu import compile_cpu


@attrs.frozen
class CPUTarget:
    cpu: str                 # LLVM's name of the CPU
    vector_bytes: int        # widest vector register the kernels use (64: AVX-512, 32: AVX/AVX2, 16: SSE, NEON)
    vector_registers: int    # architectural vector registers (32: AVX-512, NEON; 16: AVX2, SSE)
    l1_bytes: int = 32 << 10
    l2_bytes: int = 1 << 20
    bf16_dot: bool = False   # AVX512_BF16's vdpbf16ps: pairs of bfloat16 products summed into float32 lanes
    amx_bf16: bool = False   # AMX_BF16's tdpbf16ps: 16 x 32 by 32 x 16 bfloat16 tiles into 16 x 16 float32 (amx.py)

    def lanes(self, itemsize: int) -> int:
        return max(1, self.vector_bytes // itemsize)


AVX2 = CPUTarget("haswell", 32, 16)
AVX512 = CPUTarget("skylake-avx512", 64, 32)
AVX512_BF16 = CPUTarget("sapphirerapids", 64, 32, bf16_dot=True)
AMX_BF16 = CPUTarget("sapphirerapids", 64, 32, bf16_dot=True, amx_bf16=True)


def _cache_bytes(level: int) -> int | None:
    """The size of this CPU's level-`level` data (or unified) cache, or None when the system does not say."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(root)):
            path = os.path.join(root, entry)
            with open(os.path.join(path, "level")) as f:
                if int(f.read()) != level:
                    continue
            with open(os.path.join(path, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(path, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    name = {1: "SC_LEVEL1_DCACHE_SIZE", 2: "SC_LEVEL2_CACHE_SIZE"}[level]
    try:
        size = os.sysconf(name)
    except (ValueError, OSError):
        return None
    return size if size > 0 else None


@functools.cache
def host_target() -> CPUTarget:
    """The facts of the CPU this process runs on (its vector unit: that of the CPU the kernels compile for)."""
    cpu = compile_cpu()
    l1, l2 = _cache_bytes(1), _cache_bytes(2)
    return CPUTarget(cpu.name, cpu.vector_bytes, cpu.vector_registers, l1 or 32 << 10, l2 or 1 << 20,
                     bf16_dot=_has_bf16_dot(cpu.features, cpu.vector_bytes),
                     amx_bf16=_has_amx_bf16(cpu.features, cpu.vector_bytes))


def _has_bf16_dot(features: str, vector_bytes: int) -> bool:
    """Whether kernels may use vdpbf16ps: LLVM's feature list for the CPU they compile for turns AVX512_BF16 on
    (the host's list; a PREPJIT_CPU's names only the features this host lacks, so its kernels never use it) and
    they get 512-bit vectors."""
    return vector_bytes == 64 and "+avx512bf16" in features.split(",")


def _has_amx_bf16(features: str, vector_bytes: int) -> bool:
    """Whether kernels may use AMX_BF16 tiles: the CPU they compile for has them (a PREPJIT_CPU's never: as for
    vdpbf16ps), its vectors are 512 bits (a tile row is one) and Linux let this process use them."""
    flags = features.split(",")
    return vector_bytes == 64 and "+amx-bf16" in flags and "+amx-tile" in flags and amx_tiles_permitted()
