"""The CPU that LLVM kernels are compiled for: the host's, or the one PREPJIT_CPU names.

One home for the fact, read by both the cpu device (its target machine and compiler id) and
codegen's `host_target()` (the vector unit blocks are sized by). `PREPJIT_CPU=haswell` (any LLVM
CPU name: `x86-64-v3`, `skylake-avx512`, ...) compiles for that CPU's own features, less those this
host lacks (each turned off with `-name`), so the code still runs here. The vector unit is read off
what LLVM makes of a 512-bit vector add for that target machine: zmm registers (AVX-512), ymm
(AVX/AVX2), or neither. It imports only the standard library, llvmlite and errors.py.
"""
from __future__ import annotations

import functools
import os
import tempfile

import attrs

from .errors import DeviceError

# A 16 x float add, asking for 512-bit vectors as the kernels do (render_llvm.function_attributes).
_PROBE_IR = """define void @probe(ptr %p) "prefer-vector-width"="512" {
  %v = load <16 x float>, ptr %p
  %w = fadd <16 x float> %v, %v
  store <16 x float> %w, ptr %p
  ret void
}
"""


@attrs.frozen
class CompileCPU:
    name: str              # LLVM's name of the CPU
    features: str          # LLVM feature string ("+avx2,-avx512f,...") for the target machine
    triple: str
    vector_bytes: int      # widest vector register the kernels get (64: AVX-512, 32: AVX/AVX2, 16: SSE, NEON)
    vector_registers: int  # architectural vector registers (32: AVX-512, NEON; 16: AVX2, SSE)


def _machine(llvm, triple: str, name: str, features: str):
    """A target machine for CPU `name`; DeviceError when LLVM does not know that CPU (LLVM only says so on
    stderr, and a target machine for an unknown CPU can abort the process when it emits code)."""
    with tempfile.TemporaryFile() as err:
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            machine = llvm.Target.from_triple(triple).create_target_machine(cpu=name, features=features, opt=3)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        message = err.read().decode(errors="replace").strip()
    if message:
        raise DeviceError(f"LLVM cannot compile for the CPU {name!r} (PREPJIT_CPU) on {triple}: "
                          f"{message.splitlines()[0]}")
    return machine


def _vector_unit(llvm, machine) -> tuple[int, int]:
    """(vector bytes, vector registers) of the kernels `machine` compiles."""
    module = llvm.parse_assembly(_PROBE_IR)
    module.triple = machine.triple
    module.data_layout = str(machine.target_data)
    asm = machine.emit_assembly(module)
    if "zmm" in asm:
        return 64, 32
    if "ymm" in asm:
        return 32, 16
    return 16, 32 if machine.triple.startswith(("aarch64", "arm64")) else 16


@functools.cache
def compile_cpu() -> CompileCPU:
    """The CPU kernels compile for: PREPJIT_CPU (restricted to this host's features), else the host's."""
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    triple = llvm.get_default_triple()
    try:
        host = llvm.get_host_cpu_features()
    except RuntimeError:  # LLVM cannot read the flags on this host: the CPU name's defaults
        host = None
    chosen = os.environ.get("PREPJIT_CPU", "").strip()
    if chosen:
        name = chosen
        features = ",".join(f"-{flag}" for flag, on in sorted(host.items()) if not on) if host is not None else ""
    else:
        name, features = llvm.get_host_cpu_name(), host.flatten() if host is not None else ""
    machine = _machine(llvm, triple, name, features)
    vector_bytes, registers = _vector_unit(llvm, machine)
    return CompileCPU(name, features, triple, vector_bytes, registers)
