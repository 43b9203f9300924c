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
from .runtime.cache import CachedKernel, kernel_cache
from .runtime.plan import ExecutionPlan, PlanBuffer, PreparedKernel, RuntimeVar
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


def get_kernel(ast: UOp, device) -> tuple[CachedKernel, bool]:
    """The compiled kernel for `ast` on `device` from the kernel cache; (kernel, compiled now?)."""
    def build() -> CachedKernel:
        src = RENDERERS[device.language](optimize(ast, device.language))
        start = time.perf_counter()
        try:
            program = device.compile(src.name, src.source)
        except CompileError:
            raise
        except Exception as e:  # a renderer or driver bug must still say which kernel and show its source
            raise CompileError(f"{device.name} failed to compile {src.name}: {e}\n--- source ---\n{src.source}") from e
        log.info("compile %s on %s in %.1f ms", src.name, device.name, 1e3 * (time.perf_counter() - start))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("source of %s:\n%s\nast:\n%s", src.name, src.source, format_graph(ast))
        return CachedKernel(src.name, src.source, src.var_names, src.global_size, src.local_size, program,
                            compile_positional_fn(src.global_size, src.var_names))
    return kernel_cache.get_or_build((ast, device.name, device.compiler_id), build)


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


def build_plan(traced: Traced, device) -> tuple[ExecutionPlan, int]:
    """An ExecutionPlan for a traced function, and how many kernels were compiled (cache misses)."""
    sched = schedule(list(traced.outputs), list(traced.inputs))
    home = share_memory(sched)
    allocation_bytes = {}
    for b, h in enumerate(home):
        allocation_bytes[h] = max(allocation_bytes.get(h, 1), nbytes(sched.buffers[b]))
    allocations = {h: device.allocate(np.uint8, size) for h, size in allocation_bytes.items()}
    buffers = []
    for spec, h in zip(sched.buffers, home):
        memory = device.alias(allocations[h], spec.dtype.np, spec.max_size)
        text = "(" + ", ".join(d.render() if isinstance(d, UOp) else str(d) for d in spec.shape) + ")"
        buffers.append(PlanBuffer(memory, spec.dtype.np, compile_shape_fn(spec.shape), text))
    kernels, compiles, hazards = [], 0, _Hazards()
    bounds: dict[str, tuple[int, int]] = {}
    fixed_names = set()
    for i, item in enumerate(sched.kernels):
        kernel, compiled = get_kernel(item.ast, device)
        compiles += compiled
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
            buffer_ptrs=[buffers[b].memory.ptr for b in item.buffers], buffer_ids=[home[b] for b in item.buffers],
            runtime_vars=runtime_vars))
    for spec in sched.buffers:
        for d in spec.shape:
            if isinstance(d, UOp):
                for v in d.variables():
                    bounds[v.arg[0]] = (v.arg[1], v.arg[2])
    var_bounds = {n: b for n, b in sorted(bounds.items()) if n not in fixed_names}
    plan = ExecutionPlan(device, buffers, kernels, sched.inputs, sched.outputs, var_bounds,
                         memory_bytes=sum(allocation_bytes.values()))
    return plan, compiles
