"""Saved plans, the writing side and the format: `f.save(path, *args)` writes one prepared signature to a file
that `pj.load(path)` (loaded.py) replays anywhere.

A plan file is a datafile.py file of kind "plan": JSON metadata (the call signature, the plan's
data description, planner.PlanSpec: buffers, kernels, I/O, constraints, every UOp in the data
form of uop/serial.py) and a payload of the kernels' compiled code, back to back, then the bytes of the
arrays the function captured (tracing/constants.py: they are the plan's last inputs). Nothing in it
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
import os

import numpy as np

from ..codegen.dynamic_loop import DynamicLoop
from ..codegen.schedule import LoopKernels
from ..errors import PlanFileError, SignatureError
from ..runtime import datafile
from .signature import CallInfo
from ..tracing.pytree import TreeDef
from ..uop import UOp, serial
from ..uop.dtypes import to_dtype
from ..uop.var import Var

KIND, VERSION = b"plan", 2  # 2: each kernel's code names its AST as launched
MAX_FILE_BYTES = 4 << 30
MAX_ELEMENTS = 1 << 48  # a buffer's bytes at the vars' maxima, and any of its static dims
PARAMETER_KINDS = [inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_POSITIONAL,
          inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD]


# ---- plain values (signature keys, static arguments, pytree structures) <-> JSON ----
def encode_value(x):
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return {"f": x.hex()}
    if isinstance(x, tuple):
        return {"t": [encode_value(v) for v in x]}
    if isinstance(x, TreeDef):
        return {"tree": [x.kind, [encode_value(k) for k in x.keys], [encode_value(c) for c in x.children]]}
    raise SignatureError(f"a value of type {type(x).__name__} ({x!r:.60}) in the call's signature has no data form, "
                         "so this plan cannot be saved; pass static arguments as ints, floats, strings, bools, "
                         "None or tuples of those")


def decode_value(x):
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, dict) and len(x) == 1:
        (tag, v), = x.items()
        if tag == "f" and isinstance(v, str):
            return float.fromhex(v)
        if tag == "t" and isinstance(v, list):
            return tuple(decode_value(e) for e in v)
        if tag == "tree" and isinstance(v, list) and len(v) == 3 and v[0] in ("leaf", "list", "tuple", "dict", "none"):
            return TreeDef(v[0], tuple(decode_value(k) for k in v[1]), tuple(decode_tree(c) for c in v[2]))
    raise ValueError(f"not a signature value: {x!r:.60}")


def decode_tree(x) -> TreeDef:
    tree = decode_value(x)
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
        return {"dict": [[encode_value(k), _enc_spec(v)] for k, v in spec.items()]}
    raise SignatureError(f"a shapes spec {spec!r:.60} has no data form")


def decode_spec(data, vars_: dict):
    if data is None or isinstance(data, (int, str)):
        return data
    if isinstance(data, list):
        return tuple(decode_spec(s, vars_) for s in data)
    if isinstance(data, dict) and set(data) == {"var"}:
        return vars_[data["var"]]
    if isinstance(data, dict) and set(data) == {"dict"}:
        return {decode_value(k): decode_spec(v, vars_) for k, v in data["dict"]}
    raise ValueError(f"not a shapes spec: {data!r:.60}")


# ---- saving ----
def save(fn, path, info: CallInfo):
    """Write the plan of `info`'s signature (prepared now if needed) to `path`, atomically."""
    entry = fn._entry(info)
    plan, spec = entry.plan, entry.plan.spec
    device = fn.device
    asts = spec.kernels.asts()
    ast_index = {a: i for i, a in enumerate(asts)}
    programs = {}
    for seg in plan.kernels.segments:
        for pk in seg.prepared():
            programs.setdefault(pk.kernel.scheduled, pk.kernel)
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
    kernels = [_enc_segment(seg, ast_index, ref) for seg in spec.kernels.segments]  # refs before the graph
    payload, codes = [], []
    for ast in asts:
        k = programs[ast]
        if not k.binary:
            raise PlanFileError(f"kernel {k.name} has no compiled code to save")
        codes.append({"name": k.name, "source": k.source, "var_names": list(k.var_names),
                      "global_size": [ref(g) for g in k.global_size], "local_size": list(k.local_size),
                      "bytes": len(k.binary), "ast": ref(k.ast)})
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
                default = {"value": encode_value(p.default)}
            except SignatureError:
                default = None  # a default with no data form: the loaded function needs the argument
        params.append([p.name, PARAMETER_KINDS.index(p.kind), default])
    meta = {
        "function": sig.fn_name, "device": device.name, "compiler_id": device.compiler_id,
        "params": params, "vars": [[v.name, v.min, v.max] for v in sig.vars.values()], "static": sorted(sig.static),
        "shapes": {name: _enc_spec(s) for name, s in sig.shapes.items()},
        "key": encode_value(info.key), "descriptions": [[p, encode_value(part)] for p, part in entry.descriptions],
        "out_tree": encode_value(entry.out_tree), "var_sources": dict(plan.var_sources),
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


def _enc_segment(seg, ast_index: dict, ref):
    """A kernel as [ast, buffers, fixedvars], a fori_loop as {"loop": [var, lower, upper, swap, body]}, or a loop
    the plan runs natively as {"dloop": [var, lower, upper, predicate buffer, swap, conditions, parts]} (UOps as
    graph indices, `ref`'s); loaded.py's _SegmentDecoder reads each form back by its tag."""
    if isinstance(seg, LoopKernels):
        return {"loop": [seg.name, seg.lower, seg.upper, [list(p) for p in seg.swap],
                         [_enc_segment(k, ast_index, ref) for k in seg.body]]}
    if isinstance(seg, DynamicLoop):
        bound = lambda b: b if b is None or isinstance(b, int) else {"u": ref(b)}  # noqa: E731
        return {"dloop": [None if seg.var is None else ref(seg.var), bound(seg.lower), bound(seg.upper),
                          seg.pred_buffer, [list(p) for p in seg.swap], [ref(c) for c in seg.conditions],
                          [[_enc_segment(k, ast_index, ref) for k in part] for part in seg.parts]]}
    return [ast_index[seg.ast], list(seg.buffers), [[n, v] for n, v in seg.fixedvars]]


# ---- loading ----
