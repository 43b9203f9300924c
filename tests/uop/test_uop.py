"""UOp: hash-consing (equal nodes are one object), walking, substitution and printing."""
import gc
import pickle
import weakref

from prepjit.uop import Ops, UOp, dtypes, render_python
from prepjit.uop.uop import KEPT_WALK
from prepjit.uop.printer import format_graph


def test_equal_nodes_are_the_same_object():
    a = UOp(Ops.ADD, dtypes.index, (UOp.const(1), UOp.variable("n", 0, 9)))
    b = UOp(Ops.ADD, dtypes.index, (UOp.const(1), UOp.variable("n", 0, 9)))
    assert a is b
    assert hash(a) == hash(b)


def test_different_fields_give_different_nodes():
    n = UOp.variable("n", 0, 9)
    assert UOp.variable("n", 0, 8) is not n
    assert UOp.const(1, dtypes.int32) is not UOp.const(1, dtypes.int64)
    assert UOp(Ops.NEG, dtypes.index, (n,)) is not UOp(Ops.ABS, dtypes.index, (n,))


def test_args_equal_under_eq_stay_distinct():
    assert UOp.const(0.0, dtypes.float32) is not UOp.const(-0.0, dtypes.float32)
    assert UOp(Ops.CONST, dtypes.index, (), 1) is not UOp(Ops.CONST, dtypes.index, (), True)


def test_cache_does_not_keep_dead_nodes():
    def alive():
        return sum(1 for key in list(UOp._cache.keys()) if key[0] is Ops.DEFINE_VAR and key[3][0] == "tmp_dead")
    nodes = [UOp.variable("tmp_dead", 0, i) for i in range(200)]
    assert alive() == 200
    del nodes
    gc.collect()
    assert alive() == 0


def test_pickle_round_trip_is_identity():
    e = UOp.variable("n", 1, 8) * 4 + 3
    assert pickle.loads(pickle.dumps(e)) is e


def test_toposort_children_first_and_once():
    n = UOp.variable("n", 1, 8)
    e = UOp(Ops.ADD, dtypes.index, (n, UOp(Ops.MUL, dtypes.index, (n, n))))
    order = e.toposort()
    assert order[-1] is e
    assert order.count(n) == 1
    for i, node in enumerate(order):
        assert all(order.index(s) < i for s in node.src)


def test_toposort_kept_is_the_callers_to_change_and_keeps_no_cycle():
    n = UOp.variable("topo_kept", 1, 8)
    e = UOp(Ops.ADD, dtypes.index, (n, UOp(Ops.MUL, dtypes.index, (n, UOp.const(3)))))
    first = e.toposort()
    first.append(n)
    first.reverse()
    again = e.toposort()
    assert again is not first and again[-1] is e and len(again) == 4 and again[0] is n
    chain = n
    for k in range(KEPT_WALK):
        chain = UOp(Ops.ADD, dtypes.index, (chain, UOp.const(k)))
    assert len(chain.toposort()) == 2 * KEPT_WALK + 1 and "_below" not in chain.__dict__  # (too large to keep)
    assert "_below" in e.__dict__
    was_on = gc.isenabled()
    gc.disable()  # a node whose kept walk held the node itself would live on until the collector ran
    try:
        alive = weakref.ref(e)
        del e, first, again
        assert alive() is None
    finally:
        if was_on:
            gc.enable()


def test_variables_sorted_by_name_and_substitute():
    b, a = UOp.variable("b", 0, 5), UOp.variable("a", 0, 5)
    e = b * 2 + a
    assert [v.arg[0] for v in e.variables()] == ["a", "b"]
    from prepjit.uop import simplify
    assert simplify(e.substitute({a: UOp.const(1), b: UOp.const(2)})).arg == 5


def test_render_and_render_python():
    n = UOp.variable("n", 1, 8)
    e = n * 4 + 3
    assert "n" in e.render()
    assert eval(render_python(e), {}, {"v": {"n": 5}}) == 23


def test_format_graph_lists_every_node():
    n = UOp.variable("n", 1, 8)
    e = UOp(Ops.SINK, dtypes.bool, (n + 1,))
    text = format_graph(e)
    assert len(text.splitlines()) == len(e.toposort())
    assert "DEFINE_VAR" in text and "n in [1, 8]" in text


def test_threads_building_the_same_nodes_get_one_object():
    import sys
    import threading
    results = [[] for _ in range(4)]

    def build(out):
        for i in range(3000):
            out.append(UOp(Ops.ADD, dtypes.index, (UOp.variable("thr", 0, 9), UOp.const(i))))
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=build, args=(r,)) for r in results]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert all(a is b for r in results[1:] for a, b in zip(results[0], r))


def test_shapes_operators_and_bounds_import_nothing_per_call(monkeypatch):
    """symbolic.py and shape.py are read as module attributes once imported: an import statement in UOp.shape, the
    operators or the bounds costs ~2 us a call, and a model's first call makes tens of thousands."""
    import builtins
    n = UOp.variable("n", 1, 9)
    assert ((n * 3 + 2).vmax, UOp(Ops.CONST, dtypes.float32, (), 1.0).shape) == (29, ())
    imports, real = [], builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda *a, **k: imports.append(a[0]) or real(*a, **k))
    m = UOp.variable("m", 2, 5)
    x = UOp(Ops.ADD, dtypes.index, (m * 5, n))
    assert (x.vmin, x.vmax, (m + 7).vmax, UOp(Ops.CONST, dtypes.float32, (), 2.0).shape) == (11, 34, 12, ())
    assert imports == []
