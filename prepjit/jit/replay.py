"""The prepared-call fast path: the call reader's (signature.py) cached result per concrete call key, replaying a
plan straight on NumPy arrays.

A positional call whose arguments are NumPy arrays and scalars (as 0-d arrays), pj.Arrays on the cpu or on the
plan's GPU, ints, strings, bools, None, or dicts, lists and tuples of arrays (a model's weights) is looked up by its
concrete key (`Signature.light_key`, `full_key`): where the call's key but for its containers' array parts (its
light key) is the last call's, a native check that those arrays' dtypes, shapes and strides are the last call's
(runtime/array_check.py, on the cpu) stands for reading and comparing them. The first call with a key goes through
the full path (`Signature.read`, which checks everything); after it, `FastCalls.learn` keeps what that read decided:
the plan, where each array and scalar var is among the arguments, the call's var reads (Var, value, where) with the
values the key fixes (the shape vars of containers' arrays, already checked) and where the others are read from (a
scalar var's argument; an array argument's dim, whose size the key leaves out: a serving engine's prompt length
and table width change from call to call), and the output dtypes. Later calls with the key read only those: one
compiled test of their bounds, their agreement with each other and with the values the key fixes, and the plan's
index constraints (`plan.check_constraints`); when it fails, the same reads go through the checks of the full path
(`check_reads`, `plan.require`), which raise its errors, messages included. A call that passes goes straight to
`ExecutionPlan.run_arrays`: inputs are read in place (a GPU uploads NumPy inputs into staging it keeps), each output
is one `host_pool.empty` (a GPU's: device memory from its pool). Anything else unusual (a misaligned array, a
rebound captured array, a deleted pj.Array) falls back to the full path, which copies, traces again or raises.

A call that donates arrays (donate_argnums: the serving engine's KV store) replays instead through
`replay_with_io` (`ExecutionPlan.run_with_io`, as the full path does): given the arguments' pj.Arrays and the
donated positions the full path found, it takes a donated array's memory only when nothing else references it
and the array is not passed twice.
"""
from __future__ import annotations

import operator

import numpy as np

from ..errors import DeletedArrayError
from ..runtime.array import Array
from ..runtime.array_check import same_arrays_entry
from ..runtime.host_pool import allocator_for
from ..tracing.constants import CaptureWatch, capture_key
from .containers import walk
from .signature import check_reads, full_key, shape_read_where

MISS = object()
MAX_KEYS = 4096  # distinct concrete shapes remembered per prepared function
MAX_SIZED = 256  # var values whose output shapes a known call remembers


