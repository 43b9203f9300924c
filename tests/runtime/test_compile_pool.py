"""Compile workers: a plan's kernels compile in worker processes for the parent's exact target machine;
LLVM errors arrive as the same pj.CompileError; a dead worker falls back to compiling in-process; small
plans never start workers. NVRTC compiles in threads of this process, several at once."""
import json
import subprocess
import sys
import threading

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.runtime import compile_pool
from prepjit.runtime.devices import get_device

IR = """
define void @add_one(ptr %b) {
  %v = load float, ptr %b
  %w = fadd float %v, 1.0
  store float %w, ptr %b
  ret void
}
"""


def test_workers_build_the_parents_target_machine(monkeypatch):
    monkeypatch.setenv("PREPJIT_THREADS", "2")
    cpu = get_device("cpu")
    submit = cpu.compile_parallel(compile_pool.MIN_KERNELS)
    assert isinstance(submit.__self__, compile_pool.CompilePool)  # workers, not this process
    jobs = [submit("add_one", IR) for _ in range(4)]
    assert {job.result(timeout=60) for job in jobs} == {cpu.compile("add_one", IR)}  # identical object code
    assert cpu.compile_parallel(compile_pool.MIN_KERNELS).__self__ is submit.__self__  # started once, reused
    assert len(submit.__self__.processes) == 2  # one worker per job, up to the cores


def test_workers_start_with_the_jobs():
    cpu = get_device("cpu")
    pool = compile_pool.CompilePool(cpu.target_options, 8, cpu.compile)
    assert len(pool.processes) == 1
    jobs = [pool.submit("add_one", IR) for _ in range(3)]
    assert len({job.result(timeout=60) for job in jobs}) == 1 and len(pool.processes) == 3


def test_llvm_errors_arrive_as_the_same_compile_error(monkeypatch):
    monkeypatch.setenv("PREPJIT_THREADS", "2")
    cpu = get_device("cpu")
    job = cpu.compile_parallel(compile_pool.MIN_KERNELS)("broken", "define void @broken( {")
    with pytest.raises(pj.CompileError) as from_worker:
        job.result(timeout=60)
    with pytest.raises(pj.CompileError) as in_process:
        cpu.compile("broken", "define void @broken( {")
    assert str(from_worker.value) == str(in_process.value)
    assert "LLVM failed to compile kernel broken" in str(in_process.value)
    assert str(in_process.value).endswith("--- source ---\ndefine void @broken( {")


def test_a_dead_worker_falls_back_to_compiling_in_process():
    cpu = get_device("cpu")
    calls = []
    pool = compile_pool.CompilePool(cpu.target_options, 1, lambda *job: calls.append(job) or cpu.compile(*job))
    first = pool.submit("add_one", IR).result(timeout=60)
    assert not pool.broken and calls == [] and len(pool.processes) == 1
    pool.processes[0].kill()
    pool.processes[0].wait()
    assert pool.submit("add_one", IR).result(timeout=60) == first
    assert pool.broken and calls == [("add_one", IR)]


def mlp(x, w1, w2, w3):
    return pnp.tanh(pnp.tanh(x @ w1) @ w2) @ w3 + 0.625


def test_a_plan_of_several_kernels_compiles_in_the_workers(monkeypatch):
    monkeypatch.setenv("PREPJIT_THREADS", "2")
    cpu = get_device("cpu")
    in_process = []
    compile_in_process = cpu.compile
    monkeypatch.setattr(cpu, "compile", lambda name, src: in_process.append(name) or compile_in_process(name, src))
    rng = np.random.default_rng(0)
    x, w1, w2, w3 = (rng.standard_normal(s).astype(np.float32) / 4 for s in [(5, 12), (12, 24), (24, 20), (20, 7)])
    f = pj.prepare(mlp)
    want = np.tanh(np.tanh(x @ w1) @ w2) @ w3 + np.float32(0.625)
    np.testing.assert_allclose(np.asarray(f(x, w1, w2, w3)), want, rtol=1e-5, atol=1e-5)
    assert f.stats["compiles"] >= compile_pool.MIN_KERNELS and in_process == []


