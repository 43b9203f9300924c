"""The cuda device: CUDA C kernels compiled by NVRTC to cubin for the GPU's arch, loaded and launched
through pycuda on one stream, buffers in device memory.

`device="cuda"` is GPU 0, `"cuda:N"` GPU N. Compiling is `source -> cubin bytes` (nvrtc.py), so
binaries go to the kernel and disk caches keyed by the compiler identity: GPU name, arch, driver and
NVRTC versions. Each PreparedKernel gets its own packed argument buffer (8 bytes a slot: buffer
addresses, then int64 vars), built once; replay patches only the var slots and I/O addresses and
launches it with `cuLaunchKernel`'s buffer form. Results stay on the GPU until read; arrays of this
device passed to another prepared function on it are used in place. Importing prepjit never imports
pycuda: the device is created on first use, and without pycuda, a driver or a GPU it raises
`DeviceError` saying what to install.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import struct

import numpy as np

from ..errors import CompileError, DeviceError
from .device_base import MIN_BYTES, DeviceBase

INSTALL_HINT = "pip install 'prepjit[cuda]' (pycuda, built against the CUDA toolkit) on a machine with an NVIDIA GPU"
_SLOT = struct.Struct("<Q")    # a buffer address
_VAL = struct.Struct("<q")     # an int64 var
# pycuda's pool takes the current context when it starts holding freed blocks, and a dropped allocation can
# start that in any thread, outside any context (pycuda then aborts the process). So the pool always holds
# one block of a size no allocation asks for (they all are at least MIN_BYTES): it never stops holding.
_RESERVE_BYTES = MIN_BYTES // 2


def _import_pycuda():
    try:
        import pycuda
        import pycuda.driver as drv
        import pycuda.tools  # noqa: F401  (DeviceMemoryPool)
    except ImportError as e:  # not installed, or libcuda.so (the driver) missing
        raise DeviceError(f"device 'cuda' needs pycuda and the NVIDIA driver, and failed to import pycuda ({e}); "
                          f"{INSTALL_HINT}") from e
    return pycuda, drv


class CUDAProgram:
    """A loaded module, its kernel function and the block size the kernel declares."""

    def __init__(self, module, function, name: str, block: int):
        self.module, self.function, self.name, self.block = module, function, name, block


class CUDALauncher:
    """One PreparedKernel's packed argument buffer; replay patches slots in place and launches."""

    def __init__(self, stream, program: CUDAProgram, buffer_handles, vals, size_fn, static_size):
        self.launch, self.stream = program.function._launch_kernel, stream
        self.n_bufs, self.vals = len(buffer_handles), list(vals)
        self.args = bytearray(8 * (self.n_bufs + len(self.vals)))
        for slot, handle in enumerate(buffer_handles):
            self.set_buffer(slot, handle or 0)
        for slot, value in enumerate(self.vals):
            _VAL.pack_into(self.args, 8 * (self.n_bufs + slot), value)
        self.block = (program.block, 1, 1)
        self.size_fn, self.static_size = size_fn, static_size
        self.grid = None if static_size is None else self.grid_for(static_size)

    def grid_for(self, size: int) -> tuple[int, int, int]:
        return (-(-size // self.block[0]), 1, 1)

    def set_buffer(self, slot: int, handle: int):
        _SLOT.pack_into(self.args, 8 * slot, handle)

    def set_val(self, slot: int, value: int):
        if self.vals[slot] != value:
            self.vals[slot] = value
            _VAL.pack_into(self.args, 8 * (self.n_bufs + slot), value)

    def run(self):
        grid = self.grid if self.grid is not None else self.grid_for(self.size_fn(self.vals)[0])
        if grid[0] > 0:
            self.launch(grid, self.block, self.args, 0, self.stream)


class CUDADevice(DeviceBase):
    """Compiles CUDA C with NVRTC for one GPU and keeps results in its memory."""

    language = "cuda"

    def __init__(self, index: int = 0):
        super().__init__()
        pycuda, drv = _import_pycuda()
        self.drv = drv
        self.name = "cuda" if index == 0 else f"cuda:{index}"
        try:
            drv.init()
            count = drv.Device.count()
        except drv.Error as e:
            raise DeviceError(f"CUDA failed to start ({e}): no NVIDIA GPU or driver here; {INSTALL_HINT}") from e
        if index >= count:
            raise DeviceError(f"device {self.name!r} asks for GPU {index}, but CUDA sees {count} GPU(s)"
                              f"{'; ' + INSTALL_HINT if count == 0 else ''}")
        from .nvrtc import NVRTC
        self.nvrtc = NVRTC()
        self.device = drv.Device(index)
        self.context = self.device.retain_primary_context()
        self._driver = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
        self._handle = ctypes.c_void_p(self.context.handle)
        with self.pycuda_context():
            self.stream = drv.Stream()
            self.pool = pycuda.tools.DeviceMemoryPool()
            self.pool.allocate(_RESERVE_BYTES).free()
        major, minor = self.device.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.description = f"{self.device.name()} ({self.arch})"
        self.compiler_id = (f"cuda-{self.device.name()}-{self.arch}-driver{drv.get_driver_version()}-"
                            f"nvrtc{self.nvrtc.version[0]}.{self.nvrtc.version[1]}")
        self.options = [f"-arch={self.arch}", "-std=c++17", "--fmad=false"]  # NumPy rounds a*b and +c apart

    # ---- contexts: CUDA's are current per thread, pycuda's stack of them must be empty when a thread ends ----
    def current(self):
        """Make the GPU's primary context current in the calling thread (at the driver: nothing to undo later).
        Launches, copies and syncs need only this; every replay reaches it (handle / input_handle) first."""
        now = ctypes.c_void_p()
        self._driver.cuCtxGetCurrent(ctypes.byref(now))
        if now.value != self._handle.value:
            self._driver.cuCtxSetCurrent(self._handle)

    @contextlib.contextmanager
    def pycuda_context(self):
        """Around what creates pycuda objects (memory, modules, streams): the context on pycuda's stack, then off
        again (a thread that ends with it there aborts the process)."""
        if self.drv.Context.get_current() == self.context:
            yield
            return
        self.context.push()
        try:
            yield
        finally:
            self.drv.Context.pop()
            self.current()

    # ---- compiling and launching ----
    def compile(self, name: str, source: str) -> bytes:
        """CUDA C -> cubin for this GPU's arch (NVRTC, in-process; `load` makes it launchable)."""
        return self.nvrtc.compile(name, source, self.options)

    def load(self, name: str, binary: bytes) -> CUDAProgram:
        """A cubin from `compile` (this process's or the disk cache's) -> kernel `name`, ready to launch.
        The block size is the kernel's `__launch_bounds__`, read back as its maximum threads per block."""
        drv = self.drv
        try:
            with self.pycuda_context():
                module = drv.module_from_buffer(binary)
                function = module.get_function(name)
        except drv.Error as e:
            raise CompileError(f"CUDA ({self.description}) failed to load the cubin of kernel {name}: {e}") from e
        return CUDAProgram(module, function, name, function.get_attribute(drv.function_attribute.MAX_THREADS_PER_BLOCK))

    def launcher(self, program: CUDAProgram, buffer_handles, vals, size_fn, static_size) -> CUDALauncher:
        return CUDALauncher(self.stream, program, buffer_handles, vals, size_fn, static_size)

    # ---- memory (DeviceBase's primitives) ----
    def _pool_alloc(self, nbytes: int):
        """Plan buffers come from the pool too: a dropped allocation goes back to it, with no CUDA call in
        whatever thread drops it (pycuda frees memory only in the thread that made its context)."""
        try:
            with self.pycuda_context():
                return self.pool.allocate(nbytes)
        except self.drv.MemoryError as e:
            raise MemoryError(f"CUDA could not allocate {nbytes} bytes on {self.description} ({e})") from None

    _alloc = _pool_alloc

    def _address(self, memory) -> int:
        return int(memory)

    def arg(self, memory) -> int:
        return int(memory)

    def handle(self, buffer) -> int:
        self.current()   # every replay reaches this or input_handle before its launches
        return buffer.ptr

    def input_handle(self, arg):
        self.current()
        return super().input_handle(arg)

    def _upload(self, memory, host: np.ndarray):
        self.drv.memcpy_htod_async(int(memory), host, self.stream)

    def _download(self, host: np.ndarray, memory):
        self.current()
        self.drv.memcpy_dtoh_async(host, int(memory), self.stream)
        self.stream.synchronize()

    def _copy(self, dst, src, nbytes: int):
        self.current()
        self.drv.memcpy_dtod_async(int(dst), int(src), nbytes, self.stream)

    def synchronize(self):
        self.current()
        self.stream.synchronize()
