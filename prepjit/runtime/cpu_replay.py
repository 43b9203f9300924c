"""Native replay for the cpu: one ctypes call reads the I/O pointers, patches them and the var values
into every kernel's argument arrays, and runs a plan's kernels back to back.

A plan's launches are compiled into a small program (ctypes int64 arrays built once):

    prog: [n_arrays, table, align_masks, n_patches, patches, n_launches, launches, threads]
    table:    int64 slots: the I/O data pointers (read from the arrays)
    patches:  (destination address, source address) pairs: a kernel's buffer or var argument slot, and the
              table slot or the plan's VarTable value slot (var_table.py) it is copied from
    launches: (kernel fn, bufs, vals, end, chunks) entries, each run as fn(bufs, vals, 0, end), or with
              chunks > 1 as prepjit_parallel(threads, fn, bufs, vals, end, chunks) (cpu_threads.py)

`prepjit_replay(prog, arrays)` takes `arrays` as a Python tuple of NumPy arrays and reads their
data pointers itself (CPython's tuple items and NumPy's `data` field, whose offsets are checked
by a self-test before use; if the check fails, Python fills the table instead). It returns 0, or
1 + the index of an array whose data is not aligned for its dtype. Kernels clamp `end` to their
range, so a launch with end = INT64_MAX computes its whole range whatever the var values are.

A prepared call's replay reaches it through `NativeProgram.entry`: a builtin function of `arrays` alone
(`prepjit_replay_method`, a CPython METH_O function whose `self` holds the program), which CPython calls as it
calls len(), without the ~0.3 us of argument conversion a ctypes call costs. Like ctypes it releases the GIL
while the plan runs; it returns `arrays` when the plan ran (with its reference count raised, as a builtin's
result must be). Where its self-test fails (another object header, such as a free-threaded build's), the
entry is the ctypes call.
"""
from __future__ import annotations

import ctypes
import sys
import sysconfig

import numpy as np

INT64_MAX = (1 << 63) - 1
TUPLE_ITEMS_OFFSET = tuple.__basicsize__   # ob_item follows PyObject_VAR_HEAD
ARRAY_DATA_OFFSET = object.__basicsize__   # PyArrayObject's `data` follows PyObject_HEAD
REFCOUNT_OFFSET = object.__basicsize__ - 16  # PyObject ends with ob_refcnt and ob_type (in a build with a GIL)

REPLAY_FN = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.py_object)

PROG_FIELDS = (("n_arrays", "i64"), ("table", "ptr"), ("masks", "ptr"), ("n_patches", "i64"),  # the layout of `prog`
               ("patches", "ptr"), ("n_launches", "i64"), ("launches", "ptr"), ("threads", "ptr"))
_READ_PROG = "\n".join(f"  %{name}.p = getelementptr i64, ptr %prog, i64 {i}\n  %{name} = load {kind}, ptr %{name}.p"
                       for i, (name, kind) in enumerate(PROG_FIELDS))

LAUNCH_FIELDS = 5  # fn, bufs, vals, end, chunks


def tuple_item_ir(items: str, index: str) -> str:
    """LLVM IR lines loading item `index` (an i64 value) of the tuple `items` (a ptr value) into %obj."""
    return (f"  %item.off = mul i64 {index}, 8\n  %item.off2 = add i64 %item.off, {TUPLE_ITEMS_OFFSET}\n"
            f"  %item.p = getelementptr i8, ptr {items}, i64 %item.off2\n  %obj = load ptr, ptr %item.p")


# compiled in one module with cpu_threads.threads_ir(), which defines @prepjit_parallel

