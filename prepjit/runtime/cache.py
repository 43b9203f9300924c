"""The kernel cache: one compiled kernel per (AST, device, compiler identity) per process."""
from __future__ import annotations

import threading
from typing import Callable

import attrs


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


class KernelCache:
    """In-memory kernel cache; `get_or_build` compiles on a miss and reports whether it did."""

    def __init__(self):
        self.entries: dict = {}
        self.lock = threading.Lock()
        self.hits = self.misses = 0

    def get_or_build(self, key, build: Callable[[], CachedKernel]) -> tuple[CachedKernel, bool]:
        with self.lock:
            kernel = self.entries.get(key)
            if kernel is not None:
                self.hits += 1
                return kernel, False
        kernel = build()
        with self.lock:
            kernel = self.entries.setdefault(key, kernel)
            self.misses += 1
        return kernel, True

    def clear(self):
        with self.lock:
            self.entries.clear()


kernel_cache = KernelCache()
