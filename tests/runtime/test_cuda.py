"""The cuda device: errors without pycuda / NVRTC / a GPU (everywhere), and on an NVIDIA GPU: NumPy semantics
per dtype, block sizes read off the kernels, large and odd sizes replayed with new shapes, results kept on
the GPU and chained without host copies, compiler identity, "cuda:N" names and threads."""
import subprocess
import sys
import threading

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.row_plan import REDUCE_GROUP
from prepjit.codegen.render_cuda import ELEMENTWISE_GROUP
from prepjit.runtime.devices import available_devices, get_device

ON_GPU = "cuda" in available_devices()
gpu = pytest.mark.skipif(not ON_GPU, reason="no CUDA device here (needs pycuda and an NVIDIA GPU: "
                                            "pip install 'prepjit[cuda]')")


def test_importing_prepjit_never_imports_pycuda():
    code = "import sys, prepjit, prepjit.numpy; assert 'pycuda' not in sys.modules, 'pycuda imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_pycuda_the_error_says_what_to_install(monkeypatch):
    from prepjit.runtime.cuda import CUDADevice
    monkeypatch.setitem(sys.modules, "pycuda", None)   # import pycuda raises ImportError
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    with pytest.raises(pj.DeviceError, match=r"needs pycuda.*pip install 'prepjit\[cuda\]'"):
        CUDADevice()


def test_without_nvrtc_the_error_names_it(monkeypatch):
    from prepjit.runtime import nvrtc
    monkeypatch.setattr(nvrtc, "_candidates", lambda: [])
    with pytest.raises(pj.DeviceError, match="NVRTC"):
        nvrtc.NVRTC()


def test_device_names():
    with pytest.raises(pj.DeviceError, match="cuda:N"):
        get_device("cuda:x")
    if ON_GPU:
        assert get_device("cuda:0") is get_device("cuda") and get_device("CUDA").name == "cuda"
        count = get_device("cuda").drv.Device.count()
        with pytest.raises(pj.DeviceError, match=f"asks for GPU {count}"):
            get_device(f"cuda:{count}")
    else:
        with pytest.raises(pj.DeviceError, match=r"pip install 'prepjit\[cuda\]'|NVRTC|GPU"):
            pj.prepare(lambda x: x + 1, device="cuda")(np.ones(3, np.float32))


def semantics():
    """The dtype edge-case checks written for the opencl device (test_opencl.py), reused on cuda."""
    from tests.runtime import test_opencl
    return test_opencl


@gpu
@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint32", "uint64"])
def test_integer_ops_wrap_floor_and_shift_like_numpy(dtype):
    t = semantics()
    v = t.edge_values(dtype)
    a, b = np.repeat(v, v.size), np.tile(v, v.size)
    s = (np.arange(a.size) % (np.iinfo(dtype).bits + 3)).astype(dtype)
    out = pj.prepare(lambda a, b, s: t.int_ops(a, b, s, pnp), device="cuda")(a, b, s)
    with np.errstate(all="ignore"):
        expected = t.int_ops(a, b, s, np)
    np.testing.assert_array_equal(np.asarray(out), expected)


@gpu
@pytest.mark.parametrize("dtype, rtol", [("float16", 2e-3), ("float32", 1e-5), ("float64", 1e-12)])
def test_float_ops_match_numpy_with_nan_and_inf(dtype, rtol):
    t = semantics()
    v = np.array([0.0, -0.0, 0.5, -1.5, 2.5, 3.0, -7.25, 1e-3, 100.0, np.inf, -np.inf, np.nan, 60000.0], dtype)
    a, b = np.repeat(v, v.size), np.tile(v, v.size)
    out = pj.prepare(lambda a, b: t.float_ops(a, b, pnp), device="cuda")(a, b)
    with np.errstate(all="ignore"):
        expected = t.float_ops(a, b, np)
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(np.asarray(out), expected, rtol=rtol, atol=1e-6)