REPLAY_IR = f"""
define i64 @prepjit_replay(ptr %prog, ptr %arrays) nounwind {{
entry:
{_READ_PROG}
  br label %arr.cond
arr.cond:
  %i = phi i64 [0, %entry], [%i.next, %arr.store]
  %arr.more = icmp slt i64 %i, %n_arrays
  br i1 %arr.more, label %arr.body, label %patch.cond
arr.body:
{tuple_item_ir("%arrays", "%i")}
  %data.p = getelementptr i8, ptr %obj, i64 {ARRAY_DATA_OFFSET}
  %data = load i64, ptr %data.p
  %mask.p = getelementptr i64, ptr %masks, i64 %i
  %mask = load i64, ptr %mask.p
  %low = and i64 %data, %mask
  %misaligned = icmp ne i64 %low, 0
  br i1 %misaligned, label %fail, label %arr.store
arr.store:
  %slot.p = getelementptr i64, ptr %table, i64 %i
  store i64 %data, ptr %slot.p
  %i.next = add i64 %i, 1
  br label %arr.cond
fail:
  %code = add i64 %i, 1
  ret i64 %code
patch.cond:
  %j = phi i64 [0, %arr.cond], [%j.next, %patch.body]
  %patch.more = icmp slt i64 %j, %n_patches
  br i1 %patch.more, label %patch.body, label %launch.cond
patch.body:
  %pj = mul i64 %j, 2
  %dest.p = getelementptr i64, ptr %patches, i64 %pj
  %dest = load ptr, ptr %dest.p
  %pj1 = add i64 %pj, 1
  %src.p = getelementptr i64, ptr %patches, i64 %pj1
  %src = load ptr, ptr %src.p
  %value = load i64, ptr %src
  store i64 %value, ptr %dest
  %j.next = add i64 %j, 1
  br label %patch.cond
launch.cond:
  %k = phi i64 [0, %patch.cond], [%k.next, %launch.next]
  %launch.more = icmp slt i64 %k, %n_launches
  br i1 %launch.more, label %launch.body, label %done
launch.body:
  %lk = mul i64 %k, {LAUNCH_FIELDS}
  %fn.p = getelementptr i64, ptr %launches, i64 %lk
  %fn = load ptr, ptr %fn.p
  %lk1 = add i64 %lk, 1
  %bufs.p = getelementptr i64, ptr %launches, i64 %lk1
  %bufs = load ptr, ptr %bufs.p
  %lk2 = add i64 %lk, 2
  %vals.p = getelementptr i64, ptr %launches, i64 %lk2
  %vals = load ptr, ptr %vals.p
  %lk3 = add i64 %lk, 3
  %end.p = getelementptr i64, ptr %launches, i64 %lk3
  %end = load i64, ptr %end.p
  %lk4 = add i64 %lk, 4
  %chunks.p = getelementptr i64, ptr %launches, i64 %lk4
  %chunks = load i64, ptr %chunks.p
  %split = icmp sgt i64 %chunks, 1
  br i1 %split, label %launch.split, label %launch.one
launch.split:
  call void @prepjit_parallel(ptr %threads, ptr %fn, ptr %bufs, ptr %vals, i64 %end, i64 %chunks)
  br label %launch.next
launch.one:
  call void %fn(ptr %bufs, ptr %vals, i64 0, i64 %end)
  br label %launch.next
launch.next:
  %k.next = add i64 %k, 1
  br label %launch.cond
done:
  ret i64 0
}}

define ptr @prepjit_replay_method(ptr %self, ptr %arrays) nounwind {{
entry:
  %state.p = getelementptr i8, ptr %self, i64 {ARRAY_DATA_OFFSET}
  %state = load ptr, ptr %state.p
  %prog = load ptr, ptr %state
  %save.p = getelementptr i64, ptr %state, i64 1
  %save = load ptr, ptr %save.p
  %restore.p = getelementptr i64, ptr %state, i64 2
  %restore = load ptr, ptr %restore.p
  %thread = call ptr %save()
  %code = call i64 @prepjit_replay(ptr %prog, ptr %arrays)
  call void %restore(ptr %thread)
  %ran = icmp eq i64 %code, 0
  %result = select i1 %ran, ptr %arrays, ptr %self
  %count.p = getelementptr i8, ptr %result, i64 {REFCOUNT_OFFSET}
  %count = load i64, ptr %count.p
  %count.next = add i64 %count, 1
  store i64 %count.next, ptr %count.p
  ret ptr %result
}}
"""


