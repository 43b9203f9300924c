"""Scatter lowering: the buffer a scatter writes (in place or a copy), serial vs thread-split loops, gated and
combining stores, the bounds proof on them, and the GPU renderers' atomics (native adds, else CAS loops)."""
import shutil
import subprocess

import numpy as np
import pytest

import prepjit as pj
from prepjit.codegen.bounds import prove_kernel
from prepjit.codegen.render_cuda import render_cuda
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.render_opencl import render_opencl
from prepjit.codegen.schedule import schedule
from prepjit.errors import CompileError
from prepjit.uop import Ops, UOp, dtypes
from tests.helpers import assert_matches
from tests.runtime.native_threads import launch_entries, published, worker_threads  # noqa: F401 (a fixture)

X = np.arange(15, dtype=np.float32).reshape(5, 3)
IDS = np.array([0, 3, 3, -1])
V = np.ones((4, 3), np.float32)


def sched(fn, *args, **kwargs):
    traced = pj.trace(pj.prepare(fn, **kwargs), *args)
    return schedule(list(traced.outputs), list(traced.inputs))


def stores(ast):
    return [u for u in ast.toposort() if u.op is Ops.STORE]


def range_kinds(ast):
    return {u.arg[1] for u in ast.toposort() if u.op is Ops.RANGE}


def test_a_chain_of_updates_writes_one_buffer_in_place():
    s = sched(lambda x, ids, v: (x * 2).at[ids].add(v).at[0].set(0.0).at[1].max(5.0), X, IDS, V)
    names = [k.ast.arg[:2] for k in s.kernels]
    assert names == ["E_", "S_", "S_", "S_"]  # x * 2 computed into the output, then three small kernels
    assert {k.buffers[0] for k in s.kernels} == {s.outputs[0]}


def test_an_input_or_shared_target_is_copied_first():
    s = sched(lambda x, ids, v: x.at[ids].add(v), X, IDS, V)
    assert [k.ast.arg[:2] for k in s.kernels] == ["E_", "S_"]
    assert s.kernels[0].buffers == (s.outputs[0], s.inputs[0])  # a copy: the caller's x is never written

    def shared(x, ids, v):
        r = x.sum(axis=1, keepdims=True) * np.float32(1)
        total = r.sum(axis=0, keepdims=True)
        return total.at[0].set(1.0), total * 2

    s = sched(shared, X, IDS, V)
    scatter = next(k for k in s.kernels if k.ast.arg.startswith("S_"))
    copy = s.kernels[s.kernels.index(scatter) - 1]
    assert copy.ast.arg.startswith("E_") and copy.buffers[1] not in s.outputs
    a, b = pj.prepare(shared)(X, IDS, V)
    assert_matches(a, np.ones((1, 1), np.float32))
    assert_matches(b, X.sum(keepdims=True) * 2)


def test_a_scatter_read_elsewhere_keeps_its_buffer_and_two_scatters_of_one_target_do_not_share():
    def f(x, ids, v):
        y = x.at[ids].add(v)
        r = x.sum(axis=1, keepdims=True)
        return y, y.at[0].set(-1.0), r.at[1].set(0.0), r.at[2].set(9.0)

    y, z, a, b = pj.prepare(f)(X, IDS, V)
    ref = X.copy()
    np.add.at(ref, IDS, V)
    assert_matches(y, ref)
    ref[0] = -1
    assert_matches(z, ref)
    r = X.sum(axis=1, keepdims=True)
    assert_matches(a, np.where(np.arange(5)[:, None] == 1, 0, r).astype(np.float32))
    assert_matches(b, np.where(np.arange(5)[:, None] == 2, 9, r).astype(np.float32))


def test_colliding_updates_are_serial_and_row_owned_updates_split():
    s = sched(lambda x, ids, v: x.at[ids].add(v), X, IDS, V)
    ast = s.kernels[-1].ast
    assert range_kinds(ast) == {"serial"}
    (store,) = stores(ast)
    assert store.arg is Ops.ADD and len(store.src) == 4  # gated on the id being in range
    cache = np.zeros((2, 8, 3), np.float32)
    s = sched(lambda c, k, pos: c.at[:, pos].set(k), cache, np.ones((2, 3), np.float32), 3, vars={"pos": (0, 7)})
    ast = s.kernels[-1].ast
    assert range_kinds(ast) == {"loop"}  # updates dim 0 is the cache's dim 0: threads write distinct rows
    (store,) = stores(ast)
    assert store.arg is None and len(store.src) == 3  # a var index is a checked constraint, no gate needed


