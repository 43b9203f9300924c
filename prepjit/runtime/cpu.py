"""The cpu device: LLVM IR compiled by llvmlite for the host CPU (or PREPJIT_CPU's: llvm_cpu.py), launched
through ctypes.

A plan's kernels compile in worker processes when there are several (compile_pool.py).
A plan's kernels run back to back in one native call (cpu_replay.py); kernels with enough work split
their outermost range over native worker threads (cpu_threads.py).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading

import numpy as np

from ..amx_tiles import amx_tiles_permitted
from ..errors import CompileError
from ..llvm_cpu import compile_cpu
from ..uop import Ops, UOp, render_python
from . import compile_pool
from .array import Array
from .buffer import HostBuffer
from .array_check import SAME_ARRAYS_IR, same_arrays_self_test
from .cpu_replay import (INT64_MAX, LAUNCH_FIELDS, REPLAY_FN, REPLAY_IR, NativeProgram, layout_self_test,
                         method_self_test)
from .cpu_threads import CHUNKS_PER_THREAD, NativeThreads, threads_ir
from .dynamic_loop import DynamicStep
from .host_pool import empty
from .launch_steps import KernelStep, LoopStep, launchers
from .llvm_compile import compile_object, target_machine

KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


class CPUProgram:
    """A compiled kernel: the JIT engine that owns the code, and its ctypes entry point."""

    def __init__(self, engine, fn):
        self.engine, self.fn = engine, fn


# A kernel is split over threads when its loop iterations (outer range x inner iterations) reach this.
PARALLEL_MIN_ITERATIONS = 1 << 17


def thread_count() -> int:
    """Threads for one kernel: PREPJIT_THREADS, else the cores this process may run on."""
    if os.environ.get("PREPJIT_THREADS"):
        return max(1, int(os.environ["PREPJIT_THREADS"]))
    return compile_pool.cores()


class CPULauncher(KernelStep):
    """The ctypes argument arrays of one PreparedKernel, built once; replay patches slots in place. `buffer_ptrs`
    is the array of buffer addresses the kernel is called with (the PreparedKernel's `buffer_ptrs`)."""

    def __init__(self, program: CPUProgram, buffer_handles: list[int], vals: list[int], size_fn, static_size):
        self.fn = program.fn
        self.buffer_ptrs = (ctypes.c_void_p * max(1, len(buffer_handles)))(*buffer_handles)
        self.vals = (ctypes.c_int64 * max(1, len(vals)))(*vals)
        self.bufs_ptr, self.vals_ptr = ctypes.addressof(self.buffer_ptrs), ctypes.addressof(self.vals)
        self.size_fn, self.static_size = size_fn, static_size
        self.threads: NativeThreads | None = None
        self.work_fn = None         # positional var values -> the kernel's work at them (see _work_fn)
        self.chunks_a_thread = CHUNKS_PER_THREAD

    def set_val(self, slot: int, value: int):
        self.vals[slot] = value

    def use_threads(self, threads: NativeThreads, work_fn, chunks_a_thread: int):
        self.threads, self.work_fn, self.chunks_a_thread = threads, work_fn, chunks_a_thread

    def chunks(self, size: int, vals) -> int:
        """The chunks to split a launch of `size` iterations into at positional var values `vals` (0: run alone)."""
        if self.threads is None or size < 2 or self.work_fn(vals) < PARALLEL_MIN_ITERATIONS:
            return 0
        return self.threads.chunks(size, self.chunks_a_thread)

    def run(self):
        size = self.static_size if self.static_size is not None else self.size_fn(self.vals)[0]
        if size <= 0:
            return
        chunks = self.chunks(size, self.vals)
        if chunks > 1:
            self.threads.parallel(self.fn_address, self.bufs_ptr, self.vals_ptr, size, chunks)
        else:
            self.fn(self.bufs_ptr, self.vals_ptr, 0, size)

    @property
    def fn_address(self) -> int:
        return ctypes.cast(self.fn, ctypes.c_void_p).value


def _outer_loop(ast):
    """The outermost loop range (the one threads split), or None."""
    loops = [u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"]
    return min(loops, key=lambda r: r.arg[0]) if loops else None


def _loop_iterations(ast) -> tuple[int, int]:
    """(outermost range size, iterations of everything inside it), both at the vars' maxima."""
    ranges = [u for u in ast.toposort() if u.op is Ops.RANGE]
    outer = _outer_loop(ast)
    inner = 1
    for r in ranges:
        if r is not outer:
            inner *= max(1, int(r.src[0].vmax))
    return (max(0, int(outer.src[0].vmax)) if outer is not None else 1), inner


@functools.lru_cache(maxsize=1024)
def _fills_before_its_loop(launched) -> bool:
    """Whether the launched kernel first fills an array of its own outside its outermost loop (operand_prologue.py:
    a decode batch's normalised rows, SiLU(gate) * up): work each call does once, so each chunk of a launch split
    over the threads does it again. Such a launch gets one chunk a thread, not CHUNKS_PER_THREAD: in a 16-row
    SmolLM2 decode step its down projection took 221-245 us a layer at 4 chunks a thread and 163-177 at one.
    Cached: a model's blocks launch one kernel many times."""
    outer = _outer_loop(launched)
    return any(u.op is Ops.STORE and u.src[0].op is Ops.DEFINE_LOCAL and (outer is None or outer not in u.toposort())
               for u in launched.src)


def _work_fn(ast, var_names):
    """positional var values (in `var_names` order) -> the iterations of all of `ast`'s ranges (the loops and
    reductions of the kernel as lowered, before blocking) times its stores, at those values: a kernel whose
    extents depend on a var (a decode step's `pos + 1` keys) is split over threads only when it is large now,
    not because it would be at the vars' maxima. A var the compiled kernel does not take counts at its maximum."""
    ranges = [u for u in ast.toposort() if u.op is Ops.RANGE]
    slot = {n: i for i, n in enumerate(var_names)}
    vmax = {v.arg[0]: v.arg[2] for v in ast.variables()}
    spell = lambda name: f"v[{slot[name]}]" if name in slot else repr(vmax[name])  # noqa: E731
    factors = [f"max(0, {render_python(r.src[0], spell)})" for r in ranges] + [str(len(ast.src))]
    return eval(f"lambda v: {' * '.join(factors)}")


def _run_loop(lower: int, upper: int, bodies: list, slots: list):
    """A fori_loop's iterations: the loop var written into its kernels' argument slots, then the even or odd
    iteration's launches."""
    for k in range(lower, upper):
        odd = (k - lower) & 1
        for vals, slot in slots[odd]:
            vals[slot] = k
        for run in bodies[odd]:
            run()


def _run_dynamic(step: DynamicStep, parts: list):
    """A loop the plan runs natively (dynamic_loop.py): each part's launches, in the order the loop asks for."""
    for part in step.parts_in_order():
        for run in parts[part]:
            run()


class _VarSplit:
    """Top-level launches of one kernel whose size depends on the call's vars, at fixed values their size and work
    do not read (`_sizing_key`: the 30 layers' attention of a decode step, their cache offsets apart, are one):
    their end and chunk count in the native programs are set from the values in the VarTable."""

    def __init__(self, launch: CPULauncher, table):
        self.launch, self.vals, self.values = launch, list(launch.pk.vals), table.values
        self.slots = [(slot, table.slot[name]) for slot, name in launch.var_slots]
        self.cells: list = []  # (ctypes launches array, index of an entry's end)

    def update(self):
        """Set the entries for the plan vars' current values."""
        launch, vals, values = self.launch, self.vals, self.values
        for slot, j in self.slots:
            vals[slot] = values[j]
        size = max(0, launch.size_fn(vals)[0])
        chunks = launch.chunks(size, vals)
        for array, k in self.cells:
            array[k], array[k + 1] = size, chunks


def _sizing_key(launch: CPULauncher) -> tuple:
    """What a top-level launch sized per call shares its _VarSplit by: its kernel, the fixed values that its size
    (the launch size) or its work (_work_fn: the ranges of the scheduled AST) read, and its var slots."""
    kernel = launch.pk.kernel
    exprs = [*kernel.global_size, *(u.src[0] for u in kernel.scheduled.toposort() if u.op is Ops.RANGE)]
    read = {v.arg[0] for e in exprs if isinstance(e, UOp) for v in e.variables()}
    fixed = tuple(value if name in read else None for name, value in zip(kernel.var_names, launch.pk.vals))
    return launch.fn_address, fixed, tuple(launch.var_slots)


class CPUPlanRunner:
    """Replays one ExecutionPlan's launches natively: batches of launches in one call each, large kernels split
    over the worker threads from native code (cpu_threads.py); a fori_loop's iterations from Python. Both
    runs first copy the plan vars' values from the plan's VarTable (`table`) into every launcher, natively.

    `run(arrays)` takes the I/O arrays (in `io_buffers` order: NumPy, C-contiguous) and returns False,
    having run nothing, when an array is misaligned for its dtype. `run_launches()` runs the kernels with
    the buffer arguments already patched.
    """

    def __init__(self, device: "CPUDevice", steps: list, io_buffers: list[int],
                 io_slots: dict, table, dtypes: list[np.dtype]):
        all_launchers = launchers(steps)
        self.device = device
        self.io_table = (ctypes.c_int64 * max(1, len(io_buffers)))()
        io_patches = [(launch.bufs_ptr + 8 * slot, ctypes.addressof(self.io_table) + 8 * i)
                      for i, b in enumerate(io_buffers) for launch, slot in io_slots[b]]
        var_patches = [(ctypes.addressof(launch.vals) + 8 * slot, table.address + 8 * table.slot[name])
                       for launch in all_launchers for slot, name in launch.var_slots]
        self.var_table = table
        self.var_splits: dict = {}  # _sizing_key -> _VarSplit
        self.entries: list = []     # (group, _VarSplit, index of the entry in its group)
        groups = self._group(steps, {}, top=True)
        first = groups.pop(0) if groups and isinstance(groups[0], list) else []
        masks = [dt.alignment - 1 for dt in dtypes]
        self.program = self._program(first, masks, io_patches + var_patches)
        self.native_reads = device.native_reads_arrays
        self.replay = self.program.entry(device.method_address)
        if not self.native_reads:
            self.program.read_arrays_in_python()
        self.rest = self._callables(groups)
        self.first_launches = self._program(first, patches=var_patches)
        self.splits = list(self.var_splits.values())
        self.plan_vars = len(table.names)
        self.sized_for = None  # the plan vars' values the splits' entries were last set for

    def _program(self, group: list, masks=(), patches=()) -> NativeProgram:
        threads = self.device.threads
        program = NativeProgram(self.device.replay_fn, self.io_table, list(masks), list(patches), group,
                                threads.address if threads is not None else 0)
        for owner, split, k in self.entries:
            if owner is group:
                split.cells.append((program.launches, LAUNCH_FIELDS * k + 3))
        return program

    def _callables(self, groups: list) -> list:
        return [self._program(g) if isinstance(g, list) else g for g in groups]

    def _group(self, steps: list, iterations: dict, top: bool = False) -> list:
        """Runs of launches as lists of (fn, bufs, vals, end, chunks) entries (a large kernel's chunks > 1), each
        fori_loop (or loop the plan runs natively) as a call that runs its iterations (`steps`: ExecutionPlan's);
        in a loop's body (not `top`), a large kernel whose size depends on the vars runs alone, sized per launch."""
        groups: list = []
        for step in steps:
            step.group_into(self, groups, iterations, top)  # group_kernel, group_loop or group_dynamic
        return groups

    def group_dynamic(self, step: DynamicStep, groups: list, iterations: dict):
        parts = [self._callables(self._group(part, iterations)) for part in step.parts]
        groups.append(functools.partial(_run_dynamic, step, parts))

    def group_loop(self, step: LoopStep, groups: list, iterations: dict):
        bodies = [self._callables(self._group(body, iterations)) for body in (step.even, step.odd)]
        slots = [[(x.vals, slot) for x in body for slot in x.loop_slots] for body in (step.even, step.odd)]
        groups.append(functools.partial(_run_loop, step.loop.lower, step.loop.upper, bodies, slots))

    def group_kernel(self, launch: CPULauncher, groups: list, iterations: dict, top: bool):
        threads = self.device.threads
        ast = launch.pk.kernel.scheduled  # the work, as lowered (before blocking)
        if ast not in iterations:
            outer, inner = _loop_iterations(ast)
            large = threads is not None and outer > 1 and outer * inner >= PARALLEL_MIN_ITERATIONS
            iterations[ast] = _work_fn(ast, launch.pk.kernel.var_names) if large else None
        end, chunks, split = INT64_MAX, 0, None
        if iterations[ast] is not None:
            per_thread = 1 if _fills_before_its_loop(launch.pk.ast) else CHUNKS_PER_THREAD
            launch.use_threads(threads, iterations[ast], per_thread)
            if launch.static_size is not None:
                end = launch.static_size
                chunks = launch.chunks(end, launch.vals)
            elif top:
                key = _sizing_key(launch)
                if key not in self.var_splits:
                    self.var_splits[key] = _VarSplit(launch, self.var_table)
                split = self.var_splits[key]
            else:
                groups.append(launch.run)
                return
        if not (groups and isinstance(groups[-1], list)):
            groups.append([])
        if split is not None:
            self.entries.append((groups[-1], split, len(groups[-1])))
        groups[-1].append((launch.fn_address, launch.bufs_ptr, launch.vals_ptr, end, chunks))

    def size_splits(self):
        """Set the entries of the launches sized per call for the plan vars' values, unless they were last set
        for these values (a decode step's batch size stays from step to step: no Python per such kernel)."""
        values = self.var_table.values[:self.plan_vars]
        if values != self.sized_for:
            for split in self.splits:
                split.update()
            self.sized_for = values

    def run_launches(self):
        self.size_splits()
        self.first_launches()
        for segment in self.rest:
            segment()

    def run(self, arrays: tuple) -> bool:
        self.size_splits()
        if not self.native_reads:
            table = self.io_table
            for i, a in enumerate(arrays):
                table[i] = a.ctypes.data
        if self.replay(arrays) is not arrays:
            return False
        for segment in self.rest:
            segment()
        return True


class CPUDevice:
    """Compiles LLVM IR (optimised at -O2, vectorised for the host CPU) and allocates host buffers."""

    name = "cpu"
    language = "llvm"      # the kernels it runs (codegen/targets.py: their target)
    device_memory = False  # its buffers are host memory: NumPy arrays are read in place

    def __init__(self):
        import llvmlite.binding as llvm
        self.llvm = llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        cpu = compile_cpu()  # the host's CPU, or PREPJIT_CPU's
        amx_tiles_permitted()  # asked once, before any kernel (codegen's AMX blocks need it: amx_tiles.py)
        self.cpu_name, features = cpu.name, cpu.features
        # The target machine, as data so compile workers build the same one (llvm_compile.py).
        # The large code model addresses constants, other sections and external symbols with 64-bit
        # absolute relocations, so no relocation can overflow wherever the JIT's memory manager puts a
        # module's sections (in a crowded address space they land > 2 GB apart and the small model's
        # 32-bit PC-relative fixups abort the process inside LLVM). It costs a few movabs per kernel.
        self.target_options = {"triple": cpu.triple, "cpu": self.cpu_name, "features": features,
                               "opt": 3, "reloc": "pic", "codemodel": "large"}
        # an MCJIT engine owns (and frees) the target machine it is given: each engine gets its own
        self.new_target_machine = lambda: target_machine(llvm, self.target_options)
        self.target_machine = self.new_target_machine()
        version = ".".join(map(str, llvm.llvm_version_info))
        self.compiler_id = f"llvm-{version}-{self.cpu_name}-{hashlib.sha1(features.encode()).hexdigest()[:12]}"
        self.lock = threading.Lock()
        # the replay module (cpu_replay.py, array_check.py, cpu_threads.py) compiles in a worker process of its own
        # (60-100 ms of LLVM on a core a first call's tracing leaves idle); its parts (NATIVE_PARTS) are loaded at the
        # first use of one (the planner's, after the trace and schedule)
        self._replay_object = compile_pool.CompileAside(self.target_options, thread_count(), "prepjit_replay",
                                                        REPLAY_IR + SAME_ARRAYS_IR + threads_ir(cpu.triple),
                                                        self.compile)
        self._native_start_lock = threading.Lock()

    NATIVE_PARTS = frozenset({"_replay_engine", "replay_fn", "native_reads_arrays", "method_address",
                              "same_arrays_address", "threads"})

    def __getattr__(self, name: str):
        """A part of the replay module (NATIVE_PARTS), loaded and self-tested at the first use of any (called only for
        attributes not set yet: once it has run they are plain attributes)."""
        if name not in CPUDevice.NATIVE_PARTS or "_native_start_lock" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        with self._native_start_lock:
            if name not in self.__dict__:
                self._start_native()
        return self.__dict__[name]

    def _start_native(self):
        """Load the replay module (its compile error raised here), self-test its entry points and start the native
        worker threads."""
        self._replay_engine, replay_address = self._load_object("prepjit_replay", self._replay_object.result())
        self.replay_fn = REPLAY_FN(replay_address)
        self.native_reads_arrays = layout_self_test(self.replay_fn)
        address = self._replay_engine.get_function_address
        method = address("prepjit_replay_method")  # (cpu_replay.py: a prepared call's replay)
        self.method_address = method if method_self_test(self.replay_fn, method) else 0
        same_arrays = address("prepjit_same_arrays")  # (array_check.py: the fast path's check of a call's arrays)
        self.same_arrays_address = same_arrays if same_arrays_self_test(same_arrays) else 0
        threads = NativeThreads(thread_count(), address("prepjit_parallel"), address("prepjit_worker"),
                                address("prepjit_cycles"))
        self.threads = threads if threads.workers else None  # None: every kernel runs on the calling thread

    # ---- compiling and launching ----
    def compile(self, name: str, source: str) -> bytes:
        """LLVM IR -> optimised object code for this CPU, in this process (the expensive step; `load` makes it
        callable)."""
        with self.lock:
            try:
                return compile_object(self.llvm, self.target_machine, source)
            except RuntimeError as e:
                raise compile_pool.compile_error(name, source, str(e)) from e

    def compile_parallel(self, count: int):
        """submit(name, source) -> Future of `compile`'s bytes, for a batch of `count` kernels: compile worker
        processes when the batch is large enough and several cores are free, else this process."""
        pool = compile_pool.shared_pool(self.target_options, thread_count(), self.compile) \
            if count >= compile_pool.MIN_KERNELS else None
        if pool is not None:
            return pool.submit
        return lambda name, source: compile_pool.run_now(self.compile, name, source)

    def expect_compiles(self, reductions: int):
        """A plan whose trace holds `reductions` reductions is about to be scheduled (planner.build_plan): with
        enough of them for as many kernels as compile_parallel sends to the workers, they all start now, so their
        start (~65 ms of CPU each) overlaps the scheduling, which runs on one core (SmolLM2's prefill: 0.3 s),
        not the first kernels' optimisation and rendering beside the first compiles. On one core, nothing."""
        if reductions >= compile_pool.MIN_KERNELS:
            pool = compile_pool.shared_pool(self.target_options, thread_count(), self.compile)
            if pool is not None:
                pool.start_all()

    def load(self, name: str, binary: bytes) -> CPUProgram:
        """Object code from `compile` (this process's or the disk cache's) -> kernel `name` in its own JIT engine."""
        engine, address = self._load_object(name, binary)
        return CPUProgram(engine, KERNEL_FN(address))

    def _load_object(self, name: str, binary: bytes):
        """(JIT engine holding the object code, address of function `name` in it)."""
        llvm = self.llvm
        with self.lock:
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.new_target_machine())
            engine.add_object_file(llvm.ObjectFileRef.from_data(binary))
            engine.finalize_object()
            address = engine.get_function_address(name)
        if not address:
            raise CompileError(f"the object code loaded for kernel {name} does not define {name}")
        return engine, address

    def launcher(self, program: CPUProgram, buffer_handles, vals, size_fn, static_size) -> CPULauncher:
        return CPULauncher(program, buffer_handles, vals, size_fn, static_size)

    def plan_runner(self, steps: list, io_buffers: list[int], io_slots: dict, var_table,
                    dtypes: list[np.dtype]) -> CPUPlanRunner:
        """Native replay of a plan's launch steps (see CPUPlanRunner); `io_slots`: buffer -> [(launcher, slot)];
        `var_table`: the plan's VarTable, whose values the launches read."""
        return CPUPlanRunner(self, steps, io_buffers, io_slots, var_table, dtypes)

    # ---- memory ----
    def allocate(self, dtype: np.dtype, size: int) -> HostBuffer:
        return HostBuffer(dtype, size)

    def alias(self, buffer: HostBuffer, dtype: np.dtype, size: int) -> HostBuffer:
        """A buffer of another dtype/size on `buffer`'s memory (for intermediates whose lifetimes do not overlap)."""
        return HostBuffer(dtype, size, buffer.memory)

    def handle(self, buffer: HostBuffer) -> int:
        return buffer.ptr

    def input_handle(self, arg) -> tuple[int, object]:
        """(kernel handle, object to keep alive) for an argument; NumPy arrays are read in place."""
        data = arg.buffer if isinstance(arg, Array) and arg._device is self else np.asarray(arg)
        return data.ctypes.data, data

    def new_output(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, Array]:
        data = empty(shape, dtype)
        return data.ctypes.data, Array(data, shape, dtype, self)

    def copy_array(self, array: Array) -> Array:
        return Array(array.buffer.copy(), array.shape, array.dtype, self)

    def to_numpy(self, buffer: np.ndarray, shape, dtype, copy: bool) -> np.ndarray:
        return buffer.copy() if copy else buffer

    def read_buffer(self, buffer: HostBuffer, shape) -> np.ndarray:
        return buffer.view(shape).copy()

    def bool_reader(self, buffer: HostBuffer):
        """A function reading the 0-d bool in `buffer` (a while_loop's predicate, read every iteration)."""
        return ctypes.c_bool.from_address(buffer.ptr).__bool__

    def write_buffer(self, buffer: HostBuffer, array: np.ndarray):
        buffer.write(array)

    def synchronize(self):
        pass
