"""The concrete key of container arguments (prepjit/jit/containers.py): a reader compiled for a structure finds
what the walk finds in any tree of that structure, refuses any other tree, and keeps none of a tree's objects."""
import gc
import os
import weakref

import numpy as np
import pytest

import prepjit as pj
from prepjit.jit.containers import ContainerKeys, compile_reader, walk
from tests.test_replay import _arrays, _trees


def _changed(tree, rng):
    """`tree` with one random change: a leaf swapped, reshaped, of another dtype or class, a key added, renamed or
    reordered, an item dropped or added, a list for a tuple; or unchanged."""
    def containers(t, out):
        if isinstance(t, (dict, list, tuple)):
            out.append(t)
            for v in (t.values() if isinstance(t, dict) else t):
                containers(v, out)
        return out

    def rebuilt(t, target, change):
        if t is target:
            return change(t)
        if isinstance(t, dict):
            return {k: rebuilt(v, target, change) for k, v in t.items()}
        if isinstance(t, (list, tuple)):
            return type(t)(rebuilt(v, target, change) for v in t)
        return t

    def leaf_change(v):
        options = [lambda a: a.copy(), lambda a: a.astype(np.float64), lambda a: a.reshape(-1, 1),
                   lambda a: np.stack([a, a], -1)[..., 0], lambda a: a.view(np.recarray), lambda a: None,
                   lambda a: {"a": a}, lambda a: 1.5]
        return options[rng.integers(len(options))](v) if isinstance(v, np.ndarray) else np.ones(2, np.float32)

    def container_change(c):
        items = list(c.items()) if isinstance(c, dict) else list(c)
        kind = rng.integers(5)
        if kind == 0 and items:
            k = rng.integers(len(items))
            items[k] = (items[k][0], leaf_change(items[k][1])) if isinstance(c, dict) else leaf_change(items[k])
        elif kind == 1:
            items = items[:-1]
        elif kind == 2:
            items.append(("z", None) if isinstance(c, dict) else None)
        elif kind == 3:
            items = items[::-1]
        elif isinstance(c, dict) and items:
            items[0] = ("y", items[0][1])
        if isinstance(c, dict):
            return dict(items)
        return list(items) if kind == 4 else type(c)(items)

    found = containers(tree, [])
    if not found or rng.integers(4) == 0:
        return tree
    return rebuilt(tree, found[rng.integers(len(found))], container_change)


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(x is y for x, y in zip(a[1], b[1]))


def test_a_reader_finds_what_the_walk_finds_or_refuses():
    """On random trees and random changes of them, a reader compiled for the first tree's structure returns what
    the walk returns for the changed tree (the same structure, the same arrays in the same order), or None; for a tree
    of the same structure never None."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=int(os.environ.get("PREPJIT_FUZZ_TREES", "200")), deadline=None,
              suppress_health_check=[HealthCheck.too_slow], derandomize="PREPJIT_FUZZ_TREES" not in os.environ)
    @given(st.one_of(st.lists(_trees(_arrays())), st.dictionaries(st.sampled_from("abc"), _trees(_arrays()))),
           st.integers(0, 2 ** 32 - 1))
    def check(tree, seed):
        first = walk(tree)
        assert first is not None
        read = compile_reader(first[0])
        assert _same(read(tree), first)
        rng = np.random.default_rng(seed)
        for _ in range(4):
            changed = _changed(tree, rng)
            got, walked = read(changed), walk(changed)
            if walked is not None and walked[0] == first[0]:
                assert _same(got, walked)
            else:
                assert got is None
    check()


def test_a_position_compiles_its_reader_after_two_walks_and_keeps_no_tree_alive():
    keys = ContainerKeys()
    layer = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    tree = {"layers": [layer, dict(layer)], "scale": (np.float32(2) * np.ones(3, np.float32), None)}
    watched = weakref.ref(layer["w"])
    walked = keys(tree)
    assert keys.reader is None and keys(tree)[0] == walked[0] and keys.reader is not None
    reader = keys.reader
    assert keys(tree)[0] is reader(tree)[0]  # the reader's structure: compared by identity in the key
    assert keys({**tree, "scale": 1.0}) is None and keys.reader is reader   # no key part: the reader stays
    other = {**tree, "layers": tree["layers"][:1]}
    assert keys(other)[0] != walked[0] and keys(tree)[0] == walked[0] and keys.reader is reader
    del tree, layer, walked, other
    gc.collect()
    assert watched() is None


@pytest.mark.parametrize("arrays", ["numpy", "pj"])
def test_a_tree_changed_in_place_after_the_reader_replays_its_own_leaves(arrays, rng):
    """Calls through a prepared function after its reader is compiled: a leaf swapped, reshaped or retyped in
    place, a key added, a layer dropped; each call returns what NumPy computes from its own leaves."""
    def fn(params, x):
        return sum((x * layer["w"]).sum() + layer["b"] for layer in params["layers"]) * params["scale"]

    f = pj.prepare(fn)
    wrap = (lambda a: a) if arrays == "numpy" else pj.prepare(lambda a: a * 1)  # pj.Arrays on the cpu
    params = {"layers": [{"w": wrap(rng.standard_normal(4).astype(np.float32)), "b": wrap(np.full((), k, np.float32))}
                         for k in range(3)], "scale": wrap(np.full((), 2, np.float32))}
    x = rng.standard_normal(4).astype(np.float32)

    def check():
        want = fn({"layers": [{k: np.asarray(v) for k, v in lp.items()} for lp in params["layers"]],
                   "scale": np.asarray(params["scale"])}, x)
        np.testing.assert_allclose(np.asarray(f(params, x)), want, rtol=1e-5, atol=1e-5)
    for _ in range(3):
        check()
    params["layers"][1]["w"] = wrap(rng.standard_normal(4).astype(np.float32))
    check()
    if arrays == "numpy":
        params["layers"][0]["w"].shape = (1, 4)
        check()
        params["layers"][0]["w"].shape = (4,)
        params["layers"][2]["b"] = params["layers"][2]["b"].astype(np.float64)
        check()
    params["layers"][1]["extra"] = None
    check()
    params["layers"].pop()
    check()
    check()
