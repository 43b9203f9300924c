"""A native check that a call's arrays have the dtypes, shapes and strides of an earlier call's: the prepared-call
fast path (jit/replay.py) asks it whether a call's container arrays (a model's weights) are as the last call's, in
place of reading every array's parts into Python tuples and comparing them (SmolLM2's 272 arrays: ~0.3 ms of a
decode step, most of it cache misses on objects the step's weights evicted).

`same_arrays_entry(address, arrays, positions)` is a builtin function of a tuple (`items`): it returns `items`
when each `items[p]` (p in `positions`, a NumPy array as the caller checked) has the dtype object (by identity),
the rank, the shape and the strides that `arrays`' have now, else another object. It reads them from NumPy's
array struct (`data`, `nd`, `dimensions`, `strides`, `base`, `descr` follow PyObject_HEAD), whose offsets
`same_arrays_self_test` checks before use: where it fails, the address is 0 and the fast path reads the parts in
Python. A dtype equal but not identical to the recorded one reads as different: the caller then compares the parts
themselves. The check's table is one int64 array: [n, then per array: position, dtype address, rank, the dims, the
strides]; the entry keeps the dtype objects alive, so no other object takes their addresses.

Compiled with the cpu device's replay module (cpu.py), as a CPython METH_O builtin like cpu_replay's entry.
"""
from __future__ import annotations

import ctypes
import sys

import numpy as np

from .cpu_replay import ARRAY_DATA_OFFSET, METH_O, REFCOUNT_OFFSET, _MethodDef, _new_builtin, tuple_item_ir

ND_OFFSET = ARRAY_DATA_OFFSET + 8         # int nd (padded to 8)
DIMS_OFFSET = ARRAY_DATA_OFFSET + 16      # npy_intp *dimensions
STRIDES_OFFSET = ARRAY_DATA_OFFSET + 24   # npy_intp *strides
DESCR_OFFSET = ARRAY_DATA_OFFSET + 40     # PyArray_Descr *descr (after PyObject *base)

SAME_ARRAYS_IR = f"""
define ptr @prepjit_same_arrays(ptr %self, ptr %items) nounwind {{
entry:
  %table.p = getelementptr i8, ptr %self, i64 {ARRAY_DATA_OFFSET}
  %table = load ptr, ptr %table.p
  %n = load i64, ptr %table
  %first = getelementptr i64, ptr %table, i64 1
  br label %cond
cond:
  %k = phi i64 [0, %entry], [%k.next, %next]
  %e = phi ptr [%first, %entry], [%e.next, %next]
  %more = icmp slt i64 %k, %n
  br i1 %more, label %body, label %same
body:
  %index = load i64, ptr %e
{tuple_item_ir("%items", "%index")}
  %descr.p = getelementptr i8, ptr %obj, i64 {DESCR_OFFSET}
  %descr = load i64, ptr %descr.p
  %want.descr.p = getelementptr i64, ptr %e, i64 1
  %want.descr = load i64, ptr %want.descr.p
  %nd.p = getelementptr i8, ptr %obj, i64 {ND_OFFSET}
  %nd32 = load i32, ptr %nd.p
  %nd = sext i32 %nd32 to i64
  %want.nd.p = getelementptr i64, ptr %e, i64 2
  %want.nd = load i64, ptr %want.nd.p
  %same.descr = icmp eq i64 %descr, %want.descr
  %same.nd = icmp eq i64 %nd, %want.nd
  %same.head = and i1 %same.descr, %same.nd
  br i1 %same.head, label %shape, label %differ
shape:
  %dims.p = getelementptr i8, ptr %obj, i64 {DIMS_OFFSET}
  %dims = load ptr, ptr %dims.p
  %strides.p = getelementptr i8, ptr %obj, i64 {STRIDES_OFFSET}
  %strides = load ptr, ptr %strides.p
  %want.dims = getelementptr i64, ptr %e, i64 3
  %want.strides = getelementptr i64, ptr %want.dims, i64 %nd
  br label %dim.cond
dim.cond:
  %j = phi i64 [0, %shape], [%j.next, %dim.body]
  %dim.more = icmp slt i64 %j, %nd
  br i1 %dim.more, label %dim.body, label %next
dim.body:
  %d.p = getelementptr i64, ptr %dims, i64 %j
  %d = load i64, ptr %d.p
  %wd.p = getelementptr i64, ptr %want.dims, i64 %j
  %wd = load i64, ptr %wd.p
  %s.p = getelementptr i64, ptr %strides, i64 %j
  %s = load i64, ptr %s.p
  %ws.p = getelementptr i64, ptr %want.strides, i64 %j
  %ws = load i64, ptr %ws.p
  %same.d = icmp eq i64 %d, %wd
  %same.s = icmp eq i64 %s, %ws
  %same.ds = and i1 %same.d, %same.s
  %j.next = add i64 %j, 1
  br i1 %same.ds, label %dim.cond, label %differ
next:
  %k.next = add i64 %k, 1
  %twice = mul i64 %nd, 2
  %width = add i64 %twice, 3
  %e.next = getelementptr i64, ptr %e, i64 %width
  br label %cond
same:
  br label %done
differ:
  br label %done
done:
  %result = phi ptr [%items, %same], [%self, %differ]
  %count.p = getelementptr i8, ptr %result, i64 {REFCOUNT_OFFSET}
  %count = load i64, ptr %count.p
  %count.next = add i64 %count, 1
  store i64 %count.next, ptr %count.p
  ret ptr %result
}}
"""


def same_arrays_entry(address: int, arrays, positions):
    """The builtin (prepjit_same_arrays at `address`) that accepts a tuple whose items at `positions` have the
    dtypes, shapes and strides `arrays` (NumPy arrays) have now."""
    table = [len(positions)]
    for position, a in zip(positions, arrays):
        table += [position, id(a.dtype), a.ndim, *a.shape, *a.strides]
    state = np.array(table, np.int64)  # its `self`: the table
    definition = _MethodDef(b"prepjit_same_arrays", address, METH_O, None)
    # the builtin keeps its definition and the dtypes whose addresses it compares in its module slot
    return _new_builtin(ctypes.addressof(definition), state, (definition, tuple(a.dtype for a in arrays)))


def same_arrays_self_test(address: int) -> bool:
    """Does prepjit_same_arrays read NumPy's dtype, rank, shape and strides where this NumPy keeps them, and count
    its result's reference as CPython does?"""
    if not address:
        return False
    base = np.zeros((4, 6), np.float32)
    arrays = (base, np.zeros(3, np.int64), base[:, ::2], np.zeros((), np.float64))
    items = (1, *arrays)
    check = same_arrays_entry(address, arrays, [1, 2, 3, 4])
    like = (None, np.ones((4, 6), np.float32), np.ones(3, np.int64), np.ones((4, 6), np.float32)[:, ::2],
            np.ones((), np.float64))
    reshaped = base.reshape(6, 4)
    others = [(None, reshaped, *arrays[1:]),                      # a shape
              (None, base.T.copy().T, *arrays[1:]),               # the same shape, other strides
              (None, base.view(np.int32), *arrays[1:]),           # a dtype
              (None, base.reshape(24), *arrays[1:]),              # a rank
              (None, *arrays[:3], np.zeros(1, np.float64))]       # a rank from 0
    counts = [sys.getrefcount(x) for x in (items, check.__self__)]
    accepted = check(items) is items and check(like) is like
    refused = all(check(other) is check.__self__ for other in others)
    return accepted and refused and [sys.getrefcount(x) for x in (items, check.__self__)] == counts
