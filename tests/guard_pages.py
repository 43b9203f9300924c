"""Arrays that end right before an inaccessible (PROT_NONE) page, so reading one element past them crashes.

`guarded(a)` copies `a` into fresh memory whose last byte is followed by a guard page: any access past
the end (or, for an empty array, any access at all) raises SIGSEGV instead of reading a neighbour's
bytes. Tests that could crash run the risky call in a subprocess or rely on this to fail loudly.
"""
from __future__ import annotations

import ctypes
import mmap

import numpy as np

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_keep: list = []  # the mappings stay alive (and mapped) as long as the process: arrays view them


def guarded(a) -> np.ndarray:
    """A C-contiguous copy of `a` whose memory ends where a PROT_NONE page begins."""
    a = np.ascontiguousarray(a)
    data_pages = max(1, -(-a.nbytes // PAGE))
    mm = mmap.mmap(-1, (data_pages + 1) * PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    if _libc.mprotect(base + data_pages * PAGE, PAGE, 0) != 0:  # PROT_NONE
        raise OSError(ctypes.get_errno(), "mprotect failed")
    _keep.append(mm)
    end = base + data_pages * PAGE
    start = end - a.nbytes
    if a.nbytes:
        ctypes.memmove(start, a.ctypes.data, a.nbytes)
    raw = (ctypes.c_char * max(a.nbytes, 1)).from_address(start if a.nbytes else end - 1)
    out = np.frombuffer(raw, dtype=a.dtype, count=a.size, offset=0 if a.nbytes else 1) if a.nbytes else \
        np.frombuffer(raw, dtype=np.uint8, count=0, offset=1).view(a.dtype)
    out = out.reshape(a.shape)
    assert out.ctypes.data == start or not a.nbytes
    return out
