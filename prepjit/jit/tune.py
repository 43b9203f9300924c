"""PREPJIT_TUNE=1: a short timed search over a kernel's block shapes at prepare time, the winner kept on disk.

A contraction can be blocked several ways, the candidates of the device's target (codegen/targets.py): on the
cpu optimize.py's `blocking_candidates` (rows per register block, columns per block of a one-row matvec); on a
GPU (cuda, opencl) render_tiles.py's `tile_candidates` (tile rows and columns, sets of work-items splitting each
slice).
With PREPJIT_TUNE=1, a kernel being built for the first time (no tuning record yet) is compiled in each
candidate shape and timed on scratch buffers of its own sizes (on the cpu with the weight-sized operands
evicted from the caches between runs when they exceed the L2 cache: a decode step streams its weights from
memory); the fastest shape wins unless it beats the default by less than MIN_GAIN. The choice is written to
the disk cache as a "tune" record, so it is searched once per kernel, device and prepjit version, and read
back by every later process, with PREPJIT_TUNE set or not.

`choose` returns the Blocking a kernel is built with, never stored in this process: the planner passes it to
the target (targets.Target.launched), names it in the kernel's disk key (`key_suffix`) and keeps the launched
AST with the compiled kernel, so the bounds proof, the renderer and the disk cache all see the same kernel.
Only var-free kernels are tuned (their buffers and launch have one size).
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
import time

import attrs
import numpy as np

from ..codegen import optimize as opt
from ..codegen.targets import target_for
from ..codegen.tensor_maps import tensor_maps
from ..runtime import disk_cache
from ..runtime.cpu import PARALLEL_MIN_ITERATIONS, _loop_iterations
from .stages import stage
from ..uop import Ops, UOp

log = logging.getLogger("prepjit")

RUNS = 5            # timed runs of each candidate; the fastest counts
GPU_LAUNCHES = 10   # launches of a GPU candidate per timed run (queued back to back, then waited for)
MIN_GAIN = 0.03     # a candidate replaces the default only when it is this much faster
FLUSH_BYTES = 64 << 20  # written between runs to evict operands larger than the L2 cache
MAX_SCRATCH_ELEMENTS = 1 << 27  # a kernel whose buffers would be larger is not tuned


def enabled() -> bool:
    return os.environ.get("PREPJIT_TUNE", "0") == "1"


def key_suffix(blocking: opt.Blocking) -> str:
    """What a kernel's disk-cache key adds for the Blocking it is built with ("" for the default): every field
    that differs from the default's."""
    changed = {k: v for k, v in attrs.asdict(blocking).items() if v != getattr(opt.DEFAULT_BLOCKING, k)}
    return "".join(f"-{k}-" + ("x".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v))
                   for k, v in sorted(changed.items()))


def choose(ast: UOp, device, kernel_key: str | None) -> opt.Blocking:
    """The Blocking of a kernel about to be built: the disk cache's record, else (PREPJIT_TUNE=1) a search, whose
    winner is recorded, else the default. `kernel_key`: the kernel's untuned disk key (None: no data form,
    nothing recorded, the default)."""
    if kernel_key is None:
        return opt.DEFAULT_BLOCKING
    key = disk_cache.record_key("tune", kernel_key)
    record = disk_cache.read_record("tune", key)
    if record is not None:
        return opt.Blocking(**record[0])
    if not enabled() or ast.variables():
        return opt.DEFAULT_BLOCKING
    target = target_for(device)
    if not target.work_groups and not hasattr(device, "threads"):
        return opt.DEFAULT_BLOCKING
    candidates, timer = target.candidates(ast), search_gpu if target.work_groups else search
    if len(candidates) < 2:
        return opt.DEFAULT_BLOCKING
    with stage("tuning"):
        blocking = timer(ast, device, candidates)
    disk_cache.write_record("tune", key, attrs.asdict(blocking))
    return blocking


