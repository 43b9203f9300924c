"""The opencl device: NumPy semantics per dtype, work-group sizes, large and odd sizes, replay with new
shapes, results kept on the device, device selection and the errors of a missing platform or extension."""
import re

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.render_opencl import GROUP_REDUCE_MIN, REDUCE_GROUP
from prepjit.runtime.devices import get_device, unavailable_reason
from prepjit.runtime.opencl import SOURCE_TAG, binary_fetch_compiles

pytestmark = pytest.mark.skipif(unavailable_reason("opencl") is not None,
                                reason=f"opencl: {unavailable_reason('opencl')}")
cl = pytest.importorskip("pyopencl")


def edge_values(dtype) -> np.ndarray:
    """Small values, the extremes and their neighbours, as `dtype` (wrapping negatives for unsigned)."""
    info = np.iinfo(dtype)
    raw = [0, 1, -1, 2, -2, 3, -7, 100, info.min, info.max, info.min + 1, info.max - 1]
    return np.array([v % (1 << info.bits) for v in raw], np.uint64).astype(dtype)


def int_ops(a, b, s, m):
    return m.stack([a + b, a - b, a * b, a // b, a % b, -a, m.abs(a), ~a, a & b, a | b, a ^ b,
                    m.left_shift(a, s), m.right_shift(a, s), m.maximum(a, b), m.minimum(a, b), m.sign(a),
                    (a < b).astype(a.dtype), m.where(a == b, a, b)])


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint32", "uint64"])
def test_integer_ops_wrap_floor_and_shift_like_numpy(dtype):
    v = edge_values(dtype)
    a, b = np.repeat(v, v.size), np.tile(v, v.size)           # every pair, zero divisors and MIN // -1 included
    s = (np.arange(a.size) % (np.iinfo(dtype).bits + 3)).astype(dtype)  # shift amounts past the width too
    out = pj.prepare(lambda a, b, s: int_ops(a, b, s, pnp), device="opencl")(a, b, s)
    with np.errstate(all="ignore"):
        expected = int_ops(a, b, s, np)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(np.asarray(out), expected)


def float_ops(a, b, m):
    return m.stack([a + b, a - b, a * b, a / b, a % b, -a, m.abs(a), m.maximum(a, b), m.minimum(a, b), m.sign(a),
                    m.exp(a / 64), m.exp2(a / 64), m.log(m.abs(a)), m.log2(m.abs(a)), m.sqrt(m.abs(a)), m.sin(a),
                    m.cos(a), m.tanh(a), m.floor(a), m.ceil(a), m.rint(a), m.abs(a) ** (b / 8),
                    (a < b).astype(a.dtype), (a != b).astype(a.dtype), m.where(a == b, a, b)])


@pytest.mark.parametrize("dtype, rtol", [("float16", 2e-3), ("float32", 1e-5), ("float64", 1e-12)])
def test_float_ops_match_numpy_with_nan_and_inf(dtype, rtol):
    if dtype == "float64" and "cl_khr_fp64" not in get_device("opencl").extensions:
        pytest.skip("this OpenCL device has no float64")
    v = np.array([0.0, -0.0, 0.5, -1.5, 2.5, 3.0, -7.25, 1e-3, 100.0, np.inf, -np.inf, np.nan, 60000.0], dtype)
    a, b = np.repeat(v, v.size), np.tile(v, v.size)
    out = pj.prepare(lambda a, b: float_ops(a, b, pnp), device="opencl")(a, b)
    with np.errstate(all="ignore"):
        expected = float_ops(a, b, np)
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(np.asarray(out), expected, rtol=rtol, atol=1e-6)


def test_casts_between_dtypes_match_numpy():
    x = np.array([0.0, 0.4, -0.6, 1.5, 2.5, -3.5, 100.75, -100.75, 65504.0, 1e-8], np.float32)
    targets = ["int8", "int32", "int64", "bool", "float16", "float64"]

    def casts(x, m):   # in range for every target (out of range, prepjit saturates where NumPy's C cast wraps)
        small = m.rint(x / 1000).astype("int8")
        return tuple(x.astype(t) for t in targets) + (m.abs(x).astype("uint8"), m.abs(x).astype("uint32"),
                                                      small.astype("float16"), (x > 0).astype("float32"),
                                                      x.astype("float64").astype("float16"), small.astype("uint16"))
    with np.errstate(invalid="ignore"):
        in_range = casts(np.clip(x, -100, 100), np)
        out = pj.prepare(lambda x: casts(x, pnp), device="opencl")(np.clip(x, -100, 100))
    for got, want in zip(out, in_range):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), want)


