"""Parallel compiles of a plan's kernels: worker processes for LLVM (llvmlite serialises calls in one process), and
threads for a compiler that runs concurrently in one process (NVRTC: `in_threads`).

A pool is one target machine's set of `python -I llvm_compile.py` workers (plain subprocesses
speaking a small binary protocol: no pickling, and no re-import of the user's `__main__` as
multiprocessing's spawn and forkserver start methods do). It is started lazily, on the first
batch of at least MIN_KERNELS kernels, or with all its workers before a plan is scheduled whose
trace holds that many reductions (cpu.expect_compiles), and reused by later batches; a forked
child starts its own. `submit(name, source)` returns a Future (a Compile) of the object code; an LLVM failure arrives as
the same pj.CompileError (with the source) as an in-process compile. If a worker cannot start
or dies, its job and every later one compile in this process instead (logged once).

`CompileAside` is one compile in a worker of its own, read by the thread that asks for it (the cpu device's replay
module, compiled while a first call traces).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from queue import SimpleQueue

from ..errors import CompileError
from . import llvm_compile

log = logging.getLogger("prepjit")
MIN_KERNELS = 3   # smaller batches compile in this process (a worker costs ~50 ms of CPU to start)
MAX_WORKERS = 16  # each holds an LLVM (~50 MB); more rarely pays on a plan's few hundred kernels
_pools: dict[str, "CompilePool"] = {}
_threads: dict[int, ThreadPoolExecutor] = {}   # this process's compile threads (by pid: a forked child starts its own)
_pools_lock = threading.Lock()


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def compile_error(name: str, source: str, message: str) -> CompileError:
    return CompileError(f"LLVM failed to compile kernel {name}: {message}\n--- source ---\n{source}")


class Compile(Future):
    """A compile job's object code (or error); `seconds` is how long the compile itself took."""
    seconds = 0.0

    def run(self, compile_fn, *args):
        start = time.perf_counter()
        try:
            result = compile_fn(*args)
        except BaseException as e:
            self.seconds = time.perf_counter() - start
            self.set_exception(e)
        else:
            self.seconds = time.perf_counter() - start
            self.set_result(result)


def run_now(compile_fn, name: str, source: str) -> Compile:
    """compile_fn(name, source) in this thread, as a finished Compile."""
    job = Compile()
    job.run(compile_fn, name, source)
    return job


class CompilePool:
    """Up to `workers` (at most MAX_WORKERS) compile processes for one target (llvm_compile.py options), one
    started per submitted job until there are that many; `fallback(name, source)` compiles in this process
    once a worker has failed. The first worker starts at once (OSError if it cannot)."""

    def __init__(self, options: dict, workers: int, fallback):
        self.fallback, self.broken, self.pid = fallback, False, os.getpid()
        self.max_workers = min(workers, MAX_WORKERS)
        self.jobs: SimpleQueue = SimpleQueue()
        self.lock = threading.Lock()
        self.command = _worker_command(options)
        self.processes: list[subprocess.Popen] = []
        self.submitted = 0
        self._start_worker()

    def _start_worker(self):
        process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.processes.append(process)
        threading.Thread(target=self._serve, args=(process,), daemon=True, name="prepjit-compile").start()

    def start_all(self):
        """Start every worker now (planning a large plan: their start, ~65 ms of CPU each, then overlaps the
        planning, which leaves the other cores idle, not the compiles)."""
        with self.lock:
            while len(self.processes) < self.max_workers and not self.broken:
                try:
                    self._start_worker()
                except OSError:
                    self.max_workers = len(self.processes)

    def submit(self, name: str, source: str) -> Compile:
        job = Compile()
        self.jobs.put((job, name, source))
        with self.lock:
            self.submitted += 1
            if len(self.processes) < min(self.max_workers, self.submitted) and not self.broken:
                try:
                    self._start_worker()
                except OSError:  # the workers already running take the job
                    self.max_workers = len(self.processes)
        return job

    def _serve(self, process: subprocess.Popen):
        while True:
            job, name, source = self.jobs.get()
            job.run(self._compile, process, name, source)

    def _compile(self, process: subprocess.Popen, name: str, source: str) -> bytes:
        if not self.broken:
            reply = self._ask(process, source.encode())
            if reply is not None:
                data = _object_code(reply, name, source)
                if data is None:
                    raise RuntimeError(reply[1].decode(errors="replace"))
                return data
            if not self.broken:
                self.broken = True
                log.info("a compile worker failed (exit code %s); compiling in this process", process.poll())
            process.kill()
        return self.fallback(name, source)

    @staticmethod
    def _ask(process: subprocess.Popen, source: bytes) -> tuple[int, bytes] | None:
        """(status, data) of the worker's reply, or None when it is gone."""
        try:
            process.stdin.write(llvm_compile.REQUEST.pack(len(source)) + source)
            process.stdin.flush()
        except (OSError, ValueError):
            return None
        return _reply(process)


