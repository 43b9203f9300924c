"""The C-style renderer family (render_c.py) in its CUDA and OpenCL dialects: the same kernels in each
dialect's spelling, and every op x dtype kernel that renders also compiles on each GPU device present
(the cuda part needs pycuda and an NVIDIA GPU; it skips elsewhere)."""
import re

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import render_tiles
from prepjit.codegen.optimize import optimize
from prepjit.codegen.gpu_launch import FEW_OUTPUTS
from prepjit.codegen.render_c import FLOAT_ONLY, INTEGER_ONLY
from prepjit.codegen.row_plan import REDUCE_GROUP
from prepjit.codegen.render_cuda import ELEMENTWISE_GROUP, ITEMS_PER_THREAD, render_cuda
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.render_opencl import render_opencl
from prepjit.codegen.schedule import schedule
from prepjit.codegen.render_tiles import MIN_SIDE, REG, RUN, match_contraction, splits_for, tile_candidates, tile_shape
from prepjit.runtime.cuda_cubin import waits_for_earlier_grids
from prepjit.runtime.devices import available_devices, get_device
from prepjit.uop import Ops, UOp, dtypes, eval_uop
from prepjit.uop.ops import ALU

from . import cuda_emulation
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


def test_every_cuda_kernel_waits_for_the_grids_before_it_before_touching_memory():
    """Programmatic dependent launch (render_cuda.GRID_DEPENDENCY): each CUDA kernel, elementwise, row or tile, waits
    for the grids launched before it (griddepcontrol.wait, on sm_90 and later) before its first global access and
    says so in its module (pj_waits_for_earlier_grids, which the runtime reads from the cubin); OpenCL kernels
    neither."""
    asts = [ast for _, ast in op_kernels()[:6]] + [softmax_kernel(4096), matmul_kernel(), rows_matmul_kernel()]
    for ast in asts:
        src = render_cuda(ast).source
        body = src[src.index("{", src.index("__global__")):]
        first_access = min(body.index(m.group()) for m in re.finditer(r"buf\d+\[", body))
        assert body.index("griddepcontrol.wait;") < body.index("griddepcontrol.launch_dependents;") < first_access
        assert body.index("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900") < body.index("griddepcontrol.wait")
        assert 'extern "C" __constant__ unsigned pj_waits_for_earlier_grids = 1;' in src[:src.index("__global__")]
        assert "griddepcontrol" not in render_opencl(ast).source


