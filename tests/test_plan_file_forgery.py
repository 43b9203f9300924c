"""Forged plan files and `pj.load(path, recompile=True)` (saved.py): whatever a file says, a loaded plan never
reads or writes outside a buffer and a malformed file raises pj.PlanFileError.

Each forgery is a real plan's metadata with one field or graph node changed and its checksum recomputed. It is
loaded and, when accepted, called, in a worker process (`python -m tests.test_plan_file_forgery`) whose every
buffer (arguments, outputs, the plan's own memory) ends at a guard page (tests/guard_pages.py): an access past
one is a SIGSEGV, which the parent sees as the worker's death and reports as a failure, then starts a new worker
after the case that crashed. PREPJIT_FORGERY_CASES scales the default fuzz (60 cases per plan); the `fuzz`-marked
profile runs PREPJIT_FORGERY_CASES_LARGE (1000) per plan from PREPJIT_FORGERY_SEED.
"""
from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- the plans forged (built in the worker) ----
def _loop_plan(pj, pnp):
    @pj.prepare(vars={"n": (1, 16)}, shapes={"x": ("n",)}, device="cpu")
    def f(x, w):
        return pj.fori_loop(0, 4, lambda i, acc: acc * 0.5 + w[i], x)
    x, w = np.arange(16, dtype=np.float32), np.arange(4, dtype=np.float32)
    return f, (x[:6], w), [(x[:n], w) for n in (1, 16)]


def _layer_plan(pj, pnp):
    @pj.prepare(vars={"n": (1, 16), "pos": (0, 15)}, shapes={"x": ("n", 4)}, device="cpu")
    def f(x, w, pos):
        h = pnp.tanh(x @ w)
        return h[pos] * 2.0, x.sum(0)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((16, 4)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)
    return f, (x[:5], w, 2), [(x[:n], w, p) for n, p in ((1, 0), (16, 15), (7, 3))]


def _gather_plan(pj, pnp):
    table = np.arange(32, dtype=np.float32).reshape(8, 4)

    @pj.prepare(vars={"m": (1, 16)}, shapes={"ids": ("m",)}, device="cpu")
    def f(ids):
        return pnp.asarray(table)[ids] * 2.0
    ids = np.array([0, 7, 3, 1, 2, 5, 6, 4, 0, 1, 2, 3, 4, 5, 6, 7], np.int32)
    return f, (ids[:3],), [(ids[:m],) for m in (1, 16)]


def _dynamic_plan(pj, pnp):
    @pj.prepare(vars={"n": (1, 16), "k": (0, 8)}, shapes={"x": ("n",)}, device="cpu")
    def f(x, w, k):
        return pj.fori_loop(0, k, lambda i, acc: acc + w[i], x)
    x, w = np.arange(16, dtype=np.float32), np.arange(8, dtype=np.float32)
    return f, (x[:6], w, 3), [(x[:n], w, k) for n, k in ((1, 0), (16, 8), (5, 1))]


PLANS = {"loop": _loop_plan, "layer": _layer_plan, "gather": _gather_plan, "dynamic": _dynamic_plan}


def _node(meta, op, dtype=None):
    """The position of the first graph node of `op` (and `dtype`)."""
    return next(i for i, n in enumerate(meta["graph"]["nodes"]) if n[0] == op and dtype in (None, n[1]))


def _loop_body(meta):
    return next(k for k in meta["kernels"] if isinstance(k, dict))["loop"]


