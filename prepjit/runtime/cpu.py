"""The cpu device: LLVM IR compiled by llvmlite for the host CPU, launched through ctypes."""
from __future__ import annotations

import ctypes
import hashlib
import threading

import numpy as np

from ..errors import CompileError
from .array import Array
from .buffer import HostBuffer

KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


class CPUProgram:
    """A compiled kernel: the JIT engine that owns the code, and its ctypes entry point."""

    def __init__(self, engine, fn):
        self.engine, self.fn = engine, fn


class CPULauncher:
    """The ctypes argument arrays of one PreparedKernel, built once; replay patches slots in place."""

    def __init__(self, program: CPUProgram, buffer_handles: list[int], vals: list[int], size_fn, static_size):
        self.fn = program.fn
        self.bufs = (ctypes.c_void_p * max(1, len(buffer_handles)))(*buffer_handles)
        self.vals = (ctypes.c_int64 * max(1, len(vals)))(*vals)
        self.bufs_ptr, self.vals_ptr = ctypes.addressof(self.bufs), ctypes.addressof(self.vals)
        self.size_fn, self.static_size = size_fn, static_size

    def set_buffer(self, slot: int, handle: int):
        self.bufs[slot] = handle

    def set_val(self, slot: int, value: int):
        self.vals[slot] = value

    def run(self):
        size = self.static_size if self.static_size is not None else self.size_fn(self.vals)[0]
        if size > 0:
            self.fn(self.bufs_ptr, self.vals_ptr, 0, size)


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

    # ---- compiling and launching ----
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

    def launcher(self, program: CPUProgram, buffer_handles, vals, size_fn, static_size) -> CPULauncher:
        return CPULauncher(program, buffer_handles, vals, size_fn, static_size)

    # ---- memory ----
    def allocate(self, dtype: np.dtype, size: int) -> HostBuffer:
        return HostBuffer(dtype, size)

    def handle(self, buffer: HostBuffer) -> int:
        return buffer.ptr

    def input_handle(self, arg, staging: HostBuffer) -> tuple[int, object]:
        """(kernel handle, object to keep alive) for an argument; NumPy arrays are read in place."""
        data = arg.buffer if isinstance(arg, Array) and arg._device is self else np.asarray(arg)
        return data.ctypes.data, data

    def new_output(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, Array]:
        data = np.empty(shape, dtype)
        return data.ctypes.data, Array(data, shape, dtype, self)

    def copy_array(self, array: Array) -> Array:
        return Array(array.buffer.copy(), array.shape, array.dtype, self)

    def to_numpy(self, buffer: np.ndarray, shape, dtype, copy: bool) -> np.ndarray:
        return buffer.copy() if copy else buffer

    def read_buffer(self, buffer: HostBuffer, shape) -> np.ndarray:
        return buffer.view(shape).copy()

    def write_buffer(self, buffer: HostBuffer, array: np.ndarray):
        buffer.write(array)

    def synchronize(self):
        pass
