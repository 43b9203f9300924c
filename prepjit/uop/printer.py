"""Readable listings of UOp graphs: one numbered line per node, sources by number."""
from __future__ import annotations

from .ops import Ops
from .uop import UOp


def _fmt_arg(u: UOp) -> str:
    if u.arg is None:
        return ""
    if u.op is Ops.INPUT:
        return f"input {u.arg[0]}, shape {_fmt_shape(u.arg[1])}"
    if u.op in (Ops.RESHAPE, Ops.EXPAND):
        return f"shape {_fmt_shape(u.arg)}"
    if u.op is Ops.DEFINE_VAR:
        return f"{u.arg[0]} in [{u.arg[1]}, {u.arg[2]}]"
    return str(u.arg)


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(d.render() if isinstance(d, UOp) else str(d) for d in shape) + ")"


def format_graph(root: UOp) -> str:
    nodes = root.toposort()
    number = {n: i for i, n in enumerate(nodes)}
    lines = []
    for n in nodes:
        srcs = ", ".join(f"%{number[s]}" for s in n.src)
        arg = _fmt_arg(n)
        shape = "" if n.op in (Ops.SINK, Ops.LOOP) else f" {_fmt_shape(n.shape)}"
        lines.append(f"%{number[n]:<3} {n.op.name:<12} {n.dtype.name:<8}{shape:<12} {srcs}"
                     + (f"  [{arg}]" if arg else ""))
    return "\n".join(lines)
