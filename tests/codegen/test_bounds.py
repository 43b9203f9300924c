"""The bounds proof on hand-built kernels: in-bounds accesses are counted, one that may leave its buffer is refused."""
import pytest

import prepjit as pj
from prepjit.codegen.bounds import prove_kernel
from prepjit.uop import Ops, UOp, dtypes, simplify

n = UOp.variable("n", 0, 8)
pos = UOp.variable("pos", 0, 10)


def kernel(index, gate=None, out_index=None, name="E_test"):
    """out[r] = buf1[index] (a load gated on `gate`), over r in range(n)."""
    src = (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1), index) + (() if gate is None else (gate,))
    load = UOp(Ops.LOAD, dtypes.float32, src)
    store = UOp(Ops.STORE, dtypes.bool, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0),
                                          r if out_index is None else out_index, load))
    return UOp(Ops.SINK, dtypes.bool, (store,), name)


r = UOp(Ops.RANGE, dtypes.index, (n,), (0, "loop"))


def test_accesses_inside_their_buffers_are_counted():
    assert prove_kernel(kernel(r), [(n,), (n,)]) == 2
    assert prove_kernel(kernel(simplify(n - 1 - r)), [(n,), (n,)]) == 2  # a flip, empty n included


def test_an_index_past_the_end_is_refused_with_kernel_and_index():
    with pytest.raises(pj.CompileError, match=r"E_test.*load from buffer slot 1.*r0\+1"):
        prove_kernel(kernel(simplify(r + 1)), [(n,), (n,)])
    with pytest.raises(pj.CompileError, match="may be negative"):
        prove_kernel(kernel(simplify(r - 1)), [(n,), (n,)])


def test_a_gate_restricts_where_an_index_must_be_valid():
    shifted = simplify(r - 2)
    gate = UOp(Ops.CMPLT, dtypes.bool, (UOp.const(1), r))  # r >= 2: the pad's inside
    assert prove_kernel(kernel(shifted, gate), [(n,), (n,)]) == 2
    with pytest.raises(pj.CompileError):
        prove_kernel(kernel(shifted), [(n,), (n,)])


def test_constraints_are_assumed():
    index = simplify(pos * 4 + UOp(Ops.RANGE, dtypes.index, (UOp.const(4),), (0, "loop")))
    out = UOp(Ops.RANGE, dtypes.index, (UOp.const(4),), (0, "loop"))
    k = kernel(index, out_index=out)
    with pytest.raises(pj.CompileError):
        prove_kernel(k, [(4,), (n, 4)])
    assert prove_kernel(k, [(4,), (n, 4)], [UOp(Ops.CMPLT, dtypes.bool, (pos, n))]) == 2


def sum_kernel(indices, gates=None, name="E_lanes"):
    """out[r] = sum of buf1[index] (the i-th load gated on gates[i]), over r in range(n): an upcast's lanes."""
    loads = [UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1), index)
                 + (() if gates is None or gates[i] is None else (gates[i],))) for i, index in enumerate(indices)]
    value = loads[0]
    for x in loads[1:]:
        value = UOp(Ops.ADD, dtypes.float32, (value, x))
    store = UOp(Ops.STORE, dtypes.bool, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), r, value))
    return UOp(Ops.SINK, dtypes.bool, (store,), name)


def test_lanes_at_constant_offsets_are_all_counted_and_the_last_one_checked():
    lanes = [simplify(r * 4 + c) for c in range(4)]
    assert prove_kernel(sum_kernel(lanes), [(n,), (n, 4)]) == 5
    with pytest.raises(pj.CompileError, match=r"index \(\(r0\*4\)\+4\) may reach"):  # one lane past the end: refused by name
        prove_kernel(sum_kernel(lanes + [simplify(r * 4 + 4)]), [(n,), (n, 4)])


def gathered(k):
    """buf1[ids[r + k]] (ids: int32 slot 2 of shape (n + 1,)) and the gate 0 <= ids[r + k] < n."""
    ids = UOp(Ops.LOAD, dtypes.int32, (UOp(Ops.DEFINE_GLOBAL, dtypes.int32, (), 2), simplify(r + k)))
    i = UOp(Ops.CAST, dtypes.index, (ids,))
    gate = UOp(Ops.AND, dtypes.bool, (UOp(Ops.CMPLT, dtypes.bool, (UOp.const(-1), i)),
                                      UOp(Ops.CMPLT, dtypes.bool, (i, n))))
    return i, gate


