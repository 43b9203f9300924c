"""The kernel cache: one compiled kernel per (AST, device, compiler identity) per process.

Each key holds a Future, so a kernel that one thread is building is waited for, never built twice.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable

import attrs


class Abandoned(Exception):
    """The thread building a kernel stopped (interrupted) before it finished: a waiter builds it itself."""


@attrs.define(eq=False)
class CachedKernel:
    """A compiled kernel shared by every PreparedKernel with the same AST on the same device."""

    name: str
    source: str
    var_names: tuple[str, ...]
    global_size: tuple          # launch size expressions (UOps) over the vars
    local_size: tuple
    program: object             # the device's callable program
    global_size_fn: Callable    # positional var values -> launch size tuple
    binary: bytes = b""         # the code `program` was loaded from (OpenCL C on PoCL: opencl.py); saved plans store it
    scheduled: object = None    # the kernel AST it was built from, as scheduled (the kernel cache's key)
    ast: object = None          # that kernel as launched (codegen/targets.py): what was rendered and proven
    disk_key: str | None = None  # its disk-cache key (runtime/disk_cache.py; None: not kept on disk)
    # the tensor maps it takes after its vars (codegen/tensor_maps.py, read off `ast`) and positional var values ->
    # their values, flattened; None where it takes none
    tensor_maps: tuple | None = None


class KernelCache:
    """In-memory kernel cache. `claim(key)` gives the key's Future and whether the caller must build it:
    the builder then calls `done(key, kernel)` or `failed(key, error)` (a failure is not kept)."""

    def __init__(self):
        self.entries: dict = {}
        self.lock = threading.Lock()
        self.hits = self.misses = 0

    def claim(self, key) -> tuple[Future, bool]:
        with self.lock:
            future = self.entries.get(key)
            if future is not None:
                self.hits += 1
                return future, False
            self.entries[key] = future = Future()
            self.misses += 1
            return future, True

    def done(self, key, kernel: CachedKernel):
        self.entries[key].set_result(kernel)

    def failed(self, key, error: BaseException):
        with self.lock:
            future = self.entries.pop(key)
        future.set_exception(error)

    def clear(self):
        with self.lock:
            self.entries = {k: f for k, f in self.entries.items() if not f.done()}  # builds in flight stay claimed


kernel_cache = KernelCache()
