"""Lowering to kernel ASTs: index maps folded to affine forms, symbolic ranges, and the LLVM source."""
import numpy as np

import prepjit as pj
from prepjit.codegen.lower import REALIZED, lower_kernel
from prepjit.codegen.render_llvm import render_llvm
from prepjit.uop import Ops

A = np.arange(24, dtype=np.float32).reshape(4, 6)


def kernel_of(fn, *args, **prepare_kwargs):
    traced = pj.trace(pj.prepare(fn, **prepare_kwargs), *args)
    ast, reads = lower_kernel(traced.outputs[0], lambda n: n.op in REALIZED)
    return ast, reads


def loads(ast):
    return [u for u in ast.toposort() if u.op is Ops.LOAD]


def test_kernel_ast_is_sink_of_one_store():
    ast, reads = kernel_of(lambda a, b: a * b + 1, A, A)
    assert ast.op is Ops.SINK and len(ast.src) == 1
    store = ast.src[0]
    assert store.op is Ops.STORE and store.src[0].op is Ops.DEFINE_GLOBAL and store.src[0].arg == 0
    assert sorted(ld.src[0].arg for ld in loads(ast)) == [1, 2]
    assert len(reads) == 2


def test_reshape_round_trip_folds_to_the_plain_index():
    """(4, 6) -> (24,) -> (2, 12) -> (4, 6): every load index is the store index."""
    ast, _ = kernel_of(lambda a: a.reshape(-1).reshape(2, 12).reshape(4, 6) + 1, A)
    (ld,) = loads(ast)
    assert ld.src[1] is ast.src[0].src[1]
    assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in ld.src[1].toposort())


def test_transpose_index_is_affine():
    ast, _ = kernel_of(lambda a: a.T * 2, A)
    (ld,) = loads(ast)
    assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in ld.src[1].toposort())


def test_symbolic_shape_ranges_take_var_arguments():
    ast, _ = kernel_of(lambda x, pos: x[:, :pos + 1] * 2, np.ones((3, 8), np.float32), 2,
                       vars={"n": (1, 10), "pos": (0, 7)}, shapes={"x": ("n", 8)})
    ranges = [u for u in ast.toposort() if u.op is Ops.RANGE]
    assert {r.src[0].render() for r in ranges} == {"n", "(pos+1)"}
    assert [v.arg[0] for v in ast.variables()] == ["n", "pos"]
    (ld,) = loads(ast)
    assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in ld.src[1].toposort())
    src = render_llvm(ast)
    assert src.var_names == ("n", "pos")
    assert "define void @" + src.name in src.source


def test_a_var_fixed_at_one_is_no_range_as_a_static_one():
    """A dim of a var whose bounds are (1, 1) (a decode plan's batch of one) gets no range, as a static dim of 1:
    the rows' range is the outermost loop."""
    x, w = np.ones((1, 8), np.float32), np.ones((5, 8), np.float32)
    for kwargs in ({}, {"vars": {"B": (1, 1)}, "shapes": {"x": ("B", 8)}}):
        ast, _ = kernel_of(lambda x, w: x @ w.T, x, w, **kwargs)
        loops = [r.src[0] for r in ast.toposort() if r.op is Ops.RANGE and r.arg[1] == "loop"]
        assert [n.arg for n in loops] == [5], kwargs


def test_reduction_lowers_to_reduce_over_a_reduce_range():
    ast, _ = kernel_of(lambda a: a.sum(axis=1, keepdims=True), A)
    (red,) = [u for u in ast.toposort() if u.op is Ops.REDUCE]
    assert red.arg is Ops.ADD
    assert all(r.op is Ops.RANGE and r.arg[1] == "reduce" for r in red.src[1:])


def test_pad_from_concatenate_is_gated():
    import prepjit.numpy as pnp
    ast, _ = kernel_of(lambda a: pnp.concatenate([a, a], axis=1), A)
    assert any(u.op is Ops.WHERE for u in ast.toposort())


def test_llvm_source_is_on_the_prepared_kernel():
    plan = pj.prepare(lambda a: a * 2).plan(A)
    kernel = plan.kernels[0].kernel
    assert "define void @" + kernel.name in kernel.source
    assert kernel.var_names == ()