def test_gathers_share_a_proof_but_a_gate_on_another_load_does_not_count():
    (i0, g0), (i1, g1) = gathered(0), gathered(1)
    assert prove_kernel(sum_kernel([i0, i1], [g0, g1]), [(n,), (n,), (n + 1,)]) == 5
    with pytest.raises(pj.CompileError, match="load from buffer slot 1"):  # ids[r + 1] checked, ids[r] read
        prove_kernel(sum_kernel([i0, i1], [g1, g1]), [(n,), (n,), (n + 1,)])


def test_quotients_by_a_multiple_of_a_var_are_bounded():
    """x.transpose(1, 2, 0).reshape(-1) on x of shape (n, 2, 2): the read index (r // 2n) * 2 + (r % n) * 4 +
    (r // n) % 2 over r < 4n needs (4n - 1) // 2n == 1 (it was refused: only divisors that are a factor counted)."""
    r4 = UOp(Ops.RANGE, dtypes.index, (n * 4,), (0, "loop"))
    index = (r4 // (n * 2)) * 2 + (r4 % n) * 4 + (r4 // n) % 2
    assert prove_kernel(kernel(index, out_index=r4), [(n * 4,), (n, 2, 2)]) == 2
    with pytest.raises(pj.CompileError, match="may reach the buffer's size"):
        prove_kernel(kernel(index + 1, out_index=r4), [(n * 4,), (n, 2, 2)])


def test_a_transposed_flatten_on_a_symbolic_dim_is_proven_and_matches_numpy():
    import numpy as np
    import prepjit.numpy as pnp
    f = pj.prepare(lambda x: pnp.transpose(x, (1, 2, 0)).reshape(-1), vars={"n": (0, 6)}, shapes={"x": ("n", 2, 2)})
    for size in (0, 1, 3, 6):
        x = np.arange(size * 4, dtype=np.float32).reshape(size, 2, 2)
        np.testing.assert_array_equal(np.asarray(f(x)), np.transpose(x, (1, 2, 0)).reshape(-1))
    assert f.stats["traces"] == 1


def test_an_upper_bound_on_a_quotient_bounds_its_dividend():
    """repeat(concatenate([repeat(x, 2)] * 2), 2): out[r] reads x[r // 4] under the gate r // 2 < 2n (the
    concatenation's first half); x // 2 <= 2n - 1 gives x <= 4n - 1, so x // 4 <= n - 1."""
    r8 = UOp(Ops.RANGE, dtypes.index, (n * 8,), (0, "loop"))
    gate = r8 // 2 < n * 2
    assert prove_kernel(kernel(r8 // 4, gate=gate, out_index=r8), [(n * 8,), (n,)]) == 2
    with pytest.raises(pj.CompileError, match="may reach the buffer's size"):
        prove_kernel(kernel(r8 // 4, gate=r8 // 2 < n * 2 + 1, out_index=r8), [(n * 8,), (n,)])


def test_a_range_shared_by_several_terms_is_bounded_as_one_factor():
    """x[1:].T on x of shape (n, 2): the store index r0 * max(n - 1, 0) + r1 becomes n*r0 - r0 + r1 in the case
    n >= 1; bounding n*r0 and -r0 apart loses that they share r0 (it was refused)."""
    m = (n - 1).smax(0)
    r0 = UOp(Ops.RANGE, dtypes.index, (UOp.const(2),), (0, "loop"))
    r1 = UOp(Ops.RANGE, dtypes.index, (m,), (1, "loop"))
    load = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1), r1 * 2 + r0 + 2))
    store = UOp(Ops.STORE, dtypes.bool, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), r0 * m + r1, load))
    ast = UOp(Ops.SINK, dtypes.bool, (store,), "E_test")
    assert prove_kernel(ast, [(2, m), (n, 2)]) == 2
    with pytest.raises(pj.CompileError, match="store to buffer slot 0"):
        prove_kernel(ast, [(2, simplify(m - 1)), (n, 2)])


