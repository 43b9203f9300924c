"""Loading saved plans: `pj.load(path)` reads a plan file (saved.py's format) into a prepared function of its one
signature; `recompile=True` believes nothing the file states unless it is checked against its ASTs and the
signature (see saved.py's docstring and docs/saved.md)."""
from __future__ import annotations

import inspect
import math
import os
import stat

import numpy as np

from ..codegen.dynamic_loop import DynamicLoop
from ..codegen.memory import share_memory
from ..codegen.schedule import BufferSpec, KernelSequence, LoopKernels, Schedule, ScheduledKernel, _max_size
from ..codegen.ast_check import check_int_expr, check_kernel
from ..errors import CompileError, PlanFileError, SignatureError, TraceError
from .planner import PlanSpec, _kernel_from_entry, get_kernels, instantiate, kernel_launches, plan_vars, prove_plan
from ..runtime import datafile
from ..runtime.devices import get_device
from .signature import CallInfo, explain_retrace
from ..tracing.checks import for_every_iteration, when_run
from ..uop import UOp, serial
from ..uop.constraint import ERROR_KINDS, IndexConstraint
from ..uop.dtypes import dtypes
from ..uop.ops import Ops
from ..uop.var import Var
from .function import PreparedFunction, constant_on_device, freeze
from ..uop.serial import DTYPES_BY_NAME
from .saved import KIND, MAX_ELEMENTS, MAX_FILE_BYTES, PARAMETER_KINDS, VERSION, decode_spec, decode_tree, decode_value


class _SegmentDecoder:
    """Decodes a plan's segments from their data forms (saved.py's `_enc_segment`), one method per form, keyed by
    the form's tag (a kernel is a plain list), each segment checked as it is built. Records every loop the plan runs
    natively, and per kernel and loop bound the vars it takes from a call or an enclosing native loop's counter
    (the counters in scope): what _check_loop_conditions and _check_var_values check once the plan is whole."""

    def __init__(self, graph: list, n_asts: int, expr, buffers: tuple):
        self.graph, self.n_asts, self.expr, self.buffers = graph, n_asts, expr, buffers
        self.loops: list[DynamicLoop] = []
        self.var_uses: list[tuple[str, list[UOp], dict]] = []  # (what, vars no fixedvar sets, counters in scope)

    def segment(self, data, depth: int = 0, counters: dict | None = None):
        if type(data) is list:
            return self.kernel(data, counters or {})
        if type(data) is not dict or len(data) != 1 or next(iter(data)) not in _TAGGED_FORMS:
            raise ValueError(f"not a plan segment: {data!r:.60}")
        (tag, body), = data.items()
        return _TAGGED_FORMS[tag](self, body, depth, counters or {})

    def kernel(self, data, counters: dict, counter: str | None = None) -> ScheduledKernel:
        """[ast, buffers, fixedvars]; `counter`: the var of the fori_loop it is the body of (fixed per iteration)."""
        a, slots, fixed = data
        kernel = ScheduledKernel(self.graph[_index(a, self.n_asts)], tuple(_index(b, len(self.buffers)) for b in slots),
                                 tuple((_name(k), _int(v)) for k, v in fixed))
        set_by_plan = {counter} | {name for name, _ in kernel.fixedvars}
        self.var_uses.append((f"kernel {kernel.ast.arg}",
                              [u for u in kernel.ast.variables() if u.arg[0] not in set_by_plan], counters))
        return kernel

    def fori_loop(self, data, depth: int, counters: dict) -> LoopKernels:
        """A fori_loop the plan unrolls, outside any loop: [var, lower, upper, swap, body kernels]."""
        name, lower, upper, swap, body = data
        if depth or not _int(lower) < _int(upper):
            raise ValueError("not a fori_loop")
        name = _name(name)
        return LoopKernels(tuple(self.kernel(k, counters, name) for k in body), name, lower, upper, self.swap(swap))

    def dynamic_loop(self, data, depth: int, counters: dict) -> DynamicLoop:
        """A loop the plan runs natively: [var, lower, upper, predicate buffer, swap, conditions, parts]. A
        fori_loop's var is a var whose bounds hold every value its bounds can give it, a while_loop's predicate a
        0-d bool buffer."""
        var, lower, upper, pred, swap, conditions, parts = data
        if depth > 16 or len(parts) != 5:
            raise ValueError("not a loop the plan runs natively")
        bound = lambda b: _int(b) if type(b) is int else self.expr(b["u"])
        if var is None:
            pred = _index(pred, len(self.buffers))
            if self.buffers[pred].dtype is not dtypes.bool or self.buffers[pred].shape != () or \
                    (lower, upper) != (None, None):
                raise ValueError("a while_loop's predicate is not a 0-d bool buffer")
            lower = upper = None
        else:
            var, lower, upper = self.expr(var), bound(lower), bound(upper)
            low = lower if type(lower) is int else lower.vmin
            high = upper if type(upper) is int else upper.vmax
            symbolic = [b for b in (lower, upper) if isinstance(b, UOp)]
            if var.op is not Ops.DEFINE_VAR or pred is not None or any(b.dtype is not dtypes.int64 for b in symbolic) \
                    or not (var.vmin <= low and high - 1 <= var.vmax):
                raise ValueError("a loop's var does not hold every value of its bounds")
            self.var_uses.append(("a loop bound", [u for b in symbolic for u in b.variables()], counters))
        conditions = tuple(self.expr(c, dtypes.bool) for c in conditions)
        inside = counters if var is None else counters | {var.arg[0]: var}
        loop = DynamicLoop(var, lower, upper, pred, tuple(tuple(self.segment(k, depth + 1, inside) for k in part)
                                                          for part in parts), self.swap(swap), conditions)
        self.loops.append(loop)
        return loop

    def swap(self, pairs) -> tuple:
        return tuple((_index(a, len(self.buffers)), _index(b, len(self.buffers))) for a, b in pairs)