class _MethodDef(ctypes.Structure):
    """CPython's PyMethodDef."""
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


METH_O = 0x0008
_new_builtin = ctypes.pythonapi.PyCFunction_NewEx
_new_builtin.restype, _new_builtin.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
_GIL_SWITCH = [ctypes.cast(f, ctypes.c_void_p).value
               for f in (ctypes.pythonapi.PyEval_SaveThread, ctypes.pythonapi.PyEval_RestoreThread)]


def method_entry(method_address: int, program: "NativeProgram"):
    """prepjit_replay_method (at `method_address`) bound to `program`: a builtin function of `arrays`."""
    state = np.array([program.prog_ptr, *_GIL_SWITCH], np.int64)  # its `self`: the program, the GIL's release, take
    definition = _MethodDef(b"prepjit_replay", method_address, METH_O, None)
    # the builtin keeps its definition and the program alive in its module slot (CPython reads that slot only
    # for __module__)
    return _new_builtin(ctypes.addressof(definition), state, (definition, program))


def _int64s(values) -> ctypes.Array:
    values = list(values)
    return (ctypes.c_int64 * max(1, len(values)))(*values)


class NativeProgram:
    """One prepjit_replay program: its arrays kept alive, and a call that runs it. `threads`: the address of
    the cpu_threads state its split launches run on (0 when none splits)."""

    def __init__(self, replay, table, masks: list[int], patches: list[tuple[int, int]], launches: list[tuple],
                 threads: int = 0):
        self.replay, self.table = replay, table
        self.masks = _int64s(masks)
        self.patches = _int64s(x for pair in patches for x in pair)
        self.launches = _int64s(x for entry in launches for x in entry)
        self.n_arrays = len(masks)
        self.prog = _int64s([len(masks), ctypes.addressof(table), ctypes.addressof(self.masks), len(patches),
                             ctypes.addressof(self.patches), len(launches), ctypes.addressof(self.launches),
                             threads])
        self.prog_ptr = ctypes.addressof(self.prog)

    def read_arrays_in_python(self):
        """Fallback when the layout self-test failed: the caller fills the table; the program only patches and runs."""
        self.prog[0] = 0

    def __call__(self, arrays: tuple = ()) -> int:
        return self.replay(self.prog_ptr, arrays)

    def entry(self, method_address: int):
        """A function of `arrays` that runs the program and returns `arrays`, or another object, having run nothing,
        when an array is misaligned: the builtin (`method_entry`) where `method_address` is not 0, else a ctypes call."""
        if method_address:
            return method_entry(method_address, self)
        replay, prog_ptr = self.replay, self.prog_ptr
        return lambda arrays: arrays if replay(prog_ptr, arrays) == 0 else None


def layout_self_test(replay) -> bool:
    """Does prepjit_replay read the same data pointers NumPy reports? (CPython and NumPy struct layouts.)"""
    arrays = (np.arange(3, dtype=np.float32), np.zeros((2, 5), np.int64)[1:])
    table = _int64s([0, 0])
    program = NativeProgram(replay, table, [0, 0], [], [])
    return program(arrays) == 0 and list(table) == [a.ctypes.data for a in arrays]


def method_self_test(replay, method_address: int) -> bool:
    """Does the builtin entry run a program on the arrays, refuse a misaligned one, and count its result's
    reference as CPython does? (The object header it assumes is a build with a GIL's.)"""
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return False
    arrays = (np.arange(3, dtype=np.float32), np.zeros((2, 5), np.int64)[1:])
    misaligned = (np.zeros(12, np.uint8)[1:9].view(np.float32), arrays[1])
    table = _int64s([0, 0])
    run = NativeProgram(replay, table, [3, 7], [], []).entry(method_address)
    held = (arrays, misaligned, run.__self__)
    counts = [sys.getrefcount(x) for x in held]
    ran, refused = run(arrays) is arrays, run(misaligned) is run.__self__
    return ran and refused and [sys.getrefcount(x) for x in held] == counts \
        and list(table) == [a.ctypes.data for a in arrays]
