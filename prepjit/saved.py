"""Saved plans: `f.save(path, *args)` writes one prepared signature to a file, `load(path)` replays it anywhere.

A plan file is a datafile.py file of kind "plan": JSON metadata (the call signature, the plan's
data description, planner.PlanSpec: buffers, kernels, I/O, constraints, every UOp in the data
form of uop/serial.py) and a payload of the kernels' compiled code, back to back, then the bytes of the
arrays the function captured (trace/constants.py: they are the plan's last inputs). Nothing in it
is unpickled or evaluated: metadata is decoded into known types and checked, and a file that is
malformed, truncated, of another format version or for another device (name or compiler) raises
PlanFileError. Var bounds are read off the kernels' ASTs (planner.plan_vars) and must equal the
signature's. Loading a file runs its compiled code, so load files you trust; `recompile=True`
compiles every kernel here from its AST and proves every access inside its buffer again (the code
in the file is not used), which is what an untrusted file needs. Either way, what the proof relies on is
checked against the ASTs, never believed: each AST is one the scheduler makes (codegen/ast_check.py),
fixed values lie in their vars' bounds, buffer sizes follow from their shapes and their dtypes from the
ASTs' slots (_check_kernels, _check_var_values); any failure, the proof's included, is PlanFileError.
"""
from __future__ import annotations

import inspect
import math
import os
import stat

import numpy as np

from .codegen.dynamic_loop import DynamicLoop
from .codegen.memory import share_memory
from .codegen.schedule import BufferSpec, KernelSequence, LoopKernels, Schedule, ScheduledKernel, _max_size
from .codegen.ast_check import check_int_expr, check_kernel
from .errors import CompileError, PlanFileError, SignatureError, TraceError
from .planner import PlanSpec, _kernel_from_entry, get_kernels, instantiate, plan_vars, prove_plan
from .prepare import PreparedFunction, constant_on_device, freeze
from .runtime import datafile
from .runtime.devices import get_device
from .runtime.dynamic_loop import DynamicLaunches
from .signature import CallInfo, explain_retrace
from .trace.checks import for_every_iteration, when_run
from .trace.pytree import TreeDef
from .uop import UOp, serial
from .uop.constraint import ERROR_KINDS, IndexConstraint
from .uop.dtypes import dtypes, to_dtype
from .uop.ops import Ops
from .uop.var import Var

KIND, VERSION = b"plan", 1
MAX_FILE_BYTES = 4 << 30
MAX_ELEMENTS = 1 << 48  # a buffer's bytes at the vars' maxima, and any of its static dims
_DTYPES = {d.name: d for d in dtypes.all}
_KINDS = [inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_POSITIONAL,
          inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD]


# ---- plain values (signature keys, static arguments, pytree structures) <-> JSON ----
def _enc(x):
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return {"f": x.hex()}
    if isinstance(x, tuple):
        return {"t": [_enc(v) for v in x]}
    if isinstance(x, TreeDef):
        return {"tree": [x.kind, [_enc(k) for k in x.keys], [_enc(c) for c in x.children]]}
    raise SignatureError(f"a value of type {type(x).__name__} ({x!r:.60}) in the call's signature has no data form, "
                         "so this plan cannot be saved; pass static arguments as ints, floats, strings, bools, "
                         "None or tuples of those")


def _dec(x):
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, dict) and len(x) == 1:
        (tag, v), = x.items()
        if tag == "f" and isinstance(v, str):
            return float.fromhex(v)
        if tag == "t" and isinstance(v, list):
            return tuple(_dec(e) for e in v)
        if tag == "tree" and isinstance(v, list) and len(v) == 3 and v[0] in ("leaf", "list", "tuple", "dict", "none"):
            return TreeDef(v[0], tuple(_dec(k) for k in v[1]), tuple(_tree(c) for c in v[2]))
    raise ValueError(f"not a signature value: {x!r:.60}")