def test_lanes_inside_a_min_are_proven_at_once_and_a_bad_lane_alone(monkeypatch):
    """An upcast's lanes n * min(8*r + k, n - 1), k = 0..7, have one proof with k a var over 0..7; a lane
    that may leave the buffer (min(8*r, n): reaches n * n) fails that proof and is then refused by name."""
    from prepjit.codegen import bounds
    calls = []
    in_bounds = bounds._Prover.in_bounds
    monkeypatch.setattr(bounds._Prover, "in_bounds",
                        lambda self, *a, **k: calls.append(a[0]) or in_bounds(self, *a, **k))
    lanes = [simplify(n * UOp(Ops.MIN, dtypes.index, (simplify(r * 8 + k), simplify(n - 1))) + r) for k in range(8)]
    assert prove_kernel(sum_kernel(lanes), [(n,), (n, n)]) == 9
    mins = [e.render() for e in calls if "min(" in e.render()]
    assert len(mins) == 1 and "lane." in mins[0]  # the lanes at once (simplify folds lane 7 to n - 1 on its own)
    bad = simplify(n * UOp(Ops.MIN, dtypes.index, (simplify(r * 8), n)) + r)
    with pytest.raises(pj.CompileError, match=r"min\(\(r0\*8\), n\)"):
        prove_kernel(sum_kernel(lanes + [bad]), [(n,), (n, n)])


def test_accesses_inside_their_buffers_by_interval_bounds_need_no_proof(monkeypatch):
    """An index whose interval bounds lie in the buffer (a gather clamped into its dim, a static range's index) is
    proven without the prover's bounds and facts; one that may leave it still goes to the prover and is refused."""
    from prepjit.codegen import bounds
    calls = []
    in_bounds = bounds._Prover.in_bounds
    monkeypatch.setattr(bounds._Prover, "in_bounds",
                        lambda self, *a, **k: calls.append(a[0]) or in_bounds(self, *a, **k))
    i = UOp(Ops.RANGE, dtypes.index, (UOp.const(4),), (0, "loop"))
    ids = UOp(Ops.LOAD, dtypes.int64, (UOp(Ops.DEFINE_GLOBAL, dtypes.int64, (), 2), i))
    at = UOp(Ops.CAST, dtypes.index, (ids,))
    clamped = UOp(Ops.MIN, dtypes.index, (UOp(Ops.MAX, dtypes.index, (at, UOp.const(0))), UOp.const(7)))
    assert prove_kernel(kernel(clamped, out_index=i), [(4,), (8,), (4,)]) == 3 and calls == []
    with pytest.raises(pj.CompileError, match="load from buffer slot 1"):
        prove_kernel(kernel(UOp(Ops.MAX, dtypes.index, (at, UOp.const(0))), out_index=i), [(4,), (8,), (4,)])
    assert calls


def test_a_gate_over_several_ranges_bounds_the_index_as_a_whole():
    """x.reshape(-1)[8:] padded back to 12 and read as (3, 4): index 4*r0 + r1 + 8 under the gate 4*r0 + r1 < 4
    (each range alone allows 8 + 8 + 3)."""
    r0 = UOp(Ops.RANGE, dtypes.index, (UOp.const(3),), (0, "loop"))
    r1 = UOp(Ops.RANGE, dtypes.index, (UOp.const(4),), (1, "loop"))
    flat = simplify(r0 * 4 + r1)
    inside = UOp(Ops.CMPLT, dtypes.bool, (flat, UOp.const(4)))
    assert prove_kernel(kernel(simplify(flat + 8), inside, flat), [(12,), (12,)]) == 2
    with pytest.raises(pj.CompileError, match="may reach"):  # one past the gate's bound is still refused
        prove_kernel(kernel(simplify(flat + 9), inside, flat), [(12,), (12,)])


def test_the_padded_tail_of_a_flattened_slice_matches_numpy():
    import numpy as np
    import prepjit.numpy as pnp
    x = np.arange(12.0).reshape(3, 4)
    f = pj.prepare(lambda x: pnp.pad(x.reshape(-1)[8:] * 2, (0, 8)).reshape(3, 4) + x)
    np.testing.assert_array_equal(np.asarray(f(x)), np.pad(x.reshape(-1)[8:] * 2, (0, 8)).reshape(3, 4) + x)


def test_a_var_of_few_values_is_proven_at_each_of_them():
    """out[r] = buf1[0] over r < 2 * (min(3, k + 1) // 2): the loop is empty exactly when k = 0, where buf1 (size k)
    is empty too; no bound of k alone shows it, its values one by one do. A bad index is still refused."""
    k = UOp.variable("k", 0, 6)
    end = simplify((UOp.const(0) + k + 1).smin(3) // 2 * 2)
    loop = UOp(Ops.RANGE, dtypes.index, (end,), (0, "loop"))
    assert prove_kernel(kernel(UOp.const(0), out_index=loop), [(end,), (k,)]) == 2
    with pytest.raises(pj.CompileError, match="may reach"):
        prove_kernel(kernel(UOp.const(1), out_index=loop), [(end,), (k,)])  # k = 1 runs the loop: buf1[1] is past it
