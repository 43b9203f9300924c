"""Planning: a traced graph -> schedule -> rendered, compiled (cached) kernels -> an ExecutionPlan."""
from __future__ import annotations

import logging
import time

import numpy as np

from .codegen.memory import nbytes, share_memory
from .codegen.optimize import optimize
from .codegen.render_llvm import render_llvm
from .codegen.render_opencl import render_opencl
from .codegen.schedule import schedule
from .errors import CompileError
from .runtime import disk_cache
from .runtime.cache import CachedKernel, kernel_cache
from .runtime.plan import ExecutionPlan, PlanBuffer, PreparedKernel, RuntimeVar
from .stages import stage
from .trace.tracing import Traced
from .uop import UOp, render_python
from .uop.printer import format_graph

log = logging.getLogger("prepjit")
RENDERERS = {"llvm": render_llvm, "opencl": render_opencl}


def compile_shape_fn(shape: tuple):
    """dict of var values -> live shape, compiled once to a small Python function."""
    body = ", ".join(str(d) if isinstance(d, int) else render_python(d) for d in shape)
    return eval(f"lambda v: ({body}{',' if len(shape) == 1 else ''})")


def compile_positional_fn(exprs: tuple[UOp, ...], var_names: tuple[str, ...]):
    """positional var values (in var_names order) -> tuple of ints."""
    slot = {n: i for i, n in enumerate(var_names)}
    body = ", ".join(render_python(e, lambda n: f"v[{slot[n]}]") for e in exprs)
    return eval(f"lambda v: ({body},)")


def get_kernel(ast: UOp, device) -> tuple[CachedKernel, str]:
    """The compiled kernel for `ast` on `device`, and where it came from: "memory" (this process's kernel
    cache), "disk" (a binary another process compiled; see runtime/disk_cache.py) or "compiled" (now)."""
    origin = "memory"

    def build() -> CachedKernel:
        nonlocal origin
        key = disk_cache.kernel_key(ast, device.name, device.compiler_id)
        entry = disk_cache.read(key) if key else None
        kernel = _load_entry(entry, device) if entry is not None else None
        origin = "disk" if kernel is not None else "compiled"
        if kernel is None:
            entry = _compile_entry(ast, device)
            kernel = _kernel_from_entry(entry, device)
            if key:
                disk_cache.write(key, entry)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("source of %s:\n%s\nast:\n%s", kernel.name, kernel.source, format_graph(ast))
        return kernel
    kernel, _ = kernel_cache.get_or_build((ast, device.name, device.compiler_id), build)
    return kernel, origin


def _compile_entry(ast: UOp, device) -> dict:
    """Render and compile `ast`: everything a CachedKernel is rebuilt from, the device binary included."""
    with stage("optimisation"):
        optimized = optimize(ast, device.language)
    with stage("rendering"):
        src = RENDERERS[device.language](optimized)
    start = time.perf_counter()
    try:
        with stage("compilation"):
            binary = device.compile(src.name, src.source)
    except CompileError:
        raise
    except Exception as e:  # a renderer or driver bug must still say which kernel and show its source
        raise CompileError(f"{device.name} failed to compile {src.name}: {e}\n--- source ---\n{src.source}") from e
    log.info("compile %s on %s in %.1f ms", src.name, device.name, 1e3 * (time.perf_counter() - start))
    return {"name": src.name, "source": src.source, "var_names": src.var_names, "global_size": src.global_size,
            "local_size": src.local_size, "binary": binary}


def _kernel_from_entry(entry: dict, device) -> CachedKernel:
    with stage("loading"):
        program = device.load(entry["name"], entry["binary"])
    return CachedKernel(entry["name"], entry["source"], entry["var_names"], entry["global_size"],
                        entry["local_size"], program,
                        compile_positional_fn(entry["global_size"], entry["var_names"]))


def _load_entry(entry: dict, device) -> CachedKernel | None:
    """A disk cache entry as a kernel, or None (logged) when it does not load: the caller compiles instead."""
    start = time.perf_counter()
    try:
        kernel = _kernel_from_entry(entry, device)
    except Exception as e:  # an unusable entry is rebuilt, whatever the reason
        log.info("a disk cache entry on %s is unusable (%s: %s); compiling it again", device.name, type(e).__name__, e)
        return None
    log.info("load %s on %s from the disk cache in %.1f ms", kernel.name, device.name,
             1e3 * (time.perf_counter() - start))
    return kernel