class _KnownCall:
    """What one concrete call key replays: the plan, the argument positions, the var reads and the outputs."""

    def __init__(self, entry, info, array_args: list[tuple[int, bool]], n_args: int, var_reads: tuple, device,
                 captures, donated: tuple):
        plan = entry.plan
        self.entry, self.plan, self.device, self.out_tree = entry, plan, device, entry.out_tree
        self.constants = tuple(entry.constants)  # captured arrays (tracing/constants.py): the plan's last inputs
        # the arguments are the plan's first inputs as they are (NumPy arrays, in order, nothing else)
        self.args_first = [i for i, _ in array_args] == list(range(n_args)) and not any(p for _, p in array_args)
        # else the inputs are picked from the arguments in C: the NumPy arrays, then the pj.Arrays' buffers (read
        # through Array.buffer, which raises for a deleted one), put back in argument order
        self.pick_numpy = _picker([i for i, is_pj in array_args if not is_pj])
        self.pick_pj = _picker([i for i, is_pj in array_args if is_pj])
        in_order = sorted(range(len(array_args)), key=lambda k: (array_args[k][1], k))  # the picks' order
        self.reorder = None if in_order == sorted(in_order) else \
            _picker(sorted(range(len(array_args)), key=in_order.__getitem__))
        # whether the arrays the function reaches are still the ones this plan was traced with (a rebound one
        # goes to the full path, which traces again); None when it reaches none
        self.captures = captures
        self.var_names = list(plan.vars)
        self.base_values = dict(info.var_values)
        # the call's var reads (Var, source, value when the key fixes it, where), in order; source: None where the
        # key fixes the value, an argument's position (a scalar var), or (position, dim) (an array's var dim)
        self.var_reads = var_reads
        self.test = _compile_test(plan, var_reads, info.var_values)
        self.shape_fns = entry.out_shape_fns
        self.dtypes = [plan.buffers[b].dtype for b in dict.fromkeys(plan.outputs)]
        self.values = tuple(self.base_values[n] for n in self.var_names)
        self.shapes = [fn(self.base_values) for fn in self.shape_fns]
        self.sized: dict = {}  # (_run_with_vars) var values -> _sized's output shapes and allocators
        # outputs in device memory (a GPU: all of a call's allocated together by device.empties), else host arrays,
        # each from its allocator (`out_specs`, `_sized`)
        self.on_gpu = on_gpu = device.device_memory
        self.out_specs = [(device.empty if on_gpu else allocator_for(s, dt), s, dt)
                          for s, dt in zip(self.shapes, self.dtypes)]
        self.single = entry.out_tree.kind == "leaf"
        # a donating call: the arrays' positions among the arguments, in the plan's order, and the donated ones'
        self.pick_arrays, self.donated = _picker([i for i, _ in array_args]), donated
        self.run = self._run_donating if donated else \
            self._run_with_vars if any(source is not None for _, source, _, _ in var_reads) else self._run

    def _inputs(self, args: tuple) -> tuple:
        if self.args_first:
            return args + self.constants
        try:
            buffers = tuple(map(_BUFFER, self.pick_pj(args)))
        except DeletedArrayError:
            return None  # (the full path raises the error naming the argument)
        inputs = self.pick_numpy(args) + buffers
        return (inputs if self.reorder is None else self.reorder(inputs)) + self.constants

    def _run(self, args: tuple):
        """A call whose var values all come from the (keyed) shapes: outputs and values are fixed."""
        captures = self.captures
        if captures is not None and not captures.same():
            return MISS
        inputs = self._inputs(args)
        if inputs is None:
            return MISS
        if self.single:  # (the common case, spelled out: a replay's cost is mostly calls like these)
            (alloc, shape, dtype), = self.out_specs
            output = alloc(shape, dtype)
            if self.plan.run_arrays(inputs + (output,), self.values):
                return Array(output, shape, dtype, self.device)
            return self._replay_aligned(inputs, [output], self.values, self.shapes)
        return self._replay(inputs, self._outputs(self.shapes, self.out_specs), self.values, self.shapes)

    def _run_with_vars(self, args: tuple):
        """A call with vars its key does not fix (scalar vars, arrays' var dims): test their bounds, their
        agreement and the index constraints first (one compiled function); when that fails, the full path's checks
        raise its error."""
        values = self._tested(args)
        if values is MISS:
            return MISS
        inputs = self._inputs(args)
        if inputs is None:
            return MISS
        sized = self.sized.get(values)
        if sized is None:
            sized = self._sized(values)
        shapes, specs = sized
        return self._replay(inputs, self._outputs(shapes, specs), values, shapes)

    def _outputs(self, shapes: list, specs: list) -> list:
        """A call's output arrays of `shapes`: a GPU's allocated together, else each by its (allocator, shape,
        dtype) of `specs`."""
        if self.on_gpu:
            return self.device.empties(shapes, self.dtypes)
        return [alloc(shape, dtype) for alloc, shape, dtype in specs]

    def _sized(self, values: tuple) -> tuple:
        """(the output shapes, their (allocator, shape, dtype)) at these var values, remembered for the first
        MAX_SIZED values (a serving engine's calls come back to the same lengths and widths)."""
        current = dict(zip(self.var_names, values))
        shapes = [fn(current) for fn in self.shape_fns]
        sized = shapes, None if self.on_gpu else [(allocator_for(shape, dtype), shape, dtype)
                                                  for shape, dtype in zip(shapes, self.dtypes)]
        if len(self.sized) < MAX_SIZED:
            self.sized[values] = sized
        return sized

    def _tested(self, args: tuple):
        """The values of a call's vars (plan.vars order), or MISS where the arrays it captured were rebound; a
        call whose vars fail the compiled test goes through the full path's checks, which raise."""
        values = self.test(args)
        if values is None:
            return self._raise(args)
        if self.captures is not None and not self.captures.same():
            return MISS
        return values

    def _run_donating(self, args: tuple):
        """A call that donates arrays: its var values tested as `_run_with_vars` does, then the full path's replay
        (replay_with_io) on the arguments' arrays as they are (pj.Arrays: a donated one gives up its memory)."""
        values = self._tested(args)
        if values is MISS:
            return MISS
        arrays = self.pick_arrays(args)
        if any(type(a) is Array and a.is_deleted() for a in arrays):
            return MISS  # a deleted pj.Array: the full path raises the error naming it
        return replay_with_io(self.entry, dict(zip(self.var_names, values)), arrays, self.donated)

    def _replay(self, inputs: tuple, outputs: list, values: tuple, shapes: list):
        if not self.plan.run_arrays(inputs + tuple(outputs), values):
            return self._replay_aligned(inputs, outputs, values, shapes)
        return self._wrap(outputs, shapes)

    def _replay_aligned(self, inputs: tuple, outputs: list, values: tuple, shapes: list):
        """A replay the plan refused (an input misaligned for its dtype), on aligned copies of the inputs."""
        inputs = tuple(np.require(a, requirements=("C", "A")) for a in inputs)
        if not self.plan.run_arrays(inputs + tuple(outputs), values):
            return MISS
        return self._wrap(outputs, shapes)

    def _wrap(self, outputs: list, shapes: list):
        device = self.device
        if self.single:
            return Array(outputs[0], shapes[0], self.dtypes[0], device)
        return self.out_tree.unflatten([Array(o, shape, dtype, device)
                                        for o, shape, dtype in zip(outputs, shapes, self.dtypes)])

    def _raise(self, args: tuple):
        """Raise the error of a call whose vars failed the compiled test: its var reads go through the full
        path's checks (check_reads: agreement, then bounds; the plan's index constraints)."""
        reads = [(var, value if source is None else args[source] if type(source) is int else
                  args[source[0]].shape[source[1]], where) for var, source, value, where in self.var_reads]
        values, _ = check_reads(reads)
        self.plan.require({n: values[n] for n in self.var_names})
        return MISS  # (the test and the checks disagree: the full path decides)


