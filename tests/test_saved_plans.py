"""Saved plans (saved.py): f.save / pj.load across processes with every call guarantee, pj.PlanFileError for
truncated, corrupt, other-version, other-device and forged files (a pickle never runs), and recompile=True."""
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.runtime import datafile
from prepjit.jit.saved import KIND, VERSION

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFINE = """
import numpy as np, prepjit as pj, prepjit.numpy as pnp

@pj.prepare(vars={"n": (1, 64), "pos": (0, 63)}, shapes={"x": ("n", 4)}, device=DEVICE)
def layer(x, w, pos, scale=2.0):
    h = pnp.tanh(x @ w)
    return {"row": h[pos] * scale, "sum": x.sum(0), "all": (h, h)}
"""


def make(device):
    scope = {"DEVICE": device}
    exec(DEFINE, scope)
    return scope["layer"]


def expected(x, w, pos, scale=2.0):
    h = np.tanh(x @ w)
    return h[pos] * scale, x.sum(0), h


def check(out, x, w, pos, scale=2.0):
    row, total, h = expected(x, w, pos, scale)
    np.testing.assert_allclose(np.asarray(out["row"]), row, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["sum"]), total, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["all"][0]), h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out["all"][1]), h, rtol=1e-5, atol=1e-6)


def arrays(n, rng):
    return rng.standard_normal((n, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)


@pytest.fixture
def saved(tmp_path, device, rng):
    path = tmp_path / "layer.pjplan"
    x, w = arrays(5, rng)
    make(device).save(path, x, w, 2)
    return path, w


def run_python(code: str, **env) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300, cwd=ROOT, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_saved_in_one_process_loaded_in_another_with_new_vars(tmp_path):
    path = tmp_path / "layer.pjplan"
    run_python(DEFINE.replace("DEVICE", "'cpu'") + f"""
rng = np.random.default_rng(1)
layer.save({str(path)!r}, rng.standard_normal((5, 4)).astype(np.float32), np.ones((4, 3), np.float32), 2)
""")
    out = run_python(f"""
import numpy as np, prepjit as pj
g = pj.load({str(path)!r})
rng = np.random.default_rng(2)
w = rng.standard_normal((4, 3)).astype(np.float32)
for n, pos in [(9, 7), (1, 0), (64, 63), (9, 7)]:
    x = rng.standard_normal((n, 4)).astype(np.float32)
    out = g(x, w, pos)
    h = np.tanh(x @ w)
    assert np.allclose(out["row"], h[pos] * 2, atol=1e-6) and np.allclose(out["sum"], x.sum(0), atol=1e-5)
    assert np.allclose(out["all"][0], h, atol=1e-6) and out["all"][0] is not out["all"][1]
print(g.stats["compiles"], g.stats["traces"], g.stats["replays"], g.plan.vars)
""", PREPJIT_CACHE="0")  # no disk cache either: every kernel comes from the file
    assert out.split()[:3] == ["0", "0", "4"]


def test_loaded_function_keeps_every_call_guarantee(saved, rng):
    path, w = saved
    g = pj.load(path)
    assert isinstance(g.plan, pj.ExecutionPlan) and g.stats["compiles"] == 0 and g.stats["plans"] == 1
    x, _ = arrays(9, rng)
    with pytest.raises(pj.VarBoundError):
        g(x, w, 64)
    with pytest.raises(pj.IndexBoundError):  # pos < n
        g(x, w, 9)
    with pytest.raises(pj.VarBoundError):
        g(np.zeros((65, 4), np.float32), w, 0)
    with pytest.raises(pj.SignatureError):  # a static dim
        g(x, np.zeros((4, 5), np.float32), 1)
    with pytest.raises(pj.SignatureError):  # another dtype
        g(x.astype(np.float64), w, 1)
    with pytest.raises(pj.SignatureError, match="scale"):  # another static value: another signature
        g(x, w, 1, 3.0)
    first = g(x, w, 8)
    second = g(x, w, 8)
    check(first, x, w, 8)
    assert first["row"] is not second["row"]  # fresh outputs on every call
    check(g(x, w, 8, scale=2.0), x, w, 8)  # keywords take the full path


def test_truncated_flipped_and_appended_files(saved):
    path, _ = saved
    data = path.read_bytes()
    for bad in (data[:len(data) // 2], data[:-1], data + b"\0", data[:100], b""):
        path.write_bytes(bad)
        with pytest.raises(pj.PlanFileError):
            pj.load(path)
    for where in (10, len(data) // 3, len(data) - 40, len(data) - 1):
        flipped = bytearray(data)
        flipped[where] ^= 0x01
        path.write_bytes(bytes(flipped))
        with pytest.raises(pj.PlanFileError):
            pj.load(path)
    assert issubclass(pj.PlanFileError, ValueError) and issubclass(pj.PlanFileError, pj.PrepjitError)


def repack(path, edit=lambda meta: None, version=VERSION, payload=None):
    """Rewrite a plan file with edited metadata (or payload), its checksum recomputed: only the reader's own
    checks can refuse it."""
    meta, old = datafile.unpack(path.read_bytes(), KIND, VERSION)
    edit(meta)
    path.write_bytes(datafile.pack(KIND, version, meta, old if payload is None else payload))


def test_other_version_and_other_device(saved):
    path, _ = saved
    data = path.read_bytes()
    repack(path, version=VERSION + 1)
    with pytest.raises(pj.PlanFileError, match="version"):
        pj.load(path)
    path.write_bytes(data)
    repack(path, lambda meta: meta.update(compiler_id="llvm-0-othercpu"))
    with pytest.raises(pj.PlanFileError, match="another"):
        pj.load(path)
    path.write_bytes(data)
    repack(path, lambda meta: meta.update(device="tpu"))
    with pytest.raises(pj.PlanFileError, match="tpu"):
        pj.load(path)


def test_a_pickle_never_runs(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    path = tmp_path / "evil.pjplan"
    path.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(pj.PlanFileError):
        pj.load(path)
    path.write_bytes(datafile.pack(KIND, VERSION, {"device": "cpu", "pickle": pickle.dumps(Evil()).hex()},
                                   pickle.dumps(Evil())))
    with pytest.raises(pj.PlanFileError):
        pj.load(path)
    assert not marker.exists()


def test_forged_metadata_is_refused(saved):
    path, _ = saved
    data = path.read_bytes()
    edits = [
        lambda m: m["vars"].__setitem__(0, ["n", 1, 10 ** 6]),                # bounds wider than the input's
        lambda m: m["vars"].__setitem__(1, ["pos", 0, 10 ** 6]),              # and than the kernels'
        lambda m: m["buffers"][0][1].__setitem__(1, 8),                      # an input wider than the signature
        lambda m: m["kernels"][0][1].__setitem__(0, 10 ** 6),                # a buffer that does not exist
        lambda m: m["kernels"][0][1].pop(),                                  # a slot fewer than the AST has
        lambda m: m["graph"]["nodes"].__setitem__(0, ["EVAL", "int64", "os.system", []]),
        lambda m: m.__setitem__("params", "x"),
        lambda m: m["codes"][0].__setitem__("bytes", 10 ** 9),
    ]
    for edit in edits:
        path.write_bytes(data)
        repack(path, edit)
        with pytest.raises(pj.PlanFileError):
            pj.load(path)


def test_recompile_compiles_from_the_asts_and_proves_again(saved, rng):
    path, w = saved
    meta, payload = datafile.unpack(path.read_bytes(), KIND, VERSION)
    def forge(m):
        m.update(compiler_id="from-another-host")
        for buf in m["buffers"]:  # sizes and shared memory are derived again, not read
            buf[2], buf[3] = 1, 0
    repack(path, forge, payload=bytes(len(payload)))  # and the code is unusable
    with pytest.raises(pj.PlanFileError):
        pj.load(path)
    g = pj.load(path, recompile=True)
    assert g.plan.proven_accesses == meta["proven"] > 0
    x, _ = arrays(7, rng)
    check(g(x, w, 6), x, w, 6)
    with pytest.raises(pj.VarBoundError):
        g(x, w, -1)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(pj.PlanFileError):
        pj.load(path, recompile=True)


@pytest.mark.parametrize("iterations", [5, 10_000])
def test_a_fori_loop_plan_roundtrips(tmp_path, iterations):
    @pj.prepare(vars={"n": (1, 32)}, shapes={"x": ("n",)})
    def f(x):
        return pj.fori_loop(0, iterations, lambda i, acc: acc * 0.5 + i, x)

    x = np.arange(6, dtype=np.float32)
    path = tmp_path / "loop.pjplan"
    f.save(path, x)
    g = pj.load(path)
    assert path.stat().st_size < 100_000  # the loop is stored once, not per iteration
    saved_kernels, kernels = g.plan.kernels, f.plan(x).kernels
    assert [k.fixedvars for k in saved_kernels[:50]] == [k.fixedvars for k in kernels[:50]]
    assert len(saved_kernels) == len(kernels) and saved_kernels[-2].fixedvars == kernels[-2].fixedvars
    y = np.arange(11, dtype=np.float32)
    want = y.copy()
    for i in range(iterations):
        want = want * np.float32(0.5) + np.float32(i)
    np.testing.assert_allclose(np.asarray(g(y)), want, rtol=1e-5)


def test_forged_signature_parts_are_refused(saved):
    path, _ = saved
    data = path.read_bytes()
    for edit in (lambda m: m.__setitem__("descriptions", [[1, {"t": {"x": 1}}]]),
                 lambda m: m.__setitem__("key", {"t": [{"t": [{"t": []}]}] * 3} | {"x": 1}),
                 lambda m: m.__setitem__("out_tree", {"tree": ["dict", [], [{"tree": ["leaf", [], []]}] * 9]}),
                 lambda m: m["codes"][0].__setitem__("var_names", ["not_a_var"]),
                 lambda m: m["codes"][0].__setitem__("global_size", [-1])):
        path.write_bytes(data)
        repack(path, edit)
        with pytest.raises(pj.PlanFileError):
            pj.load(path)


def test_static_arguments_stay_static(tmp_path):
    @pj.prepare(static_argnames=("axes",))
    def f(x, axes, scale=0.5):
        return x.sum(axis=axes) * scale

    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    path = tmp_path / "static.pjplan"
    f.save(path, x, (0, 2))
    g = pj.load(path)
    np.testing.assert_allclose(np.asarray(g(x + 1, (0, 2))), (x + 1).sum(axis=(0, 2)) * 0.5)
    with pytest.raises(pj.SignatureError):
        g(x, (1,))


class _Model:
    """A class-based model: its weights are captured arrays of the plan."""

    def __init__(self, rng):
        self.w = rng.standard_normal((4, 3)).astype(np.float32)
        self.b = np.arange(3, dtype=np.int32)

    def __call__(self, x):
        return pnp.tanh(x @ self.w) + self.b


def test_captured_arrays_are_saved_with_the_plan(tmp_path, device, rng):
    model = _Model(rng)
    f = pj.prepare(model, vars={"n": (1, 16)}, shapes={"x": ("n", 4)}, device=device)
    path = tmp_path / "model.pjplan"
    f.save(path, np.ones((2, 4), np.float32))
    weights = model.w.copy(), model.b.copy()
    model.w[:] = 0  # captured at trace time: the file keeps the values the plan was traced with
    g = pj.load(path)
    for n in (1, 7, 16):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(g(x)), np.tanh(x @ weights[0]) + weights[1], rtol=1e-5, atol=1e-6)
    assert g.stats["compiles"] == 0


def test_captured_arrays_of_the_wrong_size_are_refused(tmp_path, rng):
    f = pj.prepare(_Model(rng), vars={"n": (1, 16)}, shapes={"x": ("n", 4)})
    path = tmp_path / "model.pjplan"
    f.save(path, np.ones((2, 4), np.float32))
    for edit in (lambda m: m["constants"][0][1].__setitem__(0, 5), lambda m: m["constants"].pop(),
                 lambda m: m["constants"][1].__setitem__(0, "float32")):
        bad = tmp_path / "bad.pjplan"
        meta, payload = datafile.unpack(path.read_bytes(), KIND, VERSION)
        edit(meta)
        bad.write_bytes(datafile.pack(KIND, VERSION, meta, payload))
        with pytest.raises(pj.PlanFileError):
            pj.load(bad)
