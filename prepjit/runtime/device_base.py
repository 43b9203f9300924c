"""What the GPU devices (opencl, cuda) share: plan buffers in device memory, a pooled allocator for
per-call staging and results, the moves between host and device, and the whole-plan replay of the
prepared-call fast path (DevicePlanRunner). A backend supplies only the primitives: raw and pooled
allocation, a memory's address and launch handle, and three copies.

Every allocation holds at least MIN_BYTES, so a gated-off load of an empty buffer (it reads element 0)
stays inside it.
"""
from __future__ import annotations

import threading

import numpy as np

from .array import Array
from .launch_steps import KernelStep, ordered_positions

MIN_BYTES = 16


class DeviceBuffer:
    """A plan buffer: `size` elements of `dtype` on device `memory` (several buffers whose lifetimes do
    not overlap may share one memory); `ptr` is its device address."""

    def __init__(self, dtype: np.dtype, size: int, memory, ptr: int):
        self.dtype, self.size, self.memory, self.ptr = np.dtype(dtype), size, memory, ptr

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * self.size


class BufferSlots(list):
    """A GPU launcher's buffer arguments as a list (its PreparedKernel's `buffer_ptrs`) of the device addresses
    they launch with (0: none yet): setting an item to a memory handle (`DeviceBase.arg`) binds it to the kernel's
    argument slot (`bind(slot, handle)`) and holds its address (`address(handle)`), not the handle: a call's
    arrays are not kept alive, nor kept from being donated, by the plan that ran on them."""

    def __init__(self, handles, bind, address):
        super().__init__(0 if h is None else address(h) for h in handles)
        self.bind, self.address = bind, address
        for slot, handle in enumerate(handles):
            bind(slot, handle)

    def __setitem__(self, slot: int, handle):
        self.bind(slot, handle)
        super().__setitem__(slot, self.address(handle))


class DevicePlanRunner:
    """A plan's replay on a GPU device, for the prepared-call fast path (`ExecutionPlan.run_arrays`).

    `run(arrays)` takes the I/O arrays in `io_buffers` order: this device's memory is used in place;
    a NumPy array the plan only reads is uploaded into staging memory this runner keeps for its slot (one
    block per slot, reused while large enough: no allocation per call); a NumPy array the plan writes (a
    gather's flag) is staged the same way and read back after the run. Then the launches run in order, each
    given the plan vars' values from the plan's VarTable first, and the stream is waited for.

    A call usually passes the arrays of the call before (a model's weights, its caches): a slot whose launchers
    hold the array's address already is not bound again (a launcher launches with the address it holds, whoever
    bound it: this runner, the plan's other entries, a runner of the plan less some kernels). A plan of single
    kernels (no loop run from the host) is handed to the device as one sequence (`run_all`), its var values
    written only into the launchers that read them.
    """

    def __init__(self, device, steps: list, io_buffers: list[int], io_slots: dict, var_table):
        self.device, self.steps = device, steps
        # per I/O array: (a launcher's buffer_ptrs, slot) of each place it binds
        self.places = [[(launch.buffer_ptrs, slot) for launch, slot in io_slots[b]] for b in io_buffers]
        self.written = [any(slot in launch.pk.output_indices for launch, slot in io_slots[b]) for b in io_buffers]
        self.values, self.var_slot = var_table.values, var_table.slot
        self.staged: list = [None] * len(io_buffers)   # (memory, its bytes) per slot, once a NumPy array came
        single = all(isinstance(step, KernelStep) for step in steps)
        self.launches = tuple(steps) if single else None   # the launch sequence when it is the same every call
        self.var_args = [(launch, slot, var_table.slot[name]) for launch in steps if single
                         for slot, name in launch.var_slots]

    def stage(self, k: int, nbytes: int):
        held = self.staged[k]
        if held is None or held[1] < nbytes:
            held = self.staged[k] = (self.device._pooled(nbytes), max(nbytes, MIN_BYTES))
        return held[0]

    def run(self, arrays: tuple) -> bool:
        device, readback = self.device, []
        arg, address_of = device.arg, device._address
        device.current()
        for k, a in enumerate(arrays):
            if type(a) is np.ndarray:
                memory = self.stage(k, a.nbytes)
                if self.written[k]:
                    readback.append((a, memory))
                elif a.nbytes:
                    device._upload(memory, a)
            else:  # this device's memory, or a pj.Array of it (a captured array)
                memory = a.buffer if type(a) is Array else a
            handle = arg(memory)
            address = address_of(handle)
            for ptrs, slot in self.places[k]:
                if ptrs[slot] != address:
                    ptrs[slot] = handle
        self.run_launches()
        device.synchronize()
        for a, memory in readback:
            if a.nbytes:
                device._download(a, memory)
        return True

    def run_launches(self):
        values = self.values
        if self.launches is not None:
            for launch, slot, index in self.var_args:
                launch.set_val(slot, values[index])
            self.device.run_all(self.launches)
            return
        var_slot = self.var_slot
        for _, launch in ordered_positions(self.steps):
            for slot, name in launch.var_slots:
                launch.set_val(slot, values[var_slot[name]])
            launch.run()


