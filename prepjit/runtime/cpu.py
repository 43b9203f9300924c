"""The cpu device: LLVM IR compiled by llvmlite for the host CPU, launched through ctypes."""
from __future__ import annotations

import ctypes
import hashlib
import threading

import numpy as np

from ..errors import CompileError
from .buffer import HostBuffer

KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


class CPUProgram:
    """A compiled kernel: the JIT engine that owns the code, and its ctypes entry point."""

    def __init__(self, engine, fn):
        self.engine, self.fn = engine, fn

    def __call__(self, bufs_ptr: int, vals_ptr: int, start: int, end: int):
        self.fn(bufs_ptr, vals_ptr, start, end)


class CPUDevice:
    """Compiles LLVM IR (optimised at -O3, vectorised for the host CPU) and allocates host buffers."""

    name = "cpu"
    language = "llvm"

    def __init__(self):
        import llvmlite.binding as llvm
        self.llvm = llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
        self.cpu_name, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
        self.target_machine = target.create_target_machine(cpu=self.cpu_name, features=features, opt=3,
                                                           reloc="pic", codemodel="default")
        version = ".".join(map(str, llvm.llvm_version_info))
        self.compiler_id = f"llvm-{version}-{self.cpu_name}-{hashlib.sha1(features.encode()).hexdigest()[:12]}"
        self.lock = threading.Lock()

    def compile(self, name: str, source: str) -> CPUProgram:
        llvm = self.llvm
        with self.lock:
            try:
                module = llvm.parse_assembly(source)
                module.triple = self.target_machine.triple
                module.data_layout = str(self.target_machine.target_data)
                module.verify()
                options = llvm.create_pipeline_tuning_options(speed_level=3)
                options.loop_vectorization = True
                options.slp_vectorization = True
                builder = llvm.create_pass_builder(self.target_machine, options)
                builder.getModulePassManager().run(module, builder)
                engine = llvm.create_mcjit_compiler(module, self.target_machine)
                engine.finalize_object()
            except RuntimeError as e:
                raise CompileError(f"LLVM failed to compile kernel {name}: {e}\n--- source ---\n{source}") from e
            fn = KERNEL_FN(engine.get_function_address(name))
        return CPUProgram(engine, fn)

    def allocate(self, dtype: np.dtype, size: int) -> HostBuffer:
        return HostBuffer(dtype, size)
