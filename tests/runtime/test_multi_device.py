"""Several devices (prepjit/distributed/multi_device.py): replicas on the host's cpu (and on CUDA GPUs where there are
some), split and replicated arguments, collectives, outputs that vary or are replicated, data-parallel
gradients, the errors, and a job of several processes meeting through a torchrun-style environment."""
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.runtime import nccl
from prepjit.runtime.devices import available_devices

CPU3 = ["cpu", "cpu", "cpu"]


def _mlp(x, w1, w2):
    return pnp.tanh(x @ w1) @ w2


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((10, 8)).astype(np.float32), rng.standard_normal((8, 16)).astype(np.float32),
            rng.standard_normal((16, 4)).astype(np.float32))


def test_forward_uneven_split_equals_one_device_and_numpy(data):
    x, w1, w2 = data
    spec = dict(vars={"n": (1, 64)}, shapes={"x": ("n", 8)})
    multi = pj.prepare(_mlp, devices=CPU3, split={"x": 0}, **spec)
    single = pj.prepare(_mlp, **spec)
    expected = np.tanh(x @ w1) @ w2
    for rows in (10, 7, 3):  # 4,3,3 / 3,2,2 / 1,1,1 rows per replica: one trace
        out = multi(x[:rows], w1, w2)
        assert isinstance(out, pj.Array) and out.shape == (rows, 4)
        np.testing.assert_allclose(np.asarray(out), np.asarray(single(x[:rows], w1, w2)), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(out), expected[:rows], rtol=1e-5, atol=1e-5)
    assert multi.stats["traces"] == 1 and multi.stats["replays"] == 3
    plans = multi.plans(x, w1, w2)
    assert len(plans) == 1 and len(plans[0]) == 3  # one stage (no collective), a plan per replica
    assert len({id(p) for p in plans[0]}) == 3
    assert {k.kernel.program is not None for p in plans[0] for k in p.kernels} == {True}
    # the same compiled kernels on every replica of one device (the kernel cache dedupes)
    assert [k.kernel for k in plans[0][0].kernels] == [k.kernel for k in plans[0][1].kernels]