# the forgeries issue 21 reported (and a few like them): name -> (plan, edit of the metadata)
REPORTED = {
    "loop upper 6 instead of 4": ("loop", lambda m: _loop_body(m).__setitem__(2, 6)),
    "loop lower -2": ("loop", lambda m: _loop_body(m).__setitem__(1, -2)),
    "fixedvar i = 6": ("loop", lambda m: _loop_body(m)[4][0].__setitem__(2, [["i", 6]])),
    "fixedvar i = 2**36": ("loop", lambda m: _loop_body(m)[4][0].__setitem__(2, [["i", 2 ** 36]])),
    "float64 load from a float32 buffer": ("loop", lambda m: m["graph"]["nodes"][_node(m, "LOAD")].__setitem__(
        1, "float64")),
    "float64 buffer slot for a float32 load": ("loop", lambda m: [m["graph"]["nodes"][_node(m, "DEFINE_GLOBAL")]
                                                                  .__setitem__(1, "float64"),
                                                                  m["buffers"][0].__setitem__(0, "float64")]),
    "var bound 2**70": ("layer", lambda m: m["vars"][0].__setitem__(2, 2 ** 70)),
    "var node bound 2**70": ("layer", lambda m: m["graph"]["nodes"][_node(m, "DEFINE_VAR")][2].__setitem__(
        2, 2 ** 70)),
    "buffer dim a string": ("layer", lambda m: m["buffers"][-1][1].__setitem__(0, "4")),
    "buffer dim 2**62": ("layer", lambda m: m["buffers"][-1][1].__setitem__(0, 2 ** 62)),
    "fixedvar value a string": ("loop", lambda m: _loop_body(m)[4][0].__setitem__(2, [["i", "6"]])),
    "loop bound a float": ("loop", lambda m: _loop_body(m).__setitem__(2, 4.5)),
    "constraint a float": ("layer", lambda m: m["constraints"][0].__setitem__(0, 1.5)),
    "flag on a float buffer": ("gather", lambda m: m["flags"][0].__setitem__(0, m["outputs"][0])),
    "node arg 2**80": ("layer", lambda m: m["graph"]["nodes"][_node(m, "CONST", "int64")].__setitem__(2, 2 ** 80)),
    "shape expression an op": ("layer", lambda m: m["graph"]["nodes"][_node(m, "CONST", "int64")].__setitem__(
        2, {"op": "ADD"})),
    "native loop bound past its var": ("dynamic", lambda m: m["graph"]["nodes"][_node(m, "DEFINE_VAR")][2]
                                       .__setitem__(2, 10 ** 6)),
}


# ---- mutations of any JSON value ----
INTS = [0, 1, -1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 17, 64, 2 ** 31, 2 ** 36, 2 ** 63 - 1, 2 ** 63, 2 ** 64, -2 ** 63 - 1,
        10 ** 30]
STRS = ["", "n", "i", "pos", "k", "m", "x", "float64", "float32", "int64", "bool", "uint8", "LOAD", "STORE", "ADD",
        "DEFINE_VAR", "DEFINE_GLOBAL", "RANGE", "loop", "reduce", "lane", "cpu", "array", "leaf"]
OTHERS = [None, True, False, 1.5, "x", [], {}, [0], {"u": 0}, {"f": "0x1p+0"}, {"t": []}, [[0]], -0.0]


def _paths(value, path=()):
    """Every position in a JSON value (containers and leaves), as key paths."""
    yield path
    if isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, path + (i,))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, path + (k,))


def _mutated(value, rng: random.Random):
    if isinstance(value, bool) or rng.random() < 0.15:
        return rng.choice(OTHERS + INTS[:6] + STRS[:6])
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, value * 2, value + rng.randint(2, 40), -value, rng.choice(INTS)])
    if isinstance(value, str):
        return rng.choice(STRS + [value + "_", value.upper()])
    if isinstance(value, list) and value:
        out, i = list(value), rng.randrange(len(value))
        how = rng.randrange(4)
        if how == 0:
            out.pop(i)
        elif how == 1:
            out.insert(i, copy.deepcopy(out[i]))
        elif how == 2:
            out[i], out[-1] = out[-1], out[i]
        else:
            out.append(rng.choice(INTS[:8]))
        return out
    if isinstance(value, dict) and value:
        out = dict(value)
        if rng.random() < 0.5:
            out.pop(rng.choice(list(out)))
        else:
            out[rng.choice(STRS)] = rng.choice(INTS[:8])
        return out
    return rng.choice(OTHERS + INTS)


def forge(meta: dict, rng: random.Random) -> tuple[dict, str]:
    """`meta` with one position changed (half the time one inside the UOp graph) and a description of it."""
    meta = copy.deepcopy(meta)
    paths = [p for p in _paths(meta) if p and p[0] != "codes" or p[:1] == ("codes",) and len(p) <= 4]
    graph = [p for p in paths if p[:2] == ("graph", "nodes") and len(p) >= 3]
    path = rng.choice(graph if graph and rng.random() < 0.5 else paths)
    parent = meta
    for k in path[:-1]:
        parent = parent[k]
    new = _mutated(parent[path[-1]], rng)
    parent[path[-1]] = new
    return meta, f"{'/'.join(map(str, path))} = {json.dumps(new)[:60]}"