SMALL_PLAN = """
import json, numpy as np, prepjit as pj
from prepjit.runtime import compile_pool
f = pj.prepare(lambda x: (x * 2.5).sum())
f(np.ones(8, np.float32))
print(json.dumps({"compiles": f.stats["compiles"], "pools": len(compile_pool._pools)}))
"""


def test_small_plans_start_no_workers(tmp_path):
    out = subprocess.run([sys.executable, "-c", SMALL_PLAN], capture_output=True, text=True, timeout=120, check=True,
                         env={"PREPJIT_CACHE": "0", "PREPJIT_THREADS": "2"}).stdout
    result = json.loads(out)
    assert 1 <= result["compiles"] < compile_pool.MIN_KERNELS and result["pools"] == 0


def test_a_batch_compiles_in_threads_several_at_once(monkeypatch):
    """in_threads (NVRTC's way): a batch of MIN_KERNELS or more compiles in this process's compile threads, two at
    once (each job waits at a barrier for the other: compiled one after another, the barrier breaks), each result or
    error in its job's own Future; a smaller batch compiles in the calling thread."""
    monkeypatch.setattr(compile_pool, "cores", lambda: 2)
    barrier, threads = threading.Barrier(2, timeout=10), []

    def compile_fn(name, source):
        threads.append(threading.get_ident())
        barrier.wait()
        if name == "bad":
            raise pj.CompileError("bad kernel")
        return source.encode()
    submit = compile_pool.in_threads(compile_fn, compile_pool.MIN_KERNELS)
    good, bad = submit("good", "x"), submit("bad", "y")
    assert good.result(timeout=30) == b"x"
    with pytest.raises(pj.CompileError, match="bad kernel"):
        bad.result(timeout=30)
    assert threading.get_ident() not in threads and good.seconds > 0
    here = compile_pool.in_threads(lambda name, source: threading.get_ident(), compile_pool.MIN_KERNELS - 1)
    assert here("small", "").result() == threading.get_ident()


def test_the_cuda_device_compiles_a_plans_kernels_in_threads(monkeypatch):
    from .cuda_stub import stub_device
    device = stub_device()
    monkeypatch.setattr(compile_pool, "cores", lambda: 2)
    monkeypatch.setattr(device, "compile", lambda name, source: threading.get_ident(), raising=False)
    assert device.compile_parallel(compile_pool.MIN_KERNELS)("k", "").result(timeout=30) != threading.get_ident()


LARGE_PLAN = """
import json, numpy as np, prepjit as pj, prepjit.numpy as pnp
from prepjit.jit import planner
from prepjit.runtime import compile_pool
running, schedule = [], planner.schedule
def spy(*args, **kwargs):  # the workers running when a plan's scheduling begins
    running.append(sum(len(pool.processes) for pool in compile_pool._pools.values()))
    return schedule(*args, **kwargs)
planner.schedule = spy
x = np.ones((4, 8), np.float32)
for f in (lambda x: (x * 2.5).sum(axis=1) + x.max(), lambda x: pnp.tanh(x @ x.T) @ x + x.sum()):  # 2, then 3 sums
    pj.prepare(f)(x)
print(json.dumps(running))
"""


def test_a_plan_of_several_reductions_starts_the_workers_before_its_scheduling():
    """A trace of MIN_KERNELS reductions or more (as many kernels, about) starts every compile worker before its
    plan is scheduled, which runs on one core: the workers' start, ~65 ms of CPU each, overlaps it instead of the
    first compiles. A trace of fewer starts none."""
    out = subprocess.run([sys.executable, "-c", LARGE_PLAN], capture_output=True, text=True, timeout=300, check=True,
                         env={"PREPJIT_CACHE": "0", "PREPJIT_THREADS": "2"}).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [0, 2]
