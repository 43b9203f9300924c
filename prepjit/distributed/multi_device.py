"""pj.prepare(..., devices=[...], split={...}): one replica of the plan per device, replayed together.

A call cuts the arguments named in `split` along their axis (np.array_split: 10 rows over 3 replicas give
4, 3, 3; the var of that dim takes each replica's size), hands the others to every replica, and replays each
replica's plans with its own var values. The function is traced once (under a replica axis, so that
pj.psum / pj.pmean / pj.all_gather / pj.device_index record collectives: tracing/collectives.py) and cut into
stages at its collectives (replicas.py); each stage is planned once (a PlanSpec) and instantiated on every
replica's device: the same kernels, compiled once per device (the kernel cache shares them between replicas
of one device). Stage by stage, every replica runs its plan (GPUs at once, from a thread each), then the
stage's collectives run across the replicas (runtime/collectives.py, NCCL on CUDA).

Results (shard_map's out_specs, with JAX's replication check): an output that varies across replicas (it
depends on a split argument or on device_index() other than through a collective) is the replicas'
values concatenated along the split axis; any other output is the same on every replica and is returned
once. They are pj.Arrays on the first device. In a job of several processes (pj.init_distributed) every
process calls with its own data, split over its own devices; collectives span every replica of the job and
each process gets the results of its replicas.
"""
from __future__ import annotations

import concurrent.futures
import functools
import inspect
import re
import threading

import numpy as np

from ..errors import CompileError, DeviceError, PrepjitError, SignatureError, TraceError, VarError
from ..jit.planner import build_plan, compile_shape_fn, get_kernels, instantiate
from ..jit.function import collect_spec_vars, constant_on_device, has_tracer, normalize_vars
from .replicas import partition, varying
from ..runtime.array import Array
from ..runtime.collectives import communicator, to_device
from ..runtime.collectives_job import current_job
from ..runtime.devices import get_device
from ..jit.signature import Signature, is_array_like
from ..tracing.collectives import replica_axis
from ..tracing.constants import capture_key, reachable_arrays
from ..tracing.core import ArrayLeaf, VarLeaf, trace_call, wrap_error
from ..uop import UOp

_NAME = re.compile(r"[A-Za-z_]\w*")


def replica_devices(names) -> list:
    """The device of each replica: "cpu" may be listed once per replica (replicas on the host, sharing its
    cores); a GPU once ("cuda:0", "cuda:1"); all of one kind."""
    if isinstance(names, str) or not names:
        raise ValueError(f"devices must be a non-empty list of device names, e.g. ['cuda:0', 'cuda:1'], got {names!r}")
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"devices must be device names, got {name!r}")
        if name.lower().startswith("cpu:"):
            raise DeviceError(f"unknown device {name!r}: the host is one device, 'cpu'; list it once per replica "
                              "(devices=['cpu', 'cpu'])")
    devices = [get_device(n) for n in names]
    kinds = {getattr(d, "language", None) for d in devices}
    if len(kinds) > 1:
        raise DeviceError(f"the replicas of one function run on devices of one kind; devices lists {list(names)}")
    gpus = [d.name for d in devices if d.device_memory]
    if len(set(gpus)) != len(gpus):
        raise DeviceError(f"a GPU can hold one replica; devices lists {list(names)}")
    return devices


def _pick(tree, r: int):
    """Replica r's piece of each leaf of a cut tree."""
    if isinstance(tree, _Parts):
        return tree.parts[r]
    if isinstance(tree, (list, tuple)):
        out = [_pick(t, r) for t in tree]
        return type(tree)(*out) if hasattr(tree, "_fields") else type(tree)(out)
    if isinstance(tree, dict):
        return {k: _pick(v, r) for k, v in tree.items()}
    return tree


def _map_leaves(tree, fn):
    if is_array_like(tree):
        return fn(tree)
    if isinstance(tree, (list, tuple)):
        out = [_map_leaves(t, fn) for t in tree]
        return type(tree)(*out) if hasattr(tree, "_fields") else type(tree)(out)
    if isinstance(tree, dict):
        return {k: _map_leaves(v, fn) for k, v in tree.items()}
    return tree


class _Entry:
    """A prepared signature: its stages, each replica's plans and constants, and how outputs combine."""

    def __init__(self, traced, axis, stages, plans, constants, varies, shape_fns, source_shapes):
        self.traced, self.axis, self.stages, self.plans = traced, axis, stages, plans
        self.constants, self.varies, self.shape_fns = constants, varies, shape_fns
        self.source_shapes = source_shapes  # per collective: its source's live shape (a function of the vars)


