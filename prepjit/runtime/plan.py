"""ExecutionPlan: a frozen list of PreparedKernels over owned buffers, replayed with new var values."""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from ..errors import IndexBoundError, SignatureError, VarError
from ..uop import Ops
from ..uop.constraint import compile_checks
from ..uop.ops import buffers_of
from ..uop.segments import Run, Segments
from .array import Array
from .cache import CachedKernel
from .launch_steps import LoopStep, launchers, ordered_positions
from .var_table import RuntimeVar, VarTable


@attrs.define(eq=False)
class PreparedKernel:
    """A compiled kernel bound to plan buffers and positional var values (the seed's fields). `vals` is a
    read-only view (var_table.KernelVals) of the plan's VarTable and of this kernel's `fixedvars`;
    `runtime_vars` lists the plan's records of its AST's vars."""

    id: int
    ast: object
    kernel: CachedKernel
    device: str
    buffer_indices: list[int]
    output_indices: list[int]
    vals: Sequence[int]
    fixedvars: dict[str, int]
    dependencies: list[int]
    buffer_ptrs: list[int]
    buffer_ids: list[int]
    runtime_vars: list[RuntimeVar]

    def prepared(self) -> tuple:
        return (self,)

    def describe(self, indent: str = "") -> list:
        """Its row of str(plan)'s table."""
        return [(str(self.id), indent + self.kernel.name, self.device, ",".join(map(str, self.buffer_indices)),
                 ",".join(self.kernel.var_names) or "-",
                 ",".join(f"{n}={v}" for n, v in self.fixedvars.items()) or "-")]

    def step(self, plan: ExecutionPlan, loop_vars: tuple = ()):
        """Its node of `plan`'s launch tree: its launcher (launch_steps.py)."""
        return plan.launcher(self, loop_vars)

    def check_fixed(self, counters: dict | None = None):
        """Raise VarBoundError when a value the plan gives one of its vars (a `fixedvars` value, or the first and
        last of a fori_loop counter's: `counters`, name -> (first, last)) is outside the bounds its runtime_vars
        record holds: the bounds the proof assumed for it (a forged plan file's fixedvar would index past a buffer)."""
        counters = counters or {}
        for rv in self.runtime_vars:
            if rv.name in self.fixedvars:
                rv.check(self.fixedvars[rv.name], f"kernel {self.kernel.name}'s fixedvars")
            for value in counters.get(rv.name, ()):
                rv.check(value, f"the counter of the fori_loop around kernel {self.kernel.name}")


@attrs.frozen
class LoopLaunches(Run):
    """A fori_loop's PreparedKernels, built on access: `templates` are the body's kernels in an even and an odd
    iteration (those are launched, the loop var patched per iteration); `first_deps` holds the dependencies
    of the first four iterations' kernels, and later iterations repeat those of iterations 2 and 3, shifted."""

    name: str
    lower: int
    upper: int
    start: int        # the plan index of its first kernel
    templates: tuple  # (even iteration's PreparedKernels, odd iteration's)
    first_deps: tuple

    def __len__(self) -> int:
        return len(self.templates[0]) * (self.upper - self.lower)

    def item(self, i: int) -> PreparedKernel:
        width = len(self.templates[0])
        r, j = divmod(i, width)
        t = self.templates[r % 2][j]
        k = self.lower + r
        if r < 4:
            deps = list(self.first_deps[i])
        else:
            base = 2 + r % 2
            shift = (r - base) * width
            deps = [d + shift if d >= self.start else d for d in self.first_deps[base * width + j]]
        fixed = {**t.fixedvars, self.name: k}
        return PreparedKernel(self.start + i, t.ast, t.kernel, t.device, t.buffer_indices, t.output_indices,
                              t.vals.table.kernel_vals(t.kernel.var_names, fixed), fixed, deps, t.buffer_ptrs,
                              t.buffer_ids, t.runtime_vars)

    def prepared(self) -> tuple:
        """The PreparedKernels that launch: an even and an odd iteration's."""
        return self.templates[0] + self.templates[1]

    def describe(self, indent: str = "") -> list:
        """A line naming the loop, then the rows of its first two iterations (the others alternate as these do)."""
        return [f"{indent}fori_loop {self.name} in [{self.lower}, {self.upper}): {len(self)} launches, "
                f"its first two iterations (the others alternate as these do):",
                *(row for i in range(min(len(self), 2 * len(self.templates[0])))
                  for row in self.item(i).describe(indent + "  "))]

    def check_fixed(self, counters: dict | None = None):
        """Each launching kernel's fixed values and this loop's counter, over [lower, upper), in its vars' bounds."""
        counters = {**(counters or {}), self.name: (self.lower, self.upper - 1)}
        for k in self.prepared():
            k.check_fixed(counters)

    def step(self, plan: ExecutionPlan, loop_vars: tuple = ()) -> LoopStep:
        """Its node of `plan`'s launch tree: the templates' launchers, the loop var patched per iteration."""
        inner = loop_vars + (self.name,)
        return LoopStep(self, *([plan.launcher(k, inner) for k in body] for body in self.templates))


