"""The cuda device: CUDA C kernels compiled by NVRTC to cubin for the GPU's arch, loaded and launched through
the driver (cuda_driver.py) on one stream; pycuda provides the context, the stream, memory and copies.

`device="cuda"` is GPU 0, `"cuda:N"` GPU N. Compiling is `source -> cubin bytes` (nvrtc.py), so
binaries go to the kernel and disk caches keyed by the compiler identity: GPU name, arch, driver and
NVRTC versions. Each PreparedKernel gets its own packed argument buffer (cuda_driver.PackedArgs: 8 bytes a
slot: buffer addresses, then int64 vars, then any tensor maps: cuda_tensor_maps.py), built once; replay patches
only the var slots and I/O addresses (and re-encodes the tensor maps that read them).
Launches wait for the next stream operation (a copy or a sync); a sequence of launches seen twice runs
from a CUDA graph after that, updating only the kernel nodes whose arguments or grid changed
(`PREPJIT_CUDA_GRAPHS=0` launches each kernel at once instead); with `PREPJIT_CUDA_PROGRAMMATIC=1`, on Hopper a graph
launches each kernel while the one before runs, its blocks waiting on the device for that grid (programmatic
dependent launch: cuda_driver.Graph; opt-in: on an H100 a SmolLM2 decode step took 0.98 ms either way). Results
stay on the GPU until read; arrays of this device passed to another prepared function on it are used in place.
Importing prepjit never imports pycuda: the device is created on first use, and without pycuda, a driver or a GPU
it raises `DeviceError` saying what to install.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import functools
import logging
import os
import struct
import threading

import numpy as np

from ..errors import CompileError, DeviceError
from . import compile_pool
from .cuda_driver import Driver, Graph, KernelNodeParams, PackedArgs
from .cuda_tensor_maps import TensorMapArgs, TensorMapEncoder
from .device_base import MIN_BYTES, BufferSlots, DeviceBase
from .launch_steps import KernelStep

INSTALL_HINT = "pip install 'prepjit[cuda]' (pycuda, built against the CUDA toolkit) on a machine with an NVIDIA GPU"
_SLOT = struct.Struct("<Q")    # a buffer address
_VAL = struct.Struct("<q")     # an int64 var
# pycuda's pool takes the current context when it starts holding freed blocks, and a dropped allocation can
# start that in any thread, outside any context (pycuda then aborts the process). So the pool always holds
# one block of a size no allocation asks for (they all are at least MIN_BYTES): it never stops holding.
_RESERVE_BYTES = MIN_BYTES // 2
GRAPH_CACHE_SIZE = 256          # launch sequences remembered (graphs of those seen twice)
_UNSEEN, _SEEN_ONCE = object(), object()
_current = threading.local()   # .context: the context handle `CUDADevice.current` made current in this thread
log = logging.getLogger("prepjit")


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
    """A loaded module, its kernel function, the block size the kernel declares, the dynamic local memory its
    launches pass and whether it waits for the grids launched before it (a graph may then launch it early)."""

    def __init__(self, device, module, function, name: str, block: int, shared: int = 0, waits: bool = False):
        self.device, self.module, self.function, self.name, self.block = device, module, function, name, block
        self.shared, self.waits = shared, waits

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter exit the driver may be gone already
            self.device.current()
            self.device.driver.unload(self.module)


class CUDALauncher(KernelStep):
    """One PreparedKernel's packed argument buffer; replay patches slots in place and queues the launch on
    the device (which launches it at once, or with the rest of the plan from a CUDA graph). `version` counts the
    changes of its grid and argument bytes (what a graph's node of it must match); `grid` is the grid of its next
    launch, computed again when a var changes (vars change only through `set_val`)."""

    def __init__(self, device, program: CUDAProgram, buffer_handles, vals, size_fn, static_size, tensor_maps=None):
        self.device, self.program = device, program
        self.queued = False   # waiting in the device's queue: its arguments must not change before it launches
        self.version = 0
        self.n_bufs, self.vals = len(buffer_handles), list(vals)
        maps, values_fn = tensor_maps or ((), None)   # (codegen/tensor_maps.py's, and their values from the vars)
        self.args = PackedArgs(self.n_bufs + len(self.vals), len(maps))
        self.maps = None
        self.buffer_ptrs = BufferSlots(buffer_handles, self._bind_buffer, device._address)  # (the PreparedKernel's buffer_ptrs)
        for slot, value in enumerate(self.vals):
            _VAL.pack_into(self.args.buffer, 8 * (self.n_bufs + slot), value)
        if maps:
            self.maps = TensorMapArgs(device.tensor_map_encoder, maps, values_fn, self.args.map_offsets)
            self.map_buffers = {m.buffer for m in maps}
            self._refresh_maps()
        self.block = program.block
        self.size_fn = size_fn
        self.static = static_size is not None
        self.grid = -(-static_size // self.block) if self.static else self._dynamic_grid()
        kernel_params, extra = self.args.addresses()
        self.params = KernelNodeParams(func=program.function.value, grid=(self.grid, 1, 1), block=(self.block, 1, 1),
                                       shared=program.shared, kernel_params=kernel_params, extra=extra)

    def _dynamic_grid(self) -> int:
        return -(-self.size_fn(self.vals)[0] // self.block)

    def _bind_buffer(self, slot: int, handle: int | None):
        address = handle or 0
        if _SLOT.unpack_from(self.args.buffer, 8 * slot)[0] != address:
            if self.queued:
                self.device.flush()
            _SLOT.pack_into(self.args.buffer, 8 * slot, address)
            self.version += 1
            if self.maps is not None and slot in self.map_buffers:
                self._refresh_maps()

    def set_val(self, slot: int, value: int):
        if self.vals[slot] != value:
            if self.queued:
                self.device.flush()
            self.vals[slot] = value
            _VAL.pack_into(self.args.buffer, 8 * (self.n_bufs + slot), value)
            if not self.static:
                self.grid = self._dynamic_grid()
            self.version += 1
            if self.maps is not None:
                self._refresh_maps()

    def _refresh_maps(self):
        """Its tensor maps encoded at its buffers' addresses and vars now (cuda_tensor_maps.py)."""
        self.maps.refresh(self.args.buffer, lambda slot: _SLOT.unpack_from(self.args.buffer, 8 * slot)[0], self.vals)

    def run(self):
        if self.queued:
            self.device.flush()
        if self.grid > 0:
            self.device.enqueue(self)

    def launch(self, stream):
        self.device.driver.check(self.device.driver.lib.cuLaunchKernel(
            self.program.function, self.grid, 1, 1, self.block, 1, 1, self.program.shared, stream, self.args.params,
            self.args.extra),
            "cuLaunchKernel")

    def node_params(self) -> KernelNodeParams:
        """Its graph node's parameters now (the arguments are read from `args`, copied by the driver)."""
        self.params.grid[0] = self.grid
        return self.params


class CUDADevice(DeviceBase):
    """Compiles CUDA C with NVRTC for one GPU and keeps results in its memory."""

    language = "cuda"   # the kernels it runs (codegen/targets.py: their target)

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
        self.driver = Driver()
        self._main_pushed = False
        self._handle = ctypes.c_void_p(self.context.handle)
        with self.pycuda_context():
            self.stream = drv.Stream()
            self.pool = pycuda.tools.DeviceMemoryPool()
            self.pool.allocate(_RESERVE_BYTES).free()
        self._stream = ctypes.c_void_p(self.stream.handle)
        self.use_graphs = os.environ.get("PREPJIT_CUDA_GRAPHS", "1") != "0"
        self.programmatic = os.environ.get("PREPJIT_CUDA_PROGRAMMATIC", "0") == "1"
        self._pending: list[CUDALauncher] = []
        self._graphs: collections.OrderedDict = collections.OrderedDict()
        self._queue_lock = threading.Lock()
        self.stats = {"graphs_built": 0, "graph_replays": 0, "node_updates": 0, "stream_launches": 0,
                      "programmatic_edges": 0}
        major, minor = self.device.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.description = f"{self.device.name()} ({self.arch})"
        # sm_90 builds for its arch-specific target sm_90a, whose 16-bit tiles use wgmma (render_cuda.WGMMA_ARCH)
        built_for = self.arch + ("a" if self.arch == "sm_90" else "")
        self.compiler_id = (f"cuda-{self.device.name()}-{built_for}-driver{drv.get_driver_version()}-"
                            f"nvrtc{self.nvrtc.version[0]}.{self.nvrtc.version[1]}")
        # --fmad=false: an elementwise a * b + c is rounded apart, as NumPy rounds it; a reduction's sum of products
        # is written as fma() (render_c.accumulate), as the cpu's vector reductions and the float32 tiles do
        self.options = [f"-arch={built_for}", "-std=c++17", "--fmad=false"]

    # ---- contexts: CUDA's are current per thread, pycuda's stack of them must be empty when a thread ends ----
    def current(self, force: bool = False):
        """Make the GPU's primary context current in the calling thread (at the driver: nothing to undo later).
        Launches, copies and syncs need only this; every replay reaches it (handle / input_handle) first. The
        context each thread was last given here is remembered (one record for all devices), so only a switch
        of GPU (or `force`, after pycuda popped its stack) calls the driver."""
        if not force and getattr(_current, "context", None) == self._handle.value:
            return
        self.driver.make_current(self._handle)
        _current.context = self._handle.value

    @contextlib.contextmanager
    def pycuda_context(self):
        """Around what creates pycuda objects (memory, streams): the context on pycuda's stack, then off again
        (a thread that ends with it there aborts the process). The main thread keeps it there until exit."""
        if self._main_pushed and threading.current_thread() is threading.main_thread():
            yield
            return
        if threading.current_thread() is threading.main_thread():
            self.context.push()
            self._main_pushed = True
            atexit.register(self.drv.Context.pop)
            yield
            return
        if self.drv.Context.get_current() == self.context:
            yield
            return
        self.context.push()
        try:
            yield
        finally:
            self.drv.Context.pop()
            self.current(force=True)

    # ---- compiling and launching ----
    def compile(self, name: str, source: str) -> bytes:
        """CUDA C -> cubin for this GPU's arch (NVRTC, in-process; `load` makes it launchable)."""
        return self.nvrtc.compile(name, source, self.options)

    def compile_parallel(self, count: int):
        """submit(name, source) -> Future of `compile`'s cubin: NVRTC compiles in threads (ctypes lets go of the
        GIL, and NVRTC allows concurrent calls), a batch of several kernels on several cores at once."""
        return compile_pool.in_threads(self.compile, count)

    def load(self, name: str, binary: bytes) -> CUDAProgram:
        """A cubin from `compile` (this process's or the disk cache's) -> kernel `name`, ready to launch.
        The block size is the kernel's `__launch_bounds__`, read back as its maximum threads per block; its dynamic
        local memory the cubin's pj_dynamic_local_bytes (cuda_cubin.py)."""
        self.current()
        try:
            module, function, block, shared, waits = self.driver.load(binary, name)
        except RuntimeError as e:
            raise CompileError(f"CUDA ({self.description}) failed to load the cubin of kernel {name}: {e}") from e
        return CUDAProgram(self, module, function, name, block, shared, waits)

    def launcher(self, program: CUDAProgram, buffer_handles, vals, size_fn, static_size,
                 tensor_maps=None) -> CUDALauncher:
        """A launcher of `program`; `tensor_maps`: (its kernel's tensor maps, positional var values -> their values)
        where it takes any (codegen/tensor_maps.py)."""
        return CUDALauncher(self, program, buffer_handles, vals, size_fn, static_size, tensor_maps)

    @functools.cached_property
    def tensor_map_encoder(self) -> TensorMapEncoder:
        return TensorMapEncoder(self.driver.lib)

    # ---- graph replay: launches wait for the next stream operation, then run as one CUDA graph ----
    def enqueue(self, launch: CUDALauncher):
        if not self.use_graphs:
            launch.launch(self._stream)
            self.stats["stream_launches"] += 1
            return
        with self._queue_lock:
            launch.queued = True
            self._pending.append(launch)

    def run_all(self, launches: tuple):
        """Queue a plan's launches (their arguments patched) as one unit: after a flush, none of them is queued
        (only their plan queues them, one call at a time), so their arguments can be repacked and they can join
        the queue together."""
        if not self.use_graphs:
            super().run_all(launches)
            return
        self.flush()
        with self._queue_lock:
            pending = self._pending
            for launch in launches:
                if launch.grid > 0:
                    launch.queued = True
                    pending.append(launch)

    def flush(self):
        """Launch what is queued, in order: from the CUDA graph of this sequence of launches (built the second
        time it is seen; only nodes whose grid or arguments changed are updated), or on the stream. Under the
        queue's lock throughout, and a launch counts as queued until it is launched: a thread whose launches
        another thread is flushing waits for that flush (in its own flush, or before patching their arguments)
        rather than returning, or repacking the arguments, while they are being launched."""
        with self._queue_lock:   # (taken even when nothing is pending here: another thread may be launching)
            if not self._pending:
                return
            launches, self._pending = self._pending, []
            try:
                self._launch(launches)
            finally:
                for launch in launches:
                    launch.queued = False

    def _launch(self, launches: list):
        key = tuple(launches)
        graph = self._graphs.get(key, _UNSEEN) if len(launches) > 1 else None
        if graph is _UNSEEN:   # first sight: remember it; a second builds the graph
            self._graphs[key] = _SEEN_ONCE
            if len(self._graphs) > GRAPH_CACHE_SIZE:
                self._graphs.popitem(last=False)
        elif graph is _SEEN_ONCE:
            try:
                graph = self._graphs[key] = Graph(self.driver, launches, self.programmatic)
                self.stats["graphs_built"] += 1
                self.stats["programmatic_edges"] += graph.programmatic_edges
            except RuntimeError as e:  # not capturable here: stream launches from now on
                log.info("cuda: a plan of %d kernels cannot run as a CUDA graph (%s)", len(launches), e)
                graph = self._graphs[key] = None
        if isinstance(graph, Graph):
            self._graphs.move_to_end(key)
            self.stats["node_updates"] += graph.launch(launches, self._stream)
            self.stats["graph_replays"] += 1
            return
        for launch in launches:
            launch.launch(self._stream)
        self.stats["stream_launches"] += len(launches)

    # ---- memory (DeviceBase's primitives) ----
    def _pool_alloc(self, nbytes: int):
        """Plan buffers come from the pool too: a dropped allocation goes back to it, with no CUDA call in
        whatever thread drops it (pycuda frees memory only in the thread that made its context)."""
        return self._pool_alloc_all([nbytes])[0]

    def _pool_alloc_all(self, sizes: list[int]) -> list:
        """Allocations from the pool inside one `pycuda_context` (each takes pycuda's current context): outside
        the main thread (serve.py's engine worker) every entry pushes and pops the context, once a call's outputs."""
        memories = []
        with self.pycuda_context():
            for nbytes in sizes:
                try:
                    memories.append(self.pool.allocate(nbytes))
                except (self.drv.MemoryError, OverflowError) as e:  # OverflowError: past the driver's size_t
                    raise MemoryError(f"CUDA could not allocate {nbytes} bytes on {self.description} ({e})") from None
        return memories

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
        self.current()
        self.flush()
        self.drv.memcpy_htod_async(int(memory), host, self.stream)

    def _download(self, host: np.ndarray, memory):
        """A blocking copy on the legacy default stream, which waits for this device's (blocking) stream."""
        self.current()
        self.flush()
        self.drv.memcpy_dtoh(host, int(memory))

    def _copy(self, dst, src, nbytes: int):
        self.current()
        self.flush()
        self.drv.memcpy_dtod_async(int(dst), int(src), nbytes, self.stream)

    def synchronize(self):
        self.current()
        self.flush()
        if self.before_wait is not None:
            self.before_wait()
        self.stream.synchronize()
