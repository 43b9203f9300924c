"""Memory planning: intermediates whose lifetimes do not overlap share one allocation.

Lifetimes are spans of kernel positions in the schedule (fori_loop bodies are already unrolled,
so a body buffer lives across the whole loop). Inputs and outputs never share: the caller
supplies them on every call.
"""
from __future__ import annotations

from .schedule import Schedule


MIN_BYTES = 16  # a gated or clamped load of an empty buffer still reads element 0: keep it allocated


def nbytes(spec) -> int:
    return max(MIN_BYTES, spec.dtype.itemsize * spec.max_size)


def share_memory(sched: Schedule) -> list[int]:
    """For each buffer, the buffer whose allocation it lives in (itself when it has its own)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, kernel in sched.kernels.boundary():  # a loop's first and last iterations stand for all of them
        for b in kernel.buffers:
            first.setdefault(b, k)
            last[b] = k
    home = list(range(len(sched.buffers)))
    io = set(sched.inputs) | set(sched.outputs)
    groups: list[list] = []  # [home buffer, last kernel using it, bytes]
    for b in sorted((b for b in first if b not in io), key=lambda b: first[b]):
        free = [g for g in groups if g[1] < first[b]]
        if free:  # the smallest allocation that is big enough, else the biggest (it grows)
            fits = [g for g in free if g[2] >= nbytes(sched.buffers[b])]
            group = min(fits, key=lambda g: g[2]) if fits else max(free, key=lambda g: g[2])
            home[b] = group[0]
            group[1], group[2] = last[b], max(group[2], nbytes(sched.buffers[b]))
        else:
            groups.append([b, last[b], nbytes(sched.buffers[b])])
    return home