_BUFFER = operator.attrgetter("buffer")


def replay_with_io(entry, values: dict, arrays, donated: tuple, timings: list | None = None):
    """Run `entry`'s plan (a prepared function's _Entry) through `ExecutionPlan.run_with_io` on a call's `arrays`
    (the plan's inputs but its captured constants: NumPy arrays and pj.Arrays, in order) with the var `values`
    (checked), giving up the arrays at the `donated` positions; the call's result (outputs sharing a buffer
    copied). The full path's replay (function.py), and the fast path's of a donating call."""
    plan = entry.plan
    distinct = plan.run_with_io({n: values[n] for n in plan.vars}, [*arrays, *entry.constants],
                                [fn(values) for fn in entry.out_shape_fns], timings, donated)
    results, it = [], iter(distinct)
    for dup, index in zip(entry.duplicate, entry.first_of):
        results.append(plan.copy_array(results[index]) if dup else next(it))
    return entry.out_tree.unflatten(results)


def _picker(positions: list):
    """items -> the tuple of items[p] for p in positions (operator.itemgetter, always a tuple)."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    if positions:
        position, = positions
        return lambda items: (items[position],)
    return lambda items: ()


def _compile_test(plan, var_reads: tuple, var_values: dict):
    """args -> the plan's var values (in plan.vars order), or None when a var read the key does not fix (a
    scalar var's argument, an array's var dim: a source in `var_reads`) is outside its var's bounds (used by the
    plan or not), disagrees with another read of its var (one the key fixes, or an earlier one of the call's), or
    the values break one of the plan's index constraints."""
    fixed = {var.name: value for var, source, value, _ in var_reads if source is None}
    slot = {}  # var name -> Python expression of its value
    lines = ["def test(a):"]
    for var, source, _, _ in var_reads:
        if source is None:
            continue
        read = f"a[{source}]" if type(source) is int else f"a[{source[0]}].shape[{source[1]}]"
        if var.name in slot:
            lines.append(f"    if {read} != {slot[var.name]}: return None")
            continue
        local = slot[var.name] = f"v{len(slot)}"
        lines.append(f"    {local} = {read}")
        lines.append(f"    if not {var.min} <= {local} <= {var.max}: return None")
        if var.name in fixed:
            lines.append(f"    if {local} != {fixed[var.name]}: return None")
    values = f"({''.join(slot.get(n, repr(var_values[n])) + ', ' for n in plan.vars)})"
    if plan.constraints:
        lines += [f"    values = {values}", "    return None if check_constraints(values) >= 0 else values"]
    else:
        lines.append(f"    return {values}")
    scope: dict = {"check_constraints": plan.check_constraints}
    exec("\n".join(lines), scope)
    return scope["test"]


def _arrays_check(device, flat: tuple, spans: list):
    """A native check (runtime/array_check.py) that a call's containers' arrays (`spans` of `flat`: NumPy arrays)
    have the dtypes, shapes and strides of these, or None where none is (pj.Array leaves, no native check here:
    the fast path then compares the concrete keys)."""
    address = getattr(device, "same_arrays_address", 0)
    positions = [p for _, start, stop in spans for p in range(start, stop)]
    if not address or not positions or any(type(flat[p]) is not np.ndarray for p in positions):
        return None
    return same_arrays_entry(address, [flat[p] for p in positions], positions)


class FastCalls:
    """The fast-path table of one prepared function: concrete call key -> its _KnownCall's run and the native check
    of its containers' arrays. A call whose light key (`Signature.light_key`: no array parts of its containers) is
    the last call's and whose containers' arrays pass the last call's check has the last call's key: it replays
    without the containers' array parts read or compared."""

    def __init__(self, signature, fn):
        self.fn = fn
        self.signature = signature  # the call reader: concrete keys, and the checks a failed test falls back to
        self.enabled = signature.simple
        self.calls: dict = {}
        # the light and concrete keys a call found last (MISS: none yet), its run and its arrays' check
        self.last = (MISS, MISS, None, None)
        self.watches: dict = {}  # capture_key -> its CaptureWatch, shared by the calls whose plans captured those

    def __call__(self, args: tuple, device_name):
        if not self.enabled:
            return MISS
        light, flat, spans = self.signature.light_key(args, device_name)
        if light is None:
            return MISS
        last_light, last_key, run, same = self.last  # (one read: another thread may set it) the last call's
        if light == last_light and (same(flat) is flat if same is not None else not spans):  # its containers'
            return run(flat)  # arrays as the last call's, or no containers: the same concrete key, not compared again
        key = full_key(light, flat, spans)
        if key != last_key:  # compared, not hashed (a model's key is a few hundred parts), as the dict would
            found = self.calls.get(key)
            if found is None:
                return MISS
            run, same = found
        self.last = light, key, run, same
        return run(flat)

    def learn(self, args: tuple, device_name, info, entry, device, donated: tuple):
        """Remember the call that just went through the full path, when the fast path can replay it. `donated`:
        the positions of the arrays it donates among its arrays (a donating call replays through run_with_io,
        which needs no whole-plan runner and copies outputs that share a buffer)."""
        plan = entry.plan
        if not self.enabled or len(self.calls) >= MAX_KEYS or \
                not donated and (not plan.replays_arrays or any(entry.duplicate)):
            return
        signature = self.signature
        light, flat, spans = signature.light_key(args, device_name)
        if light is None:
            return
        key = full_key(light, flat, spans)
        if key in self.calls:
            return
        origin = []  # flat position -> the argument it comes from
        for i, a in enumerate(args):
            walked = walk(a) if type(a) in (dict, list, tuple) else None
            origin += [i] * (1 if walked is None else len(walked[1]))
        array_args, sources = [], {}  # sources: where a var read comes from -> its source (see _KnownCall)
        for i, a in enumerate(flat):
            if origin[i] in signature.static_positions:
                continue
            if type(a) is np.ndarray or type(a) is Array:
                if origin[i] in signature.symbolic_positions:  # (an argument, not a container's leaf)
                    rank, static = signature.symbolic_positions[origin[i]]
                    name = signature.params[origin[i]].name
                    sources.update({shape_read_where(name, d): (i, d) for d in range(rank) if d not in static})
                data = a.buffer if type(a) is Array else a
                in_place = type(a) is Array and a._device is device and device.device_memory  # GPU memory
                if not in_place and (type(data) is not np.ndarray or not data.flags.c_contiguous
                                     or not data.dtype.isnative):
                    return
                array_args.append((i, type(a) is Array))
            elif origin[i] in signature.var_positions:
                sources[signature.var_positions[origin[i]]] = i
        if len(array_args) + len(entry.constants) != len(plan.inputs) or len(info.arrays) != len(array_args) \
                or any(n not in info.var_values for n in plan.vars) \
                or plan.check_constraints(tuple(info.var_values[n] for n in plan.vars)) >= 0:
            return  # (a call that breaks an index constraint raises on the full path, and is not remembered)
        # a scalar var's read (where: its parameter's name) is read anew from its position, an argument's var dim
        # from its shape; any other the key fixes
        var_reads = tuple((var, sources.get(where), value, where) for var, value, where in info.reads)
        run = _KnownCall(entry, info, array_args, len(flat), var_reads, device, self._watch(entry.reachable),
                         donated).run
        self.calls[key] = run, _arrays_check(device, flat, spans)

    def _watch(self, reachable: tuple):
        """The CaptureWatch of the arrays a plan captured (one for all the calls whose plans captured the same
        ones), or None when it captured none."""
        if not reachable:
            return None
        watch = self.watches.get(capture_key(reachable))
        if watch is None:
            watch = self.watches[capture_key(reachable)] = CaptureWatch(self.fn, list(reachable))
        return watch
