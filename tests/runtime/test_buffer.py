"""Host buffers (runtime/buffer.py): large ones are private anonymous memory that transparent huge pages can back."""
import os

import numpy as np
import pytest

from prepjit.runtime.buffer import HUGE_BYTES, aligned_empty

THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def _mapping(address: int) -> dict:
    """/proc/self/smaps's entry for the mapping holding `address`: its header line and kB fields."""
    entry = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                if entry is not None:
                    return entry
                entry = {"header": line} if lo <= address < hi else None
            elif entry is not None and head[0].endswith(":") and len(head) >= 2 and head[1].isdigit():
                entry[head[0][:-1]] = int(head[1])
    return entry


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc")
def test_a_large_buffer_is_private_memory_on_huge_pages():
    """A buffer of HUGE_BYTES or more is its own private anonymous mapping (a shared one is shmem, which the
    kernel backs with 4 KB pages whatever madvise asks), so where transparent huge pages are on or madvised a
    touched buffer sits on 2 MB pages (SmolLM2's float32 weights stream faster from them)."""
    memory = aligned_empty(4 * HUGE_BYTES)
    memory[:] = 1
    entry = _mapping(memory.ctypes.data)
    assert "/dev/zero" not in entry["header"] and entry.get("Shared_Dirty", 0) == 0
    assert entry["Private_Dirty"] >= 4 * HUGE_BYTES // 1024
    if os.path.exists(THP) and "[never]" not in open(THP).read():
        assert entry["AnonHugePages"] > 0
    np.testing.assert_array_equal(memory[:: 1 << 20], 1)
