"""The prepared-call fast path: per-signature closures that replay a plan straight on NumPy arrays.

A positional call whose arguments are NumPy arrays and scalars (as 0-d arrays), pj.Arrays on the cpu or on the
plan's GPU, ints, strings, bools, None, or dicts, lists and tuples of arrays (a model's weights) is looked up by
a cheap key: each array's dtype, shape and strides, each container's keys or length, each static value, and a
marker for each scalar var (a container's arrays take its place, in the full path's flatten order). The first
call with a key goes through the full path (`Signature.read`, which checks everything); after it,
`FastCalls.learn` records what that call decided: the plan, the var values read off the shapes (already
checked), the output shapes and dtypes, and one compiled check of every declared scalar var's bounds (used
by the plan or not) and the plan's index constraints. Later calls with the key skip straight to
`ExecutionPlan.run_arrays`: inputs are read in place (a GPU uploads NumPy inputs into staging it keeps),
each output is one `host_pool.empty` (a GPU's: device memory from its pool). Anything
unusual (a bound violation, a var that disagrees, a misaligned array) falls back to the full
path, which raises the proper error or copies.
"""
from __future__ import annotations

import numpy as np

from ..runtime.array import Array
from ..runtime.host_pool import allocator_for, empty
from ..tracing.constants import CaptureWatch, capture_key
from ..tracing.pytree import MAX_DEPTH
from ..uop import render_python

MISS = object()
MAX_KEYS = 4096  # distinct concrete shapes remembered per prepared function


class _FastCall:
    """What one concrete call signature replays: plan, argument positions, var checks and outputs."""

    def __init__(self, entry, info, array_args: list[tuple[int, bool]], n_args: int, var_args: list[tuple[int, str]],
                 declared: dict, device, captures):
        plan = entry.plan
        self.plan, self.device, self.out_tree = plan, device, entry.out_tree
        self.array_args = array_args
        self.constants = tuple(entry.constants)  # captured arrays (tracing/constants.py): the plan's last inputs
        # the arguments are the plan's first inputs as they are (NumPy arrays, in order, nothing else)
        self.args_first = [i for i, _ in array_args] == list(range(n_args)) and not any(p for _, p in array_args)
        # whether the arrays the function reaches are still the ones this plan was traced with (a rebound one
        # goes to the full path, which traces again); None when it reaches none
        self.captures = captures
        self.var_names = list(plan.vars)
        self.base_values = dict(info.var_values)
        self.var_checks = var_args
        self.check = _compile_check(plan, var_args, declared, info)
        self.shape_fns = entry.out_shape_fns
        self.dtypes = [plan.buffers[b].dtype for b in dict.fromkeys(plan.outputs)]
        self.values = tuple(self.base_values[n] for n in self.var_names)
        self.shapes = [fn(self.base_values) for fn in self.shape_fns]
        on_gpu = device.target.device_memory  # outputs in device memory (a GPU), else host arrays
        self.empty = device.empty if on_gpu else empty
        self.out_specs = [(device.empty if on_gpu else allocator_for(s, dt), s, dt)
                          for s, dt in zip(self.shapes, self.dtypes)]
        self.single = entry.out_tree.kind == "leaf"
        self.run = self._run_with_vars if self.var_checks else self._run

    def _inputs(self, args: tuple) -> tuple:
        if self.args_first:
            return args + self.constants
        return tuple(args[i].buffer if is_pj else args[i] for i, is_pj in self.array_args) + self.constants

    def _run(self, args: tuple):
        """A call whose var values all come from the (keyed) shapes: outputs and values are fixed."""
        captures = self.captures
        if captures is not None and not captures.same():
            return MISS
        inputs = self._inputs(args)
        if self.single:  # (the common case, spelled out: a replay's cost is mostly calls like these)
            (alloc, shape, dtype), = self.out_specs
            output = alloc(shape, dtype)
            if self.plan.run_arrays(inputs + (output,), self.values):
                return Array(output, shape, dtype, self.device)
            return self._replay_aligned(inputs, [output], self.values, self.shapes)
        return self._replay(inputs, [alloc(shape, dtype) for alloc, shape, dtype in self.out_specs], self.values,
                            self.shapes)

    def _run_with_vars(self, args: tuple):
        """A call with scalar vars: check their bounds, agreement with the shapes and the index constraints
        first (one compiled function); anything off goes to the full path, which raises the proper error."""
        values = self.check(args)
        if values is None or self.captures is not None and not self.captures.same():
            return MISS
        current = dict(zip(self.var_names, values))
        shapes = [fn(current) for fn in self.shape_fns]
        outputs = [self.empty(shape, dtype) for shape, dtype in zip(shapes, self.dtypes)]
        return self._replay(self._inputs(args), outputs, values, shapes)

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


def _compile_check(plan, var_args: list[tuple[int, str]], declared: dict, info):
    """args -> the plan's var values (in plan.vars order), or None when a scalar var is outside its declared
    bounds (`declared`: the signature's Vars; used by the plan or not), disagrees with a shape, or an index
    constraint fails."""
    slot = {}  # var name -> Python expression of its value
    lines = ["def check(a):"]
    for i, name in var_args:
        local = f"v{len(slot)}"
        lines.append(f"    {local} = a[{i}]")
        lines.append(f"    if not {declared[name].min} <= {local} <= {declared[name].max}: return None")
        if name in info.shape_vars:
            lines.append(f"    if {local} != {info.var_values[name]}: return None")
        slot[name] = local
    for name in plan.vars:
        slot.setdefault(name, repr(info.var_values[name]))
    for c in plan.constraints:
        lines.append(f"    if not {render_python(c.cond, lambda n: slot[n])}: return None")
    lines.append(f"    return ({''.join(slot[n] + ', ' for n in plan.vars)})")
    scope: dict = {}
    exec("\n".join(lines), scope)
    return scope["check"]


