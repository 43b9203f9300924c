"""choose_materialized on a stack of identical blocks: a residual stream's values guessed cut first, so each block's
decisions see that block alone; the guess standing only where the decisions materialise every guessed value, else
decided again as before."""
from collections import Counter

import ml_dtypes
import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import fusion
from prepjit.codegen.fusion import choose_materialized, kernel_roots
from prepjit.codegen.fusion_classes import local_classes
from prepjit.uop import Ops


def _blocks(x, ws):
    for w in ws:   # a residual stream: each block's projection of its normalised rows added to it
        x = x + (x * (1 / pnp.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6))) @ w
    return x.sum(axis=-1)


def _traced(blocks, rows=16):
    rng = np.random.default_rng(0)
    ws = [rng.random((64, 64), np.float32) for _ in range(blocks)]
    return list(pj.trace(lambda x, *ws: _blocks(x, ws), rng.random((rows, 64), np.float32), *ws).outputs)


def _graph(outputs):
    """(the graph parents first, its kernel roots, how many nodes read each node)"""
    graph, roots = kernel_roots(outputs)
    return graph, set(roots), Counter(s for n in graph for s in set(n.src))


def _plain(outputs, **options):
    """The decisions made without guessed cuts (as before them)."""
    graph, roots, readers_of = _graph(outputs)
    return fusion._decide(graph, roots, frozenset(), readers_of, options.get("row_values", False),
                          options.get("operand_prologues", False), frozenset())


def _decided(monkeypatch, outputs, **options) -> tuple[set, list]:
    calls = []
    decide = fusion._decide

    def counted(*args):
        chosen = decide(*args)
        calls.append((len(args[-1]), chosen is not None))
        return chosen
    monkeypatch.setattr(fusion, "_decide", counted)
    return choose_materialized(outputs, **options), calls



def _calls(monkeypatch, name: str) -> list:
    """The nodes fusion.<name> is called on from now (its first argument each call), in order."""
    calls, original = [], getattr(fusion, name)

    def counted(*args):
        calls.append(args[0])
        return original(*args)
    monkeypatch.setattr(fusion, name, counted)
    return calls


def _grown(calls: list) -> dict:
    """(decide, blocks) -> (the calls recorded in `calls` while `decide` decides 4 and 12 blocks, its decisions), for
    choose_materialized and the plain pass."""
    grown = {}
    for blocks in (4, 12):
        outputs = _traced(blocks, rows=16)
        for decide in (choose_materialized, _plain):
            calls.clear()
            chosen = decide(outputs, operand_prologues=True)
            grown[decide, blocks] = len(calls), chosen
    return grown

def test_a_residual_streams_guessed_cuts_stand_with_the_plain_decisions(monkeypatch):
    for rows, options in ((1, {}), (1, {"row_values": True}), (1, {"operand_prologues": True}),
                          (16, {"operand_prologues": True})):
        outputs = _traced(6, rows)
        chosen, calls = _decided(monkeypatch, outputs, **options)
        assert calls == [(5, True)], calls   # (the sums the next block reads too guessed, and materialised)
        same = chosen == _plain(outputs, **options)
        assert same   # (no sets of nodes in a failure's message: their repr walks the graph as a tree)


def test_a_blocks_stream_facts_stop_at_the_stream_below_it(monkeypatch):
    walked = Counter()
    loads = fusion._loads

    def counted(r, memo, shared, cuts=frozenset()):
        found = loads(r, memo, shared, cuts)
        walked[r] = len(found)
        return found
    monkeypatch.setattr(fusion, "_loads", counted)
    choose_materialized(_traced(8, rows=1), operand_prologues=True)
    assert walked and max(walked.values()) <= 3, sorted(walked.values())   # (a block's weight, its stream value, a
    # norm: not every block's weights below it)


