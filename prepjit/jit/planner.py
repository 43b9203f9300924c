"""Planning: a traced graph -> schedule -> rendered, compiled (cached) kernels -> an ExecutionPlan."""
from __future__ import annotations

import functools
import gc
import json
import logging
import threading
import time
from contextlib import contextmanager

import attrs
import numpy as np

from ..codegen.bounds import prove_launched
from ..codegen.memory import nbytes, share_memory
from ..codegen.offsets import share_offsets
from ..codegen.dynamic_loop import PARTS, DynamicLoop
from ..codegen.targets import target_for
from ..codegen.tensor_maps import tensor_maps
from ..codegen.schedule import KernelSequence, LoopKernels, ScheduledKernel, schedule
from ..errors import CompileError, DeviceError
from ..runtime import disk_cache
from ..runtime.cache import Abandoned, CachedKernel, kernel_cache
from ..runtime.dynamic_loop import DynamicLaunches
from ..runtime.compile_pool import run_now
from ..runtime.plan import ExecutionPlan, LoopLaunches, PlanBuffer, PreparedKernel, PreparedKernels
from ..runtime.var_table import VarTable
from . import tune
from .stages import stage
from ..tracing.core import Traced
from ..uop import Ops, UOp, dtypes, render_python, serial
from ..uop.printer import format_graph

log = logging.getLogger("prepjit")
OUTSIZED = 3  # a kernel of more than this many times the median kernel's nodes is built first (_outsized_first)

_gc_pause = {"depth": 0, "resume": False}
_gc_pause_lock = threading.Lock()


@contextmanager
def gc_paused():
    """Python's cyclic garbage collector off while the block runs (a trace and its plan, on any thread; it is
    turned back on when the last such block ends, if it was on before the first). A prepare allocates a graph of
    some 10^5 to 10^6 objects that all live until it ends, so the collections it triggers find nothing to free
    and each full one walks the whole heap: SmolLM2's two first calls (gguf f32) spent 0.35 s of 3.7 in the
    collector, 0.03 s with it paused; the 100 decode steps after them ran no full collection either way.

    When it is turned back on, what the block allocated moves to the oldest generation at once (gc.freeze and
    gc.unfreeze: a splice of lists, no walk): left in the youngest, the first collections after it walked every object
    of the plan (SmolLM2's prefill: 17 ms, then 21-46 ms) and promoted them all, which made a full collection
    (180 ms) due soon after, inside the next prepare's first call or a decode step. Its garbage waits for the next
    full collection."""
    with _gc_pause_lock:
        if _gc_pause["depth"] == 0:
            _gc_pause["resume"] = gc.isenabled()
            gc.disable()
        _gc_pause["depth"] += 1
    try:
        yield
    finally:
        with _gc_pause_lock:
            _gc_pause["depth"] -= 1
            if _gc_pause["depth"] == 0 and _gc_pause["resume"]:
                gc.freeze()
                gc.unfreeze()
                gc.enable()


def compile_shape_fn(shape: tuple):
    """dict of var values -> live shape, compiled once to a small Python function."""
    body = ", ".join(str(d) if isinstance(d, int) else render_python(d) for d in shape)
    return _python_fn(f"lambda v: ({body}{',' if len(shape) == 1 else ''})")


def compile_positional_fn(exprs: tuple[UOp, ...], var_names: tuple[str, ...]):
    """positional var values (in var_names order) -> tuple of ints."""
    slot = {n: i for i, n in enumerate(var_names)}
    body = ", ".join(render_python(e, lambda n: f"v[{slot[n]}]") for e in exprs)
    return _python_fn(f"lambda v: ({body},)")


@functools.lru_cache(maxsize=4096)
def _python_fn(source: str):
    """The function of `source` (a lambda of var values), compiled once: it holds nothing but its code, so every
    caller with that source shares it. SmolLM2's two plans ask for 984 shape functions, of few distinct sources;
    compiling each took 29 ms of their first calls (AMD EPYC)."""
    return eval(source)


