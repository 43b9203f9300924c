"""Local structural classes of a graph's nodes, so that fusion decides each of a model's identical blocks once.

choose_materialized decides with a residual stream's values cut (fusion._guessed_cuts): what a block's decisions read
then stops at the stream value below it. The graph falls into regions: each node belongs to the one node above it
whose region it is read in (its `top`): a cut, a buffer's node (REALIZED but a reduction), a node nothing reads, or
a node read from two regions (a RoPE table's rows that every block reads, a block's keys that the stacked cache
reads too), which is a region's top of its own. A node's class is its op, dtype and arg and its operands' classes,
where an operand that is a cut, a buffer's node or another region's top is a reference numbered in the order its
region first reads it (so two blocks reading other weights at the same places are alike, and a block reading one
weight twice is not like one reading two), with its kind: a cut's or a buffer's op, dtype and shape; another top's
class and the numbers its own references have in the reading region (what it reads that the region reads too). A
slice of a reference is one reference too, its starts left out (each block's rows of a stacked KV cache: fusion's
decisions read a slice's shape, never its starts).

Two nodes whose tops are of one class and who are of one class are the same node of two alike regions (`key`): what
decides them, their expressions and the kernels reading them down to the cuts, is alike, so they are decided alike.
"""
from __future__ import annotations

from ..uop import Ops, UOp
from .lower import REALIZED

_MANY = object()  # (a node read from two regions: a top of its own)


def local_classes(graph: list[UOp], cuts: frozenset) -> Classes:
    """The classes of the nodes of a parents-first graph (kernel_roots'), `cuts` read as buffers: see the module
    docstring."""
    top: dict[UOp, UOp] = {}
    for n in graph:  # parents first: a node's readers are done before it
        region = top.get(n, _MANY)
        if region is _MANY or n in cuts or n.op in REALIZED and n.op is not Ops.REDUCE_AXIS:
            region = n
        top[n] = region
        for s in n.src:
            if top.get(s, region) is not region:
                top[s] = _MANY
            else:
                top[s] = region
    intern: dict[tuple, int] = {}
    cls: dict[UOp, int] = {}
    numbers: dict[tuple, int] = {}  # (region, reference) -> its number there
    order: dict[UOp, list] = {}  # region -> its references in the order of their numbers

    def number(region: UOp, ref: UOp) -> int:
        found = numbers.get((region, ref))
        if found is None:
            refs = order.setdefault(region, [])
            refs.append(ref)
            found = numbers[region, ref] = len(refs)
        return found

    def reference(region: UOp, s: UOp) -> tuple:
        if s.op is Ops.SHRINK and top[s] is not s:  # a slice of a reference
            return Ops.SHRINK, s.shape, reference(region, s.src[0]), number(region, s)
        if s in cuts or s.op in REALIZED and s.op is not Ops.REDUCE_AXIS:
            return s.op, s.dtype.name, s.shape, number(region, s)
        return cls[s], number(region, s), tuple([number(region, ref) for ref in order.get(s, ())])  # another top
    special = {n for n, t in top.items() if t is n}  # the references: tops and their slices
    special.update(n for n in graph if n.op is Ops.SHRINK and top[n.src[0]] is n.src[0])
    for n in reversed(graph):  # children first
        if special.isdisjoint(n.src):
            refs = tuple([cls[s] for s in n.src])
        else:
            refs = tuple([reference(top[n], s) if s in special else cls[s] for s in n.src])
        cls[n] = intern.setdefault((n.op, n.dtype.name, n.arg, refs), len(intern))  # (args equal under ==, a
        # constant's 0.0 and -0.0: the decisions read no constant's value)
    return Classes(top, cls)


class Classes:
    """local_classes' answer: `key(n)` is (n's top's class, n's class)."""

    def __init__(self, top: dict, cls: dict):
        self.top, self.cls = top, cls

    def key(self, n: UOp) -> tuple[int, int]:
        return self.cls[self.top[n]], self.cls[n]