# ---- the worker ----
def _guard_every_buffer():
    """Every plan buffer and output of this process ends at a guard page (64-byte rounded: kernels may align)."""
    from prepjit.runtime import buffer, cpu
    from tests.guard_pages import guarded
    buffer.aligned_empty = lambda nbytes: guarded(np.empty(-(-max(nbytes, 1) // 64) * 64, np.uint8))
    cpu.empty = lambda shape, dtype: guarded(np.empty(shape, dtype))


def worker(plan: str, cases: list):
    """Build `plan`, then load each forgery of it with recompile=True and call it on guarded arguments; print
    'case i: refused | ran | wrong ...' for each (a crash leaves a case started and not finished)."""
    import prepjit as pj
    import prepjit.numpy as pnp
    from prepjit.runtime import datafile
    from prepjit.jit.saved import KIND, VERSION
    from tests.guard_pages import guarded

    f, save_args, calls = PLANS[plan](pj, pnp)
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "plan.pjplan")
    f.save(path, *save_args)
    meta, payload = datafile.unpack(open(path, "rb").read(), KIND, VERSION)
    _guard_every_buffer()
    for case in cases:
        if isinstance(case, str):
            forged, what = copy.deepcopy(meta), case
            REPORTED[case][1](forged)
        else:
            forged, what = forge(meta, random.Random(case))
        print(f"start {case!r} {what}", flush=True)
        with open(path, "wb") as out:
            out.write(datafile.pack(KIND, VERSION, forged, payload))
        try:
            g = pj.load(path, recompile=True)
        except pj.PlanFileError:
            print(f"case {case!r}: refused", flush=True)
            continue
        except Exception as e:  # noqa: BLE001 - the outcome under test
            print(f"case {case!r}: wrong {type(e).__name__} at load: {str(e)[:200]!r}", flush=True)
            continue
        outcome = "ran"
        for args in calls:
            args = tuple(guarded(a) if isinstance(a, np.ndarray) else a for a in args)
            try:
                out = g(*args)
                [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]
            except pj.PrepjitError:
                pass
            except Exception as e:  # noqa: BLE001
                outcome = f"wrong {type(e).__name__} in a call: {str(e)[:200]!r}"
        print(f"case {case!r}: {outcome}", flush=True)


def run_cases(plan: str, cases: list, timeout: float = 900) -> dict:
    """{case: outcome} for `cases` of `plan`, run in workers; a case whose worker died is 'crashed (signal)', and
    a new worker takes the cases after it."""
    results, left = {}, list(cases)
    while left:
        proc = subprocess.run([sys.executable, "-m", "tests.test_plan_file_forgery", plan, json.dumps(left)],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, "PREPJIT_CACHE": "0"})
        started = None
        for line in proc.stdout.splitlines():
            if line.startswith("start "):
                started = line
            elif line.startswith("case "):
                key, outcome = line[5:].split(": ", 1)
                results[json.loads(key.replace("'", '"'))] = outcome
                started = None
        if proc.returncode == 0:
            break
        if started is None:
            raise AssertionError(f"the worker failed outside a case:\n{proc.stderr[-3000:]}")
        crashed = left[len([c for c in left if c in results])]
        results[crashed] = f"crashed ({proc.returncode}): {started} {proc.stderr[-300:]!r}"
        left = left[left.index(crashed) + 1:]
    return results


def _failures(results: dict) -> list:
    return [f"{case}: {outcome}" for case, outcome in results.items() if outcome not in ("refused", "ran")]


@pytest.mark.parametrize("plan", sorted({p for p, _ in REPORTED.values()}))
def test_reported_forgeries_are_refused(plan):
    cases = [name for name, (p, _) in REPORTED.items() if p == plan]
    results = run_cases(plan, cases)
    assert results == {name: "refused" for name in cases}, results


def _fuzz(plan: str, count: int, seed: int):
    results = run_cases(plan, list(range(seed, seed + count)))
    counts = {k: sum(o.startswith(k) for o in results.values()) for k in ("refused", "ran", "wrong", "crashed")}
    print(f"forgery fuzz {plan}: {count} cases {counts}")
    assert not _failures(results), "\n".join(_failures(results)[:20])
    return counts


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_forged_fields_never_crash_or_leak_builtin_errors(plan):
    _fuzz(plan, int(os.environ.get("PREPJIT_FORGERY_CASES", "60")), seed=1000)


@pytest.mark.fuzz
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_forgery_fuzz_large(plan):
    _fuzz(plan, int(os.environ.get("PREPJIT_FORGERY_CASES_LARGE", "1000")),
          seed=int(os.environ.get("PREPJIT_FORGERY_SEED", "100000")))


if __name__ == "__main__":
    worker(sys.argv[1], json.loads(sys.argv[2]))
