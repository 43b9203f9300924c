"""The OpenCL C renderer on hand-built kernel ASTs: coverage of every op the LLVM renderer renders,
launch sizes as expressions over the vars, the grouped-reduction choice, float16 and float64 spelling."""
import pytest

from prepjit.codegen.render_c import FLOAT_ONLY, INTEGER_ONLY
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.render_opencl import GROUP_REDUCE_MIN, REDUCE_GROUP, render_opencl
from prepjit.codegen.row_plan import ROW_INLINE_MAX
from prepjit.uop import Ops, UOp, dtypes, eval_uop
from prepjit.uop.ops import ALU, COMPARISON, UNARY

N = UOp.variable("n", 1, 1000)


def loop(end, axis=0):
    return UOp(Ops.RANGE, dtypes.index, (end,), (axis, "loop"))


def load(slot, dtype, index):
    return UOp(Ops.LOAD, dtype, (UOp(Ops.DEFINE_GLOBAL, dtype, (), slot), index))


def kernel(value, index, name="k"):
    store = UOp(Ops.STORE, dtypes.bool, (UOp(Ops.DEFINE_GLOBAL, value.dtype, (), 0), index, value))
    return UOp(Ops.SINK, dtypes.bool, (store,), name)


def alu_kernel(op, dtype):
    r = loop(N)
    srcs = [load(1, dtypes.bool, r)] if op is Ops.WHERE else []
    srcs += [load(len(srcs) + i + 1, dtype, r) for i in range(1 if op in UNARY else 3 if op is Ops.FMA else 2)]
    out = dtypes.bool if op in COMPARISON else dtype
    return kernel(UOp(op, out, tuple(srcs)), r)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.float32, dtypes.float64, dtypes.int8, dtypes.int64,
                                   dtypes.uint32, dtypes.bool])
def test_every_op_the_llvm_renderer_renders_is_rendered(dtype):
    for op in sorted(ALU, key=lambda o: o.value):
        ast = alu_kernel(op, dtype)
        try:
            render_llvm(ast)
        except NotImplementedError:
            continue
        if op in (INTEGER_ONLY if dtype.is_float else FLOAT_ONLY):   # refused, never rendered wrong
            with pytest.raises(NotImplementedError, match="NumPy has it only for"):
                render_opencl(ast)
            continue
        src = render_opencl(ast)
        assert src.language == "opencl" and "__kernel void k(" in src.source


def test_elementwise_launch_size_is_an_expression_over_the_vars():
    m = UOp.variable("m", 1, 64)
    r0, r1 = loop(N, 0), loop(m, 1)
    ast = kernel(load(1, dtypes.float32, r0 * m + r1) * UOp.const(2.0, dtypes.float32), r0 * m + r1, "E_n_m")
    src = render_opencl(ast)
    assert src.var_names == ("m", "n") and src.local_size == ()
    assert "long v_m, long v_n)" in src.source and "reqd_work_group_size" not in src.source
    assert [eval_uop(e, {"n": 7, "m": 5}) for e in src.global_size] == [35]
    assert "if (gid >= " in src.source   # the launch is rounded up to whole work-groups


@pytest.mark.parametrize("bound, grouped", [(GROUP_REDUCE_MIN, False), (GROUP_REDUCE_MIN + 1, True)])
def test_long_reductions_down_columns_get_a_work_group_per_output(bound, grouped):
    """A reduction down a column stays in one work-item up to GROUP_REDUCE_MIN iterations (neighbouring work-items
    read neighbouring columns); one along a row gets a work-group past ROW_INLINE_MAX."""
    k = UOp.variable("k", 1, bound)
    r0, rr = loop(N, 0), UOp(Ops.RANGE, dtypes.index, (k,), (1, "reduce"))
    total = UOp(Ops.REDUCE, dtypes.float32, (load(1, dtypes.float32, rr * N + r0), rr), Ops.ADD)
    src = render_opencl(kernel(total, r0, "r_n"))
    assert src.local_size == ((REDUCE_GROUP,) if grouped else ())
    assert ("barrier(CLK_LOCAL_MEM_FENCE)" in src.source) == grouped
    assert eval_uop(src.global_size[0], {"n": 3, "k": 9}) == 3 * (REDUCE_GROUP if grouped else 1)
    along = UOp(Ops.REDUCE, dtypes.float32, (load(1, dtypes.float32, r0 * k + rr), rr), Ops.ADD)
    row = render_opencl(kernel(along, r0, "r_n"))
    assert row.local_size == (REDUCE_GROUP,) and "barrier(CLK_LOCAL_MEM_FENCE)" in row.source
    short = UOp.variable("k", 1, ROW_INLINE_MAX)
    rs = UOp(Ops.RANGE, dtypes.index, (short,), (1, "reduce"))
    inline = render_opencl(kernel(UOp(Ops.REDUCE, dtypes.float32, (load(1, dtypes.float32, r0 * short + rs), rs),
                                      Ops.ADD), r0, "r_n"))
    assert inline.local_size == () and "barrier" not in inline.source


def test_float16_uses_core_half_builtins_and_float64_requests_fp64():
    r = loop(N)
    half = render_opencl(kernel(UOp(Ops.EXP, dtypes.float16, (load(1, dtypes.float16, r),)), r)).source
    assert "pj_half_to_float(" in half and "vstore_half_rte(" in half and "pj_round_half" in half
    assert "vload_half(" not in half   # (widened by integer arithmetic: render_opencl._WIDEN_HALF)
    assert "cl_khr_fp16" not in half
    double = render_opencl(kernel(UOp(Ops.SQRT, dtypes.float64, (load(1, dtypes.float64, r),)), r)).source
    assert "#pragma OPENCL EXTENSION cl_khr_fp64 : enable" in double and "double" in double


def test_every_kernel_forbids_contracting_a_product_and_a_sum():
    """OpenCL C lets a compiler fuse `a * b + c` unless FP_CONTRACT is off: every kernel says it is (NumPy rounds
    twice; the FMA op is written as fma() and keeps its single rounding)."""
    r = loop(N)
    product_sum = UOp(Ops.ADD, dtypes.float32, (UOp(Ops.MUL, dtypes.float32, (load(1, dtypes.float32, r),
                                                                               load(2, dtypes.float32, r))),
                                                 load(3, dtypes.float32, r)))
    for ast in (kernel(product_sum, r), alu_kernel(Ops.FMA, dtypes.float32), alu_kernel(Ops.ADD, dtypes.int32)):
        assert "#pragma OPENCL FP_CONTRACT OFF" in render_opencl(ast).source