@gpu
def test_block_sizes_are_the_kernels_launch_bounds():
    @pj.prepare(vars={"n": (1, 5000)}, shapes={"x": ("n", 3)}, device="cuda")
    def f(x):
        return x.sum(axis=0), x * 2

    x = np.random.default_rng(0).standard_normal((4999, 3)).astype(np.float32)
    total, doubled = f(x)
    np.testing.assert_allclose(np.asarray(total), x.sum(axis=0), rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(np.asarray(doubled), x * 2)
    blocks = {k.kernel.program.block for k in f.plan(x).kernels}
    assert blocks == {REDUCE_GROUP, ELEMENTWISE_GROUP}


@pytest.fixture(scope="module")
def scale_rows():
    @pj.prepare(vars={"n": (1, (1 << 20) + 8), "m": (1, 8)}, shapes={"x": ("n", "m"), "w": ("m",)}, device="cuda")
    def f(x, w):
        return x * w + 1, (x[:, ::2] * 2).T
    return f


@gpu
@pytest.mark.parametrize("n, m", [(1, 1), (127, 1), (3, 7), (257, 5), ((1 << 20) + 3, 1), (40001, 8)])
def test_large_and_odd_sizes_replay_with_new_shapes(scale_rows, n, m):
    rng = np.random.default_rng(n + m)
    x, w = rng.standard_normal((n, m)).astype(np.float32), rng.standard_normal(m).astype(np.float32)
    y, t = scale_rows(x, w)
    assert y.shape == (n, m) and t.shape == ((m + 1) // 2, n)
    np.testing.assert_array_equal(np.asarray(y), x * w + 1)     # --fmad=false: rounded like NumPy
    np.testing.assert_array_equal(np.asarray(t), (x[:, ::2] * 2).T)
    assert scale_rows.stats["traces"] == 1


@gpu
def test_results_stay_on_the_gpu_and_chain_without_host_copies(monkeypatch):
    drv = get_device("cuda").drv

    @pj.prepare(vars={"n": (1, 100)}, shapes={"x": ("n",)}, device="cuda")
    def double(x):
        return x * 2

    x = np.arange(10, dtype=np.float32)
    first = double(x)
    assert first.device == "cuda" and int(first.buffer) != 0
    double(first)
    copies = []
    for name in ("memcpy_htod_async", "memcpy_dtoh_async", "memcpy_htod", "memcpy_dtoh"):
        real = getattr(drv, name)
        monkeypatch.setattr(drv, name, lambda *a, real=real, name=name, **k: copies.append(name) or real(*a, **k))
    second = double(double(first))
    assert copies == []
    np.testing.assert_array_equal(second.numpy(), x * 8)
    np.testing.assert_array_equal(np.asarray(first), x * 2)
    assert copies == ["memcpy_dtoh"] * 2


@gpu
def test_reductions_of_every_size_and_dtype():
    @pj.prepare(vars={"n": (1, 100000)}, shapes={"x": ("n",), "k": ("n",)}, device="cuda")
    def f(x, k):
        return x.sum(), x.max(), k.sum(), (x.astype("float16") * 2).sum(), pnp.any(x > 3)

    for n in (1, 2, 255, 256, 257, 1000, 99999):
        rng = np.random.default_rng(n)
        x = rng.standard_normal(n).astype(np.float32)
        k = rng.integers(-2**31, 2**31 - 1, n, dtype=np.int64)
        s, mx, ks, hs, anyx = (np.asarray(o) for o in f(x, k))
        np.testing.assert_allclose(s, x.sum(), rtol=1e-4, atol=1e-3 * np.sqrt(n))
        assert mx == x.max() and ks == k.sum() and bool(anyx) == bool((x > 3).any())
        np.testing.assert_allclose(hs.astype(np.float32), (x.astype(np.float16) * 2).astype(np.float32).sum(),
                                   rtol=2e-2, atol=0.1 * np.sqrt(n))


@gpu
def test_threads_each_get_the_context():
    f = pj.prepare(lambda x: x * 3 + 1, device="cuda")
    errors, x = [], np.arange(1000, dtype=np.float32)

    def worker():
        try:
            for _ in range(5):
                np.testing.assert_array_equal(np.asarray(f(x)), x * 3 + 1)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@gpu
def test_compiler_identity_names_gpu_arch_driver_and_nvrtc():
    device = get_device("cuda")
    major, minor = device.device.compute_capability()
    assert f"sm_{major}{minor}" in device.compiler_id and str(device.drv.get_driver_version()) in device.compiler_id
    assert "nvrtc" in device.compiler_id and device.device.name() in device.compiler_id


@gpu
def test_build_errors_are_compile_errors_holding_the_source():
    with pytest.raises(pj.CompileError, match="not_a_type"):
        get_device("cuda").compile("broken", 'extern "C" __global__ void broken(not_a_type *b) { }')


@gpu
def test_cuda_is_the_default_device_when_the_env_says_so(monkeypatch):
    monkeypatch.setenv("PREPJIT_DEVICE", "cuda")
    out = pj.prepare(lambda x: x + 1)(np.arange(3, dtype=np.float32))
    assert out.device == "cuda"
    np.testing.assert_array_equal(out.numpy(), [1, 2, 3])


@gpu
@pytest.mark.parametrize("graphs", [True, False])
def test_graph_replay_updates_changed_nodes_and_matches_stream_launches(monkeypatch, graphs):
    device = get_device("cuda")
    monkeypatch.setattr(device, "use_graphs", graphs)

    @pj.prepare(vars={"n": (1, 4096)}, shapes={"x": ("n", 8)}, device="cuda")
    def chain(x):
        for _ in range(4):
            x = x - x.max(axis=1, keepdims=True) * 0.5
        return x.sum(axis=0)

    def expected(x):
        for _ in range(4):
            x = x - x.max(axis=1, keepdims=True) * np.float32(0.5)
        return x.sum(axis=0)
    before = dict(device.stats)
    rng = np.random.default_rng(1)
    for n in (5, 5, 5, 300, 300, 7, 5):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(chain(x)), expected(x), rtol=1e-5, atol=1e-5)
    delta = {k: device.stats[k] - before[k] for k in before}
    if graphs:   # seen once, then a graph; new n values update nodes instead of rebuilding
        assert delta["graphs_built"] == 1 and delta["graph_replays"] == 6 and delta["node_updates"] > 0
    else:
        kernels = len(chain.plan(x).kernels)
        assert delta["graphs_built"] == delta["graph_replays"] == 0 and delta["stream_launches"] == 7 * kernels


def softmax(x, xp):
    e = xp.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def layernorm(x, xp):
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    return (x - mu) / xp.sqrt(var + np.float32(1e-5))


@gpu
@pytest.mark.parametrize("n, k", [(1, 1), (3, 16), (5, 17), (7, 33), (64, 64), (3, 257), (2, 1000), (33, 4096)])
def test_row_kernels_softmax_layernorm_and_nested_reductions(n, k):
    """Rows whose reductions fuse into the kernel that broadcasts them: a work-group per row (past
    ROW_INLINE_MAX columns), the partials combined with warp shuffles and shared memory."""
    rng = np.random.default_rng(n * k)
    x = rng.standard_normal((n, k)).astype(np.float32) * 4
    f = pj.prepare(lambda x: (softmax(x, pnp), layernorm(x, pnp), x.max(axis=1), (x * 2).sum(axis=1)), device="cuda")
    sm, ln, mx, total = (np.asarray(o) for o in f(x))
    np.testing.assert_allclose(sm, softmax(x, np), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ln, layernorm(x, np), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(mx, x.max(axis=1))
    np.testing.assert_allclose(total, (x * 2).sum(axis=1), rtol=1e-5, atol=1e-4)
    blocks = {k.kernel.program.block for k in f.plan(x).kernels}
    assert all(b in (ELEMENTWISE_GROUP, ) or 32 <= b <= REDUCE_GROUP for b in blocks)
    if k > 16:
        assert any("__shfl_xor_sync" in kk.kernel.source for kk in f.plan(x).kernels)
    y = rng.standard_normal((3, n, k)).astype(np.float32)
    g = pj.prepare(lambda y: y.max(axis=2).sum(axis=1), device="cuda")   # a reduction inside a row's reduction
    np.testing.assert_allclose(np.asarray(g(y)), y.max(axis=2).sum(axis=1), rtol=1e-5, atol=1e-4)


@gpu
@pytest.mark.parametrize("b, t, k, n", [(3, 70, 33, 130), (2, 128, 384, 384), (1, 64, 16, 64)])
def test_matmuls_with_several_row_ranges_are_tiled(b, t, k, n):
    rng = np.random.default_rng(b * t)
    x, w = rng.standard_normal((b, t, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    f = pj.prepare(lambda x, w: x @ w + 1, device="cuda")
    np.testing.assert_allclose(np.asarray(f(x, w)), x @ w + 1, rtol=1e-4, atol=1e-4)
    assert any("As[" in kk.kernel.source for kk in f.plan(x, w).kernels)


@gpu
def test_softmax_over_rows_is_one_kernel():
    f = pj.prepare(lambda x: softmax(x, pnp), device="cuda")
    x = np.random.default_rng(0).standard_normal((300, 500)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), softmax(x, np), rtol=1e-5, atol=1e-7)
    assert len(f.plan(x).kernels) == 1


@gpu
def test_fast_path_replays_numpy_and_gpu_arrays_with_vars_and_flags(monkeypatch):
    """Known calls replay through the plan's DevicePlanRunner (the fast path): NumPy inputs staged in memory
    it keeps, pj.Arrays of the GPU in place, scalar vars checked, a gather's out-of-range flag read back."""
    from prepjit.runtime.device_base import DevicePlanRunner
    runs = []
    real = DevicePlanRunner.run
    monkeypatch.setattr(DevicePlanRunner, "run", lambda self, *a: runs.append(1) or real(self, *a))
    f = pj.prepare(lambda a, b: a * b + 1, device="cuda")
    a, b = np.arange(16, dtype=np.float32), np.full(16, 2, np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(a, b)), a * b + 1)
    assert len(runs) == 2   # the first call takes the full path and teaches the fast one
    da = f(a, b)
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(f(da, b)), (a * b + 1) * b + 1)
    assert len(runs) == 4
    np.testing.assert_array_equal(np.asarray(f(a[:8].copy(), b[:8].copy())), a[:8] * 2 + 1)   # a new shape

    @pj.prepare(vars={"n": (1, 64), "p": (0, 8)}, shapes={"x": ("n",)}, device="cuda")
    def tail(x, p):
        return x[p:] * 2
    x = np.arange(64, dtype=np.float32)
    for p in (0, 5, 8, 3, 3):
        np.testing.assert_array_equal(np.asarray(tail(x, p)), x[p:] * 2)
    with pytest.raises(pj.VarBoundError):
        tail(x, 9)
    pick = pj.prepare(lambda x, ids: pnp.take(x, ids) * 2, device="cuda")
    ids = np.array([0, 5, 63, 7])
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(pick(x, ids)), np.take(x, ids) * 2)
    with pytest.raises(pj.IndexBoundError):
        pick(x, np.array([0, 5, 64, 7]))   # flagged by the gather, read back by the fast path
    np.testing.assert_array_equal(np.asarray(pick(x, ids[::-1])), np.take(x, ids[::-1]) * 2)