def test_collectives_vs_numpy(data):
    x, w1, _ = data

    @pj.prepare(devices=CPU3, split={"x": 0}, vars={"n": (1, 64)}, shapes={"x": ("n", 8)})
    def f(x, w):
        h = pnp.tanh(x @ w)
        local = h.sum(0)
        return (h / pj.psum(local), pj.pmean(local), pj.all_gather(local), pj.all_gather(local, axis=1),
                pj.all_gather(local[None], tiled=True), pj.device_index() + 0 * local[:1].astype(pnp.int32))

    h = np.tanh(x @ w1)
    parts = [p.sum(0) for p in np.array_split(h, 3)]
    scaled, mean, stacked, stacked1, tiled, index = (np.asarray(o) for o in f(x, w1))
    np.testing.assert_allclose(scaled, h / h.sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean, h.sum(0) / 3, rtol=1e-5, atol=1e-6)  # the mean of the replicas' sums
    np.testing.assert_allclose(stacked, np.stack(parts), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stacked1, np.stack(parts, axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tiled, np.stack(parts), rtol=1e-5, atol=1e-6)
    assert index.tolist() == [0, 1, 2]  # varying, 1 row each: concatenated
    plans = f.plans(x, w1)
    assert len(plans) == 2 and all(len(p) == 3 for p in plans)  # a stage before the collectives and one after


def test_replicated_and_varying_outputs_split_axis_1():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.standard_normal((3, 3)).astype(np.float32)

    @pj.prepare(devices=["cpu", "cpu"], split={"x": 1}, vars={"m": (1, 32)}, shapes={"x": (3, "m")})
    def f(x, w):
        return w @ x, w * 2, pj.psum(x.sum(1))  # varies (along axis 1), replicated, replicated
    y, w2, total = f(x, w)
    np.testing.assert_allclose(np.asarray(y), w @ x, rtol=1e-5, atol=1e-5)
    assert w2.shape == (3, 3) and total.shape == (3,)
    np.testing.assert_allclose(np.asarray(w2), w * 2)
    np.testing.assert_allclose(np.asarray(total), x.sum(1), rtol=1e-5, atol=1e-5)


def test_one_replica_is_the_identity_axis():
    @pj.prepare(devices=["cpu"], split={"x": 0})
    def f(x):
        return pj.psum(x), pj.pmean(x), pj.all_gather(x), pj.device_index()[None]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s, m, g, i = (np.asarray(o) for o in f(x))
    np.testing.assert_array_equal(s, x)
    np.testing.assert_array_equal(m, x)
    np.testing.assert_array_equal(g, x[None])
    assert i.tolist() == [0]


def _loss(w, x, y):
    return pnp.mean((x @ w - y) ** 2)


def test_data_parallel_gradients_equal_the_full_batch():
    """Each replica's gradient of its rows, weighted by its row count and pmean-ed: the full batch's gradient
    (uneven split); with an even split the plain pmean of the gradients is the same."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((11, 5)).astype(np.float32)
    y = rng.standard_normal((11, 2)).astype(np.float32)
    w = rng.standard_normal((5, 2)).astype(np.float32)

    @pj.prepare(devices=CPU3, split={"x": 0, "y": 0}, vars={"n": (1, 32)}, shapes={"x": ("n", 5), "y": ("n", 2)})
    def step(w, x, y):
        value, grad = pj.value_and_grad(_loss)(w, x, y)
        rows = x.shape[0] * pnp.ones((), pnp.float32)
        weight = rows / pj.psum(rows)
        return pj.psum(value * weight), pj.psum(grad * weight), pj.pmean(grad)

    value, grad, plain = step(w, x, y)
    one = pj.prepare(pj.value_and_grad(_loss), vars={"n": (1, 32)}, shapes={"x": ("n", 5), "y": ("n", 2)})
    v1, g1 = one(w, x, y)
    ref = 2 * x.T @ (x @ w - y) / y.size
    np.testing.assert_allclose(np.asarray(grad), ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(g1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(np.asarray(value)), float(np.asarray(v1)), rtol=1e-5)
    value, grad, plain = step(w, x[:9], y[:9])  # 3 rows each: the plain pmean is the full-batch gradient too
    ref = 2 * x[:9].T @ (x[:9] @ w - y[:9]) / y[:9].size
    np.testing.assert_allclose(np.asarray(plain), ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), ref, rtol=1e-4, atol=1e-5)
    assert step.stats["traces"] == 1


def test_training_example_data_parallel():
    from examples import train_mlp
    config = dict(sizes=(16, 32, 4), n_train=201, n_test=50, batch=64, epochs=1, seed=1, spread=1.0)  # last batch 5 + 4
    one = train_mlp.train(**config, progress=False, log=False)
    two = train_mlp.train(**config, devices=["cpu", "cpu"], progress=False, log=False)
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-4)
    for p, q in zip(two["params"], one["params"]):
        for k in p:
            np.testing.assert_allclose(p[k], q[k], rtol=1e-4, atol=1e-5)
    assert two["stats"]["traces"] == 1


def test_errors_and_recovery():
    x = np.ones((5, 4), np.float32)

    @pj.prepare(devices=["cpu", "cpu"], split={"x": 0}, vars={"n": (1, 64)}, shapes={"x": ("n", 4)})
    def f(x):
        return pj.psum(x)  # the split rows: needs an even split
    with pytest.raises(pj.SignatureError, match="same shape on every replica"):
        f(x)
    np.testing.assert_array_equal(np.asarray(f(x[:4])), np.full((2, 4), 2, np.float32))  # still works

    @pj.prepare(devices=["cpu", "cpu"], split={"x": 0})
    def static(x):
        return x * 2
    with pytest.raises(pj.SignatureError, match="divide evenly"):
        static(x)
    assert static(x[:4]).shape == (4, 4)
    with pytest.raises(pj.SignatureError, match="dims"):
        pj.prepare(lambda x: x, devices=["cpu"], split={"x": 2})(x)

    with pytest.raises(pj.DeviceError, match="once per replica"):
        pj.prepare(lambda x: x, devices=["cpu:1"])
    with pytest.raises(pj.DeviceError, match="unknown device"):
        pj.prepare(lambda x: x, devices=["tpu:0"])
    with pytest.raises(ValueError, match="not a parameter"):
        pj.prepare(lambda x: x, devices=["cpu"], split={"y": 0})
    with pytest.raises(ValueError, match="devices= replaces device="):
        pj.prepare(lambda x: x, device="cpu", devices=["cpu"])

    with pytest.raises(pj.TraceError, match="outside one"):
        pj.prepare(lambda x: pj.psum(x))(x)
    with pytest.raises(pj.TraceError, match="outside one"):
        pj.device_index()
    with pytest.raises(pj.TraceError, match="differentiates"):
        pj.prepare(lambda x: pj.grad(lambda v: pj.psum(v).sum())(x), devices=["cpu", "cpu"], split={"x": 0})(x[:4])
    with pytest.raises(pj.TraceError, match="loop"):
        pj.prepare(lambda x: pj.fori_loop(0, 3, lambda i, c: pj.psum(c), x), devices=["cpu"])(x)
    with pytest.raises(pj.TraceError, match="vmap"):
        pj.prepare(lambda x: pj.vmap(lambda v: pj.psum(v))(x), devices=["cpu"])(x)
    with pytest.raises(pj.TraceError, match="lacks"):
        pj.prepare(lambda x: x.sum(), devices=["cpu", "cpu"], split={"x": 0})(x[:4])
    with pytest.raises(pj.TraceError, match="bool"):
        pj.prepare(lambda x: pj.psum(x > 0), devices=["cpu"])(x)


def test_nccl_missing_says_what_to_install(monkeypatch):
    monkeypatch.setattr(nccl, "_candidates", lambda: ["/nonexistent/libnccl.so.2"])
    with pytest.raises(pj.DeviceError, match=r"pip install 'prepjit\[nccl\]'"):
        nccl.load_library()


def test_init_distributed_needs_the_environment(monkeypatch):
    from prepjit.runtime.collectives_job import Job
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(pj.DeviceError, match="MASTER_ADDR"):
        Job.from_env()
    with pytest.raises(pj.DeviceError, match="outside a job"):
        Job(2, 2, "127.0.0.1", 1)


WORKER = textwrap.dedent("""
    import sys, numpy as np, prepjit as pj, prepjit.numpy as pnp
    job = pj.init_distributed()
    devices = sys.argv[1].split(",")
    @pj.prepare(devices=devices, split={"x": 0}, vars={"n": (1, 64)}, shapes={"x": ("n", 4)})
    def f(x, w):
        h = x @ w
        return h, pj.psum(h.sum(0)), pj.all_gather(h.sum(0)), pj.device_index()[None] + 0 * x[:1, 0].astype(pnp.int32)
    rng = np.random.default_rng(job.rank)
    x = rng.standard_normal((4 + job.rank, 4)).astype(np.float32)   # each process its own rows
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    for _ in range(2):
        out = f(x, w)
    np.save(sys.argv[2], np.concatenate([np.asarray(o).ravel().astype(np.float64) for o in out]))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_job(tmp_path, devices: list, timeout: float = 240, ok: bool = True):
    """Run WORKER in one process per entry of `devices` (that rank's devices, comma-separated)."""
    world = len(devices)
    env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "NCCL_NVLS_ENABLE": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, devices[r], str(tmp_path / f"out{r}.npy")],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(world)]
    try:
        logs = [p.communicate(timeout=timeout)[0].decode() for p in procs]
    finally:
        for p in procs:
            p.kill()
    if not ok:
        return [p.returncode for p in procs], logs
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return [np.load(tmp_path / f"out{r}.npy") for r in range(world)]