class PreparedKernels(Segments):
    """A plan's PreparedKernels in execution order (a Sequence): single kernels, and each fori_loop as one
    LoopLaunches whose iterations are built on access; loops the plan runs natively as DynamicLaunches. Each
    segment lists the PreparedKernels that launch (`prepared()`), builds its node of the launch tree (`step`) and
    checks the values the plan fixes against its kernels' runtime_vars (`check_fixed`)."""


def _reads_where_it_writes(pk: PreparedKernel, buffer: int) -> bool:
    """Whether `pk` is one ungated store whose every read of `buffer` is at the store's own index, so it can
    write its result over `buffer` in place."""
    slots = {s for s, b in enumerate(pk.buffer_indices) if b == buffer}
    stores = [u for u in pk.ast.src if u.op is Ops.STORE]
    if len(stores) != 1 or len(stores[0].src) != 3:
        return False
    return all(len(u.src) == 2 and u.src[1] is stores[0].src[1] for u in pk.ast.toposort()
               if u.op is Ops.LOAD and any(b.arg in slots for b in buffers_of(u.src[0])))


def _copies(pk: PreparedKernel, source: int, target: int) -> bool:
    """Whether `pk` only copies buffer `source` into buffer `target` element for element (target[i] = source[i],
    the copy a `.at[...].set` starts from): nothing to do once the two are one memory (a donated input the call
    writes that output into), so such a call skips it."""
    stores = [u for u in pk.ast.src if u.op is Ops.STORE]
    if len(stores) != 1 or pk.buffer_indices[stores[0].src[0].arg] != target:
        return False
    value = stores[0].src[2]
    return (value.op is Ops.LOAD and len(value.src) == 2 and value.src[1] is stores[0].src[1]
            and all(pk.buffer_indices[b.arg] == source for b in buffers_of(value.src[0])))


class PlanBuffer:
    """What the plan knows of a buffer: dtype, planned size, live shape (a function of the vars), memory.

    An intermediate's memory exists from the start. An input's or output's memory is only the staging
    area of `write_input` / `read_output` / `execute` (prepared calls bring their own arrays), so it is
    allocated on first use: a plan whose var bounds are generous does not hold I/O buffers sized for them.
    """

    def __init__(self, dtype: np.dtype, size: int, shape_fn, shape_text: str, memory=None, allocate=None):
        self.dtype, self.size, self.shape_fn, self.shape_text = np.dtype(dtype), size, shape_fn, shape_text
        self._memory, self._allocate = memory, allocate
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * self.size

    @property
    def allocated(self) -> bool:
        return self._memory is not None

    @property
    def memory(self):
        if self._memory is None:
            with self._lock:
                if self._memory is None:
                    self._memory = self._allocate()
        return self._memory


