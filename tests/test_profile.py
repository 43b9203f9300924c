"""pj.profile: a row per kernel with time, bytes moved and FLOPs counted from the kernel AST at the live
var values; PREPJIT_LOG=profile prints the table after every call, PREPJIT_LOG=compiles where prepare time went."""
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.helpers import assert_matches


def test_a_row_for_every_kernel(device, rng):
    @pj.prepare(vars={"n": (1, 64)}, shapes={"x": ("n", 48)}, device=device)
    def softmax(x):  # over columns: on the cpu a softmax over rows is one kernel (codegen/fusion.py)
        e = pnp.exp(x - x.max(axis=0, keepdims=True))
        return e / e.sum(axis=0, keepdims=True)
    x = rng.standard_normal((5, 48)).astype(np.float32)
    prof = pj.profile(softmax, x)
    plan = softmax.plan(x)
    assert isinstance(prof, pj.Profile) and len(plan.kernels) >= 2
    assert [r["kernel"] for r in prof.rows] == [k.kernel.name for k in plan.kernels]
    assert [r["id"] for r in prof.rows] == list(range(len(plan.kernels)))
    for r in prof.rows:
        assert r["device"] == device and r["time_s"] > 0 and r["bytes"] > 0 and r["flops"] > 0
        assert r["gb_s"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["gflop_s"] == pytest.approx(r["flops"] / r["time_s"] / 1e9)
    assert prof.time_s == pytest.approx(sum(r["time_s"] for r in prof.rows))
    text = str(prof)
    for word in ("kernel", "device", "time", "bytes", "FLOPs", "GB/s", "GFLOP/s", "total", *prof.rows[0]["kernel"]):
        assert word in text
    assert len(text.splitlines()) == len(prof.rows) + 3  # title, header, kernels, total
    assert softmax.stats["replays"] == 1 and softmax.stats["traces"] == 1  # the profiled run is a real call
    e = np.exp(x - x.max(0, keepdims=True))
    assert_matches(softmax(x), e / e.sum(0, keepdims=True))


def test_elementwise_bytes_and_flops_are_exact_at_the_live_size(device, rng):
    f = pj.prepare(lambda a, b: a * b + 1, vars={"n": (1, 4096)}, shapes={"a": ("n",), "b": ("n",)}, device=device)
    for n in (1000, 37):  # the second call replays the same plan: counts follow the var
        a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        (row,) = pj.profile(f, a, b).rows
        assert row["bytes"] == 3 * n * 4   # two float32 loads and one store per element
        assert row["flops"] == 2 * n       # a multiply and an add per element
    assert f.stats["traces"] == 1


@pytest.mark.parametrize("m, k, n", [(7, 32, 16), (64, 256, 256)])  # the large one is packed on the cpu
def test_matmul_flops_are_2mnk(device, rng, m, k, n):
    f = pj.prepare(lambda a, b: a @ b, vars={"m": (1, 128)}, shapes={"a": ("m", k)}, device=device)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    prof = pj.profile(f, a, b)
    assert sum(r["flops"] for r in prof.rows) == 2 * m * n * k
    contraction = max(prof.rows, key=lambda r: r["flops"])
    assert contraction["flops"] == 2 * m * n * k
    assert contraction["bytes"] == 4 * (m * k + k * n + m * n)  # each operand once, not once per use


def test_counts_follow_a_scalar_var(rng):
    f = pj.prepare(lambda x, pos: pnp.exp(x[:, :pos + 1]).sum(axis=1), vars={"n": (1, 64), "pos": (0, 31)},
                   shapes={"x": ("n", 32)})
    x = rng.standard_normal((6, 32)).astype(np.float32)
    for pos in (3, 20):
        (row,) = pj.profile(f, x, pos).rows
        assert row["bytes"] == 4 * (6 * (pos + 1) + 6)   # only the window is read
        assert row["flops"] == 2 * 6 * (pos + 1)         # an exp and an accumulate per element read


def test_fori_loop_rows_carry_their_iteration(rng):
    f = pj.prepare(lambda x: pj.fori_loop(0, 3, lambda i, c: c * 2 + 1, x))
    x = rng.standard_normal(10).astype(np.float32)
    prof = pj.profile(f, x)
    assert [list(r["fixedvars"].values()) for r in prof.rows if r["fixedvars"]] == [[0], [1], [2]]
    assert sum(r["flops"] for r in prof.rows) == 3 * 2 * 10


def test_index_arithmetic_is_not_counted_as_flops():
    x = np.ones((6, 5), np.float32)
    (row,) = pj.profile(lambda a: pnp.tril(a), x).rows
    assert row["flops"] == 30 and row["bytes"] == 2 * 30 * 4   # one select per element; the mask is index math
    (row,) = pj.profile(lambda a: pnp.arange(10, dtype=np.int64) + a[0].astype(np.int64), x[0]).rows
    assert row["flops"] == 10                                  # the add; the iota's arithmetic is not counted


def test_profile_prepares_a_plain_function_and_checks_its_arguments(rng):
    x = rng.standard_normal(8).astype(np.float32)
    (row,) = pj.profile(lambda a: pnp.sqrt(a * a), x).rows
    assert row["flops"] == 2 * 8 and row["bytes"] == 2 * 8 * 4
    f = pj.prepare(lambda a: a + 1, vars={"n": (1, 4)}, shapes={"a": ("n",)})
    with pytest.raises(pj.VarBoundError):
        pj.profile(f, x)
    assert pj.profile(f, x[:4]).rows[0]["bytes"] == 2 * 4 * 4


def test_compiles_log_says_where_prepare_time_went(caplog, rng):
    f = pj.prepare(lambda a, b: pnp.tanh(a @ b))
    with caplog.at_level(logging.INFO, logger="prepjit"):
        f(rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32))
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prepared ")]
    for stage in ("tracing", "scheduling and lowering", "kernels"):
        assert stage in line
    assert "compilation" in line or "loaded from disk" in line


def test_prepjit_log_profile_prints_a_table_after_every_call():
    script = ("import numpy as np, prepjit as pj\n"
              "f = pj.prepare(lambda a: a * 2, vars={'n': (1, 64)}, shapes={'a': ('n',)})\n"
              "for n in (3, 5): print(np.asarray(f(np.ones(n, np.float32))).sum())\n")
    env = dict(os.environ, PREPJIT_LOG="profile")
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["6.0", "10.0"]
    assert run.stderr.count("prepjit: profile of <lambda> on cpu: 1 kernel\n") == 2
    assert "GFLOP/s" in run.stderr and "compile" not in run.stderr  # profile alone does not log compiles