def _expected_job(world: int, local: int):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    xs = [np.random.default_rng(r).standard_normal((4 + r, 4)).astype(np.float32) for r in range(world)]
    parts = [p for x in xs for p in np.array_split(x @ w, local)]
    total, stacked = sum(p.sum(0) for p in parts), np.stack([p.sum(0) for p in parts])
    return [np.concatenate([(x @ w).ravel(), total, stacked.ravel(), np.arange(r * local, (r + 1) * local)])
            for r, x in enumerate(xs)]


def test_job_of_processes_on_cpu_replicas(tmp_path):
    """Two processes (torchrun-style environment), two cpu replicas each: collectives over the job's sockets."""
    got = _run_job(tmp_path, ["cpu,cpu", "cpu,cpu"])
    for g, e in zip(got, _expected_job(2, 2)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-4)


def test_job_whose_processes_disagree_on_devices(tmp_path):
    codes, logs = _run_job(tmp_path, ["cpu,cpu", "cpu"], ok=False)
    assert all(c != 0 for c in codes)
    assert all("different numbers of devices" in log for log in logs), "\n".join(logs)


# ---- CUDA: NCCL (a world of one on the one-GPU machines; two GPUs where there are) ----

def _gpus() -> int:
    if "cuda" not in available_devices():
        return 0
    import pycuda.driver as drv
    return drv.Device.count()


