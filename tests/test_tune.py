"""PREPJIT_TUNE (prepjit/jit/tune.py): a contraction's block shapes timed at prepare time, the winner used for the
kernel (the bounds proof, the renderer and the disk key agree on it), recorded on disk and read back by a new
process that does not tune."""
import os
import subprocess
import sys

import numpy as np
import pytest

import prepjit as pj
from prepjit.jit import tune
from prepjit.codegen import optimize as opt
from prepjit.codegen.gpu_launch import launch_of
from prepjit.codegen.render_tiles import match_contraction, tile_candidates
from prepjit.runtime import disk_cache
from tests.conftest import DEVICES

SCRIPT = """
import sys, numpy as np, prepjit as pj
from prepjit.jit import tune
from prepjit.codegen import optimize as opt
x, w = np.ones((8, 192), np.float32), np.full((192, 96), 0.5, np.float32)
f = pj.prepare(lambda x, w: x @ w, device="cpu")
assert np.allclose(np.asarray(f(x, w)), x @ w)
(k,), (scheduled,) = f.plan(x, w).kernels, f.plan(x, w).spec.kernels.asts()
print(f.stats["compiles"], f.stats["disk_hits"],
      k.ast is opt.optimize_with(scheduled, "llvm", None, opt.Blocking(max_accumulators=8)))
"""


@pytest.fixture(autouse=True)
def disk_cache_on(monkeypatch):
    """Each test reads a tuned choice back from the disk cache: a PREPJIT_CACHE=0 in the caller's environment (the GPU
    runs set it) must not turn that cache off in the test or in the process it starts."""
    monkeypatch.delenv("PREPJIT_CACHE", raising=False)


def test_a_tuned_choice_is_used_recorded_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("PREPJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PREPJIT_TUNE", "1")
    timed = []

    def search(ast, device, candidates):  # the real search runs too; the test then takes a non-default shape
        timed.append(tune.search.__wrapped__(ast, device, candidates))
        return next(b for b in candidates if b.max_accumulators == 8)
    search.__wrapped__ = tune.search
    monkeypatch.setattr(tune, "search", search)
    rng = np.random.default_rng(0)
    x, w = np.ones((8, 192), np.float32), np.full((192, 96), 0.5, np.float32)
    f = pj.prepare(lambda x, w: x @ w, device="cpu")
    np.testing.assert_allclose(np.asarray(f(x, w)), x @ w, rtol=1e-5)
    (k,), (scheduled,) = f.plan(x, w).kernels, f.plan(x, w).spec.kernels.asts()
    assert len(timed) == 1 and timed[0] in opt.blocking_candidates(scheduled)
    # the plan's kernel is the AST as launched with the chosen Blocking, which its disk key names
    assert k.ast is opt.optimize_with(scheduled, "llvm", None, opt.Blocking(max_accumulators=8))
    assert k.ast is not opt.optimize(scheduled, "llvm")
    assert k.kernel.disk_key == disk_cache.kernel_key(scheduled, "cpu", f.device.compiler_id + "-max_accumulators-8")
    a, b = rng.standard_normal((8, 192)).astype(np.float32), rng.standard_normal((192, 96)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(a, b)), a @ b, rtol=1e-4, atol=1e-4)
    env = {k: v for k, v in os.environ.items() if k != "PREPJIT_TUNE"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "True"]  # the record's shape, and its kernel from the disk cache


def test_no_tuning_unless_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("PREPJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PREPJIT_TUNE", raising=False)
    monkeypatch.setattr(tune, "search", lambda *a: (_ for _ in ()).throw(AssertionError("searched")))
    x, w = np.ones((4, 160), np.float32), np.ones((160, 64), np.float32)
    f = pj.prepare(lambda x, w: x @ w + 1, device="cpu")
    np.testing.assert_allclose(np.asarray(f(x, w)), x @ w + 1)
    (k,), (scheduled,) = f.plan(x, w).kernels, f.plan(x, w).spec.kernels.asts()
    assert k.ast is opt.optimize(scheduled, "llvm") and tune.key_suffix(opt.DEFAULT_BLOCKING) == ""
    assert k.kernel.disk_key == disk_cache.kernel_key(scheduled, "cpu", f.device.compiler_id)


GPU_SCRIPT = """
import sys, numpy as np, prepjit as pj
from prepjit.codegen.gpu_launch import launch_of
x, w = np.ones((64, 64), np.float32), np.full((64, 128), 0.5, np.float32)
f = pj.prepare(lambda x, w: x @ w + 1, device=sys.argv[1])
assert np.allclose(np.asarray(f(x, w)), x @ w + 1)
(k,) = f.plan(x, w).kernels
print(f.stats["compiles"], f.stats["disk_hits"], launch_of(k.ast) == ("tile", 64, 64, 2))
"""


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "cpu"] or
                         [pytest.param("opencl", marks=pytest.mark.skip(reason="no GPU-style device (cuda, opencl)"))])
def test_gpu_tiles_are_tuned_on_the_device_recorded_and_read_back(tmp_path, monkeypatch, device):
    """On cuda and opencl a contraction's candidates are its tilings (render_tiles.tile_candidates), each compiled
    and timed on the device; the chosen one renders the kernel (here forced to 64 x 64 tiles in 2 sets of
    work-items, and checked against NumPy), names its disk key, and is read back by a process that does not tune."""
    monkeypatch.setenv("PREPJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PREPJIT_TUNE", "1")
    timed = []

    def search_gpu(ast, dev, candidates):
        timed.append((candidates, tune.search_gpu.__wrapped__(ast, dev, candidates)))
        return opt.Blocking(tile=(64, 64, 2))
    search_gpu.__wrapped__ = tune.search_gpu
    monkeypatch.setattr(tune, "search_gpu", search_gpu)
    rng = np.random.default_rng(0)
    # 64 x 128 outputs: the tilings that fill them (64 x 128, 64 x 64, 32 x 128, each split 1, 2 or 4 ways: 8 with
    # the policy's) are compiled and timed, fewer than a square's 14 (each a compile, ~2.4 s on a cold PoCL cache)
    x, w = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((64, 128)).astype(np.float32)
    f = pj.prepare(lambda x, w: x @ w + 1, device=device)
    np.testing.assert_allclose(np.asarray(f(x, w)), x @ w + 1, rtol=1e-4, atol=1e-4)
    (k,), (scheduled,) = f.plan(x, w).kernels, f.plan(x, w).spec.kernels.asts()
    (candidates, searched), = timed
    assert candidates[0] == opt.DEFAULT_BLOCKING and searched in candidates
    assert [b.tile for b in candidates[1:]] == tile_candidates(scheduled)[1:] and len(candidates) > 5
    assert launch_of(k.ast) == ("tile", 64, 64, 2)
    assert k.kernel.disk_key == disk_cache.kernel_key(scheduled, f.device.name, f.device.compiler_id + "-tile-64x64x2")
    assert "__local float" in k.kernel.source or "__shared__" in k.kernel.source
    assert k.kernel.local_size == (match_contraction(scheduled, (64, 64, 2)).threads,) == (128,)
    env = {k: v for k, v in os.environ.items() if k != "PREPJIT_TUNE"}
    out = subprocess.run([sys.executable, "-c", GPU_SCRIPT, device], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "True"]