class MultiDeviceFunction:
    """A function prepared for data-parallel replay on several devices; call it like the original."""

    def __init__(self, fn, devices, split=None, vars=None, shapes=None, static_argnums=(), static_argnames=()):
        functools.update_wrapper(self, fn)
        self.fn, self.device_names = fn, list(devices)
        self.devices = replica_devices(self.device_names)
        self.vars = normalize_vars(vars)
        self.shapes = dict(shapes or {})
        collect_spec_vars(self.shapes, self.vars)
        self.signature = Signature(fn, self.vars, self.shapes, static_argnums, static_argnames)
        self.split = dict(split or {})
        names = {p.name for p in self.signature.params}
        for name, axis in self.split.items():
            if name not in names:
                raise ValueError(f"split names {name!r}, which is not a parameter of {self.signature.fn_name}")
            if isinstance(axis, bool) or not isinstance(axis, int):
                raise ValueError(f"split[{name!r}] must be an axis (an int), got {axis!r}")
        axes = set(self.split.values())
        self.out_axis = axes.pop() if len(axes) == 1 else 0 if not axes else None  # None: outputs must not vary
        self.entries: dict = {}
        self.lock = threading.RLock()
        self._pool = concurrent.futures.ThreadPoolExecutor(len(self.devices)) if (
            self.devices[0].device_memory) and len(self.devices) > 1 else None
        self.stats = {"traces": 0, "compiles": 0, "disk_hits": 0, "plans": 0, "replays": 0, "stages": 0}

    @property
    def job(self):
        """The job of processes this process joined (pj.init_distributed, read on every use: a function prepared
        at import time spans the job joined later), or None."""
        return current_job()

    @property
    def replicas(self) -> int:
        """Replicas over the whole job (this process's devices times its processes)."""
        return len(self.devices) * (self.job.world if self.job is not None else 1)

    @property
    def first_replica(self) -> int:
        return len(self.devices) * (self.job.rank if self.job is not None else 0)

    # ---- arguments ----
    def _local_calls(self, args, kwargs) -> list:
        """(args, kwargs) per local replica: the `split` arguments cut along their axis, others shared."""
        n = len(self.devices)
        params = self.signature.bind(args, kwargs)
        per = [dict() for _ in range(n)]
        for name, value in params:
            if name in self.split:
                axis = self.split[name]

                def cut(leaf, name=name, axis=axis):
                    ndim = leaf.ndim if isinstance(leaf, Array) else np.ndim(leaf)
                    if not -ndim <= axis < ndim:
                        raise SignatureError(f"split[{name!r}] = {axis}, but {name} has {ndim} dims")
                    # one replica: the argument as it is (a pj.Array on the device stays there)
                    return _Parts([leaf] if n == 1 else np.array_split(np.asarray(leaf), n, axis=axis))
                tree = _map_leaves(value, cut)
                for r in range(n):
                    per[r][name] = _pick(tree, r)
            else:
                for r in range(n):
                    per[r][name] = value
        return [self._bound(p) for p in per]

    def _bound(self, arguments: dict):
        bound = inspect.BoundArguments(self.signature.sig, arguments)
        return bound.args, bound.kwargs

    # ---- preparing ----
    def _entry(self, info) -> _Entry:
        reachable = reachable_arrays(self.fn, [v for v in info.leaves if not isinstance(v, (ArrayLeaf, VarLeaf))])
        key = info.key + capture_key(reachable) + (self.replicas,)
        entry = self.entries.get(key)
        if entry is not None:
            return entry
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                entry = self.entries[key] = self._prepare(info)
                entry.reachable = reachable
        return entry

    def _prepare(self, info) -> _Entry:
        job = self.job
        if job is not None and job.world > 1:  # the replica axis counts len(devices) per process: all must agree
            counts = job.gather_to_all(np.array([len(self.devices)])).tolist()
            if len(set(counts)) > 1:
                raise DeviceError(f"the processes of the job list different numbers of devices (per rank: {counts}) "
                                  f"for {self.signature.fn_name}; every process must run as many replicas")
        with replica_axis(self.replicas) as axis:
            traced = trace_call(self.fn, info.build_args, info.leaves)
        try:
            stages = partition(traced, axis.collectives, axis.index)
            split_inputs = self._split_inputs(info, traced)
            split_vars = {v.arg[0] for node, axis_ in split_inputs.items() for d in node.arg[1][axis_:axis_ + 1]
                          if isinstance(d, UOp) for v in d.variables()}
            # a var in a collective's argument's shape is the same on every replica of a call (checked first)
            split_vars -= {v.arg[0] for s in stages for c in s.collectives for d in c.source.shape
                           if isinstance(d, UOp) for v in d.variables()}
            varies = varying(traced, set(split_inputs), split_vars, axis.index, axis.collectives)
            for k, (node, v) in enumerate(zip(traced.outputs, varies)):
                if v and (self.out_axis is None or not -len(node.shape) <= self.out_axis < len(node.shape)):
                    why = "split names several axes, so no output may" if self.out_axis is None else \
                        f"the call concatenates it along the split axis {self.out_axis}, which it lacks; it must not"
                    raise TraceError(f"output {k} (shape {node.shape}) differs across replicas, and {why} vary: "
                                     "give it that axis (x[None]), or make it the same on every replica (pj.psum, "
                                     "pj.all_gather)")
            plans = []
            for stage in stages:
                plans.append(self._stage_plans(stage, info) if stage.traced is not None else None)
        except PrepjitError:
            raise
        except Exception as e:  # noqa: BLE001 - planning failures reach the user as CompileErrors (as prepare's)
            raise wrap_error(e, CompileError) from e
        constants = [tuple(constant_on_device(d, v) for v in traced.constants) for d in self.devices]
        self.stats["traces"] += 1
        self.stats["plans"] += 1
        self.stats["stages"] = sum(p is not None for p in plans)
        shape_fns = [[[p.buffers[b].shape_fn for b in p.outputs] for p in replica_plans][0]
                     if replica_plans else None for replica_plans in plans]
        sources = {c.result: compile_shape_fn(tuple(c.source.shape)) for s in stages for c in s.collectives}
        return _Entry(traced, axis, stages, plans, constants, varies, shape_fns, sources)

    def _split_inputs(self, info, traced) -> dict:
        """The INPUT node of every split array leaf -> its split axis (non-negative)."""
        out, k = {}, 0
        for leaf, (path, _) in zip(info.leaves, info.descriptions):
            if isinstance(leaf, ArrayLeaf):
                name = _NAME.match(path).group()
                if name in self.split:
                    out[traced.inputs[k]] = self.split[name] % max(1, len(leaf.shape))
                k += 1
        return out

    def _stage_plans(self, stage, info) -> list:
        """The stage's plan on each replica's device: planned once, the same PlanSpec instantiated per device."""
        first, counts = build_plan(stage.traced, self.devices[0])
        self._count(counts)
        plans = [first]
        asts = first.spec.kernels.asts()
        for device in self.devices[1:]:
            compiled, counts = get_kernels(asts, device)
            self._count(counts)
            plans.append(instantiate(first.spec, dict(zip(asts, compiled)), device))
        for plan in plans:
            if len(set(plan.outputs)) != len(plan.outputs):
                raise TraceError("a stage's outputs share a buffer; please report it")
            plan.var_sources.update(info.var_sources)
        return plans

    def _count(self, counts: dict):
        self.stats["compiles"] += counts.get("compiles", 0)
        self.stats["disk_hits"] += counts.get("disk_hits", 0)

    def plans(self, *args, **kwargs) -> list:
        """The ExecutionPlans for these arguments, per stage (None for a stage with nothing to compute) and
        per local replica, prepared if needed, without running."""
        infos = self._read(args, kwargs)
        return self._entry(infos[0]).plans

    def _read(self, args, kwargs) -> list:
        infos = [self.signature.read(a, k) for a, k in self._local_calls(args, kwargs)]
        for r, info in enumerate(infos[1:], 1):
            if info.key != infos[0].key:
                sizes = [[a.shape for a in i.arrays] for i in infos]
                raise SignatureError(f"replicas 0 and {r} of {self.signature.fn_name} get arguments of different "
                                     f"signatures (array shapes per replica: {sizes}): a split dim that is static "
                                     "must divide evenly over the devices; name it a var in `shapes` for uneven splits")
        return infos

    # ---- calling ----
    def __call__(self, *args, **kwargs):
        if has_tracer(args, kwargs):  # inside another traced function: inlined (its collectives are the caller's)
            return self.fn(*args, **kwargs)
        infos = self._read(args, kwargs)
        entry = self._entry(infos[0])
        with self.lock:  # collectives pair up across replicas and processes: one call at a time
            out = self._run(entry, infos)
            self.stats["replays"] += 1
        return out

    def _run(self, entry: _Entry, infos: list):
        values = [info.var_values for info in infos]
        for plans in entry.plans:
            for plan, v in zip(plans or (), values):
                missing = [n for n in plan.vars if n not in v]
                if missing:
                    raise VarError(f"vars {missing} are used by {self.signature.fn_name} but no argument gives "
                                   "their value")
                plan.require({n: v[n] for n in plan.vars})  # every index constraint before anything runs
        for c in (c for s in entry.stages for c in s.collectives):
            shapes = [entry.source_shapes[c.result](v) for v in values]
            if len(set(shapes)) > 1:
                raise SignatureError(f"pj.{c.kind.replace('psum', 'psum/pmean')} needs the same shape on every "
                                     f"replica; its argument has shapes {shapes} on the replicas: split evenly, or "
                                     "reduce over the split dim first (x.sum(0))")
        envs = []
        for r, (info, device) in enumerate(zip(infos, self.devices)):
            arrays = [a.copies[r] if type(a) is Replicated and len(a.copies) > r and a.copies[r]._device is device
                      else a for a in info.arrays] + list(entry.constants[r])
            if device.device_memory:  # uploaded once, read by every stage
                arrays = [a if isinstance(a, Array) and a._device is device else to_device(device, np.asarray(a))
                          for a in arrays]
            env = dict(zip(entry.traced.inputs, arrays))
            if entry.axis.index is not None:
                env[entry.axis.index] = to_device(device, np.array(self.first_replica + r, np.int32)) \
                    if device.device_memory else np.array(self.first_replica + r, np.int32)
            envs.append(env)
        for stage, plans, shape_fns in zip(entry.stages, entry.plans, entry.shape_fns):
            if plans is not None:
                def one(r, stage=stage, plans=plans, shape_fns=shape_fns):
                    plan, env, v = plans[r], envs[r], values[r]
                    results = plan.run_with_io({n: v[n] for n in plan.vars}, [env[k] for k in stage.in_keys],
                                               [fn(v) for fn in shape_fns])
                    env.update(zip(stage.out_keys, results))
                self._each(one)
            for c in stage.collectives:
                results = communicator(self.devices, self.job).run(c.kind, [env[c.source] for env in envs])
                for env, result in zip(envs, results):
                    env[c.result] = result
        return entry.traced.out_tree.unflatten(self._outputs(entry, envs))

    def _each(self, one):
        if self._pool is None:
            for r in range(len(self.devices)):
                one(r)
        else:
            for future in [self._pool.submit(one, r) for r in range(len(self.devices))]:
                future.result()

    def _outputs(self, entry: _Entry, envs: list) -> list:
        first, out, seen = self.devices[0], [], set()
        for node, varies in zip(entry.traced.outputs, entry.varies):
            if varies and len(envs) > 1:
                host = np.concatenate([np.asarray(env[node]) for env in envs], axis=self.out_axis)
                out.append(to_device(first, host))
                continue
            copies = [env[node] for env in envs]
            if node in seen:
                copies = [c._device.copy_array(c) for c in copies]
            out.append(Replicated(copies) if len(copies) > 1 else copies[0])
            seen.add(node)
        return out

    def replicate(self, tree):
        """`tree` (an array or a pytree of them) with each array put on every replica's device once: passed to
        this function, each replica reads its own copy (no copy per call, as replicated outputs are)."""
        def put(leaf):
            host = np.ascontiguousarray(np.asarray(leaf))
            return Replicated([to_device(device, host) for device in self.devices])
        out = _map_leaves(tree, put)
        for device in self.devices:  # the caller may change its arrays once this returns: the copies must be done
            if device.device_memory:
                device.synchronize()
        return out


class Replicated(Array):
    """An array held on every replica's device, one copy each (a replicated output, or `replicate`): a call of
    the function hands each replica its own copy; everywhere else it is a pj.Array of its first copy."""

    __slots__ = ("copies",)

    def __init__(self, copies: list):
        first = copies[0]
        super().__init__(first.buffer, first.shape, first.dtype, first._device)
        self.copies = copies


class _Parts:
    """One leaf's pieces, one per replica (a marker while a split argument's tree is cut)."""

    def __init__(self, parts):
        self.parts = parts

