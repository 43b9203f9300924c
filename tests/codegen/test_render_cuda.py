"""The C-style renderer family (render_c.py) in its CUDA and OpenCL dialects: the same kernels in each
dialect's spelling, and every op x dtype kernel that renders also compiles on each GPU device present
(the cuda part needs pycuda and an NVIDIA GPU; it skips elsewhere)."""
import pytest

from prepjit.codegen.render_c import FLOAT_ONLY, INTEGER_ONLY, REDUCE_GROUP
from prepjit.codegen.render_cuda import ELEMENTWISE_GROUP, ITEMS_PER_THREAD, render_cuda
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.render_opencl import render_opencl
from prepjit.codegen.render_tiles import TILE, TILE_THREADS
from prepjit.runtime.devices import available_devices, get_device
from prepjit.uop import Ops, UOp, dtypes, eval_uop
from prepjit.uop.ops import ALU

from .test_render_opencl import N, alu_kernel, kernel, load, loop

RENDERERS = {"cuda": render_cuda, "opencl": render_opencl}
DTYPES = [dtypes.float16, dtypes.float32, dtypes.float64, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64,
          dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64, dtypes.bool]


def op_kernels():
    """Every (op, dtype) kernel the LLVM renderer renders (the reference semantics) and that has a meaning
    in NumPy (float bitwise ops, math on integers are refused by the C-style renderers: test_render_opencl
    checks that)."""
    out = []
    for dtype in DTYPES:
        for op in sorted(ALU, key=lambda o: o.value):
            ast = alu_kernel(op, dtype)
            try:
                render_llvm(ast)
            except NotImplementedError:
                continue
            if op not in (INTEGER_ONLY if dtype.is_float else FLOAT_ONLY):
                out.append((f"{op.name}_{dtype.name}", ast))
    return out


def test_cuda_dialect_spells_every_op():
    for name, ast in op_kernels():
        src = render_cuda(ast).source
        assert 'extern "C" __global__ void' in src and f"__launch_bounds__({ELEMENTWISE_GROUP})" in src, name
        for opencl_only in ("get_global_id", "__global ", "vload_half", "INFINITY", "NAN", "(long v_", ", long v_", "uchar"):
            assert opencl_only not in src, (name, opencl_only)


def test_both_dialects_share_launch_sizes_and_grouping():
    k = UOp.variable("k", 1, 4096)
    r0, rr = loop(N, 0), UOp(Ops.RANGE, dtypes.index, (k,), (1, "reduce"))
    total = UOp(Ops.REDUCE, dtypes.float32, (load(1, dtypes.float32, r0 * k + rr), rr), Ops.ADD)
    cuda, opencl = render_cuda(kernel(total, r0, "r_n")), render_opencl(kernel(total, r0, "r_n"))
    assert cuda.var_names == opencl.var_names == ("k", "n")
    assert [eval_uop(e, {"n": 3, "k": 9}) for e in cuda.global_size] == [3 * REDUCE_GROUP]
    assert cuda.global_size == opencl.global_size and cuda.local_size == opencl.local_size == (REDUCE_GROUP,)
    assert "__syncthreads();" in cuda.source and f"__shared__ float part" in cuda.source
    assert f"__launch_bounds__({REDUCE_GROUP})" in cuda.source
    elementwise = render_cuda(kernel(load(1, dtypes.float32, r0) + UOp.const(1.0, dtypes.float32), r0))
    assert elementwise.local_size == (ELEMENTWISE_GROUP,) and "if (gid < v_n) {" in elementwise.source
    assert "#pragma unroll" in elementwise.source and f"e < {ITEMS_PER_THREAD}; e++" in elementwise.source
    assert [eval_uop(e, {"n": 9}) for e in elementwise.global_size] == [-(-9 // ITEMS_PER_THREAD)]


def test_cuda_float16_goes_through_ptx_conversions():
    r = loop(N)
    src = render_cuda(kernel(UOp(Ops.EXP, dtypes.float16, (load(1, dtypes.float16, r),)), r)).source
    assert "cvt.rn.f16.f32" in src and "cvt.f32.f16" in src and "expf(" in src
    assert "const unsigned short *__restrict__ buf1" in src


@pytest.mark.parametrize("language", ["cuda", "opencl"])
def test_every_rendered_op_compiles(language):
    if language not in available_devices():
        pytest.skip(f"no {language} device here" + (" (needs pycuda and an NVIDIA GPU)" if language == "cuda" else ""))
    device = get_device(language)
    if language == "opencl" and "cl_khr_fp64" not in device.extensions:
        pytest.skip("this OpenCL device has no float64")
    failed = []
    for name, ast in op_kernels():
        src = RENDERERS[language](ast)
        try:
            device.load(src.name, device.compile(src.name, src.source))
        except Exception as e:  # noqa: BLE001  (collect every failure, then report them all)
            failed.append(f"{name}: {str(e).splitlines()[0]}")
    assert not failed, f"{len(failed)} of {len(op_kernels())} kernels do not compile:\n" + "\n".join(failed)


def matmul_kernel(m_max=256):
    m, n, k = UOp.variable("m", 1, m_max), UOp.variable("n", 1, 300), UOp.variable("k", 1, 500)
    i, j, r = loop(m, 0), loop(n, 1), UOp(Ops.RANGE, dtypes.index, (k,), (2, "reduce"))
    prod = load(1, dtypes.float32, i * k + r) * load(2, dtypes.float32, r * n + j)
    total = UOp(Ops.REDUCE, dtypes.float32, (prod, r), Ops.ADD)
    return kernel(total + UOp.const(1.0, dtypes.float32), i * n + j, "r_m_n")


@pytest.mark.parametrize("language", ["cuda", "opencl"])
def test_contractions_are_tiled_and_compile(language):
    src = RENDERERS[language](matmul_kernel())
    assert src.local_size == (TILE_THREADS,) and "As[" in src.source and "Bs[" in src.source
    tiles = lambda e: -(-e // TILE)  # noqa: E731
    assert [eval_uop(e, {"m": 70, "n": 129, "k": 3}) for e in src.global_size] == [tiles(70) * tiles(129) * TILE_THREADS]
    thin = RENDERERS[language](matmul_kernel(m_max=TILE // 2 - 1))   # a thin one stays a reduction
    assert "As[" not in thin.source
    if language in available_devices():
        device = get_device(language)
        device.load(src.name, device.compile(src.name, src.source))
