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