_TAGGED_FORMS = {"loop": _SegmentDecoder.fori_loop, "dloop": _SegmentDecoder.dynamic_loop}  # a kernel: a list


def _check_loop_conditions(spec, loops: list[DynamicLoop], var_names: set):
    """Every index condition a loop the plan runs natively (`loops`: all of them) lets the bounds proof assume is
    checked per call: the plan's constraints hold it at the loop var's first and last values (as checks.py recorded
    it when tracing)."""
    counters = {loop.var: (loop.lower, loop.upper) for loop in loops if loop.var is not None}
    checked = {c.cond for c in spec.constraints}
    for loop in loops:
        for cond in loop.conditions:
            if loop.var is not None and loop.var not in cond.variables():  # an index the counter does not move
                expected = [when_run(cond, loop.lower, loop.upper)]
            else:
                expected = [c.cond for c in for_every_iteration(IndexConstraint(cond, "", ""), var_names, counters)]
            if not set(expected) <= checked:
                raise ValueError("a loop's index condition is not among the plan's constraints")


class LoadedFunction(PreparedFunction):
    """A prepared function read from a plan file: one signature, every call guarantee of `pj.prepare`."""

    def __init__(self, stub, vars_, shapes, device_name, path, static_argnames=()):
        super().__init__(stub, vars=vars_, shapes=shapes, device=device_name, static_argnames=static_argnames)
        self.path = path

    @property
    def plan(self):
        """The ExecutionPlan read from the file."""
        return next(iter(self.entries.values())).plan

    def _entry(self, info: CallInfo):
        entry = self.entries.get(info.key + (self.device.name,))
        if entry is None:
            saved = next(iter(self.entries.values()))
            raise SignatureError(f"{self.signature.fn_name} was loaded from {self.path}, a plan for one signature; "
                                 f"this call needs another ({explain_retrace(saved.descriptions, info.descriptions)})")
        return entry