def search(ast: UOp, device, candidates: list) -> opt.Blocking:
    """The fastest of `candidates` (the first is the default) for `ast`, timed on the cpu device."""
    buffers = _scratch_buffers(ast)
    if buffers is None:
        return candidates[0]
    bufs = (ctypes.c_void_p * max(1, len(buffers)))(*(b.ctypes.data for b in buffers))
    vals = (ctypes.c_int64 * 1)()
    nbytes = sum(b.nbytes for b in buffers)
    flush = np.zeros(FLUSH_BYTES // 4, np.float32) if nbytes > opt.host_target().l2_bytes else None
    outer, inner = _loop_iterations(ast)
    threads = device.threads if outer > 1 and outer * inner >= PARALLEL_MIN_ITERATIONS else None
    runs, programs = [], []  # a call running each candidate once; the compiled code it calls, kept alive
    for blocking in candidates:
        source = target_for(device).render(target_for(device).launched(ast, blocking))
        program = device.load(source.name, device.compile(source.name, source.source))
        programs.append(program)
        size = int(source.global_size[0].vmax) if source.global_size else 1
        fn = ctypes.cast(program.fn, ctypes.c_void_p).value
        if threads is not None:
            runs.append(functools.partial(threads.parallel, fn, ctypes.addressof(bufs), ctypes.addressof(vals), size,
                                          threads.chunks(size)))
        else:
            runs.append(functools.partial(program.fn, ctypes.addressof(bufs), ctypes.addressof(vals), 0, size))
    times = [float("inf")] * len(runs)
    for rep in range(RUNS + 1):  # round robin, so a disturbance hits every candidate alike; the first run warms
        for c, run in enumerate(runs):
            if flush is not None:
                flush += 1
            start = time.perf_counter()
            run()
            if rep:
                times[c] = min(times[c], time.perf_counter() - start)
    return _winner(ast, candidates, times)


def search_gpu(ast: UOp, device, candidates: list) -> opt.Blocking:
    """The fastest of `candidates` (the first is the default) for `ast`, timed on the GPU `device`: each run
    queues GPU_LAUNCHES launches and waits for them, so the kernels, not the host, are timed."""
    buffers = _scratch_buffers(ast)
    if buffers is None:
        return candidates[0]
    memory = [device.allocate(b.dtype, b.size) for b in buffers]
    for buffer, host in zip(memory, buffers):
        device.write_buffer(buffer, host)
    handles = [device.handle(b) for b in memory]
    from .planner import tensor_map_args   # (planner asks this module for its Blockings)
    launchers = []
    for blocking in candidates:
        launched = target_for(device).launched(ast, blocking)
        source = target_for(device).render(launched)
        program = device.load(source.name, device.compile(source.name, source.source))
        maps = tensor_map_args(tensor_maps(launched), ())   # (a Hopper tile's, of no vars: a static kernel)
        launchers.append(device.launcher(program, handles, [], None, int(source.global_size[0].arg),
                                         **({"tensor_maps": maps} if maps else {})))
    times = [float("inf")] * len(launchers)
    for rep in range(RUNS + 1):  # round robin, as on the cpu; the first run warms
        for c, launcher in enumerate(launchers):
            device.synchronize()
            start = time.perf_counter()
            for _ in range(GPU_LAUNCHES):
                launcher.run()
            device.synchronize()
            if rep:
                times[c] = min(times[c], (time.perf_counter() - start) / GPU_LAUNCHES)
    return _winner(ast, candidates, times)


def _winner(ast: UOp, candidates: list, times: list) -> opt.Blocking:
    """The fastest candidate, unless it beats the default (the first) by less than MIN_GAIN."""
    winner = min(range(len(candidates)), key=times.__getitem__)
    if times[winner] > times[0] * (1 - MIN_GAIN):
        winner = 0
    log.info("tune %s: %s (us) -> %s", ast.arg, ", ".join(f"{_label(b)}: {t * 1e6:.1f}" for b, t in
                                                        zip(candidates, times)), _label(candidates[winner]))
    return candidates[winner]


def _label(b: opt.Blocking) -> str:
    """A candidate as the log shows it: tile rows x columns / splits on a GPU, accumulators / matvec row bytes on
    the cpu (the defaults: "default")."""
    if b == opt.DEFAULT_BLOCKING:
        return "default"
    return "x".join(map(str, b.tile[:2])) + f"/{b.tile[2]}" if b.tile else f"{b.max_accumulators}/{b.matvec_row_bytes}"


def _scratch_buffers(ast: UOp) -> list[np.ndarray] | None:
    """A buffer per slot of the kernel, as large as its highest index, holding small values (no denormals), or
    None when one would be larger than MAX_SCRATCH_ELEMENTS."""
    sizes: dict[int, tuple] = {}
    for u in ast.toposort():
        if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is Ops.DEFINE_GLOBAL:
            slot, dtype = u.src[0].arg, u.src[0].dtype
            extent = int(u.src[1].vmax) + 1
            sizes[slot] = (max(extent, sizes.get(slot, (0,))[0]), dtype)
    if any(extent > MAX_SCRATCH_ELEMENTS for extent, _ in sizes.values()):
        return None  # an index bounded only by its dtype (a gather's ids): not timed
    return [np.full(sizes[slot][0], 0.5, sizes[slot][1].np) if slot in sizes else np.zeros(1, np.float32)
            for slot in range(max(sizes, default=-1) + 1)]