def test_both_dialects_share_launch_sizes_and_grouping():
    k = UOp.variable("k", 1, 4096)
    r0, rr = loop(N, 0), UOp(Ops.RANGE, dtypes.index, (k,), (1, "reduce"))
    total = UOp(Ops.REDUCE, dtypes.float32, (load(1, dtypes.float32, r0 * k + rr), rr), Ops.ADD)
    cuda, opencl = render_cuda(kernel(total, r0, "r_n")), render_opencl(kernel(total, r0, "r_n"))
    assert cuda.var_names == opencl.var_names == ("k", "n")
    assert [eval_uop(e, {"n": 3, "k": 9}) for e in cuda.global_size] == [3 * REDUCE_GROUP]
    assert cuda.global_size == opencl.global_size and cuda.local_size == opencl.local_size == (REDUCE_GROUP,)
    assert "__syncthreads();" in cuda.source and "__shared__ __align__(16) float part" in cuda.source
    assert f"__launch_bounds__({REDUCE_GROUP})" in cuda.source
    few = render_cuda(kernel(load(1, dtypes.float32, r0) + UOp.const(1.0, dtypes.float32), r0))
    assert "if (gid >= v_n) return;" in few.source and "base" not in few.source   # n <= 1000: one output an item
    r0 = loop(UOp.variable("n", 1, FEW_OUTPUTS), 0)   # enough outputs for several a work-item
    elementwise = render_cuda(kernel(load(1, dtypes.float32, r0) + UOp.const(1.0, dtypes.float32), r0))
    assert elementwise.local_size == (ELEMENTWISE_GROUP,) and f"if (base + {ITEMS_PER_THREAD} <= v_n) {{" in \
        elementwise.source   # consecutive outputs, unchecked where all are in range: vector loads and stores
    assert "__builtin_assume_aligned(buf1, 16)" in elementwise.source
    assert [eval_uop(e, {"n": 9}) for e in elementwise.global_size] == [-(-9 // ITEMS_PER_THREAD)]
    m = UOp.variable("m", 1, 64)
    r1 = loop(m, 1)
    two_d = render_cuda(kernel(load(1, dtypes.float32, r0 * m + r1) * load(2, dtypes.float32, r1), r0 * m + r1))
    assert "#pragma unroll" in two_d.source and f"e < {ITEMS_PER_THREAD}; e++" in two_d.source   # a block apart
    assert "if (gid < " in two_d.source and "assume_aligned" not in two_d.source


def softmax_kernel(k_max, static=False, heads=1):
    """softmax over rows of an (n, k * heads) buffer, as fusion hands it over: both reductions inside the store."""
    k = UOp.const(k_max) if static else UOp.variable("k", 1, k_max) * heads if heads > 1 else UOp.variable("k", 1, k_max)
    r0, r1 = loop(N, 0), loop(k, 1)
    rr2, rr3 = (UOp(Ops.RANGE, dtypes.index, (k,), (a, "reduce")) for a in (2, 3))
    top = UOp(Ops.REDUCE, dtypes.float32, (load(1, dtypes.float32, r0 * k + rr2), rr2), Ops.MAX)
    exp = lambda r: UOp(Ops.EXP, dtypes.float32, (load(1, dtypes.float32, r0 * k + r) - top,))  # noqa: E731
    total = UOp(Ops.REDUCE, dtypes.float32, (exp(rr3), rr3), Ops.ADD)
    return kernel(UOp(Ops.FDIV, dtypes.float32, (exp(r1), total)), r0 * k + r1, "r_soft")


@pytest.mark.parametrize("language", ["cuda", "opencl"])
def test_row_reductions_get_a_work_group_per_row(language):
    src = RENDERERS[language](softmax_kernel(4096))
    assert src.local_size == (REDUCE_GROUP,) and src.var_names == ("k", "n")
    assert [eval_uop(e, {"n": 3, "k": 9}) for e in src.global_size] == [3 * REDUCE_GROUP]
    long = "long long" if language == "cuda" else "long"
    assert f"for ({long} c = lid; c < v_k; c += {REDUCE_GROUP})" in src.source   # the row's columns
    computed = RENDERERS[language](softmax_kernel(2048, heads=2)).source   # rows of k * 2: a count computed first
    lines = [line.strip() for line in computed.splitlines()]   # a pragma before anything but a loop fails to compile
    assert all(lines[k + 1].startswith("for (") for k, line in enumerate(lines) if line.startswith("#pragma unroll"))
    barrier = "__syncthreads();" if language == "cuda" else "barrier(CLK_LOCAL_MEM_FENCE);"
    if language == "cuda":   # shuffles within each warp, one barrier per reduction
        assert src.source.count("__shfl_xor_sync") == 2 and src.source.count(barrier) == 2
    else:                    # a local-memory tree
        assert src.source.count(barrier) == 4
    small = RENDERERS[language](softmax_kernel(40))     # a group sized to the row
    assert small.local_size == (64,) and [eval_uop(e, {"n": 3, "k": 9}) for e in small.global_size] == [3 * 64]
    inline = RENDERERS[language](softmax_kernel(16))    # short rows: each work-item computes its row's values
    assert inline.local_size == ((ELEMENTWISE_GROUP,) if language == "cuda" else ()) and barrier not in inline.source
    runs = RENDERERS[language](softmax_kernel(4096, static=True)).source   # runs of consecutive columns
    if language == "cuda":
        step = REDUCE_GROUP * ITEMS_PER_THREAD   # 4 passes a work-item: straight-line code (UNROLLED_PASSES)
        assert f"c = lid * {ITEMS_PER_THREAD} + {3 * step};" in runs and "for (" not in runs.split("c = lid")[1]
        assert "__builtin_assume_aligned(buf1, 16)" in runs
    else:   # one item at a time
        assert f"c = lid; c < 4096L; c += {REDUCE_GROUP})" in runs


def test_rendered_kernels_compile_with_nvrtc_alone():
    """Every op x dtype kernel and the row and tile kernels compile with NVRTC for sm_90 (no GPU needed:
    NVRTC alone, e.g. the nvidia-cuda-nvrtc wheel)."""
    from prepjit.runtime.nvrtc import NVRTC
    try:
        nvrtc = NVRTC()
        nvrtc.compile("probe", 'extern "C" __global__ void probe(int *a) { a[0] = 1; }', ["-arch=sm_90"])
    except (pj.DeviceError, pj.CompileError) as e:
        pytest.skip(f"no working NVRTC here ({str(e).splitlines()[0]})")
    asts = [ast for _, ast in op_kernels()] + [softmax_kernel(4096), softmax_kernel(40), matmul_kernel(),
                                               softmax_kernel(4096, static=True), rows_matmul_kernel(),
                                               static_matmul_kernel(4096, 384, 384), static_matmul_kernel(512, 32, 128)]
    for ast in asts:
        src = render_cuda(ast)
        cubin = nvrtc.compile(src.name, src.source, ["-arch=sm_90", "-std=c++17", "--fmad=false"])
        assert waits_for_earlier_grids(cubin), src.name   # (read back from the cubin: runtime/cuda_cubin.py)


def test_cuda_float16_converts_through_libdevice_not_inline_ptx():
    """float16 widens and rounds by libdevice's __nv_half2float and __nv_float2half_rn (the same cvt instructions):
    NVVM merges no loads across an inline asm statement, so with PTX conversions a run of float16 elements (or a
    quantized block's bytes beside its float16 scales) was loaded an element at a time."""
    r = loop(N)
    src = render_cuda(kernel(UOp(Ops.EXP, dtypes.float16, (load(1, dtypes.float16, r),)), r)).source
    assert "__nv_half2float(h)" in src and "__nv_float2half_rn(f)" in src and "expf(" in src
    assert "cvt.rn.f16.f32" not in src and "cvt.f32.f16" not in src
    assert "const unsigned short *__restrict__ buf1" in src


@pytest.mark.parametrize("language", ["cuda", "opencl"])
def test_every_rendered_op_compiles(language):
    if language not in available_devices():
        pytest.skip(f"no {language} device here" + (" (needs pycuda and an NVIDIA GPU)" if language == "cuda" else ""))
    device = get_device(language)
    if language == "opencl" and "cl_khr_fp64" not in device.extensions:
        pytest.skip("this OpenCL device has no float64")
    kernels = [(name, RENDERERS[language](ast)) for name, ast in op_kernels()]
    if language == "opencl" and _build_as_one_opencl_program(device, [src for _, src in kernels]):
        return
    failed = []
    for name, src in kernels:
        try:
            device.load(src.name, device.compile(src.name, src.source))
        except Exception as e:  # noqa: BLE001  (collect every failure, then report them all)
            failed.append(f"{name}: {str(e).splitlines()[0]}")
    assert not failed, f"{len(failed)} of {len(kernels)} kernels do not compile:\n" + "\n".join(failed)


_DEFINED = re.compile(r"^[A-Za-z_][\w ]*?\b(\w+)\(", re.M)   # a function at file scope: a kernel or a helper
_ENABLED = re.compile(r"^#pragma OPENCL EXTENSION (\w+) : enable$", re.M)


def _build_as_one_opencl_program(device, sources) -> bool:
    """Whether the OpenCL C `sources` build as one program and each kernel loads from it with work-groups the
    device allows. Each source is as alone there as in a program of its own: the names it defines (its kernel and
    helpers) take the suffix _i, so a name only another source defines stays undefined in it, and an extension it
    enables is disabled after it. PoCL costs ~0.2 s of CPU a program however small (266 programs ~60 s with its
    cache empty, as on CI; one program of all 266 ~1 s); False (a failure, told kernel by kernel by the caller)
    when the program fails to build."""
    parts = []
    for i, src in enumerate(sources):
        defined = "|".join(map(re.escape, set(_DEFINED.findall(src.source))))
        parts.append(re.sub(rf"\b({defined})\b", lambda m: f"{m.group(1)}_{i}", src.source) + "\n" +
                     "".join(f"#pragma OPENCL EXTENSION {ext} : disable\n" for ext in _ENABLED.findall(src.source)))
    try:
        code = device.compile(f"{sources[0].name}_0", "".join(parts))
    except pj.CompileError:
        return False
    for i, src in enumerate(sources):
        loaded = device.load(f"{src.name}_{i}", code)
        required, most = device._group_sizes(device.cl.Kernel(loaded.program, loaded.name))
        assert required <= most, (src.name, required, most)
    return True


def matmul_kernel(m_max=256):
    m, n, k = UOp.variable("m", 1, m_max), UOp.variable("n", 1, 300), UOp.variable("k", 1, 500)
    i, j, r = loop(m, 0), loop(n, 1), UOp(Ops.RANGE, dtypes.index, (k,), (2, "reduce"))
    prod = load(1, dtypes.float32, i * k + r) * load(2, dtypes.float32, r * n + j)
    total = UOp(Ops.REDUCE, dtypes.float32, (prod, r), Ops.ADD)
    return kernel(total + UOp.const(1.0, dtypes.float32), i * n + j, "r_m_n")


def rows_matmul_kernel():
    """x @ w with x of shape (b, t, k): the rows are two ranges."""
    t, m, k = UOp.variable("t", 1, 100), UOp.variable("m", 1, 300), UOp.variable("k", 1, 500)
    b, i, j, r = loop(N, 0), loop(t, 1), loop(m, 2), UOp(Ops.RANGE, dtypes.index, (k,), (3, "reduce"))
    prod = load(1, dtypes.float32, (b * t + i) * k + r) * load(2, dtypes.float32, r * m + j)
    return kernel(UOp(Ops.REDUCE, dtypes.float32, (prod, r), Ops.ADD), (b * t + i) * m + j, "r_b_t_m")


@pytest.mark.parametrize("language", ["cuda", "opencl"])
def test_contractions_over_several_row_ranges_are_tiled(language):
    src = RENDERERS[language](rows_matmul_kernel())
    tm, tn = tile_shape(N.vmax * 100, 300, 1)
    assert src.local_size == (match_contraction(rows_matmul_kernel()).threads,) and "As[" in src.source
    tiles = lambda e, t: -(-e // t)  # noqa: E731
    assert [eval_uop(e, {"n": 5, "t": 70, "m": 5, "k": 3}) for e in src.global_size] == \
        [tiles(5 * 70, tm) * tiles(5, tn) * src.local_size[0]]


def test_tile_shapes_fill_the_gpu_and_waste_little():
    assert tile_shape(4096, 4096, 1) == (128, 128)     # large: the biggest tile, 1024 groups
    assert tile_shape(4096, 384, 1) == (64, 64)        # 96 groups of 128 x 128 would leave SMs idle: 384
    assert tile_shape(4096, 1536, 1) == (128, 64)      # 384 groups of 128 x 128 are 3 waves of 132: 768
    assert tile_shape(128, 128, 384) == (128, 64)      # a batch of attention scores
    assert tile_shape(128, 32, 384) == (128, 32)       # attention @ values: no padded columns
    assert tile_shape(1024, 1024, 1) == (64, 64)       # the most groups when none gives enough


def test_small_contractions_split_each_slice_between_sets_of_work_items():
    assert splits_for(1024, 256) == 1                  # 4096^3 in 128 x 128 tiles: 8192 warps
    assert splits_for(384, 64) == 2                    # 4096 x 384 in 64 x 64 tiles: 768 warps, 1536 split in two
    assert splits_for(4, 64) == 4                      # the most sets that fit a group
    assert splits_for(4, 256) == 1


def static_matmul_kernel(m, n, k):
    i, j, r = loop(UOp.const(m), 0), loop(UOp.const(n), 1), UOp(Ops.RANGE, dtypes.index, (UOp.const(k),), (2, "reduce"))
    prod = load(1, dtypes.float32, i * k + r) * load(2, dtypes.float32, r * n + j)
    return kernel(UOp(Ops.REDUCE, dtypes.float32, (prod, r), Ops.ADD), i * n + j, "r_m_n")


@pytest.mark.parametrize("language", ["cuda", "opencl"])
def test_contraction_operands_load_runs_along_their_contiguous_axis(language):
    m, n, k = 512, 256, 64   # a (m, k) row-major: runs along k; b (k, n) row-major: runs along its columns
    ast = static_matmul_kernel(m, n, k)
    i, j, r = sorted((u for u in ast.toposort() if u.op is Ops.RANGE), key=lambda u: u.arg[0])
    c = match_contraction(ast)
    assert (c.tm, c.tn) == tile_shape(m, n, 1)
    src = RENDERERS[language](ast).source
    assert f"pA0[{RUN - 1}]" in src and f"pB0[{RUN - 1}]" in src and "(gk + 3)" in src
    assert src.count("float4 a_lo") == 2 and src.count("const float4 *)&As[1][kk]") == 2   # 4-vector local reads
    strided = load(1, dtypes.float32, r * (2 * m) + 2 * i) * load(2, dtypes.float32, r * n + j)  # no unit stride
    src = RENDERERS[language](kernel(UOp(Ops.REDUCE, dtypes.float32, (strided, r), Ops.ADD), i * n + j, "r_m_n"))
    assert "pA0[0] = " in src.source and "pA0[1] = " not in src.source and f"pB0[{RUN - 1}] = " in src.source


@pytest.mark.parametrize("language", ["cuda", "opencl"])
def test_contractions_are_tiled_and_compile(language):
    src = RENDERERS[language](matmul_kernel())
    tm, tn = tile_shape(256, 300, 1)
    assert src.local_size == (match_contraction(matmul_kernel()).threads,) and "As[" in src.source and "Bs[" in src.source
    tiles = lambda e, t: -(-e // t)  # noqa: E731
    assert [eval_uop(e, {"m": 70, "n": 129, "k": 3}) for e in src.global_size] == \
        [tiles(70, tm) * tiles(129, tn) * src.local_size[0]]
    thin = RENDERERS[language](matmul_kernel(m_max=MIN_SIDE - 1))   # a thin one stays a reduction
    assert "As[" not in thin.source
    if language in available_devices():
        device = get_device(language)
        device.load(src.name, device.compile(src.name, src.source))


def strided_matmul_kernel(m, n, k, a_strides, b_strides, batch=1):
    """out[p, i, j] = sum_r a[p, i, r] * b[p, r, j], a's and b's (row, reduce) / (reduce, column) element strides given
    (transposed operands: strides (1, m) or (n, 1)); p a batch range."""
    p, i, j = loop(UOp.const(batch), 0), loop(UOp.const(m), 1), loop(UOp.const(n), 2)
    r = UOp(Ops.RANGE, dtypes.index, (UOp.const(k),), (3, "reduce"))
    a = load(1, dtypes.float32, p * (m * k) + i * a_strides[0] + r * a_strides[1])
    b = load(2, dtypes.float32, p * (k * n) + r * b_strides[0] + j * b_strides[1])
    total = UOp(Ops.REDUCE, dtypes.float32, (a * b, r), Ops.ADD)
    return kernel(total + UOp.const(1.0, dtypes.float32), (p * m + i) * n + j, "r_p_m_n")


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("m, n, k, a_t, b_t, batch", [
    (256, 192, 64, False, False, 1),    # runs of 4 along k (a) and along the columns (b), 64 x 64 tiles
    (70, 45, 33, False, False, 1),      # no runs fit: single elements, every edge partial
    (130, 129, 17, True, True, 1),      # both transposed: a runs along its rows, b along k
    (128, 32, 128, False, False, 3),    # batched attention @ values: 128 x 32 tiles
    (128, 128, 32, False, True, 2),     # batched scores q @ k^T
])
def test_tile_kernels_compute_the_matmul(m, n, k, a_t, b_t, batch):
    """The CUDA tile kernel, run on the CPU through cuda_emulation, equals NumPy's matmul."""
    ast = strided_matmul_kernel(m, n, k, (1, m) if a_t else (k, 1), (1, k) if b_t else (n, 1), batch)
    assert match_contraction(ast) is not None
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((batch, m, k), np.float32), rng.standard_normal((batch, k, n), np.float32)
    a_mem = np.ascontiguousarray(np.swapaxes(a, 1, 2)) if a_t else a
    b_mem = np.ascontiguousarray(np.swapaxes(b, 1, 2)) if b_t else b
    out = np.zeros(batch * m * n, np.float32)
    cuda_emulation.run(render_cuda(ast), [out, a_mem.ravel(), b_mem.ravel()])
    np.testing.assert_allclose(out.reshape(batch, m, n), a @ b + 1, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("language", ["cuda", "opencl"])
def test_fma_tiles_keep_two_copies_of_a_slice_and_one_barrier_a_slice(language):
    """An FMA tile (render_tiles.SIMT_STAGES = 2) stores the next slice's registers into the local tiles' other copy
    after the arithmetic, so its loop has one barrier a slice (where it had one before the arithmetic and one after),
    two slices a step, one from each copy; the emulated kernels' values: test_tile_kernels_compute_the_matmul,
    test_every_tile_candidate_computes_the_matmul."""
    assert render_tiles.SIMT_STAGES == 2
    src = RENDERERS[language](static_matmul_kernel(512, 256, 64)).source
    barrier = "__syncthreads();" if language == "cuda" else "barrier(CLK_LOCAL_MEM_FENCE);"
    loop = src[src.index(" k0 = 0; k0 < 64"):]
    loop = loop[:loop.index(barrier, loop.index("&As[1][kk]")) + len(barrier)]   # (the loop: two slices)
    assert f"k0 += {2 * render_tiles.TILE_K})" in loop and f"As[2][{render_tiles.TILE_K}][" in src
    assert loop.count(barrier) == 2
    order = [loop.index(x) for x in ("&As[0][kk]", "As[1][(lid", barrier, "&As[1][kk]", "As[0][(lid")]
    assert order == sorted(order)


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_every_tile_candidate_computes_the_matmul():
    """Each tiling PREPJIT_TUNE may pick on a GPU (every tile shape, each number of sets of work-items splitting a
    slice) renders a CUDA kernel that equals NumPy's matmul, run through cuda_emulation (k = 40: a partial slice)."""
    m, n, k = 256, 192, 40
    ast = strided_matmul_kernel(m, n, k, (k, 1), (n, 1))
    candidates = tile_candidates(ast)
    assert len(candidates) == len(set(candidates)) == 14 and candidates[0][:2] == tile_shape(m, n, 1)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    for tile in candidates:
        src = render_cuda(ast, tile)
        assert src.local_size == ((tile[0] // REG) * (tile[1] // REG) * tile[2],), tile
        out = np.zeros(m * n, np.float32)
        cuda_emulation.run(src, [out, a.ravel(), b.ravel()])
        np.testing.assert_allclose(out.reshape(m, n), a @ b + 1, rtol=1e-5, atol=1e-4, err_msg=str(tile))


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("k, group", [(128, 4 * 32), (384, 3 * 32), (130, 160), (4096, REDUCE_GROUP)])
def test_row_kernels_compute_softmax(k, group):
    """A softmax row kernel, run on the CPU through cuda_emulation: groups sized by the runs of 4 that CUDA work-items
    take (a row of 128: one warp, shuffles only, 4 rows a work-group, the warps past the 5th row leaving; 384: 3 warps,
    each work-item's passes straight-line code), a row of 130 in single elements (5 warps, one pass each, the
    work-items past the row's end skipping it)."""
    rows = 5
    r0, r1 = loop(UOp.const(rows), 0), loop(UOp.const(k), 1)
    rr2, rr3 = (UOp(Ops.RANGE, dtypes.index, (UOp.const(k),), (a, "reduce")) for a in (2, 3))
    top = UOp(Ops.REDUCE, dtypes.float32, (load(1, dtypes.float32, r0 * k + rr2), rr2), Ops.MAX)
    exp = lambda r: UOp(Ops.EXP, dtypes.float32, (load(1, dtypes.float32, r0 * k + r) - top,))  # noqa: E731
    total = UOp(Ops.REDUCE, dtypes.float32, (exp(rr3), rr3), Ops.ADD)
    src = render_cuda(kernel(UOp(Ops.FDIV, dtypes.float32, (exp(r1), total)), r0 * k + r1, "r_soft"))
    assert src.local_size == (group,)
    x = np.random.default_rng(k).standard_normal((rows, k)).astype(np.float32) * 4
    out = np.zeros(rows * k, np.float32)
    cuda_emulation.run(src, [out, x.ravel()])
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out.reshape(rows, k), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_head_merged_operands_load_runs():
    """ctx (heads, m, 32) read as (m, heads * 32) @ w: no unit stride along k, but runs of 4 inside each head (what
    the attention output projection reads) load as runs, each element its run start's index + e."""
    heads, m, n = 4, 128, 64
    i, j, r = loop(UOp.const(m), 0), loop(UOp.const(n), 1), UOp(Ops.RANGE, dtypes.index, (UOp.const(heads * 32),), (2, "reduce"))
    a = load(1, dtypes.float32, r // 32 * (m * 32) + i * 32 + r % 32)
    ast = kernel(UOp(Ops.REDUCE, dtypes.float32, (a * load(2, dtypes.float32, r * n + j), r), Ops.ADD), i * n + j, "r_m_n")
    src = render_cuda(ast)
    assert f"pA0[{RUN - 1}] = " in src.source
    rng = np.random.default_rng(3)
    ctx, w = rng.standard_normal((heads, m, 32), np.float32), rng.standard_normal((heads * 32, n), np.float32)
    out = np.zeros(m * n, np.float32)
    cuda_emulation.run(src, [out, ctx.ravel(), w.ravel()])
    np.testing.assert_allclose(out.reshape(m, n), np.swapaxes(ctx, 0, 1).reshape(m, -1) @ w, rtol=1e-5, atol=1e-4)


def _attention_softmax(s, mask):   # MiniLM's: scores scaled, the padding mask added, then softmax
    x = s * 0.125 + mask
    e = np.exp(x - x.max(axis=-1, keepdims=True)) if isinstance(s, np.ndarray) else \
        pnp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _residual_layernorm(x, y, g, b):   # MiniLM's: a residual added to a biased projection, then layernorm
    xp = np if isinstance(x, np.ndarray) else pnp
    h = x * g + b + y
    c = h - xp.mean(h, axis=-1, keepdims=True)
    return c / xp.sqrt(xp.mean(c * c, axis=-1, keepdims=True) + 1e-12) * g + b


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("fn, shapes", [(_attention_softmax, [(2, 3, 16, 128), (2, 1, 1, 128)]),
                                        (_residual_layernorm, [(2, 16, 384), (2, 16, 384), (384,), (384,)])])
def test_softmax_and_layernorm_of_computed_rows_are_one_row_kernel(fn, shapes):
    """A row's value that its reduction and its output both read (exp(x - max), x - mean) is recomputed inside the
    one row kernel, not given a pass of its own (each reader computing it costs more than writing it and reading it
    back, counted in iterations, but on a GPU the row kernel's second read comes from cache): MiniLM's softmax
    and layernorm are one kernel each, run here through cuda_emulation against NumPy (opencl renders it too). Each
    work-item takes one run of its row (128 = a warp's runs of 4, 384 = 3 warps'), whose elements it loads once, in
    the first pass, and keeps for the others."""
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) * 3 for s in shapes]
    traced = pj.trace(fn, *args)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    assert len(sched.kernels) == 1
    k = sched.kernels[0]
    render_opencl(optimize(k.ast, "opencl"))
    src = render_cuda(optimize(k.ast, "cuda"))
    assert src.source.count("__shfl_xor_sync") == 2   # both of the row's reductions combine in this kernel
    assert src.source.count(" = buf") == ITEMS_PER_THREAD * len(args)   # each work-item loads its run of the row once
    bufs = {i: a.ravel() for i, a in zip(sched.inputs, args)}
    out = np.zeros(sched.buffers[k.buffers[0]].max_size, np.float32)
    cuda_emulation.run(src, [out] + [bufs[i] for i in k.buffers[1:]])
    np.testing.assert_allclose(out.reshape(shapes[0]), fn(*args), rtol=1e-5, atol=1e-6)
