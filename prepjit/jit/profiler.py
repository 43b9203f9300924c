"""The profiler: `pj.profile(f, *args)` replays a call kernel by kernel and reports each kernel's time,
bytes moved, FLOPs and rates (`PREPJIT_LOG=profile` does it on every call).

Counts come from the kernel AST (before the device-specific optimisations, which change how the work
is done but not how much): analysed once per AST into sums of products of loop extents, then evaluated
at the live var values.
- FLOPs: every ALU op on loaded data (not index arithmetic) once per iteration of the ranges its value
  depends on; a reduction adds one op per step, so a multiply-accumulate counts 2 and a matmul 2*M*N*K.
- Bytes: each buffer the kernel loads or stores, once per distinct element its index reaches (the
  product of the ranges the index depends on), at most the buffer's live size.
"""
from __future__ import annotations

import functools
import logging

from .planner import compile_shape_fn
from ..uop import Ops, UOp
from ..uop.ops import ALU

log = logging.getLogger("prepjit.profile")


class KernelCounts:
    """A kernel's FLOPs and per-buffer element accesses as functions of its var values."""

    def __init__(self, ast: UOp):
        deps: dict[UOp, frozenset] = {}   # node -> the RANGEs its value varies with
        loaded = set()                     # nodes whose value depends on data loaded from a buffer
        for u in ast.toposort():
            if u.op in (Ops.LOAD, Ops.REDUCE) or any(s in loaded for s in u.src):
                loaded.add(u)
            if u.op is Ops.RANGE:
                deps[u] = frozenset((u,)).union(*(deps[s] for s in u.src))
            else:
                deps[u] = frozenset().union(*(deps[s] for s in u.src))
                if u.op is Ops.REDUCE:
                    deps[u] -= set(u.src[1:])
        flops: dict[frozenset, int] = {}   # ranges -> ops executed once per iteration of them
        accesses: dict[int, dict[frozenset, int]] = {}  # buffer slot -> ranges -> elements per iteration
        for u in _data_nodes(ast):
            if u.op in ALU and u in loaded:  # index arithmetic that reaches a value (iota, pad masks) is not counted
                flops[deps[u]] = flops.get(deps[u], 0) + 1
            elif u.op is Ops.REDUCE:
                steps = deps[u] | set(u.src[1:])
                flops[steps] = flops.get(steps, 0) + 1
        for u in ast.toposort():
            if u.op in (Ops.LOAD, Ops.STORE):  # LOAD: (buffer, index[, gate]); STORE: (buffer, index, value[, gate])
                addressing = u.src[1:] if u.op is Ops.LOAD else u.src[1:2] + u.src[3:]
                where = frozenset().union(*(deps[s] for s in addressing))
                per_slot = accesses.setdefault(u.src[0].arg, {})
                per_slot[where] = per_slot.get(where, 0) + 1
        ranges = sorted({r for terms in [flops, *accesses.values()] for key in terms for r in key},
                        key=lambda r: r.arg[0])
        slot = {r: i for i, r in enumerate(ranges)}
        self._extents = compile_shape_fn(tuple(_extent(r) for r in ranges)) if ranges else lambda v: ()
        self._flops = [(n, tuple(slot[r] for r in key)) for key, n in flops.items()]
        self._accesses = {b: [(n, tuple(slot[r] for r in key)) for key, n in terms.items()]
                          for b, terms in accesses.items()}

    def evaluate(self, values: dict[str, int]) -> tuple[int, dict[int, int]]:
        """(FLOPs, elements accessed per buffer slot) at these var values."""
        extents = [max(0, int(e)) for e in self._extents(values)]

        def total(terms):
            out = 0
            for n, key in terms:
                for i in key:
                    n *= extents[i]
                out += n
            return out
        return total(self._flops), {b: total(terms) for b, terms in self._accesses.items()}


def _extent(r: UOp) -> UOp:
    """A range's trip count over the vars: its end, or its largest value when the end depends on another range."""
    end = r.src[0]
    return UOp.const(int(end.vmax)) if any(u.op is Ops.RANGE for u in end.toposort()) else end