def _tree(x) -> TreeDef:
    tree = _dec(x)
    if not isinstance(tree, TreeDef):
        raise ValueError("not a pytree structure")
    return tree


def _enc_spec(spec):
    """A `shapes` spec (dims, pytrees of dims) as data."""
    if spec is None or isinstance(spec, (int, str)):
        return spec
    if isinstance(spec, Var):
        return {"var": spec.name}
    if isinstance(spec, (tuple, list)):
        return [_enc_spec(s) for s in spec]
    if isinstance(spec, dict):
        return {"dict": [[_enc(k), _enc_spec(v)] for k, v in spec.items()]}
    raise SignatureError(f"a shapes spec {spec!r:.60} has no data form")


def _dec_spec(data, vars_: dict):
    if data is None or isinstance(data, (int, str)):
        return data
    if isinstance(data, list):
        return tuple(_dec_spec(s, vars_) for s in data)
    if isinstance(data, dict) and set(data) == {"var"}:
        return vars_[data["var"]]
    if isinstance(data, dict) and set(data) == {"dict"}:
        return {_dec(k): _dec_spec(v, vars_) for k, v in data["dict"]}
    raise ValueError(f"not a shapes spec: {data!r:.60}")


# ---- saving ----
def save(fn: PreparedFunction, path, info: CallInfo):
    """Write the plan of `info`'s signature (prepared now if needed) to `path`, atomically."""
    entry = fn._entry(info)
    plan, spec = entry.plan, entry.plan.spec
    device = fn.device
    asts = spec.kernels.asts()
    ast_index = {a: i for i, a in enumerate(asts)}
    programs = {}
    for step in plan.kernels.launches():
        for pk in (step[1] + step[2] if isinstance(step, tuple) else step.flat if isinstance(step, DynamicLaunches)
                   else (step,)):
            programs.setdefault(pk.ast, pk.kernel)
    roots: list[UOp] = list(asts)
    root_index = dict(ast_index)

    def ref(u: UOp) -> int:
        if u not in root_index:
            root_index[u] = len(roots)
            roots.append(u)
        return root_index[u]

    buffers = [[b.dtype.name, [d if isinstance(d, int) else {"u": ref(d)} for d in b.shape], b.max_size, h]
               for b, h in zip(spec.buffers, spec.home)]
    constraints = [[ref(c.cond), c.text, c.what] + ([c.error_kind] if c.error_kind != "index" else [])
                   for c in spec.constraints]
    kernels = [_enc_kernels(seg, ast_index, ref) for seg in spec.kernels.segments]  # refs before the graph
    payload, codes = [], []
    for ast in asts:
        k = programs[ast]
        if not k.binary:
            raise PlanFileError(f"kernel {k.name} has no compiled code to save")
        codes.append({"name": k.name, "source": k.source, "var_names": list(k.var_names),
                      "global_size": [ref(g) for g in k.global_size], "local_size": list(k.local_size),
                      "bytes": len(k.binary)})
        payload.append(k.binary)
    constants = [np.ascontiguousarray(np.asarray(c)) for c in entry.constants]  # captured arrays, after the code
    payload += [c.tobytes() for c in constants]
    try:
        graph = serial.to_data(tuple(roots))
    except ValueError as e:
        raise SignatureError(f"this plan cannot be saved: {e}") from None
    sig = fn.signature
    params = []
    for p in sig.params:
        default = None
        if p.default is not p.empty:
            try:
                default = {"value": _enc(p.default)}
            except SignatureError:
                default = None  # a default with no data form: the loaded function needs the argument
        params.append([p.name, _KINDS.index(p.kind), default])
    meta = {
        "function": sig.fn_name, "device": device.name, "compiler_id": device.compiler_id,
        "params": params, "vars": [[v.name, v.min, v.max] for v in sig.vars.values()], "static": sorted(sig.static),
        "shapes": {name: _enc_spec(s) for name, s in sig.shapes.items()},
        "key": _enc(info.key), "descriptions": [[p, _enc(part)] for p, part in entry.descriptions],
        "out_tree": _enc(entry.out_tree), "var_sources": dict(plan.var_sources),
        "graph": graph, "asts": len(asts), "buffers": buffers,
        "kernels": kernels,
        "inputs": list(spec.inputs), "outputs": list(spec.outputs), "constraints": constraints,
        "flags": [[b, what] for b, what in spec.flags], "proven": spec.proven_accesses, "codes": codes,
        "constants": [[to_dtype(c.dtype).name, list(c.shape)] for c in constants],
    }
    data = datafile.pack(KIND, VERSION, meta, b"".join(payload))
    path = os.fspath(path)
    temp = f"{path}.{os.urandom(6).hex()}.tmp"
    try:
        with open(temp, "xb") as out:
            out.write(data)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def _enc_kernels(seg, ast_index: dict, ref):
    """A kernel as [ast, buffers, fixedvars], a fori_loop as {"loop": [var, lower, upper, swap, body]}, or a loop
    the plan runs natively as {"dloop": [var, lower, upper, predicate buffer, swap, conditions, parts]} (UOps as
    graph indices, `ref`'s)."""
    if isinstance(seg, LoopKernels):
        return {"loop": [seg.name, seg.lower, seg.upper, [list(p) for p in seg.swap],
                         [_enc_kernels(k, ast_index, ref) for k in seg.body]]}
    if isinstance(seg, DynamicLoop):
        bound = lambda b: b if b is None or isinstance(b, int) else {"u": ref(b)}  # noqa: E731
        return {"dloop": [None if seg.var is None else ref(seg.var), bound(seg.lower), bound(seg.upper),
                          seg.pred_buffer, [list(p) for p in seg.swap], [ref(c) for c in seg.conditions],
                          [[_enc_kernels(k, ast_index, ref) for k in part] for part in seg.parts]]}
    return [ast_index[seg.ast], list(seg.buffers), [[n, v] for n, v in seg.fixedvars]]