class CompileAside:
    """One compile (`name`, `source`) in a worker process of its own, started now; `result()` reads its object code in
    the thread that asks (the cpu device's replay module compiles while a first call traces, on a core that leaves
    idle, and is read at its first use). No thread of this process waits for it: a thread's malloc arena, freed,
    leaves a gap where later JIT sections land (test_jit_address_space). `fallback(name, source)` compiles in this
    process where no worker can start (one core: `workers` < 2, no Python to start), the worker fails, or the caller
    is a forked child (the worker's pipes are its parent's)."""

    def __init__(self, options: dict, workers: int, name: str, source: str, fallback):
        self.name, self.source, self.fallback, self.pid, self.process = name, source, fallback, os.getpid(), None
        if _workers_can_start(workers):
            try:
                self.process = subprocess.Popen(_worker_command(options), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                data = source.encode()
                self.process.stdin.write(llvm_compile.REQUEST.pack(len(data)) + data)
                self.process.stdin.close()  # (the worker exits once it has replied)
            except (OSError, ValueError, ImportError):
                if self.process is not None:
                    self.process.kill()
                self.process = None

    def result(self) -> bytes:
        """The object code (once: the worker's reply is read here), or the compile's pj.CompileError."""
        process, self.process = self.process, None
        if process is None or self.pid != os.getpid():
            return self.fallback(self.name, self.source)
        reply = _reply(process)
        process.stdout.close()
        process.wait()
        data = None if reply is None else _object_code(reply, self.name, self.source)
        return self.fallback(self.name, self.source) if data is None else data


def _object_code(reply: tuple[int, bytes], name: str, source: str) -> bytes | None:
    """The object code of a worker's (status, data) reply to compiling `source`; LLVM's error raised as its
    pj.CompileError; None for any other failure (the caller decides)."""
    status, data = reply
    if status == llvm_compile.OK:
        return data
    if status == llvm_compile.LLVM_ERROR:
        raise compile_error(name, source, data.decode(errors="replace"))
    return None


def _worker_command(options: dict) -> list[str]:
    """The command line of a compile worker for target `options` (llvm_compile.py's)."""
    import llvmlite
    return [sys.executable, "-I", str(Path(llvm_compile.__file__)), json.dumps(options),
            str(Path(llvmlite.__file__).resolve().parents[1])]


def _workers_can_start(workers: int) -> bool:
    """Whether compile workers may run: several cores, and a Python interpreter to start (not a frozen app, nor one
    that embeds Python, whose sys.executable is the app itself)."""
    return workers >= 2 and not getattr(sys, "frozen", False) and Path(sys.executable or "-").name.startswith("python")


def _reply(process: subprocess.Popen) -> tuple[int, bytes] | None:
    """(status, data) of a worker's next reply, or None when it is gone."""
    try:
        header = llvm_compile.read_exact(process.stdout, llvm_compile.REPLY.size)
        if header is None:
            return None
        status, size = llvm_compile.REPLY.unpack(header)
        data = llvm_compile.read_exact(process.stdout, size)
    except (OSError, ValueError):
        return None
    return None if data is None else (status, data)


def in_threads(compile_fn, count: int):
    """submit(name, source) -> Compile of `compile_fn(name, source)` in one of this process's compile threads, for
    a compiler that releases the GIL and may be called from several threads at once (NVRTC through ctypes), for a
    batch of at least MIN_KERNELS kernels on several cores; else in this thread."""
    workers = min(cores(), MAX_WORKERS)
    if count < MIN_KERNELS or workers < 2:
        return lambda name, source: run_now(compile_fn, name, source)
    with _pools_lock:
        threads = _threads.get(os.getpid())
        if threads is None:
            threads = _threads[os.getpid()] = ThreadPoolExecutor(workers, thread_name_prefix="prepjit-compile")

    def submit(name: str, source: str) -> Compile:
        job = Compile()
        threads.submit(job.run, compile_fn, name, source)
        return job
    return submit


def shared_pool(options: dict, workers: int, fallback) -> CompilePool | None:
    """This process's pool for target `options` (started now if there is none), or None when it cannot run
    (one core, a pool that broke, a failed start, or no Python interpreter to start: a frozen app, or one
    that embeds Python, whose sys.executable is the app itself)."""
    if not _workers_can_start(workers):
        return None
    key = json.dumps(options, sort_keys=True)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None or pool.pid != os.getpid():
            try:
                pool = _pools[key] = CompilePool(options, workers, fallback)
            except (OSError, ImportError) as e:
                log.info("compile workers did not start (%s); compiling in this process", e)
                return None
    return None if pool.broken else pool


@atexit.register
def _stop_workers():
    """Close this process's workers' input (they exit at its end) and reap them."""
    for pool in _pools.values():
        if pool.pid == os.getpid():
            for process in pool.processes:
                try:
                    process.stdin.close()
                    process.wait(timeout=1)
                except (OSError, ValueError, subprocess.TimeoutExpired):
                    process.kill()
