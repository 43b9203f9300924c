"""Running cases: time prepjit and each available peer on the same inputs, check results, collect a record."""
from __future__ import annotations

import functools
import os
import platform
import tempfile
import time

import numpy as np

from .blas import blas_info
from .case import Case
from .first_call import in_fresh_process
from .peers import Peer
from .timing import time_per_call


def bind_namespace(fn, xp):
    """`fn(xp, *arrays)` as a function of the arrays alone, keeping its parameter names and name."""
    bound = functools.partial(fn, xp)
    bound.__name__ = fn.__name__
    return bound


def prepjit_call(case: Case, arrays: list) -> tuple:
    """prepjit's prepared function for a case and the arguments it takes: `fn` prepared on all the arrays, or the
    case's own form (`Case.prepjit`, e.g. weights read from a closure)."""
    if case.prepjit is not None:
        return case.prepjit(arrays)
    import prepjit as pj
    import prepjit.numpy as pnp
    return pj.prepare(bind_namespace(case.fn, pnp), **case.prepare_kwargs), arrays


def plan_memory(prepared, arrays) -> dict:
    """Bytes of a plan's buffers at the var bounds' maxima: all of them and the intermediates (neither an input nor
    an output), each counted alone, and the plan's own `memory_bytes` (intermediates sharing memory counted once)."""
    plan = prepared.plan(*arrays)
    io = set(plan.inputs) | set(plan.outputs)
    sizes = [b.nbytes for b in plan.buffers]
    return {"plan_bytes": sum(sizes), "intermediate_bytes": sum(s for i, s in enumerate(sizes) if i not in io),
            "memory_bytes": plan.memory_bytes,  # what the plan holds for intermediates, shared buffers once
            "kernels": len(plan.kernels)}


def _prepare_seconds(make_call, arrays, smoke: bool) -> float:
    """Median time of a first call (trace + compile) with fresh state each round, in this process (the peers')."""
    samples = []
    for _ in range(1 if smoke else 3):
        call = make_call()
        start = time.perf_counter()
        call(*arrays)
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def _first_call_seconds(case: Case, smoke: bool) -> tuple[float, list]:
    """The median first call of a prepare case, each in a fresh Python process with the disk cache off: nothing
    of an earlier round (kernels, simplifier memos, compile workers) is warm. Also every round's record."""
    calls = [in_fresh_process(case.name, smoke, {"PREPJIT_CACHE": "0"}) for _ in range(1 if smoke else 3)]
    return float(np.median([c["seconds"] for c in calls])), calls


def _disk_cache_seconds(case: Case) -> tuple[float, list]:
    """The median first call of a prepare case in a second (third, ...) fresh process with the disk cache that a
    first process filled (a private empty directory), and every round's record, the filling one first."""
    with tempfile.TemporaryDirectory(prefix="prepjit-bench-") as cache:
        env = {"PREPJIT_CACHE": "1", "PREPJIT_CACHE_DIR": cache}
        calls = [in_fresh_process(case.name, False, env) for _ in range(3)]
    return float(np.median([c["seconds"] for c in calls[1:]])), calls


def run_case(case: Case, peers: list[Peer], smoke: bool = False, seed: int = 0) -> dict:
    if case.processes is not None:
        times, record = case.processes(peers, smoke)
        return with_ratios(case, {"case": case.name, "kind": case.kind, **record}, times)
    rng = np.random.default_rng(seed)
    arrays = case.make_inputs(rng, smoke)
    reference = case.fn(np, *arrays)
    record: dict = {"case": case.name, "kind": case.kind,
                    "shapes": [list(a.shape) if hasattr(a, "shape") else type(a).__name__ for a in arrays]}
    times: dict[str, float] = {}
    if case.kind == "prepare":
        times["prepjit"], record["first_calls"] = _first_call_seconds(case, smoke)
        if not smoke:
            record["disk_cache_seconds"], record["disk_cache_calls"] = _disk_cache_seconds(case)
    prepared, args = prepjit_call(case, arrays)
    if case.kind != "prepare":
        times["prepjit"] = time_per_call(lambda: prepared(*args), smoke=smoke)
    results = prepared(*args)
    pairs = zip(results, reference) if isinstance(reference, tuple) else [(results, reference)]
    for got, want in pairs:
        np.testing.assert_allclose(np.asarray(got), want, rtol=case.rtol, atol=case.atol,
                                   err_msg=f"prepjit's result for {case.name} differs from NumPy's")
    record.update(plan_memory(prepared, args))
    for peer in peers:
        own = case.peer_fns.get(peer.name)
        if own is None and (peer.namespace is None or (case.peers is not None and peer.name not in case.peers)):
            continue
        if case.kind == "prepare" and peer.name != "jax":
            continue
        try:
            if case.kind == "prepare":
                times[peer.name] = _prepare_seconds(lambda: peer.prepare(bind_namespace(case.fn, peer.namespace())),
                                                    arrays, smoke)
            else:
                call = own(arrays) if own is not None else peer.prepare(bind_namespace(case.fn, peer.namespace()))
                times[peer.name] = time_per_call(lambda: call(*arrays), smoke=smoke)
        except Exception as e:  # a peer that cannot run a case is reported, not fatal
            record.setdefault("peer_errors", {})[peer.name] = f"{type(e).__name__}: {e}"[:200]
    record = with_ratios(case, record, times)
    if case.work is not None:
        amount, unit = case.work(arrays)
        scale = 1e9
        record["rate_unit"] = unit
        record["rates"] = {p: amount / t / scale for p, t in times.items()}
    return record


def with_ratios(case: Case, record: dict, times: dict) -> dict:
    """`record` with the times, prepjit's ratio to each peer's and the goal's verdict (none without prepjit's)."""
    record["seconds"] = times
    record["ratio_vs"] = {p: times["prepjit"] / t for p, t in times.items()
                          if "prepjit" in times and p != "prepjit" and t > 0}
    if case.goal is not None:
        peer, limit = case.goal
        ratio = record["ratio_vs"].get(peer)
        record["goal"] = {"peer": peer, "max_ratio": limit, "ratio": ratio,
                          "met": None if ratio is None else ratio <= limit}
    return record


def copy_bandwidth(nbytes: int = 64 << 20, rounds: int = 5) -> float:
    """GB/s of NumPy copying `nbytes` into a warm buffer on every core (bytes read + bytes written):
    the memory bandwidth a streaming kernel can hope for on this machine, for the rate column."""
    from concurrent.futures import ThreadPoolExecutor
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros_like(src)
    bounds = [nbytes * k // threads for k in range(threads + 1)]
    slices = [slice(a, b) for a, b in zip(bounds, bounds[1:])]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(rounds):
            start = time.perf_counter()
            list(pool.map(lambda s: np.copyto(dst[s], src[s]), slices))
            best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best / 1e9


def kernel_cpu() -> dict:
    """The CPU prepjit's cpu kernels are compiled for: LLVM's name of it (PREPJIT_CPU, e.g. "haswell" for AVX2 code
    on an AVX-512 host, else the host's own) and its vector width, which the results must name: the same host
    gives other figures for another target."""
    from prepjit.llvm_cpu import compile_cpu
    target = compile_cpu()
    return {"name": target.name, "vector_bytes": target.vector_bytes, "chosen": bool(os.environ.get("PREPJIT_CPU"))}


def machine_info(measure_bandwidth: bool = True) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "blas": blas_info(),
            "kernel_cpu": kernel_cpu()}
    if measure_bandwidth:
        info["copy_gb_per_s"] = round(copy_bandwidth(), 1)
    return info