# ---- loading ----
def _dec_dynamic(data, expr, buffers: tuple, kernel, depth: int) -> DynamicLoop:
    """A DynamicLoop from its data form (`_enc_kernels`; `expr(i, dtype)` is graph node i, checked to be an
    expression of that dtype), checked: a fori_loop's var is a var whose bounds hold every value its bounds
    can give it, a while_loop's predicate a 0-d bool buffer."""
    var, lower, upper, pred, swap, conditions, parts = data
    if depth > 16 or len(parts) != 5:
        raise ValueError("not a loop the plan runs natively")
    bound = lambda b: _int(b) if type(b) is int else expr(b["u"])  # noqa: E731
    n = len(buffers)
    if var is None:
        pred = _index(pred, n)
        if buffers[pred].dtype is not dtypes.bool or buffers[pred].shape != () or (lower, upper) != (None, None):
            raise ValueError("a while_loop's predicate is not a 0-d bool buffer")
        lower = upper = None
    else:
        var, lower, upper = expr(var), bound(lower), bound(upper)
        low = lower if type(lower) is int else lower.vmin
        high = upper if type(upper) is int else upper.vmax
        if var.op is not Ops.DEFINE_VAR or pred is not None or any(
                isinstance(b, UOp) and b.dtype is not dtypes.int64 for b in (lower, upper)) or not (
                var.vmin <= low and high - 1 <= var.vmax):
            raise ValueError("a loop's var does not hold every value of its bounds")
    conditions = tuple(expr(c, dtypes.bool) for c in conditions)
    return DynamicLoop(var, lower, upper, pred, tuple(tuple(kernel(k) for k in part) for part in parts),
                       tuple((_index(a, n), _index(b, n)) for a, b in swap), conditions)


