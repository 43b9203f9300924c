"""read_axes.walk_order: the memoised walks of the kernels reading a residual stream yield what the plain
depth-first walk (reads_with_axes) yields, in its order (fusion's _Stream breaks ties by it), expanding the
stream once for all its readers."""
import functools
from collections import Counter

import numpy as np

import prepjit as pj
from prepjit.codegen.fusion import _loads, kernel_roots
from prepjit.codegen.lower import REALIZED
from prepjit.codegen import read_axes


def _stream(x, ws):
    for w in ws:   # a residual stream: each block's projection of the normalised stream added to it
        x = x + (x * (x * x).mean(axis=-1, keepdims=True)) @ w
    return x.sum(axis=-1)


def _walks(blocks):
    rng = np.random.default_rng(0)
    ws = [rng.random((8, 8), np.float32) for _ in range(blocks)]
    graph, roots = kernel_roots(list(pj.trace(lambda x, *ws: _stream(x, ws), rng.random((3, 8), np.float32),
                                              *ws).outputs))
    shared = {n for n, k in Counter(s for node in graph for s in set(node.src)).items()
              if k > 1 and n.op not in REALIZED}
    return roots, functools.partial(_loads, memo={}, shared=shared)


def test_shared_walks_keep_the_plain_walks_order():
    roots, loads = _walks(6)
    for r in roots:
        plain = {}
        for n, axes in read_axes.reads_with_axes(r, lambda n: n.op in REALIZED):
            plain.setdefault(n, set()).add(axes)
        got = loads(r)
        assert list(got) == list(plain) and got == plain
    assert any(len(loads(r)) > 6 for r in roots)   # (some reader walks the stream through every block)


def test_the_readers_walks_grow_linearly_with_the_blocks(monkeypatch):
    expanded = Counter()
    walk = read_axes.walk_order

    def counted(tops, expand, shared, memo):
        def count(item):
            expanded["memoised"] += 1
            return expand(item)
        return walk(tops, count, shared, memo)
    monkeypatch.setattr("prepjit.codegen.fusion.walk_order", counted)
    for blocks in (8, 24):
        roots, loads = _walks(blocks)
        for r in roots:
            loads(r)
            expanded[blocks, "plain"] += sum(1 for _ in read_axes.reads_with_axes(r, lambda n: expanded.update(
                [(blocks, "plain")]) or n.op in REALIZED))
        expanded[blocks], expanded["memoised"] = expanded["memoised"], 0
    assert expanded[24] < 3.3 * expanded[8], expanded   # three times the blocks, three times the walk
    assert expanded[24, "plain"] > 5 * expanded[8, "plain"], expanded   # (the plain walks: growing as the square)