def _read(path) -> bytes:
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PlanFileError(f"{path} is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise PlanFileError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(info.st_size + 1)
    finally:
        os.close(fd)


def load(path, recompile: bool = False) -> LoadedFunction:
    """The prepared function saved in `path` (see PreparedFunction.save): it takes the saved signature's calls
    and replays the saved plan; stats["compiles"] == 0. With `recompile`, every kernel is compiled here from
    its stored AST and the bounds proof runs again (for a file you do not trust)."""
    data = _read(path)
    try:
        meta, payload = datafile.unpack(data, KIND, VERSION)
    except datafile.FormatError as e:
        raise PlanFileError(f"{path} is not a usable plan file: {e}") from None
    device_name = meta.get("device")
    if not isinstance(device_name, str):
        raise PlanFileError(f"{path} is malformed: no device")
    try:
        device = get_device(device_name)
    except Exception as e:  # noqa: BLE001 - any failure to reach the file's device
        raise PlanFileError(f"{path} is a plan for device {device_name!r}, which is not available here ({e})") from None
    if meta.get("compiler_id") != device.compiler_id and not recompile:
        raise PlanFileError(f"{path} was compiled for another {device.name} ({meta.get('compiler_id')!r}; this one "
                            f"is {device.compiler_id!r}); load it with recompile=True to compile it here")
    try:
        fn, spec, codes, call = _decode(meta, payload, path, device_name)
    except PlanFileError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever a malformed field makes a decoder raise
        raise PlanFileError(f"{path} is malformed: {type(e).__name__}: {e}") from None
    try:
        plan = _instantiate(fn, spec, codes, device, recompile, path)
    except PlanFileError:
        raise
    except CompileError as e:  # a kernel the bounds proof refuses (or that does not compile here)
        raise PlanFileError(f"{path} holds a kernel this prepjit refuses: {e}") from None
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - a var with two bounds (runtime/var_table.py), or a kernel no
        raise PlanFileError(f"{path} is inconsistent: {type(e).__name__}: {e}") from None  # renderer can build
    key, out_tree, descriptions, sources, constants = call
    plan.var_sources.update(sources)
    entry = fn.entries[key + (device.name,)] = freeze(plan, out_tree, descriptions)
    entry.constants = tuple(constant_on_device(device, value) for value in constants)
    fn._stats.update(plans=1, proven_accesses=plan.proven_accesses)
    return fn


def _instantiate(fn: LoadedFunction, spec: PlanSpec, codes: list, device, recompile: bool, path):
    """The ExecutionPlan of a decoded file. With `recompile`, buffer sizes, shared memory and the bounds proof are
    derived here (the file's are not read) and every kernel is compiled from its AST."""
    if recompile:
        home = share_memory(Schedule(spec.buffers, spec.kernels, spec.inputs,
                                     spec.outputs + tuple(b for b, _ in spec.flags)))
        asts = spec.kernels.asts()
        compiled, counts = get_kernels(asts, device)  # the proof is of the kernels as launched (before any runs)
        spec = PlanSpec(spec.buffers, tuple(home), spec.kernels, spec.inputs, spec.outputs, spec.constraints,
                        spec.flags, prove_plan(spec.kernels, spec.buffers, spec.constraints,
                                               kernel_launches(asts, compiled)))
        compiled = dict(zip(asts, compiled))
        fn._stats.update(counts)
    else:
        try:
            programs = [_kernel_from_entry(fields, binary, device, ast)
                        for (fields, binary), ast in zip(codes, spec.kernels.asts())]
        except Exception as e:  # noqa: BLE001 - code the device cannot load
            raise PlanFileError(f"{path}: the {device.name} cannot load its compiled code ({e})") from None
        compiled = dict(zip(spec.kernels.asts(), programs))
    return instantiate(spec, compiled, device)


def _decode(meta: dict, payload: bytes, path, device_name: str):
    """(the LoadedFunction without its plan, the PlanSpec, [(kernel fields, code)], (signature key, output
    structure, descriptions, var sources)), or a decoding error."""
    vars_ = {}
    for name, lo, hi in meta["vars"]:
        vars_[name] = Var(name, lo, hi)
    shapes = {name: decode_spec(s, vars_) for name, s in meta["shapes"].items()}
    params = [inspect.Parameter(name, PARAMETER_KINDS[kind], **({} if default is None else {"default": decode_value(default["value"])}))
              for name, kind, default in meta["params"]]
    fn_name = meta["function"]

    def stub(*args, **kwargs):
        raise TraceError(f"{fn_name} was loaded from a plan file and has no Python code to trace; call it "
                         "outside traced functions")
    stub.__name__ = stub.__qualname__ = str(fn_name)
    stub.__signature__ = inspect.Signature(params)
    fn = LoadedFunction(stub, vars_, shapes, device_name, os.fspath(path), tuple(map(str, meta["static"])))

    graph = serial.from_data(meta["graph"])
    n_asts = _int(meta["asts"], 1, len(graph))
    slot_dtypes = {ast: check_kernel(ast) for ast in graph[:n_asts]}  # per AST: its buffer slots' dtypes
    expr = lambda i, dtype=dtypes.int64: check_int_expr(graph[_index(i, len(graph))], dtype)  # noqa: E731
    buffers = []
    for dt, shape, _size, _home in meta["buffers"]:  # the size is derived from the shape, not read
        shape = tuple(_int(d, 0, MAX_ELEMENTS) if type(d) is int else expr(d["u"]) for d in shape)
        buffers.append(BufferSpec(DTYPES_BY_NAME[dt], shape, _max_size(shape)))
        if buffers[-1].max_size * buffers[-1].dtype.itemsize > MAX_ELEMENTS:
            raise ValueError(f"a buffer of shape {shape} is larger than {MAX_ELEMENTS} bytes")
    buffers, n = tuple(buffers), len(buffers)
    home = tuple(_index(h, n) for *_, h in meta["buffers"])

    segments = _SegmentDecoder(graph, n_asts, expr, buffers)
    kernels = KernelSequence([segments.segment(k) for k in meta["kernels"]])
    inputs = tuple(_index(b, n) for b in meta["inputs"])
    outputs = tuple(_index(b, n) for b in meta["outputs"])
    constraints = tuple(IndexConstraint(expr(c[0], dtypes.bool), str(c[1]), str(c[2]), _error_kind(c))
                        for c in meta["constraints"])
    flags = tuple((_index(b, n), str(what)) for b, what in meta["flags"])
    if any(buffers[b].dtype is not dtypes.bool or buffers[b].shape != () for b, _ in flags):
        raise ValueError("a gather's flag is not a 0-d bool buffer")
    spec = PlanSpec(buffers, home, kernels, inputs, outputs, constraints, flags, _int(meta["proven"], 0))
    _check_kernels(spec, slot_dtypes)
    _check_var_values(spec, _check_vars(fn, spec), segments.var_uses)
    _check_loop_conditions(spec, segments.loops, {str(v[0]) for v in meta["vars"]})
    _check_io(fn, meta, spec)
    codes, offset = [], 0
    for c in meta["codes"]:
        size = c["bytes"]
        if type(size) is not int or size <= 0 or offset + size > len(payload):
            raise ValueError("code sizes do not match the payload")
        fields = {"name": str(c["name"]), "source": str(c["source"]), "var_names": tuple(map(str, c["var_names"])),
                  "global_size": tuple(expr(g) for g in c["global_size"]),
                  "local_size": tuple(_int(s, 1, 1 << 16) for s in c["local_size"]),
                  "ast": graph[_index(c["ast"], len(graph))]}
        if fields["ast"].op is not Ops.SINK:
            raise ValueError(f"kernel {fields['name']}'s launched AST is not a kernel")
        if not set(fields["var_names"]) <= {v.arg[0] for v in graph[_index(len(codes), n_asts)].variables()}:
            raise ValueError(f"kernel {fields['name']} takes vars its AST does not have")
        codes.append((fields, payload[offset:offset + size]))
        offset += size
    constants = []
    for dtype, shape in meta.get("constants", []):
        shape = tuple(_index(d, MAX_FILE_BYTES) for d in shape)
        size = math.prod(shape) * DTYPES_BY_NAME[dtype].itemsize
        if offset + size > len(payload):
            raise ValueError("captured array sizes do not match the payload")
        constants.append(np.frombuffer(payload, DTYPES_BY_NAME[dtype].np, size // DTYPES_BY_NAME[dtype].itemsize, offset)
                         .reshape(shape).copy())
        offset += size
    if offset != len(payload) or len(codes) != n_asts:
        raise ValueError("code sizes do not match the payload")
    _check_constants(spec, constants)
    call = (decode_value(meta["key"]), decode_tree(meta["out_tree"]), [(str(p), decode_value(part)) for p, part in meta["descriptions"]],
            {str(k): str(v) for k, v in meta["var_sources"].items()}, constants)
    if not isinstance(call[0], tuple):
        raise ValueError("the signature key is not a tuple")
    return fn, spec, codes, call


def _check_constants(spec: PlanSpec, constants: list):
    """The captured arrays are the plan's last inputs, each of its input buffer's dtype and (static) shape."""
    for value, b in zip(constants, spec.inputs[len(spec.inputs) - len(constants):]):
        buf = spec.buffers[b]
        if buf.dtype.np != value.dtype or tuple(buf.shape) != value.shape:
            raise ValueError(f"captured array {value.dtype} {value.shape} does not match its input buffer {b}")


def _index(i, n: int) -> int:
    if type(i) is not int or not 0 <= i < n:
        raise ValueError(f"index {i!r:.40} out of range")
    return i


def _int(x, lo: int = -2**63, hi: int = 2**63 - 1) -> int:
    """`x` if it is an int in [lo, hi] (by default: what a kernel's int64 argument holds)."""
    if type(x) is not int or not lo <= x <= hi:
        raise ValueError(f"{x!r:.40} is not an int in [{lo}, {hi}]")
    return x


def _name(x) -> str:
    if not isinstance(x, str) or not x.isidentifier():
        raise ValueError(f"{x!r:.40} is not a var name")
    return x


def _check_kernels(spec: PlanSpec, slot_dtypes: dict):
    """Every kernel, with each set of buffers it runs on (both parities of a loop), has buffers of its AST's slot
    dtypes, and none writes an argument: the proof counts elements of the dtypes the plan allocates."""
    inputs = set(spec.inputs)
    for k, _ in spec.kernels.counted():
        if slot_dtypes[k.ast] != [spec.buffers[b].dtype for b in k.buffers]:
            raise ValueError(f"kernel {k.ast.arg}'s buffers are not of its AST's dtypes")
        if k.buffers[0] in inputs:
            raise ValueError(f"kernel {k.ast.arg} writes an argument of the call")


def _check_vars(fn: LoadedFunction, spec: PlanSpec):
    """The plan's VarTable (its var bounds read off the ASTs), PlanFileError where the signature says other
    bounds; a var's bounds are the ones every call checks, so they are what the proof may assume."""
    table = plan_vars(spec)  # ValueError for a var with two bounds
    for name, (lo, hi) in table.bounds.items():
        var = fn.vars.get(name)
        if var is not None and (var.min, var.max) != (lo, hi):
            raise PlanFileError(f"{fn.path} is inconsistent: var {name!r} is [{var.min}, {var.max}] in the "
                                f"signature but [{lo}, {hi}] in the kernels")
    return table


def _check_var_values(spec: PlanSpec, table, var_uses: list):
    """Every var of every kernel gets a value: one each call supplies and checks, the counter of a native loop the
    kernel is inside (that loop's own var), or one the plan fixes (a fori_loop's counter, a fixedvar): `var_uses`
    holds each kernel's other vars with the counters in scope (_SegmentDecoder). Shapes, constraints and native loop
    bounds use only the call's vars (and enclosing counters). That the fixed values are inside the bounds the proof
    assumed is checked by the plan when it is built (PreparedKernel.check_fixed, against the kernels' runtime_vars)."""
    shapes = [("a buffer shape", d.variables(), {}) for b in spec.buffers for d in b.shape if isinstance(d, UOp)]
    constraints = [("an index constraint", c.cond.variables(), {}) for c in spec.constraints]
    for what, variables, counters in var_uses + shapes + constraints:
        for u in variables:
            if u.arg[0] not in table.var and counters.get(u.arg[0]) is not u:
                raise ValueError(f"{what} uses var {u.arg[0]!r}, which no call supplies")


def _error_kind(c) -> str:
    """A saved constraint's error kind: its 4th entry (files without one hold index constraints only)."""
    if not isinstance(c, list) or len(c) not in (3, 4) or (len(c) == 4 and c[3] not in ERROR_KINDS):
        raise ValueError(f"not an index constraint: {c!r:.80}")
    return c[3] if len(c) == 4 else "index"


def _check_io(fn: LoadedFunction, meta: dict, spec: PlanSpec):
    """The signature's array leaves are the plan's inputs (same dtypes and shapes) and its outputs fill the output
    structure; PlanFileError otherwise (a call would hand kernels arrays of another size)."""
    key = decode_value(meta["key"])
    arrays = [part for part in key if isinstance(part, tuple) and part and part[0] == "array"]
    if len(arrays) + len(meta.get("constants", [])) != len(spec.inputs) or decode_tree(meta["out_tree"]).num_leaves != len(spec.outputs):
        raise PlanFileError("the plan's inputs or outputs do not match its signature")
    for (_, dtype, dims), b in zip(arrays, spec.inputs):
        buf = spec.buffers[b]
        same = buf.dtype.name == dtype and len(dims) == len(buf.shape) and all(
            d == s if isinstance(d, int) else isinstance(s, UOp) and s.op is Ops.DEFINE_VAR and s.arg[0] == d
            and d in fn.vars and fn.vars[d] == Var.of(s)
            for d, s in zip(dims, buf.shape))
        if not same:
            raise PlanFileError(f"the plan's input buffer {b} ({buf.dtype.name} {buf.shape}) does not match its "
                                f"signature ({dtype} {dims})")
