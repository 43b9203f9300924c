"""The cpu JIT survives a crowded address space (issue: LLVM relocation overflow aborted the process).

A child process fills every gap of its mmap area, reserves 3 GB of PROT_NONE address space (costs no
memory) below it and leaves single free pages at the top of that reservation. Small JIT sections then
land in those pages and larger ones 3 GB further down, so a kernel's code and its constants end up more
than 2 GB apart: with a 32-bit PC-relative code model LLVM's loader asserts and the process aborts.
The child checks that its kernels were really placed on both sides of the reservation, so the test
reaches the case it names.
"""
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(r"""
    import ctypes, mmap
    import numpy as np
    import numpy.testing  # every import before the address space is crowded: only the JIT is under test
    import prepjit as pj
    import prepjit.numpy as pnp

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    PAGE = mmap.PAGESIZE
    MAP_NORESERVE, MAP_FIXED_NOREPLACE = 0x4000, 0x100000
    FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE
    SPAN, HOLES = 3 * 2**30, 64

    def mappings():
        out = []
        for line in open("/proc/self/maps"):
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            out.append((lo, hi, fields[1], fields[5] if len(fields) > 5 else ""))
        return sorted(out)

    def reserve(addr, size):  # True where [addr, addr + size) is now ours, False where something is mapped there
        return libc.mmap(addr, size, 0, FLAGS, -1, 0) == addr

    def mmap_area():
        maps = mappings()
        heap_end = max([hi for lo, hi, _, name in maps if name == "[heap]"] or [0])
        return [(lo, hi) for lo, hi, _, name in maps
                if lo > heap_end + 2**40 and name not in ("[stack]", "[vvar]", "[vdso]", "[vsyscall]")]

    pj.prepare(lambda a: a + 1)(np.zeros(4, np.float32))  # the device and its replay program exist first
    area = mmap_area()
    for (_, end), (start, _) in zip(area, area[1:]):
        if start > end:
            reserve(end, start - end)
    # Python may map a new arena below the area while it is crowded: the holes are punched only in a
    # reservation the test owns, never in memory that someone else mapped there (a CI run once unmapped
    # pages of a live arena that way and crashed in pymalloc).
    for attempt in range(10):
        low = min(lo for lo, _ in mmap_area())
        if reserve(low - SPAN, SPAN):
            break
    else:
        raise SystemExit("could not reserve the span below the mmap area")
    for k in range(HOLES):
        libc.munmap(low - (2 * k + 1) * PAGE, PAGE)

    for i in range(40):
        f = pj.prepare(lambda a, b, i=i: pnp.exp(a * (i % 4 + 0.5)) * pnp.tanh(b - i * 0.25) + pnp.sqrt(pnp.abs(a) + 2.0))
        a = np.linspace(-1, 1, 1000 + i, dtype=np.float32)
        b = a[::-1].copy()
        ref = np.exp(a * (i % 4 + 0.5)) * np.tanh(b - i * 0.25) + np.sqrt(np.abs(a) + 2.0)
        np.testing.assert_allclose(np.asarray(f(a, b)), ref, rtol=1e-4, atol=1e-5)

    used = [(lo, perms) for lo, hi, perms, name in mappings() if not name and perms != "---p"]
    in_holes = any(low - 2 * HOLES * PAGE <= lo < low for lo, _ in used)
    below = any(low - SPAN - 2**32 <= lo < low - SPAN for lo, _ in used)
    print("placed", in_holes, below)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="crowds the address space through /proc/self/maps")
def test_kernels_compile_and_run_when_sections_land_far_apart(tmp_path):
    env = {"PREPJIT_CACHE": "0", "PREPJIT_THREADS": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"child exited with {done.returncode}:\n{done.stderr[-3000:]}"
    assert "placed True True" in done.stdout, f"JIT sections did not land on both sides: {done.stdout}"
