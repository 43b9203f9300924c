"""Selects between the same reads of different buffers rendered as one read of the selected buffer
(codegen/buffer_select.py, render_llvm)."""
import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.buffer_select import with_buffer_selects
from prepjit.codegen.lower import REALIZED, lower_kernel
from prepjit.codegen.render_llvm import render_llvm
from prepjit.uop import Ops

ROWS = [np.arange(12, dtype=np.float32).reshape(3, 4) * (k + 1) - 7 for k in range(6)]


def kernel_of(fn, *args):
    traced = pj.trace(pj.prepare(fn), *args)
    return lower_kernel(traced.outputs[0], lambda n: n.op in REALIZED)[0]


def stacked(*rows):
    return pnp.stack([pnp.sqrt(pnp.abs(r)) * 2 + r for r in rows])


def reads(ast):
    return [u for u in ast.toposort() if u.op is Ops.LOAD]


def test_a_stack_reads_one_piece_of_selected_buffers():
    ast = kernel_of(stacked, *ROWS)
    assert len(reads(ast)) == len(ROWS)
    selected = with_buffer_selects(ast)
    (read,) = reads(selected)
    assert read.src[0].op is Ops.WHERE
    assert {u.arg for u in read.src[0].toposort() if u.op is Ops.DEFINE_GLOBAL} == set(range(1, len(ROWS) + 1))
    source = render_llvm(ast).source
    assert source.count("load float") == 1 and source.count("select i1") == len(ROWS) - 1


def test_a_stack_of_selected_buffers_runs_exactly():
    rows = [r.copy() for r in ROWS]
    rows[3][2, 1] = -0.0
    out = np.asarray(pj.prepare(stacked)(*rows))
    want = np.stack([np.sqrt(np.abs(r)) * np.float32(2) + r for r in rows])
    np.testing.assert_array_equal(out, want)


def test_a_select_along_the_innermost_index_keeps_both_reads():
    """A condition on the innermost index would make the row's contiguous reads a gather: left as it is."""
    fn = lambda a, b: pnp.where(pnp.arange(4) < 2, a * 3, b * 3)   # noqa: E731
    ast = kernel_of(fn, *ROWS[:2])
    assert with_buffer_selects(ast) is ast
    np.testing.assert_array_equal(np.asarray(pj.prepare(fn)(*ROWS[:2])),
                                  np.where(np.arange(4) < 2, ROWS[0] * 3, ROWS[1] * 3))


def test_pieces_reading_other_indices_keep_their_reads():
    fn = lambda a, b: pnp.stack([a, b[::-1]])   # noqa: E731
    ast = kernel_of(fn, *ROWS[:2])
    assert with_buffer_selects(ast) is ast