def test_guessed_cuts_not_materialised_decide_again_without_them(monkeypatch):
    rng = np.random.default_rng(0)
    a, c = rng.random((4, 8), np.float32), rng.random((4, 1), np.float32)

    def f(a, c):
        s = a.sum(axis=1, keepdims=True) + c   # cheap, read by two small kernels: recomputed in each
        return s * 2, s * 3, c * 4
    outputs = list(pj.trace(f, a, c).outputs)
    chosen, calls = _decided(monkeypatch, outputs)
    assert calls == [(1, False), (0, True)], calls
    assert not chosen and not _plain(outputs)
    bias = pj.trace(lambda a, c: (lambda h: h * (h > 0))(a @ a.T + c[:, 0]), a, c).outputs   # (a bias a projection's
    # activation reads twice: no stream value, nothing guessed)
    assert _decided(monkeypatch, list(bias))[1] == [(0, True)]
    outputs = _traced(6, rows=16)   # (the lower blocks' sums, their stream short, are recomputed by their readers)
    chosen, calls = _decided(monkeypatch, outputs)
    assert calls == [(5, False), (0, True)], calls
    same = chosen == _plain(outputs)
    assert same and 0 < len(chosen & fusion._guessed_cuts(*_graph(outputs))) < 5


def test_each_block_is_decided_once(monkeypatch):
    grown = _grown(_calls(monkeypatch, "_worth_materialising"))
    for blocks in (4, 12):
        same = grown[choose_materialized, blocks][1] == grown[_plain, blocks][1]
        assert same
    counts = {k: n for k, (n, _) in grown.items()}
    assert counts[choose_materialized, 12] - counts[choose_materialized, 4] <= 8 < \
        counts[_plain, 12] - counts[_plain, 4], counts   # (a block more: its stream value's decision alone, whose
    # cost counts the stream below it)


def test_classes_tell_alike_values_from_values_reading_one_operand_twice():
    rng = np.random.default_rng(0)
    x, w1, w2 = (rng.random(8, np.float32) for _ in range(3))
    alike = pj.trace(lambda x, w1, w2: (x * w1 + 1, x * w2 + 1), x, w1, w2).outputs
    twice = pj.trace(lambda x, w1, w2: (x * w1 + w1, x * w1 + w2), x, w1, w2).outputs
    for (a, b), same in ((alike, True), (twice, False)):
        graph, _ = kernel_roots([a, b])
        classes = local_classes(graph, frozenset((a, b)))   # (a and b cut: each a region of its own)
        assert (classes.key(a) == classes.key(b)) is same


def test_a_16_bit_streams_last_value_read_through_its_widened_copy_is_guessed_too():
    rng = np.random.default_rng(0)
    ws = [rng.random((64, 64), np.float32).astype(ml_dtypes.bfloat16) for _ in range(3)]

    def normed(x):
        h = x.astype(np.float32)   # (one reader: the widened copy, which the norm reads twice)
        return h * (1 / pnp.sqrt((h * h).mean(axis=-1, keepdims=True) + 1e-6))

    def f(x, *ws):
        for w in ws:
            x = x + (normed(x).astype(ml_dtypes.bfloat16) @ w)
        return normed(x).sum(axis=-1)
    outputs = list(pj.trace(f, rng.random((1, 64), np.float32).astype(ml_dtypes.bfloat16), *ws).outputs)
    graph, roots, readers_of = _graph(outputs)
    last = next(n for n in graph if n.op is Ops.ADD and n.dtype == ml_dtypes.bfloat16)
    assert readers_of[last] == 1 and last in fusion._guessed_cuts(graph, roots, readers_of)
    for options in ({"row_values": True}, {"operand_prologues": True}):
        same = choose_materialized(outputs, **options) == _plain(outputs, **options)
        assert same


def test_alike_blocks_costs_are_computed_once(monkeypatch):
    grown = {k: n for k, (n, _) in _grown(_calls(monkeypatch, "_expression")).items()}
    memo, plain = (grown[decide, 12] - grown[decide, 4] for decide in (choose_materialized, _plain))
    assert 0 < 4 * memo < plain, grown   # (a block's stream value and what its cost reads, not every node of it)
