"""Hopper's wide tiles on bulk tensor copies (render_fragments_tma.py, tensor_maps.py): which launches take
them, the tensor maps an operand gets (or not), and that NVRTC compiles them for sm_90a (they run on an H100 only:
no emulation)."""
import pytest

from prepjit.codegen import tensor_maps as tm
from prepjit.codegen.gpu_launch import launch, launch_of
from prepjit.codegen.optimize import Blocking
from prepjit.codegen.render_cuda import CUDA, CUDA_HOPPER, render_cuda
from prepjit.codegen.render_fragments_tma import CONSUMER_REGISTERS, PRODUCER_REGISTERS
from prepjit.uop import dtypes

from .test_render_fragments import float32_kernel, strided_narrow_kernel, working_nvrtc


def test_hopper_takes_wide_tiles_of_sixteen_bit_operands_only():
    for dtype in (dtypes.bfloat16, dtypes.float16):
        ast = strided_narrow_kernel(dtype, 4096, 4096, 4096)
        assert launch_of(launch(ast, CUDA_HOPPER, Blocking())) == ("tile", 128, 256, 1, dtype.name, "tma")
        assert launch_of(launch(ast, CUDA, Blocking()))[-1] == dtype.name   # (other GPUs: today's tiles)
    narrow = strided_narrow_kernel(dtypes.bfloat16, 4096, 128, 4096)    # too few columns for a wide tile
    assert launch_of(launch(narrow, CUDA_HOPPER, Blocking()))[-1] != "tma"


@pytest.mark.parametrize("a_t, b_t", [(False, False), (True, True), (False, True)])
def test_operand_maps_are_their_loads_views(a_t, b_t):
    m, n, k = 1000, 4096, 2048
    launched = launch(strided_narrow_kernel(dtypes.bfloat16, m, n, k, a_t, b_t, batch=3), CUDA_HOPPER, Blocking())
    a, b = tm.tensor_maps(launched)
    # a: (m, k) k-minor, or (k, m) m-minor; b: (k, n) n-minor or (n, k) k-minor; each batch a third dim
    assert (a.buffer, b.buffer) == (1, 2)
    assert [int(d.arg) for d in a.dims] == ([m, k, 3] if a_t else [k, m, 3])
    assert [int(s.arg) for s in a.strides] == [m if a_t else k, m * k] and a.box == ((64, 64) if a_t else (64, 128))
    assert [int(d.arg) for d in b.dims] == ([k, n, 3] if b_t else [n, k, 3])
    assert [int(s.arg) for s in b.strides] == [k if b_t else n, k * n] and b.box == ((64, 256) if b_t else (64, 64))


def test_computed_operands_have_no_map_and_unaligned_ones_are_tested():
    scaled = launch(strided_narrow_kernel(dtypes.bfloat16, 4096, 4096, 4096, scale_b=True), CUDA_HOPPER, Blocking())
    assert [m.name for m in tm.tensor_maps(scaled)] == ["A"]
    (a,) = tm.tensor_maps(scaled)
    values = (0, 4096, 4096, 1, 4096, 4096 * 4096)
    assert a.usable(1 << 20, values)
    assert not a.usable((1 << 20) + 2, values)                       # a view 1 element in
    assert not a.usable(1 << 20, (0, 4095, 4096, 1, 4095, 4095 * 4096))   # rows of 8190 bytes


@pytest.mark.parametrize("a_t, b_t, offset, scale_b", [(False, False, 0, False), (True, True, 0, False),
                                                       (False, True, 3, False), (False, False, 0, True)])
def test_wide_tiles_compile_with_nvrtc_for_sm90a(a_t, b_t, offset, scale_b):
    nvrtc = working_nvrtc()
    src = render_cuda(strided_narrow_kernel(dtypes.bfloat16, 4096, 4096, 4096, a_t, b_t, offset=offset,
                                            scale_b=scale_b), None, CUDA_HOPPER)
    maps = 1 if scale_b else 2
    assert src.source.count("const __grid_constant__ pj_tensor_map pj_map") == maps
    assert "__launch_bounds__(384)" in src.source and "pj_wgmma_bf16_n256_" in src.source
    assert f"pj_setmaxnreg<{PRODUCER_REGISTERS}, false>" in src.source and \
        f"pj_setmaxnreg<{CONSUMER_REGISTERS}, true>" in src.source
    assert PRODUCER_REGISTERS + 2 * CONSUMER_REGISTERS <= 512
    nvrtc.compile(src.name, src.source, ["-arch=sm_90a", "-std=c++17", "--fmad=false"])


def test_tf32_takes_wide_tiles_where_both_operands_are_along_k():
    """Under precision "tf32" a float32 x @ W.T (both tiles minor along k, which wgmma's tf32 form needs) takes the
    wide tile, 32 float32 elements a 128-byte row of its maps' boxes; a @ b and a.T @ b keep today's tiles."""
    launched = launch(float32_kernel(4096, 4096, 4096, "tf32", False, True), CUDA_HOPPER, Blocking())
    assert launch_of(launched) == ("tile", 128, 256, 1, "tf32", "tma")
    a, b = tm.tensor_maps(launched)
    assert a.dtype == b.dtype == dtypes.float32 and (a.box, b.box) == ((32, 128), (32, 256))
    assert [int(s.arg) for s in a.strides] == [4096, 4096 * 4096]
    for a_t, b_t in ((False, False), (True, False)):
        assert launch_of(launch(float32_kernel(4096, 4096, 4096, "tf32", a_t, b_t), CUDA_HOPPER, Blocking())) == \
            ("tile", 128, 128, 1, "tf32")
    assert launch_of(launch(float32_kernel(4096, 4096, 4096, None, False, True), CUDA_HOPPER, Blocking()))[4:] == ()


@pytest.mark.parametrize("offset, scale_b", [(0, False), (3, False), (0, True)])
def test_tf32_wide_tiles_round_their_stages_and_compile_for_sm90a(offset, scale_b):
    """The tf32 wide tile: the producer's last three warps round each stage in place (pj_round_tf32 a 16-byte chunk
    at a time) and arrive on `ready`, which the consumers wait on; wgmma m64n256k8, four steps a 32-deep slice;
    NVRTC compiles it for sm_90a (maps usable or not: an unaligned view, a computed operand)."""
    nvrtc = working_nvrtc()
    src = render_cuda(float32_kernel(4096, 4096, 4096, "tf32", False, True, offset=offset, scale_b=scale_b), None,
                      CUDA_HOPPER)
    assert src.source.count("const __grid_constant__ pj_tensor_map pj_map") == (1 if scale_b else 2)
    assert "pj_mbar_init(&ready[s], 96)" in src.source and "pj_mbar_wait(&ready[st]" in src.source
    assert src.source.count("x.w = pj_round_tf32(x.w)") == 4   # (A and B; by their maps, and chunk by chunk)
    assert src.source.count("pj_wgmma_tf32_n256_00(wacc0,") == 4 and "(kt * 32)" in src.source
    nvrtc.compile(src.name, src.source, ["-arch=sm_90a", "-std=c++17", "--fmad=false"])