def get_kernels(asts: list[UOp], device, meanwhile=None) -> tuple[list[CachedKernel], dict[str, int]]:
    """The compiled kernel of each AST on `device` (identical ASTs share one), and how many were compiled now
    ("compiles") or loaded from the disk cache ("disk_hits"; see runtime/disk_cache.py); the rest came from
    this process's kernel cache. Misses are optimised and rendered here, in order, while the earlier ones
    compile, in worker processes when the device has them (`compile_parallel`); `meanwhile(launches)` then runs
    here while the last ones compile (what it raises stops the build), given the kernels known so far as
    launched (`kernel_launches`; not those another thread is still building). Each kernel keeps the AST it was
    launched as (CachedKernel.ast) and its disk key. Nothing is optimised or compiled twice, even by threads
    preparing at once: a kernel another thread is building is waited for."""
    futures, claims = {}, {}
    for ast in dict.fromkeys(asts):
        key = (ast, device.name, device.compiler_id)
        futures[ast], mine = kernel_cache.claim(key)
        if mine:
            claims[ast] = key
    counts = {"compiles": 0, "disk_hits": 0}

    def known(building: dict):  # the kernels built here (compiling now) and those whose build is done
        done = {ast: f.result() for ast, f in futures.items() if f.done() and f.exception() is None}
        meanwhile({**kernel_launches(list(done), list(done.values())), **building})
    try:
        for ast, kernel in _build(list(claims), device, counts, meanwhile and known):
            key = claims.pop(ast)
            kernel_cache.failed(key, kernel) if isinstance(kernel, Exception) else kernel_cache.done(key, kernel)
    except BaseException:  # interrupted: what is left unbuilt is built by whoever needs it next
        for key in claims.values():
            kernel_cache.failed(key, Abandoned())
        raise
    kernels = {}
    for ast, future in futures.items():
        try:
            kernels[ast] = future.result()
        except Abandoned:  # the thread building it was interrupted: build it here
            (kernels[ast],), more = get_kernels([ast], device)
            counts = {k: counts[k] + more[k] for k in counts}
    return [kernels[ast] for ast in asts], counts


def kernel_launches(asts: list[UOp], kernels: list[CachedKernel]) -> dict[UOp, tuple[UOp, str | None]]:
    """{scheduled AST: (the kernel as launched, its disk key)}: what `prove_plan` proves."""
    return {ast: (kernel.ast, kernel.disk_key) for ast, kernel in zip(asts, kernels)}