class ExecutionPlan:
    """Owns its buffers and PreparedKernels (in a valid execution order); replays them. Its vars' bounds and
    values live in `var_table` (var_table.py); `vars`, `bindings` and each kernel's `vals` are views of it."""

    def __init__(self, device, buffers: list[PlanBuffer], kernels: PreparedKernels,
                 inputs: tuple[int, ...], outputs: tuple[int, ...], var_table: VarTable,
                 memory_bytes: int = 0, constraints=(), flags=(), proven_accesses: int = 0, spec=None):
        self._device, self._buffers, self.kernels = device, buffers, kernels
        self.var_table = table = var_table
        self.spec = spec  # the data-only description it was built from (planner.PlanSpec): what saved plans store
        self.constraints = tuple(constraints)  # IndexConstraints over the vars, checked before every run
        self.check_constraints = compile_checks(self.constraints, list(table.names))  # values -> violated one or -1
        merged: dict[int, list[str]] = {}
        for b, what in flags:  # gathers of the same ids from the same dim share one flag
            merged.setdefault(b, []).append(what)
        # (buffer, what): a 0-d bool a gather sets when it met an out-of-range id
        self.flags = tuple((b, "; ".join(dict.fromkeys(whats))) for b, whats in merged.items())
        self.proven_accesses = proven_accesses  # loads and stores the bounds proof showed inside their buffers
        self.memory_bytes = memory_bytes  # device memory the plan holds for intermediates (shared ones counted once)
        self.device = device.name
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        self.lock = threading.Lock()
        for seg in kernels.segments:  # (VarBoundError before anything is built)
            seg.check_fixed()
        self._steps = [seg.step(self) for seg in kernels.segments]  # the launch tree (launch_steps.py)
        self._launches = launchers(self._steps)
        # (launcher, argument slot, VarTable slot): the plan vars written into the launchers before a run
        self._var_args = [(launch, i, table.slot[name]) for launch in self._launches for i, name in launch.var_slots]
        self._distinct_outputs = list(dict.fromkeys(self.outputs))
        # input position -> (the output written into it when donated, the position of a kernel that then has
        # nothing to do or None), or None: no output can take it (see donation_target)
        self._donations: dict[int, tuple[int, int | None] | None] = {}
        self._skipping: dict[frozenset, tuple] = {}  # kernel positions a call skips -> (its steps, its runner)
        self._flag_arrays = tuple(np.zeros((), np.bool_) for _ in self.flags)  # the fast path's flag outputs
        io = set(self.inputs) | set(self.outputs) | {b for b, _ in self.flags}
        self._io_slots = {b: [] for b in io}  # (one pass over the launches: a model's weights are hundreds of inputs)
        for launch in self._launches:
            for slot, bi in enumerate(launch.pk.buffer_indices):
                if bi in self._io_slots:
                    self._io_slots[bi].append((launch, slot))
        self._runner = self._native_runner()

    def _native_runner(self, steps=None):
        """The device's whole-plan replay of `steps` (default: all; the cpu's runs kernels back to back
        natively), or None."""
        steps = self._steps if steps is None else steps
        io_order = list(self.inputs) + self._distinct_outputs + [b for b, _ in self.flags]
        if not hasattr(self._device, "plan_runner") or len(set(io_order)) != len(io_order):
            return None
        running = set(launchers(steps))
        io_slots = {b: [(launch, slot) for launch, slot in slots if launch in running]
                    for b, slots in self._io_slots.items()}
        return self._device.plan_runner(steps, io_order, io_slots, self.var_table,
                                        [self._buffers[b].dtype for b in io_order])

    def _without(self, skip: frozenset) -> tuple:
        """(launch steps, whole-plan runner or None) of this plan less the kernels at positions `skip` (a plan of
        single kernels: its steps are its kernels'), built on first use."""
        if not skip:
            return self._steps, self._runner
        if skip not in self._skipping:
            steps = [step for position, step in enumerate(self._steps) if position not in skip]
            self._skipping[skip] = (steps, self._native_runner(steps) if self._runner is not None else None)
        return self._skipping[skip]

    def predicate_reader(self, buffer: int | None):
        """A function reading the 0-d bool plan buffer `buffer` (a while_loop's predicate), or None for None."""
        if buffer is None:
            return None
        memory = self._buffers[buffer].memory
        reader = getattr(self._device, "bool_reader", None)  # a host device reads it in place
        return reader(memory) if reader else lambda: bool(self._device.read_buffer(memory, ()))

    def launcher(self, pk: PreparedKernel, loop_vars: tuple = ()):
        """A launcher of `pk`; in a loop's body, the slots of its loop vars (`loop_vars`) are patched per iteration."""
        kernel = pk.kernel
        runtime = [(i, n) for i, n in enumerate(kernel.var_names) if n not in pk.fixedvars and n not in loop_vars]
        loop_slots = [i for i, n in enumerate(kernel.var_names) if n in loop_vars]
        static_size = None if runtime or loop_slots else kernel.global_size_fn(pk.vals)[0]
        maps = {"tensor_maps": kernel.tensor_maps} if kernel.tensor_maps else {}   # (a Hopper tile's: cuda only)
        launcher = self._device.launcher(kernel.program, list(pk.buffer_ptrs), pk.vals, kernel.global_size_fn,
                                         static_size, **maps)
        pk.buffer_ptrs = launcher.buffer_ptrs  # what the launches read: I/O slots are patched there before a run
        launcher.pk, launcher.var_slots, launcher.loop_slots = pk, runtime, loop_slots
        return launcher

    @property
    def buffers(self) -> list[PlanBuffer]:
        return self._buffers

    # ---- vars (views of var_table) ----
    @property
    def vars(self) -> Mapping[str, tuple[int, int]]:
        """name -> (min, max) of every var a call supplies (a read-only view)."""
        return self.var_table.bounds

    @property
    def bindings(self) -> Mapping[str, int]:
        """name -> the value last given to each var (by execute_with_vars or a call; a read-only view)."""
        return self.var_table.bindings

    @property
    def var_sources(self) -> dict[str, str]:
        """var -> where calls read it (an argument, a shape), for messages."""
        return self.var_table.sources

    def validate_vars(self, values: dict[str, int]) -> dict[str, int]:
        """Check every value (unknown, fixed, type, bounds, none missing) before anything changes; return them as ints."""
        table, checked = self.var_table, {}
        for name, value in values.items():
            if name in table.fixed:
                raise VarError(f"var {name!r} is fixed by the plan (a loop counter) and cannot be supplied")
            if name not in table.var:
                raise VarError(f"unknown var {name!r}; this plan's vars are {list(table.names) or 'none'}")
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise VarError(f"var {name!r} must be an int, got {type(value).__name__}")
            checked[name] = table.var[name].check(int(value))
        missing = sorted(table.unbound - set(values))  # after the names given: a typo is named
        if missing:
            raise VarError(f"vars {missing} have no value yet; pass them to execute_with_vars")
        self.require({**self.bindings, **checked})
        return checked

    def require(self, values: dict[str, int]):
        """Raise IndexBoundError when `values` (every var of the plan) violate an index constraint."""
        if self.constraints:
            failed = self.check_constraints(tuple(values[n] for n in self.var_table.names))
            if failed >= 0:
                raise self.constraints[failed].error(values, self.var_sources)

    def _raise_flagged(self, set_flags):
        """After a run: IndexBoundError when a gather flagged an out-of-range id (outputs are dropped)."""
        hit = [what for (_, what), on in zip(self.flags, set_flags) if on]
        if hit:
            raise IndexBoundError(f"{'; '.join(hit)}; no output is returned (NumPy raises IndexError)")

    def execute_with_vars(self, values: dict[str, int]):
        """Validate all values, then bind them (they stay for later `execute()` calls) and run."""
        checked = self.validate_vars(values)
        with self.lock:
            self.var_table.bind(checked)
            self._run_owned()

    def execute(self):
        with self.lock:
            self._run_owned()

    def _run_owned(self):
        missing = sorted(self.var_table.unbound)
        if missing:
            raise VarError(f"vars {missing} have no value yet; use execute_with_vars")
        self._run({b: self._device.handle(self._buffers[b].memory) for b in self._io_slots})
        if self.flags:
            self._raise_flagged([self._device.read_buffer(self._buffers[b].memory, ()).item()
                                 for b, _ in self.flags])

    def _run(self, handles: dict, timings: list | None = None, skip: frozenset = frozenset()):
        """The replay every entry shares (execute, execute_with_vars, run_with_io; run_arrays is it with the
        device's runner patching the call's arrays itself): point the kernels' I/O slots at `handles` (plan
        buffer -> the device's handle), run the launch tree but the kernels at positions `skip` (through the
        device's whole-plan runner where it has one; with `timings`, the profiler's, one launch at a time, each
        waited for and timed, None for a skipped kernel), wait for the device."""
        self._patch(handles)
        steps, runner = self._without(skip)
        if timings is not None:
            self._run_timed(steps, timings, skip)
        elif runner is not None:  # it writes the var values into the launchers itself
            runner.run_launches()
        else:
            self._write_var_args()
            for _, launch in ordered_positions(steps):
                launch.run()
        self._device.synchronize()

    def _write_var_args(self):
        """Write the plan vars' values from the VarTable into every launcher's argument slots."""
        values = self.var_table.values
        for launch, i, slot in self._var_args:
            launch.set_val(i, values[slot])

    def _patch(self, ptrs: dict[int, int]):
        """Point the kernels' I/O slots (their `buffer_ptrs`) at `ptrs`: plan buffer -> the device's handle."""
        for b, ptr in ptrs.items():
            for launch, slot in self._io_slots[b]:
                launch.pk.buffer_ptrs[slot] = ptr

    # ---- I/O on owned buffers ----
    def live_shape(self, buffer_index: int) -> tuple[int, ...]:
        return self._buffers[buffer_index].shape_fn(self.bindings)

    def write_input(self, i: int, array):
        buf = self._buffers[self.inputs[i]]
        array = np.asarray(array)
        if array.dtype != buf.dtype:
            raise SignatureError(f"input {i} has dtype {buf.dtype}, got {array.dtype}")
        if array.size > buf.memory.size:
            raise SignatureError(f"input {i} holds at most {buf.memory.size} elements, got {array.size}")
        self._device.write_buffer(buf.memory, array)

    def read_output(self, i: int) -> np.ndarray:
        b = self.outputs[i]
        return self._device.read_buffer(self._buffers[b].memory, self.live_shape(b))

    # ---- replay with caller-owned I/O ----
    def run_with_io(self, values: dict[str, int], args: list, output_shapes: list, timings: list | None = None,
                    donated: tuple = ()) -> list:
        """The prepared-call path: values already validated; returns one fresh pj.Array per distinct output.

        Inputs are handed to the device (the cpu reads NumPy arrays in place) and kernels write
        straight into newly allocated outputs, so no intermediate is allocated and nothing is copied.
        With `timings` (the profiler's replay), kernels run one at a time, each waited for, and each
        one's wall time in seconds is appended. `donated`: positions of arguments the caller gives up: a
        pj.Array of this device there whose memory an output can take (`donation_target`, same live shape)
        gets that output written into it, and is deleted. It is taken last, when nothing but the kernels can
        fail, and only when nothing else references the memory (Array._give_up_memory). A kernel that only
        copies a taken argument into its output (the copy a scatter starts from) is then not run.
        """
        device = self._device
        self.require(values)
        reusable = {}  # distinct output -> the donated argument position whose memory it may be written into
        for p in donated:
            j, arg = self.donation_target(p), args[p]
            if (j is not None and j not in reusable and isinstance(arg, Array) and arg._device is device
                    and arg.shape == tuple(output_shapes[j])
                    and not any(other is arg for q, other in enumerate(args) if q != p)):  # (read elsewhere too)
                reusable[j] = p
        skip = set()  # positions of kernels with nothing to do: copies of a taken argument into its output
        with self.lock:
            self.var_table.bind(values)
            handles, keep = {}, []
            for p, (b, arg) in enumerate(zip(self.inputs, args)):
                if p not in reusable.values():
                    handles[b], alive = device.input_handle(arg)
                    keep.append(alive)
            results = [None] * len(self._distinct_outputs)
            for j, (b, shape) in enumerate(zip(self._distinct_outputs, output_shapes)):
                if j not in reusable:
                    handles[b], results[j] = device.new_output(shape, self._buffers[b].dtype)
            flags = []
            for b, _ in self.flags:
                handles[b], array = device.new_output((), np.dtype(np.bool_))
                flags.append(array)
            # from here on a taken argument is deleted; None: still referenced, so its output gets new memory
            taken = {j: args[p]._give_up_memory() for j, p in reusable.items()}
            try:
                for j, memory in taken.items():
                    if memory is None:
                        b = self._distinct_outputs[j]
                        handles[b], results[j] = device.new_output(output_shapes[j], self._buffers[b].dtype)
            except BaseException:  # (out of memory) the call fails before any kernel ran: the arguments stay
                for j, memory in taken.items():
                    if memory is not None:
                        args[reusable[j]]._take_back_memory(memory)
                raise
            for j, memory in taken.items():
                p, b = reusable[j], self.inputs[reusable[j]]
                arg = args[p] if memory is None else Array(memory, args[p].shape, args[p].dtype, device)
                handles[b], alive = device.input_handle(arg)
                keep.append(alive)
                if memory is not None:
                    results[j] = arg
                    handles[self._distinct_outputs[j]] = handles[b]
                    if self._donations[p][1] is not None:
                        skip.add(self._donations[p][1])
            self._run(handles, timings, frozenset(skip))
        if flags:
            self._raise_flagged([bool(np.asarray(f)) for f in flags])
        return results

    def donation_target(self, position: int) -> int | None:
        """The distinct output a call may write into the memory of input `position` when the caller donates
        it (jax.jit's donate_argnums): one of the input's dtype and planned shape, in a plan of single
        kernels, whose first writing kernel comes after every other kernel reading the input and reads it, if
        at all, only where it writes (an elementwise update such as x + 1, or the copy a scatter starts
        from: cache.at[pos].set(v)). None when no output can, and in a plan whose kernels can flag an error
        (a gather's out-of-range id): that call raises after its kernels ran, and must leave the argument intact."""
        if position not in self._donations:
            self._donations[position] = self._find_donation(position)
        found = self._donations[position]
        return None if found is None else found[0]

    def _find_donation(self, position: int) -> tuple[int, int | None] | None:
        """(donation_target, the position of its first writing kernel when that only copies the input into it)."""
        kernels = self.kernels.segments
        b_in = self.inputs[position]
        if self.flags or not all(isinstance(k, PreparedKernel) for k in kernels) or self.inputs.count(b_in) > 1:
            return None
        have = self._buffers[b_in]
        flagged = {b for b, _ in self.flags}
        for j, b_out in enumerate(self._distinct_outputs):
            buf = self._buffers[b_out]
            if b_out in self.inputs or b_out in flagged or \
                    (buf.dtype, buf.size, buf.shape_text) != (have.dtype, have.size, have.shape_text):
                continue
            writers = [i for i, k in enumerate(kernels)
                       if any(k.buffer_indices[slot] == b_out for slot in k.output_indices)]
            readers = [i for i, k in enumerate(kernels) if b_in in k.buffer_indices]
            if writers and all(i < writers[0] or i == writers[0] and _reads_where_it_writes(kernels[i], b_in)
                               for i in readers):
                return j, (writers[0] if _copies(kernels[writers[0]], b_in, b_out) else None)
        return None

    def _run_timed(self, steps: list, timings: list, skip: frozenset):
        self._device.synchronize()  # inputs staged on the device are not part of the first kernel's time
        self._write_var_args()
        times = [0.0] * len(self.kernels)  # a loop run natively: each kernel's time summed over the iterations
        for position, launch in ordered_positions(steps):
            start = time.perf_counter()
            launch.run()
            self._device.synchronize()
            times[position] += time.perf_counter() - start
        timings.extend(None if position in skip else t for position, t in enumerate(times))

    @property
    def replays_arrays(self) -> bool:
        """Whether `run_arrays` is available (the device replays whole plans on the call's arrays)."""
        return self._runner is not None

    def run_arrays(self, arrays: tuple, values: tuple) -> bool:
        """The prepared-call fast path: `arrays` are the inputs then the distinct outputs (C-contiguous NumPy
        arrays, or on a GPU its memory too; outputs freshly allocated), `values` the var values, validated, in
        `self.vars` order, index constraints met. Returns False, having run nothing, when an array is not
        aligned for its dtype; raises IndexBoundError when a gather flagged an out-of-range id.
        """
        flags = self._flag_arrays
        with self.lock:
            if values:
                self.var_table.bind_all(values)
            if not flags:  # (most plans: nothing to read back)
                return self._runner.run(arrays)
            if not self._runner.run(arrays + flags):
                return False
            set_flags = [bool(f) for f in flags]
        if any(set_flags):
            self._raise_flagged(set_flags)
        return True

    def copy_array(self, array):
        return self._device.copy_array(array)

    def __str__(self) -> str:
        """A table of the kernels, each segment of plan.kernels describing itself (`describe()`: a kernel's row;
        a loop's line, then its kernels' rows, indented), then the buffers."""
        rows = [("#", "kernel", "device", "buffers", "vars", "fixedvars")]
        rows += [row for seg in self.kernels.segments for row in seg.describe()]
        table = [r for r in rows if type(r) is tuple]
        widths = [max(len(r[c]) for r in table) for c in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() if type(r) is tuple else r
                 for r in rows]
        bufs = [f"  buf{i}: {b.dtype} {b.shape_text} ({b.nbytes} bytes)" for i, b in enumerate(self._buffers)]
        head = (f"ExecutionPlan on {self.device}: {len(self.kernels)} kernels, {len(self._buffers)} buffers "
                f"in {self.memory_bytes} bytes, "
                f"inputs {list(self.inputs)}, outputs {list(self.outputs)}, vars {self.vars}")
        return "\n".join([head, *lines, "buffers:", *bufs])

    __repr__ = __str__
