"""Fresh host output arrays without fresh page faults: a bounded pool of large blocks reused once unused.

Every prepared call returns new output arrays. A large `np.empty` is a fresh mapping whose pages
fault in on first write, which costs about as much as the kernel writing them. `empty(shape,
dtype)` hands out large outputs on pooled blocks instead, keeping outputs fresh (a later call never
changes an earlier result): each output array is built on a `_Lease`, a small owner object that
holds the block; NumPy keeps that owner as the `base` of the array and of every view, slice or
reshape of it, so the lease dies only once no array can reach the memory, and only then does its
`__del__` return the block to the pool. (A memoryview of a NumPy block would not do: NumPy
collapses `base` through the memoryview to the block itself, so the memoryview dies at once.)

Only blocks of at least MIN_POOLED_BYTES are pooled; at most MAX_IDLE_BYTES of unused blocks are
kept, the oldest dropped first.
"""
from __future__ import annotations

import threading

import numpy as np

MIN_POOLED_BYTES = 1 << 20
MAX_IDLE_BYTES = 256 << 20
PAGE = 4096


class _Lease:
    """The owner (`base`) of arrays on one pooled block; returns the block when the last of them is gone."""

    __slots__ = ("__array_interface__", "pool", "block")

    def __init__(self, pool: "HostPool", block: tuple, shape: tuple, dtype: np.dtype):
        self.pool, self.block = pool, block
        self.__array_interface__ = {"data": (block[2], False), "shape": shape, "typestr": dtype.str, "version": 3}

    def __del__(self):
        self.pool.give_back(self.block)


class HostPool:
    """Idle blocks, most recently returned last; `take` reuses one of the right size or allocates a new one.

    `give_back` runs from a lease's `__del__`, which may fire in any thread, or inside this pool's own
    critical sections (a garbage collection started by an allocation): hence the re-entrant lock, and
    critical sections that leave the lists consistent between any two steps.
    """

    def __init__(self, max_idle_bytes: int = MAX_IDLE_BYTES):
        self.max_idle_bytes = max_idle_bytes
        self.idle: list[tuple] = []   # (nbytes, np.uint8 block, data pointer)
        self.idle_bytes = 0
        self.lock = threading.RLock()

    def take(self, nbytes: int) -> tuple:
        with self.lock:
            for k in range(len(self.idle) - 1, -1, -1):
                if self.idle[k][0] == nbytes:
                    block = self.idle.pop(k)
                    self.idle_bytes -= nbytes
                    return block
        data = np.empty(nbytes, np.uint8)
        return nbytes, data, data.ctypes.data

    def give_back(self, block: tuple):
        with self.lock:
            self.idle.append(block)
            self.idle_bytes += block[0]
            while self.idle_bytes > self.max_idle_bytes:
                self.idle_bytes -= self.idle.pop(0)[0]

    def empty(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """A new C-contiguous array that no other live array shares memory with."""
        nbytes = _nbytes(shape, dtype)
        if nbytes < MIN_POOLED_BYTES:
            return np.empty(shape, dtype)
        block = self.take(-(-nbytes // PAGE) * PAGE)
        leased = np.asarray(_Lease(self, block, shape, dtype))
        return leased if leased.dtype == dtype else leased.view(dtype)   # ml_dtypes' types come back as void


def _nbytes(shape: tuple, dtype: np.dtype) -> int:
    nbytes = dtype.itemsize
    for d in shape:
        nbytes *= d
    return nbytes


host_pool = HostPool()
empty = host_pool.empty


def allocator_for(shape: tuple, dtype: np.dtype):
    """`empty`, or plain `np.empty` when an output of this (fixed) shape is too small to be pooled."""
    return np.empty if _nbytes(shape, dtype) < MIN_POOLED_BYTES else empty
