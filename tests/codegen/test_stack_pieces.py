"""A stack's pieces specialised to their one index (codegen/stack_pieces.py): reads ungated, values exact."""
import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.lower import REALIZED, lower_kernel
from prepjit.uop import Ops

ROWS = [np.arange(12, dtype=np.float32).reshape(3, 4) * (k + 1) - 7 for k in range(5)]


def kernel_of(fn, *args):
    traced = pj.trace(pj.prepare(fn), *args)
    ast, _ = lower_kernel(traced.outputs[0], lambda n: n.op in REALIZED)
    return ast


def gated_loads(ast):
    return [u for u in ast.toposort() if u.op is Ops.LOAD and len(u.src) > 2]


def rotated(x):
    return pnp.concatenate([-x[..., 2:], x[..., :2]], axis=-1)


def stacked(*rows):
    return pnp.stack([rotated(r) * 2 + r for r in rows])


def test_a_stack_of_rows_reads_each_piece_ungated():
    """Each piece of a stack along the outer axis is read at its one index: its position gates fold away (the
    rotation's split of the last axis, wider than one value, keeps its gates)."""
    ast = kernel_of(stacked, *ROWS)
    position_gated = [u for u in gated_loads(ast) if any(r.op is Ops.RANGE and r.arg[0] == 0
                                                         for r in u.src[2].toposort())]
    assert position_gated == []
    assert len(gated_loads(ast)) == 2 * len(ROWS)   # the rotation's two halves of each piece


def test_a_stack_runs_exactly():
    rows = [r.copy() for r in ROWS]
    rows[2][1, 3] = -0.0
    out = np.asarray(pj.prepare(stacked)(*rows))
    want = np.stack([np.concatenate([-r[..., 2:], r[..., :2]], axis=-1) * 2 + r for r in rows])
    np.testing.assert_array_equal(out, want)
    assert np.signbit(out[2, 1, 1]) == np.signbit(want[2, 1, 1])


def test_wider_pieces_keep_their_gates():
    """A concatenation of pieces two rows tall along the outer axis is not specialised: a read ungated over its
    segment would run at the other rows too."""
    pair = [r[:2] for r in ROWS[:3]]
    fn = lambda a, b, c: pnp.concatenate([a * 2, b * 3, c * 4])   # noqa: E731
    ast = kernel_of(fn, *pair)
    assert len(gated_loads(ast)) == 3
    np.testing.assert_array_equal(np.asarray(pj.prepare(fn)(*pair)), np.concatenate([pair[0] * 2, pair[1] * 3,
                                                                                     pair[2] * 4]))


def test_a_stack_on_an_inner_axis():
    fn = lambda a, b, c: pnp.stack([a + 1, b * 2, c - 3], axis=1)   # noqa: E731
    ast = kernel_of(fn, *ROWS[:3])
    assert gated_loads(ast) == []
    np.testing.assert_array_equal(np.asarray(pj.prepare(fn)(*ROWS[:3])),
                                  np.stack([ROWS[0] + 1, ROWS[1] * 2, ROWS[2] - 3], axis=1))
