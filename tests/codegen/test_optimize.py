"""Register blocking of contractions (codegen/optimize.py): blocked kernels equal NumPy for every shape kind."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.optimize import optimize, register_block
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.target import AVX2, AVX512
from prepjit.uop import Ops


@pytest.mark.parametrize("m,k,n,avx512,avx2", [
    (64, 32, 48, (8, 16), (6, 16)),  # 48 columns: the widest block that divides them, one vector
    (128, 17, 96, (8, 32), (6, 16)),
    (5, 7, 64, (5, 32), (5, 16)),    # fewer rows than a block: one block of them all
    (16, 3, 32, (8, 32), (6, 16)),
    (8, 8, 8, None, (6, 8)),         # fewer columns than an AVX-512 vector: left unblocked there
    (3, 5, 7, None, None)])
def test_matmul_shapes_match_numpy(rng, m, k, n, avx512, avx2):
    """Each shape is register-blocked in (rows, columns) blocks of its target (None: left as it is), the last row
    block clamped where the rows are more than a block and not a multiple of one; the host's kernel equals NumPy."""
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    f = pj.prepare(lambda a, b: a @ b, device="cpu")
    np.testing.assert_allclose(np.asarray(f(a, b)), a @ b, rtol=1e-4, atol=1e-4)
    (kernel,) = f.plan(a, b).kernels
    for target, block in ((AVX512, avx512), (AVX2, avx2)):
        blocked = optimize(kernel.kernel.scheduled, "llvm", target)
        if block is None:
            assert blocked is kernel.kernel.scheduled
            continue
        rows, columns = block
        assert _columns(blocked) == rows * columns
        assert (_clamped_rows(blocked) > 0) == (m > rows and m % rows != 0)


def test_block_shapes_come_from_the_target():
    """AVX-512's 32 registers hold 8 x 2 accumulators of 16 floats; AVX2's 16 hold 6 x 2 of 8."""
    assert register_block(AVX512, 4) == (8, 32) and register_block(AVX512, 8) == (8, 16)
    assert register_block(AVX2, 4) == (6, 16) and register_block(AVX2, 8) == (6, 8)


@pytest.mark.parametrize("target,rows,cols,width", [(AVX512, 8, 32, 512), (AVX2, 6, 16, 256)])
def test_blocked_kernel_stores_a_block_per_iteration(rng, target, rows, cols, width):
    a, b = rng.standard_normal((80, 16)).astype(np.float32), rng.standard_normal((16, 64)).astype(np.float32)
    plan = pj.prepare(lambda a, b: a @ b, device="cpu").plan(a, b)
    (kernel,) = plan.kernels
    blocked = optimize(kernel.kernel.scheduled, "llvm", target)
    assert _columns(blocked) == rows * cols and all(s.op is Ops.STORE for s in blocked.src)
    assert len(blocked.src) == rows * 2  # each row's columns are two vectors
    assert f'"prefer-vector-width"="{width}"' in render_llvm(blocked, target).source
    assert optimize(kernel.kernel.scheduled, "opencl") is kernel.kernel.scheduled


def test_batched_float64_and_fused_operands(rng):
    """Both float64 contractions of a batch of matrices are blocked in vectors of 8 doubles (AVX-512), the first
    with its epilogue (+ 1, maximum) computed in each of its 8 x 16 stores, the second (over w.T, packed) 8 x 8."""
    x = rng.standard_normal((4, 16, 8))
    w = rng.standard_normal((8, 32))
    f = pj.prepare(lambda x, w: pnp.maximum(x @ w + 1, 0) @ w.T, device="cpu")
    ref = np.maximum(x @ w + 1, 0) @ w.T
    np.testing.assert_allclose(np.asarray(f(x, w)), ref, rtol=1e-10, atol=1e-10)
    first, pack, second = f.plan(x, w).kernels
    assert pack.ast.arg[:5] == "pack_"
    blocked = optimize(first.kernel.scheduled, "llvm", AVX512)
    assert _columns(blocked) == 8 * 16 and {_lanes(s) for s in blocked.src} == {8}
    assert all(any(u.op is Ops.MAX for u in s.src[2].toposort()) for s in blocked.src)
    blocked = optimize(second.kernel.scheduled, "llvm", AVX512)
    assert _columns(blocked) == 8 * 8 and {_lanes(s) for s in blocked.src} == {8}