def _data_nodes(ast: UOp) -> list[UOp]:
    """The nodes that compute stored values: reached from STOREs' values, not through load or store indices."""
    seen, stack = set(), [u.src[2] for u in ast.toposort() if u.op is Ops.STORE]
    while stack:
        u = stack.pop()
        if u in seen or u.op is Ops.LOAD:
            continue
        seen.add(u)
        stack.extend(u.src[:1] if u.op is Ops.REDUCE else u.src)
    return list(seen)


@functools.lru_cache(maxsize=4096)
def kernel_counts(ast: UOp) -> KernelCounts:
    """The counts of a kernel AST, analysed once (ASTs are hash-consed, so equal kernels share them)."""
    return KernelCounts(ast)


class Profile:
    """One call's kernels with their time, bytes moved and FLOPs; `str()` is a table, `.rows` the same as dicts."""

    def __init__(self, name: str, plan, values: dict[str, int], timings: list[float | None]):
        self.name, self.device = name, plan.device
        self.rows = []
        for pk, seconds in zip(plan.kernels, timings):
            live = {**values, **pk.fixedvars}
            flops, elements = kernel_counts(pk.kernel.scheduled).evaluate(live)  # the computation's, not its blocks'
            if seconds is None:  # not run by this call (a copy into a donated argument's own memory)
                seconds, flops, elements = 0.0, 0, {}
            moved = 0
            for slot, count in elements.items():
                buf = plan.buffers[pk.buffer_indices[slot]]
                size = 1
                for d in buf.shape_fn(live):
                    size *= d
                moved += min(count, size) * buf.dtype.itemsize
            self.rows.append({"id": pk.id, "kernel": pk.kernel.name, "fixedvars": dict(pk.fixedvars),
                              "device": pk.device, "time_s": seconds, "bytes": moved, "flops": flops,
                              "gb_s": _rate(moved, seconds), "gflop_s": _rate(flops, seconds)})

    @property
    def time_s(self) -> float:
        """The kernels' total time in seconds."""
        return sum(r["time_s"] for r in self.rows)

    def __str__(self) -> str:
        head = ("#", "kernel", "device", "time", "bytes", "FLOPs", "GB/s", "GFLOP/s")
        table = [head]
        for r in self.rows:
            name = r["kernel"] + "".join(f" {n}={v}" for n, v in r["fixedvars"].items())
            table.append((str(r["id"]), name, r["device"], _time(r["time_s"]), _si(r["bytes"], "B"),
                          _si(r["flops"], ""), f"{r['gb_s']:.2f}", f"{r['gflop_s']:.2f}"))
        moved, flops, seconds = sum(r["bytes"] for r in self.rows), sum(r["flops"] for r in self.rows), self.time_s
        table.append(("", "total", self.device, _time(seconds), _si(moved, "B"), _si(flops, ""),
                      f"{_rate(moved, seconds):.2f}", f"{_rate(flops, seconds):.2f}"))
        widths = [max(len(row[c]) for row in table) for c in range(len(head))]
        left = {1, 2}  # names read left-aligned, numbers right-aligned
        lines = ["  ".join(cell.ljust(w) if c in left else cell.rjust(w) for c, (cell, w) in
                           enumerate(zip(row, widths))).rstrip() for row in table]
        count = f"{len(self.rows)} kernel{'' if len(self.rows) == 1 else 's'}"
        return "\n".join([f"profile of {self.name} on {self.device}: {count}", *lines])

    __repr__ = __str__


def _rate(amount: int, seconds: float) -> float:
    """Giga-units per second."""
    return amount / seconds / 1e9 if seconds > 0 else 0.0


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def _si(n: int, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n} {unit}".rstrip()


def timed_call(f, entry, info):
    """Run a prepared call kernel by kernel: (its result, its Profile)."""
    timings: list[float] = []
    out = f._run(entry, info, timings)
    return out, Profile(f.signature.fn_name, entry.plan, info.var_values, timings)


def log_timed_call(f, entry, info):
    """PREPJIT_LOG=profile: run the call kernel by kernel, log its Profile, return its result."""
    out, prof = timed_call(f, entry, info)
    log.info("%s", prof)
    return out