class DeviceBase:
    """Memory and staging for a device whose memory the host cannot address.

    Backends define `_alloc(nbytes)` (plan-lifetime memory), `_pool_alloc(nbytes)` (memory returned to a
    pool when it is dropped; `_pool_alloc_all(sizes)` where several at once cost less), `_address(memory)` (an int), `arg(memory)` (what a launcher's buffer slot
    takes), `_upload(memory, host)` (asynchronous, in stream order), `_download(host, memory)` (blocking)
    and `_copy(dst, src, nbytes)` (device to device, in stream order).
    """
    device_memory = True  # its buffers live in memory the host cannot address: NumPy inputs are uploaded
    # called (no arguments) by a thread about to wait in `synchronize` for the work it queued, once that work is
    # submitted: what the thread hands to others before it blocks (examples/serve.py's engine worker posts the last
    # step's tokens to its event loop there, so the loop turns them into text while the GPU runs). None: nothing.
    before_wait = None

    def __init__(self):
        # held around the backend's calls that allocate from the pool (pools are not thread-safe); the opencl
        # device holds it around every call into its runtime (opencl.py); reentrant, for a finalizer that runs
        # inside a locked call
        self.lock = threading.RLock()

    # ---- plan buffers ----
    def allocate(self, dtype: np.dtype, size: int) -> DeviceBuffer:
        memory = self._alloc(max(np.dtype(dtype).itemsize * size, MIN_BYTES))
        return DeviceBuffer(dtype, size, memory, self._address(memory))

    def alias(self, buffer: DeviceBuffer, dtype: np.dtype, size: int) -> DeviceBuffer:
        """A buffer of another dtype/size on `buffer`'s memory (for intermediates whose lifetimes do not overlap)."""
        return DeviceBuffer(dtype, size, buffer.memory, buffer.ptr)

    def handle(self, buffer: DeviceBuffer):
        return self.arg(buffer.memory)

    def current(self):
        """Make this device current in the calling thread where the backend needs that (CUDA); else nothing."""

    def run_all(self, launches: tuple):
        """Run `launches` (a plan's launchers, their arguments patched) in order."""
        for launch in launches:
            launch.run()

    def plan_runner(self, steps: list, io_buffers: list[int], io_slots: dict, var_table,
                    dtypes: list) -> DevicePlanRunner:
        """The fast path's replay of a plan's launch steps (see DevicePlanRunner); `io_slots`: buffer ->
        [(launcher, slot)]; `var_table`: the plan's VarTable, whose values the launches read."""
        return DevicePlanRunner(self, steps, io_buffers, io_slots, var_table)

    def read_buffer(self, buffer: DeviceBuffer, shape) -> np.ndarray:
        return self.to_numpy(buffer.memory, shape, buffer.dtype, copy=True)

    def write_buffer(self, buffer: DeviceBuffer, array: np.ndarray):
        flat = np.ascontiguousarray(array, dtype=buffer.dtype).reshape(-1)
        if flat.nbytes:
            self._upload(buffer.memory, flat)
            self.synchronize()

    # ---- per-call memory ----
    def _pooled(self, nbytes: int):
        with self.lock:
            return self._pool_alloc(max(nbytes, MIN_BYTES))

    def _pool_alloc_all(self, sizes: list[int]) -> list:
        """`_pool_alloc` of each size; a backend that sets something up around an allocation does it once here."""
        return [self._pool_alloc(nbytes) for nbytes in sizes]

    def input_handle(self, arg) -> tuple[object, object]:
        """(kernel argument, object to keep alive): this device's arrays pass as they are; NumPy is copied
        into a pooled buffer of its own size (kept alive, with the array, until the call synchronises)."""
        if isinstance(arg, Array) and arg._device is self:
            return self.arg(arg.buffer), arg
        data = np.ascontiguousarray(arg)
        memory = self._pooled(data.nbytes)
        if data.nbytes:
            self._upload(memory, data)
        return self.arg(memory), (memory, data)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype):
        """Fresh device memory for an array of `shape` and `dtype` (from the pool)."""
        return self._pooled(_nbytes(shape, dtype))

    def empties(self, shapes: list[tuple[int, ...]], dtypes: list[np.dtype]) -> list:
        """`empty` of each shape and dtype (a call's outputs), allocated together (`_pool_alloc_all`)."""
        sizes = [max(_nbytes(shape, dtype), MIN_BYTES) for shape, dtype in zip(shapes, dtypes)]
        with self.lock:
            return self._pool_alloc_all(sizes)

    def new_output(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[object, Array]:
        memory = self.empty(shape, dtype)
        return self.arg(memory), Array(memory, shape, dtype, self)

    def copy_array(self, array: Array) -> Array:
        nbytes = array.size * array.dtype.itemsize
        memory = self._pooled(nbytes)
        if nbytes:
            self._copy(memory, array.buffer, nbytes)
        return Array(memory, array.shape, array.dtype, self)

    def to_numpy(self, memory, shape, dtype, copy: bool) -> np.ndarray:
        out = np.empty(shape, dtype)
        if out.nbytes:
            self._download(out, memory)
        return out


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    nbytes = np.dtype(dtype).itemsize
    for d in shape:
        nbytes *= d
    return nbytes
