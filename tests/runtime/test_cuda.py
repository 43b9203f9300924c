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
from prepjit.codegen.render_c import REDUCE_GROUP
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
    assert copies == ["memcpy_dtoh_async"] * 2


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
        assert delta["graphs_built"] == delta["graph_replays"] == 0 and delta["stream_launches"] >= 7 * 5