@pytest.fixture(scope="module")
def column_reductions():
    """sum/max/min/prod over a symbolic number of rows (a work-group per output past GROUP_REDUCE_MIN rows),
    and sum over the 3 columns of each row (a loop per work-item)."""
    @pj.prepare(vars={"n": (1, 5000)}, shapes={"x": ("n", 3), "k": ("n", 3), "flags": ("n",)}, device="opencl")
    def f(x, k, flags):
        return (x.sum(axis=0), x.max(axis=0), x.min(axis=0), x.sum(axis=1), pnp.sum(x), k.sum(axis=0),
                (x.astype("float16") * 2).sum(axis=0), pnp.any(flags), pnp.all(flags))
    return f


@pytest.mark.parametrize("n", [1, 2, 127, 128, 129, GROUP_REDUCE_MIN + 1, 1000, 4999])
def test_reductions_are_correct_for_any_size(column_reductions, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    x[n // 2, 1] = np.nan if n > 2 else x[n // 2, 1]                  # max/min propagate NaN
    k = rng.integers(-2**31, 2**31 - 1, (n, 3), dtype=np.int32)
    flags = rng.random(n) < 0.999
    out = [np.asarray(o) for o in column_reductions(x, k, flags)]
    tol = dict(rtol=1e-5, atol=1e-4 * np.sqrt(n))
    np.testing.assert_allclose(out[0], x.sum(axis=0), **tol)
    np.testing.assert_array_equal(out[1], x.max(axis=0))
    np.testing.assert_array_equal(out[2], x.min(axis=0))
    np.testing.assert_allclose(out[3], x.sum(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[4], x.sum(), **tol)
    assert out[5].dtype == k.sum(axis=0).dtype
    np.testing.assert_array_equal(out[5], k.sum(axis=0))
    half = (x.astype(np.float16) * 2).astype(np.float32).sum(axis=0)
    np.testing.assert_allclose(out[6].astype(np.float32), half, rtol=2e-3, atol=2e-2 * np.sqrt(n))
    assert out[6].dtype == np.float16
    assert out[7] == flags.any() and out[8] == flags.all()
    assert column_reductions.stats["traces"] == 1


def test_work_group_sizes(column_reductions):
    plan = column_reductions.plan(np.ones((4, 3), np.float32), np.ones((4, 3), np.int32), np.ones(4, bool))
    device = get_device("opencl")
    for k in plan.kernels:
        grouped = "reqd_work_group_size" in k.kernel.source
        assert k.kernel.local_size == ((REDUCE_GROUP,) if grouped else ())
        if grouped:   # one work-group per output: the launch size is outputs * REDUCE_GROUP
            assert k.kernel.program.local_size == REDUCE_GROUP
            assert k.kernel.global_size_fn([7] * len(k.vals))[0] % REDUCE_GROUP == 0
        else:
            assert 1 <= k.kernel.program.local_size <= device.device.max_work_group_size
    assert any("reqd_work_group_size" in k.kernel.source for k in plan.kernels)
    assert any("reqd_work_group_size" not in k.kernel.source for k in plan.kernels)


@pytest.fixture(scope="module")
def scale_rows():
    @pj.prepare(vars={"n": (1, (1 << 20) + 8), "m": (1, 8)}, shapes={"x": ("n", "m"), "w": ("m",)}, device="opencl")
    def f(x, w):
        return x * w + 1, (x[:, ::2] * 2).T
    return f


@pytest.mark.parametrize("n, m", [(1, 1), (1, 8), (127, 1), (3, 7), (129, 5), ((1 << 20) + 3, 1), (40001, 8)])
def test_large_and_odd_sizes_replay_with_new_shapes(scale_rows, n, m):
    rng = np.random.default_rng(n + m)
    x, w = rng.standard_normal((n, m)).astype(np.float32), rng.standard_normal(m).astype(np.float32)
    y, t = scale_rows(x, w)
    assert y.shape == (n, m) and t.shape == ((m + 1) // 2, n)
    np.testing.assert_allclose(np.asarray(y), x * w + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(t), (x[:, ::2] * 2).T)
    assert scale_rows.stats["traces"] == 1 and scale_rows.stats["compiles"] <= 3


def test_results_stay_on_the_device_and_chain_without_host_copies(monkeypatch):
    @pj.prepare(vars={"n": (1, 100)}, shapes={"x": ("n",)}, device="opencl")
    def double(x):
        return x * 2

    x = np.arange(10, dtype=np.float32)
    first = double(x)
    assert first.device == "opencl" and isinstance(first.buffer, cl.MemoryObjectHolder)
    double(first)   # prepared once with a pj.Array input too
    copies = []
    real_copy = cl.enqueue_copy
    monkeypatch.setattr(cl, "enqueue_copy", lambda *a, **k: copies.append(a) or real_copy(*a, **k))
    second = double(double(first))
    assert copies == []              # device arrays in, device arrays out: nothing crossed to the host
    np.testing.assert_array_equal(second.numpy(), x * 8)
    np.testing.assert_array_equal(np.asarray(first), x * 2)   # an earlier result is untouched
    assert len(copies) == 2          # only the two reads


def test_device_arrays_from_another_prepared_function_feed_a_reduction():
    make = pj.prepare(lambda x: x * 3, device="opencl")
    total = pj.prepare(lambda x: x.sum(), device="opencl")
    x = np.arange(1000, dtype=np.int64)
    assert int(total(make(x))) == 3 * x.sum()


def test_opencl_is_the_default_device_when_the_env_says_so(monkeypatch):
    monkeypatch.setenv("PREPJIT_DEVICE", "opencl")
    f = pj.prepare(lambda x: x + 1)
    out = f(np.arange(3, dtype=np.float32))
    assert out.device == "opencl" and f.plan(np.arange(3, dtype=np.float32)).device == "opencl"
    np.testing.assert_array_equal(out.numpy(), [1, 2, 3])


def test_opencl_device_env_picks_by_index_or_name(monkeypatch):
    from prepjit.runtime.opencl import OpenCLDevice, candidate_devices
    devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    assert candidate_devices(cl, "0") == [devices[0]]
    last = devices[-1]
    assert len(candidate_devices(cl, last.name[:6].upper())) == 1
    monkeypatch.setenv("PREPJIT_OPENCL_DEVICE", "no such device anywhere")
    with pytest.raises(pj.DeviceError, match="matches no OpenCL device"):
        OpenCLDevice()


def test_a_device_that_cannot_build_kernels_is_passed_over(monkeypatch):
    """With no PREPJIT_OPENCL_DEVICE, the first device whose probe kernel builds is used (a PoCL whose LLVM does
    not know the host CPU fails its probe; a second platform may not); when none builds, every reason is said."""
    from prepjit.runtime import opencl
    real = cl.get_platforms()[0].get_devices()[0]

    class Broken:   # a device whose context starts but whose compiler refuses everything
        platform, name, type = real.platform, "broken", cl.device_type.CPU
    monkeypatch.setattr(opencl, "candidate_devices", lambda cl_, spec: [Broken, real])
    started = []
    real_start = opencl._start

    def start(cl_, device, options):
        started.append(device.name)
        if device is Broken:
            raise pj.DeviceError("the OpenCL device x / broken cannot build kernels (error: unknown target CPU)")
        return real_start(cl_, device, options)
    monkeypatch.setattr(opencl, "_start", start)
    monkeypatch.setattr(opencl, "_build_options", lambda cl_, device: [])
    dev = opencl.OpenCLDevice()
    assert started == ["broken", real.name] and dev.device is real
    monkeypatch.setattr(opencl, "candidate_devices", lambda cl_, spec: [Broken])
    with pytest.raises(pj.DeviceError, match=r"broken cannot build kernels .*unknown target CPU.*pip install"):
        opencl.OpenCLDevice()


@pytest.mark.parametrize("platforms", ["none", "error"])
def test_missing_platform_raises_device_error_with_install_hint(monkeypatch, platforms):
    from prepjit.runtime.opencl import OpenCLDevice

    def get_platforms():
        if platforms == "error":
            raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")
        return []
    monkeypatch.setattr(cl, "get_platforms", get_platforms)
    with pytest.raises(pj.DeviceError, match=r"no OpenCL platform.*pip install 'prepjit\[opencl\]'"):
        OpenCLDevice()


def test_float64_on_a_device_without_fp64_is_a_clear_device_error():
    from prepjit.runtime.opencl import OpenCLDevice
    f = pj.prepare(lambda x: x * 2, device="opencl")
    x = np.ones(4, np.float64)
    if "cl_khr_fp64" in get_device("opencl").extensions:
        np.testing.assert_array_equal(f(x).numpy(), x * 2)
    source = f.plan(x).kernels[0].kernel.source
    no_fp64 = OpenCLDevice()
    no_fp64.extensions.discard("cl_khr_fp64")
    with pytest.raises(pj.DeviceError, match="float64 \\(cl_khr_fp64\\).*" + re.escape(no_fp64.description)):
        no_fp64.compile("E_4", source)


def test_prepare_on_a_device_without_fp64_or_fp16_says_which_dtype(monkeypatch):
    """A program that needs float64 on an OpenCL device without cl_khr_fp64 (faked here) raises pj.DeviceError at
    its first call, naming the dtype and the device, not a build failure; float16 needs no cl_khr_fp16 (it is
    stored through the core vstore_half_rte, read as its bits and computed in float), so it runs; the prepared
    function keeps working."""
    device = get_device("opencl")
    monkeypatch.setattr(device, "extensions", device.extensions - {"cl_khr_fp64", "cl_khr_fp16"})
    monkeypatch.setenv("PREPJIT_CACHE", "0")
    f = pj.prepare(lambda x: x * 3.25 - 0.0625, device="opencl")  # a kernel no other test compiled
    for dtype in ("float64", "int64"):  # a cast to bfloat16 from an int64 rounds through a double too
        x = np.arange(6).astype(dtype)
        g = f if dtype == "float64" else pj.prepare(lambda x: x.astype(pnp.bfloat16) * 3, device="opencl")
        with pytest.raises(pj.DeviceError, match=f"float64 \\(cl_khr_fp64\\).*{re.escape(device.description)}"):
            g(x)
    half = np.arange(6, dtype=np.float16)
    np.testing.assert_array_equal(f(half).numpy(), half * np.float16(3.25) - np.float16(0.0625))
    assert f(np.ones(3, np.float32)).numpy().tolist() == [3.1875] * 3
    with pytest.raises(pj.DeviceError):
        f(np.ones(6))
    monkeypatch.undo()
    if "cl_khr_fp64" in device.extensions:
        np.testing.assert_array_equal(f(np.ones(6)).numpy(), np.full(6, 3.1875))


def test_build_errors_are_compile_errors_holding_the_source():
    with pytest.raises(pj.CompileError, match="not_a_type"):
        get_device("opencl").compile("broken", "__kernel void broken(__global not_a_type *b) { }")


def test_compiler_identity_names_platform_device_and_driver():
    device = get_device("opencl")
    for part in (device.device.platform.name, device.device.name, device.device.driver_version):
        assert part in device.compiler_id


def test_uploads_are_not_waited_for_until_the_next_sync_and_keep_their_host_arrays():
    """A copy from the host is queued, not waited for (its event, which holds the host array, is kept until the
    device synchronises), so a call's uploads overlap its launches; dropping the array meanwhile is safe."""
    import gc
    device = get_device("opencl")
    device.synchronize()
    n = 1 << 20
    buffer = device.allocate(np.float32, n)
    host = np.arange(n, dtype=np.float32)
    device._upload(buffer.memory, host)
    assert len(device.upload_events()) == 1
    del host
    gc.collect()
    np.testing.assert_array_equal(device.read_buffer(buffer, (n,)), np.arange(n, dtype=np.float32))
    device.synchronize()
    assert device.upload_events() == []


def test_a_compilers_build_log_gives_the_user_no_warning(monkeypatch):
    """NVIDIA's OpenCL compiler logs for every kernel, and pyopencl turns a non-empty log into a CompilerWarning:
    prepjit's builds keep it from the user (an error still raises with its log)."""
    original = cl.Program.build

    def logging_build(self, *args, **kwargs):
        cl.compiler_output("a remark")  # what pyopencl's build does with a non-empty log
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cl.Program, "build", logging_build)
    monkeypatch.setenv("PREPJIT_CACHE", "0")
    f = pj.prepare(lambda x: x * 5 - 2, device="opencl")
    x = np.arange(7, dtype=np.float32)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(np.asarray(f(x)), x * 5 - 2)
    with pytest.warns(cl.CompilerWarning):  # the user's own builds keep pyopencl's warning
        cl.Program(get_device("opencl").context, "__kernel void k(__global float *a) { a[0] = 1; }").build()


@pytest.mark.parametrize("keeps_source", [True, False], ids=["source", "binary"])
def test_kept_code_loads_into_a_launchable_kernel(monkeypatch, keeps_source):
    """`compile` keeps the source where fetching the binary compiles again (PoCL), else the binary; either loads,
    from this process's compile (which still holds its program) or as the bytes alone (a later process's)."""
    device = get_device("opencl")
    monkeypatch.setattr(device, "keeps_source", keeps_source)
    source = "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }"
    code = device.compile("twice", source)
    assert code.startswith(SOURCE_TAG) == keeps_source
    for kept in (code, bytes(code)):
        buffer = device.allocate(np.float32, 256)
        device.write_buffer(buffer, np.arange(256, dtype=np.float32))
        device.launcher(device.load("twice", kept), [device.handle(buffer)], [], None, 256).run()
        np.testing.assert_array_equal(device.read_buffer(buffer, (256,)), 2 * np.arange(256, dtype=np.float32))


POCL_SCRIPT = """
import json
import numpy as np
import prepjit as pj
import prepjit.numpy as pnp

@pj.prepare(vars={"n": (1, 4096)}, shapes={"x": ("n", 8)}, device="opencl")
def f(x):
    h = pnp.tanh(x) * 3
    return h.sum(axis=1), h.max()

x = np.linspace(-2, 2, 800, dtype=np.float32).reshape(100, 8)
rows, top = f(x)
h = np.tanh(x) * np.float32(3)
error = max(float(np.abs(np.asarray(rows) - h.sum(1)).max()), abs(float(np.asarray(top)) - float(h.max())))
print(json.dumps({"stats": f.stats, "error": error}))
"""


def test_pocl_compiles_each_kernel_once_and_its_cache_serves_the_next_process(tmp_path, frozen_code):
    """On PoCL a first call compiles each kernel's work-group function once, for its launch (fetching the program
    binary compiled a generic one besides); a second process loads every kernel from prepjit's disk cache
    (the source) and PoCL's own cache serves the rebuild and the launch: it compiles nothing."""
    import json
    import os
    import subprocess
    import sys
    from collections import Counter
    if not binary_fetch_compiles(get_device("opencl").device):
        pytest.skip("the OpenCL device is not PoCL's")
    pocl_cache = tmp_path / "pocl"
    env = {**os.environ, "PREPJIT_CACHE_DIR": str(tmp_path / "prepjit"), "POCL_CACHE_DIR": str(pocl_cache),
           "PYTHONPATH": str(frozen_code)}

    def run() -> tuple[dict, list]:
        done = subprocess.run([sys.executable, "-c", POCL_SCRIPT], env=env, cwd=frozen_code, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["error"] < 1e-4
        return result["stats"], sorted(pocl_cache.rglob("*.so"))   # .../<program>/<kernel>/<work-group>/<kernel>.so

    first, compiled = run()
    assert first["compiles"] >= 2 and first["disk_hits"] == 0
    per_kernel = Counter(path.parent.parent for path in compiled)
    assert len(per_kernel) == first["compiles"] and set(per_kernel.values()) == {1}, compiled
    second, again = run()
    assert second["compiles"] == 0 and second["disk_hits"] == first["compiles"]
    assert again == compiled


def test_before_wait_is_called_in_a_calls_wait_once_its_work_is_submitted():
    """A prepared call waits for its kernels in synchronize, which calls the device's `before_wait` first (the
    queue flushed: its work submitted): once a call, with the call's result right; unset, nothing is called."""
    device, calls = get_device("opencl"), []
    f = pj.prepare(lambda x: x * 2 + 1, device="opencl")
    x = np.arange(1000, dtype=np.float32)
    device.before_wait = lambda: calls.append(device.queue)
    try:
        np.testing.assert_array_equal(np.asarray(f(x)), x * 2 + 1)
        np.testing.assert_array_equal(np.asarray(f(x + 1)), x * 2 + 3)
    finally:
        device.before_wait = None
    assert len(calls) >= 2 and all(queue is device.queue for queue in calls)
    del calls[:]
    f(x)
    assert calls == []