class FastCalls:
    """The fast-path table of one prepared function: concrete call key -> its _FastCall's run."""

    def __init__(self, signature, fn):
        self.fn = fn
        self.enabled = signature.simple
        self.var_positions = {i: p.name for i, p in enumerate(signature.params) if p.name in signature.scalar_vars}
        self.static_positions = {i for i, p in enumerate(signature.params) if p.name in signature.static}
        self.declared = signature.vars  # name -> Var: the declared bounds a scalar var is checked against
        self.calls: dict = {}
        self.watches: dict = {}  # capture_key -> its CaptureWatch, shared by the calls whose plans captured those

    def key(self, args: tuple, device_name) -> tuple:
        """(the concrete key of a positional call, its arguments with each container's arrays in its place),
        or (None, None) when an argument is not of a fast kind."""
        parts = [device_name]
        var_positions = self.var_positions
        static_positions = self.static_positions
        flat = None   # the arguments with containers flattened, once there is one
        for i, a in enumerate(args):
            t = type(a)
            if static_positions and i in static_positions:  # keyed by value (static_argnums / static_argnames)
                if t not in (int, float, str, bool) and a is not None:
                    return None, None
                parts.append((t, a))
            elif t is np.ndarray:
                parts.append((a.dtype, a.shape, a.strides))
            elif t is int:
                parts.append(int if i in var_positions else a)
            elif t is Array:
                parts.append((Array, a._device, a.dtype, a.shape))
            elif t is str or t is bool or a is None:
                parts.append((t, a))
            elif t is dict or t is list or t is tuple:
                if flat is None:
                    flat = list(args[:i])
                if not _tree_key(a, parts, flat, 0):
                    return None, None
                continue
            elif isinstance(a, np.generic) and not isinstance(a, np.flexible) and i not in var_positions:
                # a NumPy scalar is a 0-d array (signature.is_array_like)
                if flat is None:
                    flat = list(args[:i])
                flat.append(np.asarray(a))
                parts.append((a.dtype, (), ()))
                continue
            else:
                return None, None
            if flat is not None:
                flat.append(a)
        return tuple(parts), (args if flat is None else tuple(flat))

    def __call__(self, args: tuple, device_name):
        if not self.enabled:
            return MISS
        key, flat = self.key(args, device_name)
        run = self.calls.get(key)
        return MISS if run is None else run(flat)

    def learn(self, args: tuple, device_name, info, entry, device):
        """Remember the call that just went through the full path, when the fast path can replay it."""
        plan = entry.plan
        if not self.enabled or not plan.replays_arrays or any(entry.duplicate) or len(self.calls) >= MAX_KEYS:
            return
        key, flat = self.key(args, device_name)
        if key is None or key in self.calls:
            return
        origin = []  # flat position -> the argument it comes from
        for i, a in enumerate(args):
            arrays = []
            origin += [i] * (len(arrays) if type(a) in (dict, list, tuple) and _tree_key(a, [], arrays, 0) else 1)
        array_args, var_args = [], []
        for i, a in enumerate(flat):
            if origin[i] in self.static_positions:
                continue
            if type(a) is np.ndarray or type(a) is Array:
                data = a.buffer if type(a) is Array else a
                in_place = type(a) is Array and a._device is device and device.target.device_memory  # GPU memory
                if not in_place and (type(data) is not np.ndarray or not data.flags.c_contiguous
                                     or not data.dtype.isnative):
                    return
                array_args.append((i, type(a) is Array))
            elif origin[i] in self.var_positions:
                var_args.append((i, self.var_positions[origin[i]]))
        if len(array_args) + len(entry.constants) != len(plan.inputs) or len(info.arrays) != len(array_args) \
                or any(n not in info.var_values for n in plan.vars) \
                or plan.check_constraints(tuple(info.var_values[n] for n in plan.vars)) >= 0:
            return  # (a call that breaks an index constraint raises on the full path, and is not remembered)
        self.calls[key] = _FastCall(entry, info, array_args, len(flat), var_args, self.declared, device,
                                    self._watch(entry.reachable)).run

    def _watch(self, reachable: tuple):
        """The CaptureWatch of the arrays a plan captured (one for all the calls whose plans captured the same
        ones), or None when it captured none."""
        if not reachable:
            return None
        watch = self.watches.get(capture_key(reachable))
        if watch is None:
            watch = self.watches[capture_key(reachable)] = CaptureWatch(self.fn, list(reachable))
        return watch


def _tree_key(tree, parts: list, flat: list, depth: int) -> bool:
    """Append the key parts of a container of arrays (its keys or length, each array's dtype, shape and strides)
    and its arrays in the full path's order (pytree.flatten: dict insertion order); False when it holds anything
    else (its other leaves are static values: the full path keys them) or nests deeper than MAX_DEPTH."""
    t = type(tree)
    if t is np.ndarray:
        parts.append((tree.dtype, tree.shape, tree.strides))
    elif t is Array:
        parts.append((Array, tree._device, tree.dtype, tree.shape))
    elif tree is None:
        parts.append(None)
        return True
    elif depth == MAX_DEPTH:
        return False
    elif t is dict:
        parts.append((dict, tuple(tree)))
        return all(_tree_key(v, parts, flat, depth + 1) for v in tree.values())
    elif t is list or t is tuple:
        parts.append((t, len(tree)))
        return all(_tree_key(v, parts, flat, depth + 1) for v in tree)
    else:
        return False
    flat.append(tree)
    return True

