"""UOp graphs as plain JSON data: a canonical, process-independent form for cache keys and files.

`to_data(roots)` lists every node once, in topological order, as `[op, dtype, arg, [source positions]]`
and names the roots by position; `from_data` rebuilds the same (hash-consed) nodes and rejects
anything malformed with ValueError, so data read from a file can never become code or arbitrary
objects. Args are None, bools, ints, strs, floats (`{"f": hex}`, exact, -0.0 kept apart from 0.0),
Ops (`{"op": name}`), dtypes (`{"dtype": name}`) and tuples of those (JSON lists).
"""
from __future__ import annotations

from .dtypes import DType, dtypes
from .ops import Ops
from .uop import UOp

DTYPES_BY_NAME = {d.name: d for d in dtypes.all}


def _arg_to_data(arg):
    if arg is None or isinstance(arg, (bool, int, str)):
        return arg
    if isinstance(arg, float):
        return {"f": arg.hex()}
    if isinstance(arg, Ops):
        return {"op": arg.name}
    if isinstance(arg, DType):
        return {"dtype": arg.name}
    if isinstance(arg, tuple):
        return [_arg_to_data(a) for a in arg]
    raise ValueError(f"a UOp arg of type {type(arg).__name__} has no data form")


def _arg_from_data(data):
    if data is None or isinstance(data, (bool, int, str)):
        return data
    if isinstance(data, list):
        return tuple(_arg_from_data(a) for a in data)
    if isinstance(data, dict) and len(data) == 1:
        (tag, value), = data.items()
        if tag == "f" and isinstance(value, str):
            return float.fromhex(value)
        if tag == "op" and value in Ops.__members__:
            return Ops[value]
        if tag == "dtype" and value in DTYPES_BY_NAME:
            return DTYPES_BY_NAME[value]
    raise ValueError(f"not a UOp arg: {data!r:.80}")


def to_data(roots: tuple[UOp, ...]) -> dict:
    """{"nodes": [[op, dtype, arg, [sources]], ...], "roots": [positions]}; ValueError for an arg with no data form."""
    position: dict[UOp, int] = {}
    nodes = []
    for root in roots:
        for node in root.toposort():
            if node not in position:
                position[node] = len(nodes)
                nodes.append([node.op.name, node.dtype.name, _arg_to_data(node.arg), [position[s] for s in node.src]])
    return {"nodes": nodes, "roots": [position[r] for r in roots]}


def from_data(data) -> tuple[UOp, ...]:
    """The roots `to_data` described; ValueError when `data` is not such a description."""
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or not isinstance(data.get("roots"), list):
        raise ValueError("a UOp graph is a dict with lists 'nodes' and 'roots'")
    built: list[UOp] = []
    for node in data["nodes"]:
        if not (isinstance(node, list) and len(node) == 4 and node[0] in Ops.__members__ and node[1] in DTYPES_BY_NAME
                and isinstance(node[3], list)
                and all(type(s) is int and 0 <= s < len(built) for s in node[3])):
            raise ValueError(f"not a UOp node: {node!r:.80}")
        built.append(UOp(Ops[node[0]], DTYPES_BY_NAME[node[1]], tuple(built[s] for s in node[3]), _arg_from_data(node[2])))
    if not all(type(r) is int and 0 <= r < len(built) for r in data["roots"]):
        raise ValueError("a UOp graph root is not one of its nodes")
    return tuple(built[r] for r in data["roots"])