def test_many_colliding_updates_across_the_thread_pool_threshold(worker_threads):
    n = 1 << 18  # above the work at which CPU kernels split over threads
    ids = np.random.default_rng(1).integers(0, 7, n)
    f = pj.prepare(lambda z, ids, v: z.at[ids].add(v))
    args = np.zeros(7, np.float32), ids, np.ones(n, np.float32)
    assert [chunks for _, chunks in launch_entries(f.plan(*args)._runner.first_launches)] == [0, 0, 0]
    splits, counts = published(worker_threads, f, *args)   # its updates collide anywhere: one thread runs them
    assert splits == 0
    assert_matches(counts, np.bincount(ids, minlength=7).astype(np.float32), rtol=0, atol=0)
    x = np.zeros((1024, 6), np.float32)  # rows owned by threads, columns colliding within a row
    cols = np.random.default_rng(2).integers(0, 6, 300)
    v = np.ones((1024, 300), np.float32)
    g = pj.prepare(lambda x, cols, v: x.at[:, cols].add(v))
    assert (1024, worker_threads.chunks(1024)) in launch_entries(g.plan(x, cols, v)._runner.first_launches)
    splits, out = published(worker_threads, g, x, cols, v)
    assert splits == 1
    ref = x.copy()
    np.add.at(ref, (slice(None), cols), v)
    assert_matches(out, ref, rtol=0, atol=0)


def test_the_bounds_proof_covers_gated_stores():
    n = UOp.variable("n", 0, 10)
    r = UOp(Ops.RANGE, dtypes.index, (UOp.const(4),), (0, "serial"))
    ids = UOp(Ops.LOAD, dtypes.index, (UOp(Ops.DEFINE_GLOBAL, dtypes.index, (), 1), r))
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
    one = UOp.const(1.0, dtypes.float32)
    inside = UOp(Ops.AND, dtypes.bool, (UOp(Ops.CMPLT, dtypes.bool, (UOp.const(-1), ids)),
                                         UOp(Ops.CMPLT, dtypes.bool, (ids, n))))
    ok = UOp(Ops.SINK, dtypes.bool, (UOp(Ops.STORE, dtypes.bool, (out, ids, one, inside), Ops.ADD),), "S_ok")
    assert prove_kernel(ok, [(n,), (4,)]) == 2
    loose = UOp(Ops.CMPLT, dtypes.bool, (ids, n + 1))  # lets ids == n through
    bad = UOp(Ops.SINK, dtypes.bool, (UOp(Ops.STORE, dtypes.bool, (out, ids, one, loose), Ops.ADD),), "S_bad")
    with pytest.raises(CompileError, match="store to buffer slot 0"):
        prove_kernel(bad, [(n,), (4,)])


def scatter_ast(how, dtype):
    traced = pj.trace(pj.prepare(lambda x, ids, v: getattr(x.at[ids], how)(v)), np.zeros(5, dtype),
                      np.array([1, 2]), np.ones(2, dtype))
    return schedule(list(traced.outputs), list(traced.inputs)).kernels[-1].ast


def test_llvm_reads_combines_and_writes_inside_the_gate():
    src = render_llvm(scatter_ast("add", np.float32)).source
    assert "S1.store:" in src or ".store:" in src
    body = src[src.index(".store:"):src.index(".done:")]
    assert "load float" in body and "fadd float" in body and "store float" in body


@pytest.mark.parametrize("how", ["add", "multiply", "min", "max"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint32])
def test_gpu_renderers_combine_atomically(how, dtype):
    ast = scatter_ast(how, dtype)
    cl, cu = render_opencl(ast).source, render_cuda(ast).source
    native_cl = how == "add" and np.dtype(dtype).kind in "iu"  # OpenCL 1.2 has integer atomic adds only
    assert ("atomic_add(" in cl or "atom_add(" in cl) if native_cl else ("atomic_cmpxchg" in cl or "atom_cmpxchg" in cl)
    assert "atomicAdd(" in cu if how == "add" else "atomicCAS" in cu  # CUDA adds floats and ints natively
    if np.dtype(dtype).itemsize == 8:
        assert "cl_khr_int64_base_atomics" in cl
    if shutil.which("clang"):  # OpenCL C syntax and types, checked by clang against the default header
        done = subprocess.run(["clang", "-x", "cl", "-cl-std=CL1.2", "-fsyntax-only", "-Xclang",
                               "-finclude-default-header", "-"], input=cl, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr + cl


def test_gpu_set_is_a_plain_gated_store_and_half_combines_are_refused():
    cl = render_opencl(scatter_ast("set", np.float32)).source
    assert "cmpxchg" not in cl and "if (" in cl
    with pytest.raises(NotImplementedError, match="float16"):
        render_opencl(scatter_ast("add", np.float16))
