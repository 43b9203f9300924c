"""Selects between the same reads of different buffers made one read of a select of buffers by the targets' passes
(codegen/buffer_select.py: BUFFER_SELECT), proven inside each of its buffers and rendered as a select of pointers
(render_llvm, render_c)."""
import re

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.bounds import prove_kernel
from prepjit.codegen.buffer_select import with_buffer_selects
from prepjit.codegen.lower import REALIZED, lower_kernel
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.targets import CUDA_TARGET, LLVM, OPENCL_TARGET
from prepjit.errors import CompileError
from prepjit.uop import Ops
from prepjit.uop.ops import buffers_of

from . import cuda_emulation

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
    assert read.src[0].op is Ops.BUFFER_SELECT
    assert [b.arg for b in buffers_of(read.src[0])] == list(range(1, len(ROWS) + 1))
    assert render_llvm(ast).source.count("load float") == len(ROWS)  # the renderer renders the AST it is given
    source = render_llvm(LLVM.launched(ast)).source
    assert source.count("load float") == 1 and source.count("select i1") == len(ROWS) - 1


def test_the_prepared_kernel_is_the_select_of_buffers_it_runs():
    """The cpu target's passes make the select (the kernel as launched: PreparedKernel.ast), not its renderer."""
    plan = pj.prepare(stacked, device="cpu").plan(*ROWS)
    (pk,) = [k for k in plan.kernels if any(u.op is Ops.BUFFER_SELECT for u in k.ast.toposort())]
    (read,) = reads(pk.ast)
    assert [b.arg for b in buffers_of(read.src[0])] == list(range(1, len(ROWS) + 1))
    assert pk.kernel.source.count("select i1") == len(ROWS) - 1


def test_the_proof_checks_a_selected_read_inside_every_buffer_it_selects():
    """Each piece is 12 elements; with any one of them 9 long the selected read may leave it: refused, naming it."""
    launched = LLVM.launched(kernel_of(stacked, *ROWS))
    assert any(u.op is Ops.BUFFER_SELECT for u in launched.toposort())
    shapes = [(len(ROWS), 3, 4)] + [(3, 4)] * len(ROWS)
    assert prove_kernel(launched, shapes) == prove_kernel(kernel_of(stacked, *ROWS), shapes) == len(ROWS) + 1
    for slot in range(1, len(ROWS) + 1):
        short = shapes[:slot] + [(3, 3)] + shapes[slot + 1:]
        with pytest.raises(CompileError, match=f"load from buffer slot {slot} "):
            prove_kernel(launched, short)


def test_writing_over_a_donated_piece_sees_the_selected_read():
    """A plan writes a result over a donated input only where every read of it is at the written element: a read
    through a select of buffers reads each of them (here rows 2, 3 read the donated rows 1, 0, which rows 0, 1 would
    have overwritten), so the result gets memory of its own and is right."""
    fn = lambda a, b: pnp.where(pnp.arange(4)[:, None] < 2, b[::-1] * 2, a[::-1] * 2)   # noqa: E731
    out, in_place, (a, b) = _called_with_a_donated(fn)
    assert not in_place
    np.testing.assert_array_equal(np.asarray(out), np.where(np.arange(4)[:, None] < 2, b[::-1] * 2, a[::-1] * 2))


def test_a_selected_read_at_the_written_element_writes_over_the_donated_piece():
    """Every read of the donated `a` is at the element written: the result is written over it in place."""
    fn = lambda a, b: pnp.where(pnp.arange(4)[:, None] < 2, a, b)   # noqa: E731
    out, in_place, (a, b) = _called_with_a_donated(fn)
    assert in_place
    np.testing.assert_array_equal(np.asarray(out), np.where(np.arange(4)[:, None] < 2, a, b))


def _called_with_a_donated(fn):
    """fn(a, b) prepared on the cpu with `a` donated (a plan output's memory), its kernel reading through a select of
    buffers -> (the result, whether it was written in a's memory, (a, b) as NumPy arrays)."""
    a, b = np.arange(12, dtype=np.float32).reshape(4, 3), np.arange(12, 24, dtype=np.float32).reshape(4, 3)
    f = pj.prepare(fn, donate_argnums=0, device="cpu")
    assert any(u.op is Ops.BUFFER_SELECT for k in f.plan(a, b).kernels for u in k.ast.toposort())
    donated = pj.prepare(lambda x: x * 1, device="cpu")(a)
    memory = id(donated.buffer)
    out = f(donated, b)
    return out, id(out.buffer) == memory, (a, b)


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


@pytest.mark.parametrize("target", [OPENCL_TARGET, CUDA_TARGET], ids=["opencl", "cuda"])
def test_a_work_group_target_reads_one_piece_through_a_select_of_pointers(target):
    """On a GPU a stack's work-item read every piece's buffers and kept one of the values; launched, it reads its own
    piece's buffer through a select of pointers (render_c), proven inside each."""
    ast = kernel_of(stacked, *ROWS)
    launched = target.launched(ast)
    (read,) = reads(launched)
    assert [b.arg for b in buffers_of(read.src[0])] == list(range(1, len(ROWS) + 1))
    source = target.render(launched).source
    assert len(re.findall(r": buf\d+\)\[", source)) == 1 and not re.search(r"\bbuf[1-9]\[", source)
    shapes = [(len(ROWS), 3, 4)] + [(3, 4)] * len(ROWS)
    assert prove_kernel(launched, shapes) == len(ROWS) + 1


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_a_select_of_pointers_equals_numpy_on_the_cuda_emulation():
    src = CUDA_TARGET.render(CUDA_TARGET.launched(kernel_of(stacked, *ROWS)))
    out = np.zeros((len(ROWS), 3, 4), np.float32)
    cuda_emulation.run(src, [out.ravel(), *(r.ravel() for r in ROWS)])
    np.testing.assert_array_equal(out, np.stack([np.sqrt(np.abs(r)) * 2 + r for r in ROWS]))


def test_a_stack_through_a_select_of_buffers_equals_numpy_on_every_device(device):
    plan = pj.prepare(stacked, device=device).plan(*ROWS)
    assert any(u.op is Ops.BUFFER_SELECT for k in plan.kernels for u in k.ast.toposort())
    got = np.asarray(pj.prepare(stacked, device=device)(*ROWS))
    np.testing.assert_array_equal(got, np.stack([np.sqrt(np.abs(r)) * 2 + r for r in ROWS]))