def test_symbolic_batch_matmul(rng):
    """A var row count over two column blocks: full blocks of 8 rows (AVX2: 6), then one of 4, 2 and 1 rows."""
    w = rng.standard_normal((24, 64)).astype(np.float32)
    f = pj.prepare(lambda x, w: x @ w, vars={"n": (1, 100)}, shapes={"x": ("n", 24)}, device="cpu")
    for n in (1, 37, 100):
        x = rng.standard_normal((n, 24)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(x, w)), x @ w, rtol=1e-4, atol=1e-4)
    (kernel,) = f.plan(x, w).kernels
    assert _columns(optimize(kernel.kernel.scheduled, "llvm", AVX512)) == (8 + 4 + 2 + 1) * 32
    assert _columns(optimize(kernel.kernel.scheduled, "llvm", AVX2)) == (6 + 4 + 2 + 1) * 16


def test_row_sums_and_integer_contractions_untouched_but_correct(rng):
    """Only float sums of products are blocked: an int32 matmul and a row sum (no operand constant along the
    output's columns) keep their AST, on either target."""
    x = rng.integers(-5, 5, (16, 32)).astype(np.int32)
    y = rng.integers(-5, 5, (32, 16)).astype(np.int32)
    f = pj.prepare(lambda x, y: x @ y, device="cpu")
    np.testing.assert_array_equal(np.asarray(f(x, y)), x @ y)
    g = pj.prepare(lambda x: x.sum(axis=1), device="cpu")
    xf = x.astype(np.float32)
    np.testing.assert_allclose(np.asarray(g(xf)), xf.sum(axis=1))
    for kernel in (*f.plan(x, y).kernels, *g.plan(xf).kernels):
        for target in (AVX512, AVX2):
            assert optimize(kernel.kernel.scheduled, "llvm", target) is kernel.kernel.scheduled


def _lanes(store) -> int:
    """The output elements a blocked kernel's store writes: its lane range's extent (a vector), else 1."""
    return next((u.src[0].arg for u in store.toposort() if u.op is Ops.RANGE and u.arg[1] == "lane"), 1)


def _columns(ast) -> int:
    """The output elements (rows x columns) one iteration of a blocked kernel stores."""
    return sum(_lanes(s) for s in ast.src)


def _clamped_rows(ast) -> int:
    """How many output elements of a blocked kernel clamp their row (a MIN in the store index)."""
    return sum(_lanes(s) for s in ast.src if any(u.op is Ops.MIN for u in s.src[1].toposort()))


def test_symbolic_rows_are_blocked_then_in_smaller_blocks(rng):
    """A var row count: full blocks of 8 rows (AVX2: 6), then for the rows past them one block of 4, 2 and 1 at most
    (loop nests of 0 or 1 iterations), none clamped: a few rows (a decode batch) cost their own rows, not a block's.
    A row's bits do not depend on the block it falls in."""
    w = rng.standard_normal((24, 64)).astype(np.float32)
    f = pj.prepare(lambda x, w: x @ w, vars={"n": (0, 300)}, shapes={"x": ("n", 24)}, device="cpu")
    for n in list(range(0, 20)) + [31, 32, 33, 63, 64, 65, 255, 256, 257, 299, 300]:
        x = rng.standard_normal((n, 24)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(x, w)), x @ w, rtol=1e-4, atol=1e-4, err_msg=f"n={n}")
    np.testing.assert_array_equal(np.asarray(f(x[:15], w)), np.asarray(f(x, w))[:15])
    (kernel,) = f.plan(x, w).kernels
    blocked = optimize(kernel.kernel.scheduled, "llvm", AVX512)
    assert _columns(blocked) == (8 + 4 + 2 + 1) * 32 and _clamped_rows(blocked) == 0
    blocked = optimize(kernel.kernel.scheduled, "llvm", AVX2)
    assert _columns(blocked) == (6 + 4 + 2 + 1) * 16 and _clamped_rows(blocked) == 0