def _nccl() -> bool:
    try:
        nccl.load_library()
        return True
    except pj.DeviceError:
        return False


needs_cuda = pytest.mark.skipif(_gpus() == 0 or not _nccl(), reason="needs a CUDA GPU, pycuda and NCCL")
needs_two = pytest.mark.skipif(_gpus() < 2 or not _nccl(), reason="needs two CUDA GPUs and NCCL "
                                                                   "(the lent machines here have one)")


@needs_cuda
def test_cuda_one_replica_nccl_world_of_one(data):
    x, w1, w2 = data

    @pj.prepare(devices=["cuda:0"], split={"x": 0}, vars={"n": (1, 64)}, shapes={"x": ("n", 8)})
    def f(x, w1, w2):
        y = _mlp(x, w1, w2)
        return y, pj.psum(y.sum(0)), pj.all_gather(y.sum(0)), pj.pmean(y)
    y, s, g, m = f(x, w1, w2)
    expected = np.tanh(x @ w1) @ w2
    assert y.device == "cuda"
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(s), expected.sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(g), expected.sum(0)[None], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(m), expected, rtol=1e-4, atol=1e-4)
    y, s, g, m = f(x[:5], w1, w2)  # replays
    np.testing.assert_allclose(np.asarray(s), expected[:5].sum(0), rtol=1e-4, atol=1e-4)


@needs_two
def test_cuda_two_replicas(data):
    x, w1, w2 = data
    multi = pj.prepare(lambda x, w1, w2: (_mlp(x, w1, w2), pj.psum(_mlp(x, w1, w2).sum(0))),
                       devices=["cuda:0", "cuda:1"], split={"x": 0}, vars={"n": (1, 64)}, shapes={"x": ("n", 8)})
    y, s = multi(x, w1, w2)
    expected = np.tanh(x @ w1) @ w2
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(s), expected.sum(0), rtol=1e-4, atol=1e-4)


@needs_two
def test_cuda_job_of_two_processes(tmp_path):
    """One process per GPU (cuda:0 and cuda:1 of one host), NCCL's unique id sent over the job's socket."""
    for g, e in zip(_run_job(tmp_path, ["cuda:0", "cuda:1"]), _expected_job(2, 1)):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-3)


def test_an_output_sized_by_the_split_var_varies():
    """x.shape[0] is each replica's own row count: a value computed from it varies even without reading x."""
    @pj.prepare(devices=CPU3, split={"x": 0}, vars={"n": (1, 64)}, shapes={"x": ("n", 2)})
    def f(x, w):
        return (x.shape[0] * w)[None], pnp.zeros((x.shape[0],), pnp.float32) + w.sum(), w + 1
    w = np.ones((), np.float32)
    rows, zeros, same = f(np.ones((7, 2), np.float32), w)
    assert np.asarray(rows).tolist() == [3, 2, 2]
    assert zeros.shape == (7,) and same.shape == ()


def test_nccl_unique_id_bytes_round_trip():
    uid = nccl.id_from_bytes(bytes(range(128)))  # zero bytes first: a plain field read would stop there
    assert nccl.id_bytes(uid) == bytes(range(128))
    with pytest.raises(pj.DeviceError, match="128"):
        nccl.id_from_bytes(b"short")


def test_replicated_outputs_and_arguments_keep_a_copy_per_replica():
    @pj.prepare(devices=["cpu", "cpu"], split={"x": 0}, vars={"n": (1, 64)}, shapes={"x": ("n", 3)})
    def step(w, x):
        return w - 0.5 * pj.pmean(x.T @ x), x @ w
    rng = np.random.default_rng(3)
    w, x = rng.standard_normal((3, 3)).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)
    w1, _ = step(w, x)
    assert isinstance(w1, pj.Array) and len(w1.copies) == 2 and w1.copies[0] is not w1.copies[1]
    parts = np.array_split(x, 2)
    expected = w - 0.5 * sum(p.T @ p for p in parts) / 2
    np.testing.assert_allclose(np.asarray(w1), expected, rtol=1e-5, atol=1e-6)
    w2, y = step(w1, x)  # fed back: each replica reads its own copy
    np.testing.assert_allclose(np.asarray(w2), expected - 0.5 * sum(p.T @ p for p in parts) / 2, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(y), x @ expected, rtol=1e-5, atol=1e-5)
    held = step.replicate({"w": w})["w"]
    assert len(held.copies) == 2 and np.array_equal(np.asarray(held), w)
    np.testing.assert_allclose(np.asarray(step(held, x)[0]), expected, rtol=1e-5, atol=1e-6)