def _outsized_first(misses: list) -> list:
    """`misses` ((AST, ...) each) with the kernels of more than OUTSIZED times the median's nodes first, in order,
    then the others in order: such a kernel (a stack of every layer's rows: SmolLM2's decode E_30_3_64, 655 nodes
    against at most 185, 0.1-0.19 s of LLVM) rendered last in a plan compiled alone at its end while the other
    workers idled; first, it compiles beside the others' optimisation and rendering. (Node counts say little about
    the other kernels' compile times: a softmax row of 24 nodes compiles as long as a tile of 121.)"""
    sizes = [len(miss[0].toposort()) for miss in misses]
    median = sorted(sizes)[len(sizes) // 2] if sizes else 0
    outsized = [size > OUTSIZED * median for size in sizes]
    return [m for m, big in zip(misses, outsized) if big] + [m for m, big in zip(misses, outsized) if not big]


def _build(asts: list[UOp], device, counts: dict, meanwhile=None):
    """(ast, its kernel or the exception that stopped it) for each AST: from the disk cache, else compiled
    with the Blocking PREPJIT_TUNE's record (tune.py) gives it, which its disk key names; `meanwhile(launches)`
    runs once every compile is under way, given those being compiled (`kernel_launches`)."""
    misses = []
    # with the disk cache off a key serves only PREPJIT_TUNE's search: serialising and hashing each AST would be waste
    keyed = disk_cache.cache_root() is not None or tune.enabled()
    for ast in asts:
        key = disk_cache.kernel_key(ast, device.name, device.compiler_id) if keyed else None
        blocking = tune.choose(ast, device, key)
        suffix = tune.key_suffix(blocking)
        key = disk_cache.kernel_key(ast, device.name, device.compiler_id + suffix) if key and suffix else key
        kernel = _load_entry(key, ast, device) if key else None
        if kernel is None:
            misses.append((ast, blocking, key))
        else:
            counts["disk_hits"] += 1
            yield ast, kernel
    misses = _outsized_first(misses)
    parallel = getattr(device, "compile_parallel", None)
    submit = parallel(len(misses)) if parallel else lambda name, source: run_now(device.compile, name, source)
    jobs, building = [], {}
    for ast, blocking, key in misses:  # the workers compile earlier kernels while later ones are optimised, rendered
        try:
            with stage("optimisation"):
                launched = target_for(device).launched(ast, blocking)
            with stage("rendering"):
                src = target_for(device).render(launched)
        except Exception as e:
            yield ast, e
            continue
        with stage("compilation"):  # compiling itself when the device compiles in this process
            jobs.append((ast, launched, key, src, submit(src.name, src.source)))
        building[ast] = (launched, key)
    if meanwhile is not None:
        meanwhile(building)
    for ast, launched, key, src, job in jobs:
        try:
            with stage("compilation"):
                binary = job.result()
        except (CompileError, DeviceError) as e:  # (DeviceError: the device cannot run what the kernel needs)
            yield ast, e
            continue
        except Exception as e:  # a renderer or driver bug must still say which kernel and show its source
            error = CompileError(f"{device.name} failed to compile {src.name}: {e}\n--- source ---\n{src.source}")
            error.__cause__ = e
            yield ast, error
            continue
        log.info("compile %s on %s in %.1f ms", src.name, device.name, 1e3 * job.seconds)
        fields = {"name": src.name, "source": src.source, "var_names": src.var_names,
                  "global_size": src.global_size, "local_size": src.local_size, "ast": launched}
        try:
            kernel = _kernel_from_entry(fields, binary, device, ast, key)
        except Exception as e:
            yield ast, e
            continue
        if key:
            disk_cache.write(key, fields, binary)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("source of %s:\n%s\nast:\n%s", kernel.name, kernel.source, format_graph(ast))
        counts["compiles"] += 1
        yield ast, kernel


def _kernel_from_entry(fields: dict, binary: bytes, device, scheduled: UOp,
                       disk_key: str | None = None) -> CachedKernel:
    """The CachedKernel of `fields` (disk_cache.read's, with the launched AST) and its compiled code, built from
    the `scheduled` kernel AST."""
    with stage("loading"):
        program = device.load(fields["name"], binary)
    maps = tensor_maps(fields["ast"])
    return CachedKernel(**fields, program=program, binary=binary, scheduled=scheduled, disk_key=disk_key,
                        global_size_fn=compile_positional_fn(fields["global_size"], fields["var_names"]),
                        tensor_maps=tensor_map_args(maps, fields["var_names"]))


def tensor_map_args(maps: tuple, var_names: tuple) -> tuple | None:
    """A kernel's tensor maps (codegen/tensor_maps.py) and the function of its positional var values that gives
    their values (TensorMap.values, flattened), as its device's launcher takes them; None for no maps."""
    if not maps:
        return None
    return maps, compile_positional_fn(tuple(v for m in maps for v in m.values()), var_names)


def _load_entry(key: str, ast: UOp, device) -> CachedKernel | None:
    """The disk cache's kernel under `key`, or None (logged when the entry is unusable): the caller compiles."""
    start = time.perf_counter()
    entry = disk_cache.read(key)
    if entry is None:
        return None
    try:
        kernel = _kernel_from_entry(*entry, device, ast, key)
    except Exception as e:  # an unusable entry is rebuilt (and replaced), whatever the reason
        log.info("a disk cache entry on %s is unusable (%s: %s); compiling it again", device.name, type(e).__name__, e)
        return None
    log.info("load %s on %s from the disk cache in %.1f ms", kernel.name, device.name,
             1e3 * (time.perf_counter() - start))
    return kernel


def _prove(launched: UOp, key: str | None, shapes: tuple, constraints: list) -> int:
    """prove_launched, remembered in the disk cache under the kernel's disk `key` (a failed proof is never
    remembered: it raises every time)."""
    if key is not None:
        try:
            key = disk_cache.record_key("proof", key, json.dumps(serial.to_data(tuple(constraints))), json.dumps(
                [[d if isinstance(d, int) else serial.to_data((d,)) for d in shape] for shape in shapes]))
        except ValueError:
            key = None
    record = disk_cache.read_record("proof", key) if key else None
    if record is not None and type(record[0].get("proven")) is int:
        return record[0]["proven"]
    proven = prove_launched(launched, list(shapes), constraints)
    if key:
        disk_cache.write_record("proof", key, {"proven": proven})
    return proven


class _Hazards:
    """Kernel dependencies over plan buffers: read-after-write, write-after-read and write-after-write."""

    def __init__(self):
        self.last_writer: dict[int, int] = {}
        self.readers: dict[int, set[int]] = {}  # buffer -> kernels that read it since its last write

    def add(self, kernel: int, buffer_ids: list[int], output_indices: list[int]) -> list[int]:
        """The kernels that must complete before `kernel`, whose buffers are the memories `buffer_ids` (plan buffers
        sharing memory share an id), those at `output_indices` written (one), the others read."""
        (writes,) = (buffer_ids[i] for i in output_indices)
        reads = [b for i, b in enumerate(buffer_ids) if i not in output_indices]
        deps = {self.last_writer[b] for b in reads if b in self.last_writer}
        deps |= self.readers.get(writes, set())
        if writes in self.last_writer:
            deps.add(self.last_writer[writes])
        for b in reads:
            self.readers.setdefault(b, set()).add(kernel)
        self.last_writer[writes], self.readers[writes] = kernel, set()
        deps.discard(kernel)
        return sorted(deps)


def _bounds_text(table: VarTable) -> str:
    return ", ".join(f"{n} <= {rv.max}" for n, rv in table.var.items()) or "static shapes"


@attrs.frozen
class PlanSpec:
    """A plan as data, before any device: its buffers (dtype, live shape over the vars, size at the maxima),
    which buffers share memory, its kernels (AST, buffer slots, fixedvars) in execution order, I/O buffers,
    index constraints, gather flags ((buffer, what)) and proven accesses. `instantiate` puts it on a device;
    saved.py writes it to a file and reads it back."""

    buffers: tuple   # BufferSpec per plan buffer
    home: tuple      # per buffer, the buffer whose allocation it lives in (codegen/memory.py)
    kernels: tuple   # ScheduledKernel per launch
    inputs: tuple
    outputs: tuple
    constraints: tuple = ()
    flags: tuple = ()
    proven_accesses: int = 0


def prove_plan(kernels, buffers, constraints, launches: dict, proofs: dict | None = None) -> int | None:
    """The bounds proof of every kernel as launched (`launches`: `kernel_launches`), once per distinct kernel
    and shapes (a fori_loop's iterations share one): how many accesses were proven, or CompileError. Kernels
    missing from `launches` are left to a later call with the same `proofs` ({(AST, shapes): accesses}): the
    count is None until every kernel is proven. Inside a loop the plan runs natively its var is known to lie
    in its bounds (lower <= var < upper)."""
    conds, proofs, proven = [c.cond for c in constraints] + kernels.loop_facts(), {} if proofs is None else proofs, 0
    for k, count in kernels.counted():
        shapes = tuple(tuple(buffers[b].shape) for b in k.buffers)
        if (k.ast, shapes) not in proofs and k.ast in launches:
            proofs[k.ast, shapes] = _prove(*launches[k.ast], shapes, conds)
        proven = None if proven is None or (k.ast, shapes) not in proofs else proven + count * proofs[k.ast, shapes]
    return proven


def _share_offsets(sched, constraints):
    """`sched` with its kernels that differ only in constant buffer offsets (a layer's slice of a stacked
    array) sharing one AST, the offsets fixedvars (codegen/offsets.py): one optimisation, proof and compile."""
    segments = sched.kernels.segments
    singles = [i for i, seg in enumerate(segments) if isinstance(seg, ScheduledKernel)]
    taken = {getattr(seg, "name", None) for seg in segments} | {u.arg[0] for u in (
        *(v for ast in sched.kernels.asts() for v in ast.variables()),
        *(v for buf in sched.buffers for d in buf.shape if isinstance(d, UOp) for v in d.variables()),
        *(v for c in constraints for v in c.cond.variables()))}
    shared = share_offsets([segments[i] for i in singles], lambda k: tuple(sched.buffers[b].shape for b in k.buffers),
                           taken)
    if all(k is segments[i] for i, k in zip(singles, shared)):
        return sched
    segments = list(segments)
    for i, k in zip(singles, shared):
        segments[i] = k
    return attrs.evolve(sched, kernels=KernelSequence(segments))


def build_plan(traced: Traced, device) -> tuple[ExecutionPlan, dict[str, int]]:
    """An ExecutionPlan for a traced function, and how many of its kernels were compiled now
    ("compiles") or loaded from the disk cache ("disk_hits")."""
    expect = getattr(device, "expect_compiles", None)  # (a device compiling in worker processes: the cpu)
    if expect is not None:  # its workers start now, their start beside the scheduling (one core), not the compiles
        expect(sum(u.op is Ops.REDUCE_AXIS for u in UOp(Ops.SINK, dtypes.bool, tuple(traced.outputs)).toposort()))
    with stage("scheduling and lowering"):
        target = target_for(device)
        sched = schedule(list(traced.outputs) + [f for f, _ in traced.flags], list(traced.inputs),
                         pack_contractions=target.packs_contractions, attention_tiles=target.fuses_attention)
        sched = _share_offsets(sched, traced.constraints)
    proofs = {}

    def prove(launches):  # every access of every kernel inside its buffer, or CompileError, while they compile
        with stage("bounds proof"):
            prove_plan(sched.kernels, sched.buffers, traced.constraints, launches, proofs)
    asts = sched.kernels.asts()
    compiled, counts = get_kernels(asts, device, meanwhile=prove)
    with stage("bounds proof"):  # those another thread was building
        proven = prove_plan(sched.kernels, sched.buffers, traced.constraints, kernel_launches(asts, compiled), proofs)
    n_out = len(traced.outputs)
    spec = PlanSpec(sched.buffers, tuple(share_memory(sched)), sched.kernels, sched.inputs, sched.outputs[:n_out],
                    tuple(traced.constraints), tuple((b, what) for b, (_, what) in zip(sched.outputs[n_out:],
                                                                                     traced.flags)), proven)
    return instantiate(spec, dict(zip(asts, compiled)), device), {**counts, "proven_accesses": proven}


def plan_vars(spec: PlanSpec) -> VarTable:
    """The VarTable of `spec`: every var (DEFINE_VAR) of its kernels' ASTs, loop bounds, buffer shapes and
    constraints, so var bounds are read off what the bounds proof saw (never taken from elsewhere); the names
    its kernels fix (fixedvars, a fori_loop's counter) and the counters of the loops it runs natively."""
    defines, fixed, loops = set(), set(), set()

    def walk(segments):
        for seg in segments:
            if isinstance(seg, DynamicLoop):
                if seg.var is not None:
                    defines.add(seg.var)
                    loops.add(seg.name)
                defines.update(v for b in (seg.lower, seg.upper) if isinstance(b, UOp) for v in b.variables())
                walk(k for part in seg.parts for k in part)
            elif isinstance(seg, LoopKernels):
                fixed.add(seg.name)
                walk(seg.body)
            else:
                defines.update(seg.ast.variables())
                fixed.update(n for n, _ in seg.fixedvars)
    walk(spec.kernels.segments)
    defines.update(v for buf in spec.buffers for d in buf.shape if isinstance(d, UOp) for v in d.variables())
    defines.update(v for c in spec.constraints for v in c.cond.variables())
    return VarTable(defines, fixed, loops)


def instantiate(spec: PlanSpec, compiled: dict[UOp, CachedKernel], device) -> ExecutionPlan:
    """The ExecutionPlan of `spec` on `device`, `compiled[ast]` running the kernels with that AST (its vars:
    `plan_vars`); each PreparedKernel's `ast` is its kernel as launched (CachedKernel.ast)."""
    table = plan_vars(spec)
    home = spec.home
    io = set(spec.inputs) | set(spec.outputs) | {b for b, _ in spec.flags}
    allocation_bytes = {}
    for b, h in enumerate(home):
        if b not in io:
            allocation_bytes[h] = max(allocation_bytes.get(h, 1), nbytes(spec.buffers[b]))
    try:
        allocations = {h: device.allocate(np.uint8, size) for h, size in allocation_bytes.items()}
    except MemoryError as e:
        raise MemoryError(f"the plan's intermediates need {sum(allocation_bytes.values())} bytes at the vars' "
                          f"maxima ({_bounds_text(table)}); narrow the var bounds ({e})") from None
    buffers = []
    for b, (buf, h) in enumerate(zip(spec.buffers, home)):
        text = "(" + ", ".join(d.render() if isinstance(d, UOp) else str(d) for d in buf.shape) + ")"
        dtype, shape_fn = buf.dtype.np, compile_shape_fn(buf.shape)
        if b in io:
            buffers.append(PlanBuffer(dtype, buf.max_size, shape_fn, text,
                                      allocate=lambda dtype=dtype, size=buf.max_size: device.allocate(dtype, size)))
        else:
            buffers.append(PlanBuffer(dtype, buf.max_size, shape_fn, text,
                                      memory=device.alias(allocations[h], dtype, buf.max_size)))
    hazards = _Hazards()

    def prepared(i: int, item) -> PreparedKernel:
        """Kernel `i`: `buffer_ptrs` are the device's handles of its buffers (None for an I/O buffer: a call's
        arrays are patched there), `dependencies` the earlier kernels its `buffer_ids` conflict with."""
        kernel, fixed = compiled[item.ast], dict(item.fixedvars)
        pk = PreparedKernel(
            id=i, ast=kernel.ast, kernel=kernel, device=device.name, buffer_indices=list(item.buffers),
            output_indices=[0], vals=table.kernel_vals(kernel.var_names, fixed), fixedvars=fixed, dependencies=[],
            buffer_ptrs=[device.handle(buffers[b].memory) if buffers[b].allocated else None for b in item.buffers],
            buffer_ids=[home[b] for b in item.buffers], runtime_vars=table.runtime_vars(kernel.ast))
        pk.dependencies = hazards.add(i, pk.buffer_ids, pk.output_indices)
        return pk

    def dynamic(seg: DynamicLoop, start: int) -> DynamicLaunches:
        """A loop the plan runs natively: its kernels prepared once each, at their positions from `start`."""
        parts = []
        for part in seg.parts:
            out = []
            for item in part:
                out.append(dynamic(item, start) if isinstance(item, DynamicLoop) else prepared(start, item))
                start += len(item) if isinstance(item, DynamicLoop) else 1
            parts.append(tuple(out))
        return DynamicLaunches(seg.name, seg.lower, seg.upper, seg.pred_buffer, tuple(parts), PARTS)

    segments = []
    for seg, start in zip(spec.kernels.segments, spec.kernels.starts):
        if isinstance(seg, DynamicLoop):
            segments.append(dynamic(seg, start))
            continue
        if not isinstance(seg, LoopKernels):
            segments.append(prepared(start, seg))
            continue
        n, width = seg.upper - seg.lower, len(seg.body)
        first = [prepared(start + i, seg.item(i)) for i in range(min(n, 4) * width)]
        for i in range(max(4, n - 2) * width, n * width):  # the last iterations leave the hazards after the loop
            hazards.add(start + i, [home[b] for b in seg.item(i).buffers], [0])
        segments.append(LoopLaunches(seg.name, seg.lower, seg.upper, start, (first[:width], first[width:2 * width]),
                                     tuple(tuple(pk.dependencies) for pk in first)))
    return ExecutionPlan(device, buffers, PreparedKernels(segments), spec.inputs, spec.outputs, table,
                         memory_bytes=sum(allocation_bytes.values()), constraints=spec.constraints,
                         flags=spec.flags, proven_accesses=spec.proven_accesses, spec=spec)
