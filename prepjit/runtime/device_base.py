"""What the GPU devices (opencl, cuda) share: plan buffers in device memory, a pooled allocator for
per-call staging and results, and the moves between host and device. A backend supplies only the
primitives: raw and pooled allocation, a memory's address and launch handle, and three copies.

Every allocation holds at least MIN_BYTES, so a gated-off load of an empty buffer (it reads element 0)
stays inside it.
"""
from __future__ import annotations

import threading

import numpy as np

from .array import Array

MIN_BYTES = 16


class DeviceBuffer:
    """A plan buffer: `size` elements of `dtype` on device `memory` (several buffers whose lifetimes do
    not overlap may share one memory); `ptr` is its device address."""

    def __init__(self, dtype: np.dtype, size: int, memory, ptr: int):
        self.dtype, self.size, self.memory, self.ptr = np.dtype(dtype), size, memory, ptr

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * self.size


class DeviceBase:
    """Memory and staging for a device whose memory the host cannot address.

    Backends define `_alloc(nbytes)` (plan-lifetime memory), `_pool_alloc(nbytes)` (memory returned to a
    pool when it is dropped), `_address(memory)` (an int), `arg(memory)` (what a launcher's buffer slot
    takes), `_upload(memory, host)` (asynchronous, in stream order), `_download(host, memory)` (blocking)
    and `_copy(dst, src, nbytes)` (device to device, in stream order).
    """

    def __init__(self):
        self.pool_lock = threading.Lock()

    # ---- plan buffers ----
    def allocate(self, dtype: np.dtype, size: int) -> DeviceBuffer:
        memory = self._alloc(max(np.dtype(dtype).itemsize * size, MIN_BYTES))
        return DeviceBuffer(dtype, size, memory, self._address(memory))

    def alias(self, buffer: DeviceBuffer, dtype: np.dtype, size: int) -> DeviceBuffer:
        """A buffer of another dtype/size on `buffer`'s memory (for intermediates whose lifetimes do not overlap)."""
        return DeviceBuffer(dtype, size, buffer.memory, buffer.ptr)

    def handle(self, buffer: DeviceBuffer):
        return self.arg(buffer.memory)

    def read_buffer(self, buffer: DeviceBuffer, shape) -> np.ndarray:
        return self.to_numpy(buffer.memory, shape, buffer.dtype, copy=True)

    def write_buffer(self, buffer: DeviceBuffer, array: np.ndarray):
        flat = np.ascontiguousarray(array, dtype=buffer.dtype).reshape(-1)
        if flat.nbytes:
            self._upload(buffer.memory, flat)
            self.synchronize()

    # ---- per-call memory ----
    def _pooled(self, nbytes: int):
        with self.pool_lock:
            return self._pool_alloc(max(nbytes, MIN_BYTES))

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

    def new_output(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[object, Array]:
        memory = self._pooled(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
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