def test_throughput_benchmark_runs(tmp_path):
    """benchmarks/multi_device.py at tiny size on cpu replicas (the training step: MiniLM's compile is slow here):
    replicated and one-device results agree."""
    import json
    from benchmarks import multi_device
    out = tmp_path / "md.json"
    args = ["--devices", "cpu,cpu", "--small", "--reps", "1", "--only", "train", "--out", str(out)]
    assert multi_device.main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == ["mlp_train_step_b64"]
    assert all(r["max_abs_diff"] < 1e-4 and r["speedup"] > 0 for r in rows)


def test_gathers_scalar_vars_and_index_errors_across_stages():
    """A scalar var, an index constraint every stage's bounds proof relies on, and gather flags in the stages
    before and after a collective: IndexBoundError, and the function keeps working."""
    @pj.prepare(devices=["cpu", "cpu"], split={"ids": 0}, vars={"n": (1, 64), "pos": (0, 15)}, shapes={"ids": ("n",)})
    def f(table, ids, pos):
        rows = table[ids]
        return rows * pj.psum(rows.sum(0)) + table[pos], pj.psum(table[ids].sum())
    table = np.arange(32, dtype=np.float32).reshape(8, 4)
    ids = np.array([1, 2, 3, 4, 5])
    rows = table[ids]
    a, b = f(table, ids, 3)
    np.testing.assert_allclose(np.asarray(a), rows * rows.sum(0) + table[3])
    np.testing.assert_allclose(np.asarray(b), rows.sum())
    with pytest.raises(pj.IndexBoundError, match="pos < 8"):
        f(table, ids, 9)
    with pytest.raises(pj.IndexBoundError, match="out of range"):
        f(table, np.array([1, 2, 30, 4]), 3)
    np.testing.assert_allclose(np.asarray(f(table, ids, 2)[0]), rows * rows.sum(0) + table[2])


class _FakeNCCL:
    """libnccl's calls as NCCLCollectives makes them, on fake GPU memory (ints naming NumPy arrays): grouped
    calls are collected and run at ncclGroupEnd, as NCCL does."""

    def __init__(self, memory):
        self.memory, self.group, self.calls = memory, None, []

    def ncclGetVersion(self, ref):
        ref._obj.value = 22300
        return 0

    def ncclGetUniqueId(self, ref):
        return 0

    def ncclCommInitRank(self, ref, nranks, uid, rank):
        ref._obj.value = 1000 + rank
        self.calls.append(("init", nranks, rank))
        return 0

    def ncclGroupStart(self):
        self.group = []
        return 0

    def ncclAllReduce(self, send, recv, count, dtype, op, comm, stream):
        self.group.append(("reduce", send, recv, count, dtype, comm))
        return 0

    def ncclAllGather(self, send, recv, count, dtype, comm, stream):
        self.group.append(("gather", send, recv, count, dtype, comm))
        return 0

    def ncclGroupEnd(self):
        calls, self.group = self.group, None
        self.calls += [c[0] for c in calls]
        if calls and calls[0][0] in ("reduce", "gather"):
            calls.sort(key=lambda c: c[5].value)  # rank order
            sends = [self.memory[c[1]].view(np.uint8)[:c[3] * (1 if c[0] == "gather" else 4)] for c in calls]
            if calls[0][0] == "reduce":
                total = sum(s.view(np.float32) for s in sends)
                for c in calls:
                    self.memory[c[2]].view(np.float32)[:] = total
            else:
                for c in calls:
                    self.memory[c[2]].view(np.uint8)[:] = np.concatenate(sends)
        return 0


class _FakeGPU:
    def __init__(self, name, memory):
        self.name, self.memory, self._stream = name, memory, None

    def current(self):
        pass

    def flush(self):
        pass

    def empty(self, shape, dtype):
        handle = len(self.memory) + 1
        self.memory[handle] = np.zeros(int(np.prod(shape)), dtype)
        return handle