@pytest.mark.parametrize("m", [5, 13, 999])
def test_static_row_counts_no_block_divides_are_clamped(rng, m):
    """Fewer rows than a block: one exact block of them all; more, and no block divides them: the last clamps."""
    a, b = rng.standard_normal((m, 16)).astype(np.float32), rng.standard_normal((16, 32)).astype(np.float32)
    f = pj.prepare(lambda a, b: a @ b, device="cpu")
    np.testing.assert_allclose(np.asarray(f(a, b)), a @ b, rtol=1e-4, atol=1e-4)
    (kernel,) = f.plan(a, b).kernels
    blocked = optimize(kernel.kernel.scheduled, "llvm", AVX512)
    assert _columns(blocked) == min(m, 8) * 32 and (_clamped_rows(blocked) > 0) == (m > 8)


def test_symbolic_rows_in_a_batched_fused_mlp(rng):
    """Both contractions of an MLP over a (b, n) batch of rows are blocked: x @ w1 (two column blocks) in full row
    blocks and then one of 4, 2 and 1 rows; h @ w2 (one AVX-512 column block) in 8-row blocks, the last clamping."""
    w1, b1 = rng.standard_normal((16, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    w2 = rng.standard_normal((64, 32)).astype(np.float32)
    f = pj.prepare(lambda x, w1, b1, w2: pnp.maximum(x @ w1 + b1, 0) @ w2, vars={"b": (1, 3), "n": (0, 40)},
                   shapes={"x": ("b", "n", 16)}, device="cpu")
    for b, n in [(1, 0), (1, 1), (2, 7), (3, 9), (1, 40), (3, 17)]:
        x = rng.standard_normal((b, n, 16)).astype(np.float32)
        ref = np.maximum(x @ w1 + b1, 0) @ w2
        np.testing.assert_allclose(np.asarray(f(x, w1, b1, w2)), ref, rtol=1e-4, atol=1e-4, err_msg=f"b={b} n={n}")
    first, second = (optimize(k.kernel.scheduled, "llvm", AVX512) for k in f.plan(x, w1, b1, w2).kernels)
    assert _columns(first) == (8 + 4 + 2 + 1) * 32 and _clamped_rows(first) == 0
    assert _columns(second) == 8 * 32 and _clamped_rows(second) == 7 * 32  # a block's first row is never past the end


def test_symbolic_rows_of_a_transposed_operand_and_float64(rng):
    """x @ w.T in float64 with a var row count: blocks of vectors of 8 doubles (AVX2: 4), rows as for float32."""
    w = rng.standard_normal((32, 12))
    f = pj.prepare(lambda x, w: x @ w.T, vars={"n": (1, 50)}, shapes={"x": ("n", 12)}, device="cpu")
    for n in (1, 2, 9, 23, 50):
        x = rng.standard_normal((n, 12))
        np.testing.assert_allclose(np.asarray(f(x, w)), x @ w.T, rtol=1e-10, atol=1e-10)
    (kernel,) = f.plan(x, w).kernels
    assert _columns(optimize(kernel.kernel.scheduled, "llvm", AVX512)) == (8 + 4 + 2 + 1) * 16
    assert _columns(optimize(kernel.kernel.scheduled, "llvm", AVX2)) == (6 + 4 + 2 + 1) * 8


def _tail_stores(ast) -> int:
    """How many stores of a blocked kernel sit in the peeled column tail (their loops include the tail range)."""
    last = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop")
    return sum(any(u.op is Ops.RANGE and u.arg == (last, "loop") for u in s.toposort()) for s in ast.src)


def test_symbolic_columns_get_full_blocks_and_a_peeled_tail(rng):
    """Batched q @ k.T with symbolic batch and sequence: the same 8 x 32 blocks as a static shape, then one
    tail column per row; every sequence length (below, at and across block edges) equals NumPy."""
    f = pj.prepare(lambda q, k: q @ k.transpose(0, 1, 3, 2), vars={"b": (1, 3), "s": (0, 80)},
                   shapes={"q": ("b", 2, "s", 16), "k": ("b", 2, "s", 16)}, device="cpu")
    for b, s in [(1, 0), (1, 1), (2, 7), (1, 31), (3, 32), (2, 33), (1, 64), (2, 71), (1, 80)]:
        q, k = (rng.standard_normal((b, 2, s, 16)).astype(np.float32) for _ in range(2))
        np.testing.assert_allclose(np.asarray(f(q, k)), q @ k.transpose(0, 1, 3, 2), rtol=1e-4, atol=1e-4,
                                   err_msg=f"b={b} s={s}")
    *packs, kernel = f.plan(q, k).kernels  # k.T is strided along the columns: its full panels are packed
    assert [p.ast.arg[:5] for p in packs] == ["pack_"]
    blocked = optimize(kernel.kernel.scheduled, "llvm", AVX512)
    assert _columns(blocked) == 8 * 32 + 8 and _tail_stores(blocked) == 8
    assert _tail_stores(optimize(kernel.kernel.scheduled, "llvm", AVX2)) == 6


@pytest.mark.parametrize("n", [20, 40, 100])
def test_static_columns_no_block_divides_are_peeled(rng, n):
    a, b = rng.standard_normal((37, 24)).astype(np.float32), rng.standard_normal((24, n)).astype(np.float32)
    f = pj.prepare(lambda a, b: a @ b, device="cpu")
    np.testing.assert_allclose(np.asarray(f(a, b)), a @ b, rtol=1e-4, atol=1e-4)
    (kernel,) = f.plan(a, b).kernels
    assert _tail_stores(optimize(kernel.kernel.scheduled, "llvm", AVX512)) == 8


def test_symbolic_rows_in_one_block_and_columns_in_one_block_plus_tail(rng):
    """At most 4 rows (one row block: its range folds to a single iteration) and at most 32 columns (at most one
    full block, then the tail): the blocks and the tail must still share a loop, or stay unblocked."""
    f = pj.prepare(lambda x, w: x @ w, vars={"n": (1, 4), "s": (1, 32)}, shapes={"x": ("n", 16), "w": (16, "s")},
                   device="cpu")
    for n, s in [(1, 1), (4, 32), (3, 31), (2, 5)]:
        x, w = rng.standard_normal((n, 16)).astype(np.float32), rng.standard_normal((16, s)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(x, w)), x @ w, rtol=1e-4, atol=1e-4, err_msg=f"n={n} s={s}")
    (kernel,) = f.plan(x, w).kernels  # the row blocks' range folds to one iteration: no loop the tail could share
    for target in (AVX512, AVX2):
        assert optimize(kernel.kernel.scheduled, "llvm", target) is kernel.kernel.scheduled


def test_a_blocks_value_is_its_substitution_with_each_loads_index_simplified():
    """optimize._instantiate (a register block's value at each of its offsets) in one walk gives what substituting
    the offsets and then simplifying the index of each load of the result gives, for a gather (a load whose index
    holds another load, left as substituted there) read at a shifted row: the same node, and simpler than the
    substitution alone."""
    from prepjit.codegen.lower import REALIZED, lower_kernel
    from prepjit.codegen.optimize import _instantiate
    from prepjit.uop import UOp, simplify
    table, ids = np.arange(60, dtype=np.float32).reshape(5, 12), np.array([3, 1, 0, 4], np.int64)
    traced = pj.trace(pj.prepare(lambda t, i: t[i] * 2 + t[i[::-1]]), table, ids)
    ast, _ = lower_kernel(traced.outputs[0], lambda n: n.op in REALIZED)
    value = ast.src[0].src[2]
    row = next(u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[0] == 0)
    mapping = {row: UOp(Ops.ADD, row.dtype, (UOp(Ops.MUL, row.dtype, (row, UOp.const(1))), UOp.const(0)))}  # (row,
    # built unsimplified: the loads' indices fold it)

    def substituted_then_simplified(u):
        u = u.substitute(mapping)
        return u.substitute({ld: UOp(Ops.LOAD, ld.dtype, (ld.src[0], *(simplify(s) for s in ld.src[1:])), ld.arg)
                             for ld in u.toposort() if ld.op is Ops.LOAD})
    expected = substituted_then_simplified(value)
    assert _instantiate(value, mapping, {}) is expected
    assert expected is not value.substitute(mapping)
