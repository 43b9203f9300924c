"""Permission for this process to use AMX tiles (Intel's Advanced Matrix Extensions), asked of Linux once.

Linux keeps the 8 KB tile data state (XFEATURE_XTILEDATA, 18) off for a process until it asks with
arch_prctl(ARCH_REQ_XCOMP_PERM); an AMX instruction run before then faults (SIGILL). The cpu device asks when it
is created (runtime/cpu.py) and codegen's `host_target()` blocks contractions on tiles only where this returned
True, so a kernel falls back to vector code on another OS, an older kernel, or a hypervisor that refuses.
It imports only the standard library.
"""
from __future__ import annotations

import ctypes
import functools
import platform
import sys

SYS_ARCH_PRCTL = 158           # x86-64 Linux system call number of arch_prctl
ARCH_REQ_XCOMP_PERM = 0x1023   # request permission for a dynamically enabled XSAVE feature
XFEATURE_XTILEDATA = 18        # the AMX tile data state


@functools.cache
def amx_tiles_permitted() -> bool:
    """Whether this process may use AMX tiles: asks Linux for the tile data state once (granted for the whole
    process, every thread); False off x86-64 Linux or when refused."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False