def test_nccl_collectives_group_calls_per_gpu(monkeypatch):
    """NCCLCollectives on two fake GPUs: one communicator per GPU (ranks 0, 1 of 2) made in one group, and
    each collective one grouped call per GPU with the counts, the dtype and the rank order NCCL needs."""
    memory = {}
    fake = _FakeNCCL(memory)
    monkeypatch.setattr(nccl, "load_library", lambda: fake)
    gpus = [_FakeGPU("cuda", memory), _FakeGPU("cuda:1", memory)]
    comm = nccl.NCCLCollectives(gpus)
    assert fake.calls == [("init", 2, 0), ("init", 2, 1)] and comm.size == 2
    values = [np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 10, np.float32)]
    arrays = []
    for g, v in zip(gpus, values):
        h = g.empty(v.shape, v.dtype)
        memory[h][:] = v.ravel()
        arrays.append(pj.Array(h, v.shape, v.dtype, g))
    sums = comm.run("psum", arrays)
    for s in sums:
        assert s.shape == (2, 3)
        np.testing.assert_array_equal(memory[s.buffer].reshape(2, 3), values[0] + values[1])
    gathered = comm.run("all_gather", arrays)
    for g in gathered:
        assert g.shape == (2, 2, 3)
        np.testing.assert_array_equal(memory[g.buffer].reshape(2, 2, 3), np.stack(values))
    with pytest.raises(pj.DeviceError, match="one replica per GPU"):
        nccl.NCCLCollectives([gpus[0], gpus[0]])


def test_gathered_values_sized_by_the_split_var_are_replicated():
    """all_gather's result has the local size n in its shape, and n is checked equal on every replica: the result
    (tiled, or stacked on the last axis) is replicated, returned once."""
    @pj.prepare(devices=["cpu", "cpu"], split={"x": 0}, vars={"n": (1, 64)}, shapes={"x": ("n", 3)})
    def f(x):
        return pj.all_gather(x, tiled=True), pj.all_gather(x.T, axis=1, tiled=True), pj.all_gather(x, axis=-1)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    tiled, tiled1, last = (np.asarray(o) for o in f(x))
    np.testing.assert_array_equal(tiled, x)
    np.testing.assert_array_equal(tiled1, x.T)
    np.testing.assert_array_equal(last, np.stack(np.array_split(x, 2), -1))


def test_a_pytree_argument_is_split_leaf_by_leaf():
    @pj.prepare(devices=["cpu", "cpu"], split={"batch": 0}, vars={"n": (1, 64)},
                shapes={"batch": {"x": ("n", 2), "y": ("n",)}})
    def f(batch, w):
        return batch["x"] @ w + batch["y"][:, None], pj.psum(batch["y"].sum())
    batch = {"x": np.ones((5, 2), np.float32), "y": np.arange(5, dtype=np.float32)}
    out, total = f(batch, np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(np.asarray(out), 2 + np.arange(5, dtype=np.float32)[:, None] + np.zeros(3))
    assert float(np.asarray(total)) == 10
    with pytest.raises(pj.VarBoundError, match=r"batch\['x'\].shape\[0\]"):  # 1 row: none for replica 1
        f({"x": np.ones((1, 2), np.float32), "y": np.ones(1, np.float32)}, np.ones((2, 3), np.float32))


def test_collectives_keep_dtypes():
    @pj.prepare(devices=CPU3, split={"x": 0})
    def f(x):
        return pj.psum(x[0]), pj.all_gather(x[0] > 1), pj.psum(x[0].astype(pnp.float16))  # a row per replica
    x = np.arange(9, dtype=np.int32).reshape(3, 3)
    ints, bools, halves = f(x)
    assert ints.dtype == np.int32 and np.asarray(ints).tolist() == x.sum(0).tolist()
    assert bools.dtype == np.bool_ and np.asarray(bools).tolist() == (x > 1).tolist()
    assert halves.dtype == np.float16 and np.asarray(halves).tolist() == x.sum(0).tolist()


@pytest.mark.parametrize("device", [d for d in available_devices() if d != "cpu"] or
                         [pytest.param("opencl", marks=pytest.mark.skip(reason="no GPU-style device (cuda, opencl)"))])
def test_replicate_copies_before_it_returns(device):
    """`replicate` waits for its uploads: the caller may overwrite its array right after (the opencl device's
    uploads are not waited for until it synchronises; without the wait PoCL showed 15 of 200 copies overwritten)."""
    step = pj.prepare(lambda w, x: w * x, devices=[device], split={"x": 0})
    held = []
    for i in range(200):
        w = np.full(1 << 16, float(i), np.float32)
        held.append(step.replicate({"w": w})["w"])
        w[:] = -1
    for i, h in enumerate(held):
        np.testing.assert_array_equal(np.asarray(h), np.full(1 << 16, float(i), np.float32))
