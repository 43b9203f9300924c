"""The prepared function: trace once per signature, freeze an ExecutionPlan, replay it on every later call.

`PreparedFunction` is what `pj.prepare` (prepare.py) returns for one device: it reads each call's signature
(signature.py), traces and plans a new one (planner.py), replays a known one (through the fast path of
replay.py when it can) and saves one to a file (saved.py)."""
from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import sys
import threading
import time
import warnings

import attrs
import numpy as np

from ..errors import CompileError, PrepjitError, TraceError, VarError
from .planner import build_plan, gc_paused
from .profiler import log_timed_call
from .replay import MISS, FastCalls, replay_with_io
from .saved import save
from ..runtime.array import Array
from ..runtime.devices import default_device, get_device
from ..runtime.plan import ExecutionPlan
from .signature import CallInfo, Signature, explain_retrace, retrace_hint
from .stages import describe, stage, tally
from ..tracing.pytree import TreeDef
from ..tracing.tracer import Tracer
from ..tracing.constants import capture_key, reachable_arrays
from ..tracing.core import ArrayLeaf, Traced, VarLeaf, trace_call, wrap_error
from ..uop.var import Var

log = logging.getLogger("prepjit")


LOG_MODES = set(os.environ.get("PREPJIT_LOG", "").replace(" ", "").split(",")) - {""}  # e.g. "compiles,profile"
PROFILE_CALLS = "profile" in LOG_MODES  # every call runs kernel by kernel and logs its pj.Profile


def _configure_logging():
    if LOG_MODES & {"compiles", "source", "profile"} and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("prepjit: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.DEBUG if "source" in LOG_MODES else logging.INFO if "compiles" in LOG_MODES
                     else logging.WARNING)
        if PROFILE_CALLS:
            logging.getLogger("prepjit.profile").setLevel(logging.INFO)


_configure_logging()


@attrs.define
class _Entry:
    """A prepared signature: its plan, output structure and how to build outputs."""

    plan: ExecutionPlan
    out_tree: TreeDef
    descriptions: list
    out_shape_fns: list  # per distinct output buffer
    duplicate: list      # per output: True when an earlier output shares its buffer (copy it)
    first_of: list       # per output: the index of the first output with the same buffer
    constants: tuple = ()  # captured arrays (tracing/constants.py) on the plan's device: its last inputs
    reachable: tuple = ()  # the arrays whose ids key this entry, kept alive so no other array takes an id


def normalize_vars(vars_) -> dict[str, Var]:
    out: dict[str, Var] = {}
    if not isinstance(vars_, dict) and any(not isinstance(v, Var) for v in ([vars_] if isinstance(vars_, str) else
                                                                           vars_ or ())):
        raise VarError(f"vars must be a dict of name -> (min, max) (or a list of pj.Var), got {vars_!r}: "
                       "write e.g. vars={\"n\": (1, 1024)}")
    items = vars_.items() if isinstance(vars_, dict) else ((v.name, v) for v in (vars_ or ()))
    for name, spec in items:
        if isinstance(spec, Var):
            var = spec
        elif isinstance(spec, (tuple, list)) and len(spec) == 2:
            var = Var(name, *spec)
        else:
            raise VarError(f"vars[{name!r}] must be (min, max) or a pj.Var, got {spec!r}")
        if var.name != name:
            raise VarError(f"vars[{name!r}] is a Var named {var.name!r}")
        out[name] = var
    return out


def collect_spec_vars(shapes, vars_: dict[str, Var]):
    """Vars given as pj.Var objects inside `shapes` join `vars` (same name must mean the same bounds)."""
    def walk(x):
        if isinstance(x, Var):
            if x.name in vars_ and vars_[x.name] != x:
                raise VarError(f"two different vars are named {x.name!r}: {vars_[x.name]} and {x}")
            vars_[x.name] = x
        elif isinstance(x, (tuple, list)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)
    walk(shapes)