def _check_loop_conditions(spec, var_names: set):
    """Every index condition a loop the plan runs natively lets the bounds proof assume is checked per call: the
    plan's constraints hold it at the loop var's first and last values (as checks.py recorded it when tracing)."""
    loops, stack = [], [s for s in spec.kernels.segments if isinstance(s, DynamicLoop)]
    while stack:
        loop = stack.pop()
        loops.append(loop)
        stack += [s for part in loop.parts for s in part if isinstance(s, DynamicLoop)]
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
        spec = PlanSpec(spec.buffers, tuple(home), spec.kernels, spec.inputs, spec.outputs, spec.constraints,
                        spec.flags, prove_plan(spec.kernels, spec.buffers, spec.constraints, device))
        asts = spec.kernels.asts()
        compiled, counts = get_kernels(asts, device)
        compiled = dict(zip(asts, compiled))
        fn._stats.update(counts)
    else:
        try:
            programs = [_kernel_from_entry(fields, binary, device) for fields, binary in codes]
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
    shapes = {name: _dec_spec(s, vars_) for name, s in meta["shapes"].items()}
    params = [inspect.Parameter(name, _KINDS[kind], **({} if default is None else {"default": _dec(default["value"])}))
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
        buffers.append(BufferSpec(_DTYPES[dt], shape, _max_size(shape)))
        if buffers[-1].max_size * buffers[-1].dtype.itemsize > MAX_ELEMENTS:
            raise ValueError(f"a buffer of shape {shape} is larger than {MAX_ELEMENTS} bytes")
    buffers, n = tuple(buffers), len(buffers)
    home = tuple(_index(h, n) for *_, h in meta["buffers"])

    def kernel(data, depth=0):
        if isinstance(data, dict) and set(data) == {"dloop"}:
            return _dec_dynamic(data["dloop"], expr, buffers, lambda k: kernel(k, depth + 1), depth)
        if isinstance(data, dict):
            (name, lower, upper, swap, body), = data.values() if set(data) == {"loop"} else ((),)
            if depth or not _int(lower) < _int(upper):
                raise ValueError("not a fori_loop")
            return LoopKernels(tuple(kernel(k, 1) for k in body), _name(name), lower, upper,
                               tuple((_index(a, n), _index(b, n)) for a, b in swap))
        a, slots, fixed = data
        return ScheduledKernel(graph[_index(a, n_asts)], tuple(_index(b, n) for b in slots),
                               tuple((_name(k), _int(v)) for k, v in fixed))
    kernels = KernelSequence([kernel(k) for k in meta["kernels"]])
    inputs = tuple(_index(b, n) for b in meta["inputs"])
    outputs = tuple(_index(b, n) for b in meta["outputs"])
    constraints = tuple(IndexConstraint(expr(c[0], dtypes.bool), str(c[1]), str(c[2]), _error_kind(c))
                        for c in meta["constraints"])
    flags = tuple((_index(b, n), str(what)) for b, what in meta["flags"])
    if any(buffers[b].dtype is not dtypes.bool or buffers[b].shape != () for b, _ in flags):
        raise ValueError("a gather's flag is not a 0-d bool buffer")
    spec = PlanSpec(buffers, home, kernels, inputs, outputs, constraints, flags, _int(meta["proven"], 0))
    _check_kernels(spec, slot_dtypes)
    _check_var_values(spec, _check_vars(fn, spec))
    _check_loop_conditions(spec, {str(v[0]) for v in meta["vars"]})
    _check_io(fn, meta, spec)
    codes, offset = [], 0
    for c in meta["codes"]:
        size = c["bytes"]
        if type(size) is not int or size <= 0 or offset + size > len(payload):
            raise ValueError("code sizes do not match the payload")
        fields = {"name": str(c["name"]), "source": str(c["source"]), "var_names": tuple(map(str, c["var_names"])),
                  "global_size": tuple(expr(g) for g in c["global_size"]),
                  "local_size": tuple(_int(s, 1, 1 << 16) for s in c["local_size"])}
        if not set(fields["var_names"]) <= {v.arg[0] for v in graph[_index(len(codes), n_asts)].variables()}:
            raise ValueError(f"kernel {fields['name']} takes vars its AST does not have")
        codes.append((fields, payload[offset:offset + size]))
        offset += size
    constants = []
    for dtype, shape in meta.get("constants", []):
        shape = tuple(_index(d, MAX_FILE_BYTES) for d in shape)
        size = math.prod(shape) * _DTYPES[dtype].itemsize
        if offset + size > len(payload):
            raise ValueError("captured array sizes do not match the payload")
        constants.append(np.frombuffer(payload, _DTYPES[dtype].np, size // _DTYPES[dtype].itemsize, offset)
                         .reshape(shape).copy())
        offset += size
    if offset != len(payload) or len(codes) != n_asts:
        raise ValueError("code sizes do not match the payload")
    _check_constants(spec, constants)
    call = (_dec(meta["key"]), _tree(meta["out_tree"]), [(str(p), _dec(part)) for p, part in meta["descriptions"]],
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


def _check_var_values(spec: PlanSpec, table):
    """Every var of every kernel gets values inside the bounds its AST gives it (those the bounds proof assumed):
    a var each call supplies and checks, the counter of a native loop the kernel is inside (that loop's own
    var), or values the plan fixes (a fori_loop's counter over [lower, upper), a fixedvar). Shapes, constraints
    and native loop bounds use only the call's vars (and enclosing counters)."""
    def uses(e, counters: dict, what: str):
        for u in e.variables():
            if u.arg[0] not in table.var and counters.get(u.arg[0]) is not u:
                raise ValueError(f"{what} uses var {u.arg[0]!r}, which no call supplies")

    def check(k, fixed: dict, counters: dict):
        for u in k.ast.variables():
            name, lo, hi = u.arg
            if name in fixed:
                if not all(lo <= v <= hi for v in fixed[name]):
                    raise ValueError(f"kernel {k.ast.arg} fixes var {name!r} at {fixed[name]}, outside its bounds "
                                     f"[{lo}, {hi}]")
            else:
                uses(u, counters, f"kernel {k.ast.arg}")

    def walk(segments, counters: dict):
        for seg in segments:
            if isinstance(seg, DynamicLoop):
                for b in (seg.lower, seg.upper):
                    if isinstance(b, UOp):
                        uses(b, counters, "a loop bound")
                walk((k for part in seg.parts for k in part), counters | ({} if seg.var is None else
                                                                          {seg.name: seg.var}))
            elif isinstance(seg, LoopKernels):
                for body in seg.body:
                    check(body, {seg.name: (seg.lower, seg.upper - 1)} | {n: (v,) for n, v in body.fixedvars},
                          counters)
            else:
                check(seg, {n: (v,) for n, v in seg.fixedvars}, counters)
    walk(spec.kernels.segments, {})
    for b in spec.buffers:
        for d in b.shape:
            if isinstance(d, UOp):
                uses(d, {}, "a buffer shape")
    for c in spec.constraints:
        uses(c.cond, {}, "an index constraint")


def _error_kind(c) -> str:
    """A saved constraint's error kind: its 4th entry (files without one hold index constraints only)."""
    if not isinstance(c, list) or len(c) not in (3, 4) or (len(c) == 4 and c[3] not in ERROR_KINDS):
        raise ValueError(f"not an index constraint: {c!r:.80}")
    return c[3] if len(c) == 4 else "index"


def _check_io(fn: LoadedFunction, meta: dict, spec: PlanSpec):
    """The signature's array leaves are the plan's inputs (same dtypes and shapes) and its outputs fill the output
    structure; PlanFileError otherwise (a call would hand kernels arrays of another size)."""
    key = _dec(meta["key"])
    arrays = [part for part in key if isinstance(part, tuple) and part and part[0] == "array"]
    if len(arrays) + len(meta.get("constants", [])) != len(spec.inputs) or _tree(meta["out_tree"]).num_leaves != len(spec.outputs):
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
