"""Segments: a Sequence made of single items and runs whose items are built on access (a fori_loop's
iterations), so a long run costs no object per item. The schedule's kernels and a plan's PreparedKernels
are both such sequences."""
from __future__ import annotations

import bisect
from collections.abc import Sequence


class Run:
    """A segment of many items: subclasses give `__len__` and `item(i)` (the i-th item of the run)."""

    def __len__(self) -> int:
        raise NotImplementedError

    def item(self, i: int):
        raise NotImplementedError


class Segments(Sequence):
    """The items of `segments` (single items, and Runs expanded in place), in order."""

    def __init__(self, segments):
        self.segments = tuple(segments)
        self.starts, n = [], 0
        for seg in self.segments:
            self.starts.append(n)
            n += len(seg) if isinstance(seg, Run) else 1
        self.size = n

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.size))]
        if i < 0:
            i += self.size
        if not 0 <= i < self.size:
            raise IndexError("index out of range")
        s = bisect.bisect_right(self.starts, i) - 1
        seg = self.segments[s]
        return seg.item(i - self.starts[s]) if isinstance(seg, Run) else seg

    def __iter__(self):
        for seg in self.segments:
            if isinstance(seg, Run):
                yield from (seg.item(i) for i in range(len(seg)))
            else:
                yield seg