class PreparedFunction:
    """A function prepared for replay; call it like the original."""

    def __init__(self, fn, vars=None, shapes=None, device=None, static_argnums=(), static_argnames=(),
                 donate_argnums=(), donate_argnames=(), hint_retraces=False):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.vars = normalize_vars(vars)
        self.shapes = dict(shapes or {})
        collect_spec_vars(self.shapes, self.vars)
        self.signature = Signature(fn, self.vars, self.shapes, static_argnums, static_argnames)
        self.donated = self.signature.parameter_names(donate_argnums, donate_argnames, "donate")
        self._fast_calls = FastCalls(self.signature, fn)
        self.device_name = device
        self.entries: dict[tuple, _Entry] = {}
        self.lock = threading.RLock()
        # compiles: kernels compiled by this function's prepares; disk_hits: kernels loaded instead from the
        # disk cache (compiled by an earlier process); kernels another prepared function already built count in neither
        # (changed under self.lock); replays count on the replay path, without a lock: see `stats`
        self._stats = {"traces": 0, "compiles": 0, "disk_hits": 0, "plans": 0, "proven_accesses": 0}
        self._replays = itertools.count()  # next() is atomic: each call takes one number
        self._stats_reads = 0
        # hint_retraces: warn when an argument's shape keeps tracing new plans (for pj.prepare's functions, whose
        # user can give `shapes`); _traced_shapes: array path -> its key dims in each trace so far
        self.hint_retraces, self._traced_shapes, self._hinted = hint_retraces, {}, set()

    @property
    def device(self):
        return get_device(self.device_name)

    @property
    def stats(self) -> dict:
        with self.lock:  # each read takes one number from the replay counter too: subtract the reads so far
            replays = next(self._replays) - self._stats_reads
            self._stats_reads += 1
            return {**self._stats, "replays": replays}

    def __get__(self, obj, objtype=None):  # decorating a method binds like a function
        return self if obj is None else functools.partial(self, obj)

    # ---- preparing ----
    def _entry(self, info: CallInfo) -> _Entry:
        device = self.device
        reachable = reachable_arrays(self.fn, [v for v in info.leaves if not isinstance(v, (ArrayLeaf, VarLeaf))])
        key = info.key + (device.name,) + capture_key(reachable)
        entry = self.entries.get(key)
        if entry is not None:
            return entry
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                self._check_not_tracing()
                reason = explain_retrace(self._closest(info), info.descriptions)
                log.info("trace %s: %s", self.signature.fn_name, reason)
                if self.hint_retraces:
                    self._hint_retraces(info)
                start = time.perf_counter()
                traced, (plan, kernel_counts), times = self._traced_here(lambda: _trace_and_plan(self.fn, info, device))
                log.info("prepared %s in %s (kernels: %d, of which %d compiled and %d loaded from disk)",
                         self.signature.fn_name, describe(times, time.perf_counter() - start), len(plan.kernels),
                         kernel_counts["compiles"], kernel_counts["disk_hits"])
                self._stats["traces"] += 1
                for name, count in kernel_counts.items():
                    self._stats[name] += count
                self._stats["plans"] += 1
                plan.var_sources.update(info.var_sources)  # IndexBoundError messages say where values come from
                entry = freeze(plan, traced.out_tree, info.descriptions)
                entry.constants = tuple(constant_on_device(device, value) for value in traced.constants)
                entry.reachable = tuple(reachable)
                self.entries[key] = entry
        return entry

    def _hint_retraces(self, info: CallInfo):
        """Warn (once per argument) when an argument's static shape keeps changing from trace to trace."""
        for path, part in info.descriptions:
            if part[0] != "array" or path in self._hinted:
                continue
            shapes = self._traced_shapes.setdefault(path, [])
            shapes.append(part[2])
            hint = retrace_hint(self.signature.fn_name, path, shapes, self.signature.unused_vars)
            if hint is not None:
                self._hinted.add(path)
                warnings.warn(hint, stacklevel=4)  # (the call: here, _entry, __call__)

    def _closest(self, info: CallInfo) -> list:
        best, score = [], -1
        for entry in self.entries.values():
            same = sum(a == b for a, b in zip(entry.descriptions, info.descriptions))
            if same > score:
                best, score = entry.descriptions, same
        return best

    def _trace(self, info: CallInfo) -> Traced:
        self._check_not_tracing()
        return self._traced_here(lambda: trace_call(self.fn, info.build_args, info.leaves))

    def _check_not_tracing(self):
        if self in _tracing_now():
            raise TraceError(f"{self.signature.fn_name} called itself with concrete (non-traced) arguments while it "
                             "is being traced: that call would need the plan being built. Call it on traced values "
                             "(it is then inlined), or compute the value outside and pass it as an argument")

    def _traced_here(self, work):
        """Run `work` (a trace, and a plan) marked as tracing this function on this thread. The trace's errors
        are prepjit's already (trace_call wraps them); the plan's other errors but a MemoryError (intermediates that
        do not fit at the vars' maxima) become CompileErrors."""
        tracing = _tracing_now()
        tracing.add(self)
        try:
            return work()
        except (PrepjitError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - rewrapped, the original chained
            raise wrap_error(e, CompileError) from e
        finally:
            tracing.discard(self)

    def plan(self, *args, **kwargs) -> ExecutionPlan:
        """The ExecutionPlan for these arguments, prepared (traced and compiled) if needed, without running."""
        return self._entry(self.signature.read(args, kwargs)).plan

    def trace(self, *args, **kwargs) -> Traced:
        """The traced UOp graph for these arguments, without compiling."""
        return self._trace(self.signature.read(args, kwargs))

    def save(self, path, *args, **kwargs):
        """Write the plan for these arguments' signature (prepared if needed) to `path`; `pj.load` reads it."""
        save(self, path, self.signature.read(args, kwargs))

    # ---- calling ----
    def __call__(self, *args, **kwargs):
        if not kwargs and not PROFILE_CALLS:  # the fast path (replay.py): a known call
            out = self._fast_calls(args, self.device_name or default_device())
            if out is not MISS:
                next(self._replays)
                return out
        if has_tracer(args, kwargs):  # called inside another traced function: inline, like nested jax.jit
            return self.fn(*args, **kwargs)
        info = self.signature.read(args, kwargs)
        entry = self._entry(info)
        if PROFILE_CALLS:
            return log_timed_call(self, entry, info)
        if not kwargs:
            self._fast_calls.learn(args, self.device_name or default_device(), info, entry, self.device,
                                   self._donated_inputs(info))
        return self._run(entry, info)

    def _run(self, entry: _Entry, info: CallInfo, timings: list | None = None):
        """Replay `entry`'s plan on this call's arguments (kernel by kernel, timed, with `timings`: profiler.py)."""
        plan, values = entry.plan, info.var_values
        missing = [n for n in plan.vars if n not in values]
        if missing:
            raise VarError(f"vars {missing} are used by {self.signature.fn_name} but no argument gives their value; "
                           "add a parameter whose shape (in `shapes`) or value (a scalar var) carries them")
        out = replay_with_io(entry, values, info.arrays, self._donated_inputs(info), timings)
        next(self._replays)
        return out

    def _donated_inputs(self, info: CallInfo) -> tuple[int, ...]:
        """The positions, among the call's arrays, of the leaves of donated parameters."""
        if not self.donated:
            return ()
        arrays = [path for leaf, (path, _) in zip(info.leaves, info.descriptions) if isinstance(leaf, ArrayLeaf)]
        return tuple(i for i, path in enumerate(arrays) if re.match(r"\w+", path).group(0) in self.donated)


def freeze(plan: ExecutionPlan, out_tree: TreeDef, descriptions: list) -> _Entry:
    """A prepared signature's entry: `plan`, the output structure and which outputs share a buffer."""
    first: dict[int, int] = {}
    for i, b in enumerate(plan.outputs):
        first.setdefault(b, i)
    duplicate = [first[b] != i for i, b in enumerate(plan.outputs)]
    shape_fns = [plan.buffers[b].shape_fn for b in first]
    return _Entry(plan, out_tree, descriptions, shape_fns, duplicate, [first[b] for b in plan.outputs])


def constant_on_device(device, value: np.ndarray):
    """A captured array where the plan reads it: the cpu reads the (trace-time copy) in place, other devices
    get it uploaded once, as a pj.Array of theirs."""
    if not device.device_memory:
        return value
    _, (memory, _) = device.input_handle(value)
    return Array(memory, value.shape, value.dtype, device)


def has_tracer(args, kwargs) -> bool:
    """Whether a top-level argument is traced (checked cheaply: this is on the replay path)."""
    return any(type(a) is Tracer for a in args) or bool(kwargs) and any(type(a) is Tracer for a in kwargs.values())


def _trace_and_plan(fn, info: CallInfo, device):
    with tally() as times, gc_paused():
        with stage("tracing"):
            traced = trace_call(fn, info.build_args, info.leaves)
        return traced, build_plan(traced, device), times


_tracing = threading.local()  # .fns: the prepared functions being traced on this thread (self-calls raise)


def _tracing_now() -> set:
    fns = getattr(_tracing, "fns", None)
    if fns is None:
        fns = _tracing.fns = set()
    return fns