class _Hazards:
    """Kernel dependencies over plan buffers: read-after-write, write-after-read and write-after-write."""

    def __init__(self):
        self.last_writer: dict[int, int] = {}
        self.readers: dict[int, set[int]] = {}  # buffer -> kernels that read it since its last write

    def add(self, kernel: int, writes: int, reads) -> list[int]:
        """The kernels that must complete before `kernel`, which writes buffer `writes` and reads `reads`."""
        deps = {self.last_writer[b] for b in reads if b in self.last_writer}
        deps |= self.readers.get(writes, set())
        if writes in self.last_writer:
            deps.add(self.last_writer[writes])
        for b in reads:
            self.readers.setdefault(b, set()).add(kernel)
        self.last_writer[writes], self.readers[writes] = kernel, set()
        deps.discard(kernel)
        return sorted(deps)


def _bounds_text(sched) -> str:
    names = {v.arg for spec in sched.buffers for d in spec.shape if isinstance(d, UOp) for v in d.variables()}
    return ", ".join(f"{n} <= {hi}" for n, _, hi in sorted(names)) or "static shapes"


def build_plan(traced: Traced, device) -> tuple[ExecutionPlan, dict[str, int]]:
    """An ExecutionPlan for a traced function, and how many of its kernels were compiled now
    ("compiles") or loaded from the disk cache ("disk_hits")."""
    with stage("scheduling and lowering"):
        sched = schedule(list(traced.outputs), list(traced.inputs), pack_contractions=device.language == "llvm")
    home = share_memory(sched)
    io = set(sched.inputs) | set(sched.outputs)
    allocation_bytes = {}
    for b, h in enumerate(home):
        if b not in io:
            allocation_bytes[h] = max(allocation_bytes.get(h, 1), nbytes(sched.buffers[b]))
    try:
        allocations = {h: device.allocate(np.uint8, size) for h, size in allocation_bytes.items()}
    except MemoryError as e:
        raise MemoryError(f"the plan's intermediates need {sum(allocation_bytes.values())} bytes at the vars' "
                          f"maxima ({_bounds_text(sched)}); narrow the var bounds ({e})") from None
    buffers = []
    for b, (spec, h) in enumerate(zip(sched.buffers, home)):
        text = "(" + ", ".join(d.render() if isinstance(d, UOp) else str(d) for d in spec.shape) + ")"
        dtype, shape_fn = spec.dtype.np, compile_shape_fn(spec.shape)
        if b in io:
            buffers.append(PlanBuffer(dtype, spec.max_size, shape_fn, text,
                                      allocate=lambda dtype=dtype, size=spec.max_size: device.allocate(dtype, size)))
        else:
            buffers.append(PlanBuffer(dtype, spec.max_size, shape_fn, text,
                                      memory=device.alias(allocations[h], dtype, spec.max_size)))
    kernels, counts, hazards = [], {"compiles": 0, "disk_hits": 0}, _Hazards()
    bounds: dict[str, tuple[int, int]] = {}
    fixed_names = set()
    for i, item in enumerate(sched.kernels):
        kernel, origin = get_kernel(item.ast, device)
        counts["compiles"] += origin == "compiled"
        counts["disk_hits"] += origin == "disk"
        fixed = dict(item.fixedvars)
        fixed_names |= set(fixed)
        runtime_vars = [RuntimeVar(v.arg[0], v.arg[1], v.arg[2]) for v in item.ast.variables()]
        for rv in runtime_vars:
            bounds[rv.name] = (rv.min_val, rv.max_val)
        vals = [fixed.get(n, bounds[n][0]) for n in kernel.var_names]
        deps = hazards.add(i, writes=home[item.buffers[0]], reads=[home[b] for b in item.buffers[1:]])
        kernels.append(PreparedKernel(
            id=i, ast=item.ast, kernel=kernel, device=device.name, buffer_indices=list(item.buffers),
            output_indices=[0], vals=vals, fixedvars=fixed, dependencies=deps,
            buffer_ptrs=[buffers[b].memory.ptr if buffers[b].allocated else 0 for b in item.buffers], buffer_ids=[home[b] for b in item.buffers],
            runtime_vars=runtime_vars))
    for spec in sched.buffers:
        for d in spec.shape:
            if isinstance(d, UOp):
                for v in d.variables():
                    bounds[v.arg[0]] = (v.arg[1], v.arg[2])
    var_bounds = {n: b for n, b in sorted(bounds.items()) if n not in fixed_names}
    plan = ExecutionPlan(device, buffers, kernels, sched.inputs, sched.outputs, var_bounds,
                         memory_bytes=sum(allocation_bytes.values()))
    return plan, counts