def test_symbolic_reshapes_divide_only_within_matched_dims():
    """Unit dims added or dropped on symbolic shapes (batched matmul) and a merge of (s, 16) map straight
    through: no division by a var; splitting a merged dim divides by the split-off size only."""
    q = np.ones((2, 3, 5, 16), np.float32)
    ast, _ = kernel_of(lambda q, k: q @ k.transpose(0, 1, 3, 2), q, q,
                       vars={"b": (1, 8), "s": (1, 64)}, shapes={"q": ("b", 3, "s", 16), "k": ("b", 3, "s", 16)})
    assert all(not any(u.op in (Ops.IDIV, Ops.MOD) for u in ld.src[1].toposort()) for ld in loads(ast))
    ast, _ = kernel_of(lambda x: x.reshape(x.shape[0], -1).reshape(x.shape[0], x.shape[1], 4, 4) * 2, q[0],
                       vars={"s": (1, 64)}, shapes={"x": (3, "s", 16)})
    (ld,) = loads(ast)
    assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in ld.src[1].toposort())


def test_a_gathered_row_is_read_ungated_at_a_clamped_id():
    """A gather from a buffer (a paged cache's blocks through a block table) reads each row at its id clamped into the
    dim, ungated, and selects 0 where the id is out of range: a row's elements are consecutive addresses (one vector
    load on a GPU; gated, each element's address was `in range ? index : 0`). A gather from a padded array keeps its
    gate (the pad's gate is what proves its reads in bounds); NumPy's values either way (the out-of-range id's 0
    too, `mode="fill"`)."""
    import prepjit.numpy as pnp
    pool, ids = np.arange(60, dtype=np.float32).reshape(5, 12), np.array([3, -1, 0, 7], np.int64)
    ast, _ = kernel_of(lambda p, i: p[i] * 2, pool, ids)
    pool_load = next(ld for ld in loads(ast) if ld.dtype == ast.src[0].src[0].dtype)
    assert len(pool_load.src) == 2, pool_load   # no gate
    assert any(u.op is Ops.WHERE for u in ast.toposort())
    padded, _ = kernel_of(lambda p, i: pnp.pad(p, ((1, 1), (0, 0)))[i] * 2, pool, ids)
    padded_loads = [ld for ld in loads(padded) if ld.dtype == padded.src[0].src[0].dtype]
    assert padded_loads and all(len(ld.src) == 3 for ld in padded_loads), padded_loads
    fill = pj.prepare(lambda p, i: pnp.take(p, i, axis=0, mode="fill", fill_value=0) * 2)
    np.testing.assert_array_equal(fill(pool, ids), np.where((ids >= -5) & (ids < 5), 1, 0)[:, None] * pool[ids % 5] * 2)


def test_a_var_loop_of_a_kernel_without_reductions_stays_rolled():
    """Its loops over a var's extent carry llvm.loop.unroll.disable (a copy or a stack is memory-bound: LLVM's
    unrolling tripled their compile time), and so does the parallel range around it; loops of constant extent are
    left to LLVM."""
    ast, _ = kernel_of(lambda x: x * 2, np.ones((3, 5, 8), np.float32), vars={"n": (1, 64)},
                       shapes={"x": (3, "n", 8)})
    assert render_llvm(ast).source.count("llvm.loop.unroll.disable") == 2
    ast, _ = kernel_of(lambda x: x * 2, np.ones((3, 5, 8), np.float32))
    assert "llvm.loop.unroll.disable" not in render_llvm(ast).source


def test_the_loops_around_a_var_loop_stay_rolled():
    """A kernel with reductions leaves its loops over a var's extent to LLVM, but the loops around one (here the
    parallel range and a loop of 4 steps around a sum over n) carry llvm.loop.unroll.disable: unrolled, each step
    was a copy of the vectorised loop inside (a prefill softmax's heads: ~2.5x its LLVM time), whose iterations are
    the work. Without a var, none does; the sums are NumPy's."""
    def sum_kernel(**prepare_kwargs):
        traced = pj.trace(pj.prepare(lambda a: a.sum(-1), **prepare_kwargs), x)
        (red,) = [u for u in traced.outputs[0].toposort() if u.op is Ops.REDUCE_AXIS]
        return render_llvm(lower_kernel(red, lambda n: n.op in REALIZED and n is not red)[0]).source
    x = np.arange(3 * 4 * 37, dtype=np.float32).reshape(3, 4, 37) % 11
    source = sum_kernel(vars={"n": (1, 64)}, shapes={"a": (3, 4, "n")})
    assert source.count("llvm.loop.unroll.disable") == 2, source
    assert "llvm.loop.unroll.disable" not in sum_kernel()
    summed = pj.prepare(lambda a: a.sum(-1), vars={"n": (1, 64)}, shapes={"a": (3, 4, "n")})
    np.testing.assert_array_equal(np.asarray(summed(x)), x.sum(-1))
