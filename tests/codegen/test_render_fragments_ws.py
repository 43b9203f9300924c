"""Hopper's warp-specialised tiles (render_fragments_ws.py): which tiles have the variant, what it is made of, that
the producer's chunk offsets are where its chunks are, that CUDA's compilers keep it for sm_90a and the CPU emulation
(and every other GPU) the other variants; and the grid's banded order over the tiles (render_fragments)."""
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import render_fragments, render_fragments_ws as ws
from prepjit.codegen.render_cuda import render_cuda
from prepjit.codegen.render_tiles import match_contraction, tile_shape
from prepjit.runtime.devices import available_devices
from prepjit.uop import dtypes

from . import cuda_emulation
from .test_render_fragments import EMULATED, emulate, float32_kernel, strided_narrow_kernel, working_nvrtc


@pytest.mark.parametrize("a_t, b_t", [(False, False), (True, True), (False, True)])
def test_sixteen_bit_tiles_of_two_warpgroups_have_a_warp_specialised_variant(a_t, b_t):
    ast = strided_narrow_kernel(dtypes.bfloat16, 4096, 4096, 4096, a_t, b_t)
    src = render_cuda(ast, (128, 128, 1, "bfloat16")).source
    assert "#if PJ_WARP_SPECIALISED" in src and "#else" in src
    # one producer warpgroup, one consumer of all 128 rows (two m64n128 blocks), on a ring of mbarriers
    assert f"pj_setmaxnreg<{ws.PRODUCER_REGISTERS}, false>();" in src
    assert f"pj_setmaxnreg<{ws.CONSUMER_REGISTERS}, true>();" in src
    assert ws.PRODUCER_REGISTERS + ws.CONSUMER_REGISTERS == 2 * 128   # (the launch's 128 a work-item, two tiles an SM)
    assert "pj_mbar_wait(&full[st]" in src and "pj_mbar_wait(&empty[st]" in src
    assert "pj_cp_async_mbar_arrive(&full[st]);" in src and "pj_mbar_arrive(&empty[(kt - 1) % 3]);" in src
    assert f"pj_wgmma_bf16_n128_{int(a_t)}{int(b_t is False)}(wacc1, " in src
    # its three 64-deep stages (96 KB) where it runs, the other variants' four 32-deep ones (64 KB) elsewhere
    assert "pj_dynamic_local_bytes = PJ_WARP_SPECIALISED ? 98304 : 65536;" in src
    assert "unsigned short (&As)[3][1][128][64]" in src or "unsigned short (&As)[3][2][64][64]" in src


def test_other_tiles_keep_their_variants():
    narrow = strided_narrow_kernel(dtypes.bfloat16, 4096, 4096, 4096)
    for tile in ((128, 64), (64, 128), (128, 256)):   # one warpgroup, or more accumulators than a consumer holds
        assert "#if PJ_WARP_SPECIALISED" not in render_cuda(narrow, (*tile, 1, "bfloat16")).source
        assert not ws.warp_specialised(match_contraction(narrow, (*tile, 1, "bfloat16")))
    tf32 = float32_kernel(4096, 4096, 4096, "tf32", b_t=True)   # (its chunks rounded in local memory: not here)
    assert not ws.warp_specialised(match_contraction(tf32, (128, 128, 1, "tf32")))


@pytest.mark.parametrize("a_t, b_t", [(False, False), (True, True)])
def test_producer_chunk_offsets_are_where_its_chunks_are(a_t, b_t):
    """Chunk lid + 128 n of a producer work-item is its first chunk's place plus _chunk_offsets' n-th, for every
    work-item (so the producer keeps one address an operand)."""
    c = match_contraction(strided_narrow_kernel(dtypes.bfloat16, 4096, 4096, 4096, a_t, b_t), (128, 128, 1, "bfloat16"))
    for s in render_fragments._staged(c, ws.WS_DEPTH):
        _, rows, length = s.shape
        per_row = length // s.kind.chunk
        offsets = ws._chunk_offsets(s)
        assert offsets is not None and len(offsets) == s.chunks // 128

        def place(ch):   # (emit_chunk_starts's row and block of chunk ch)
            return ch // per_row % rows, ch // (per_row * rows)
        for lid in range(128):
            row0, blk0 = place(lid)
            for n, (row, blk, own, k) in enumerate(offsets):
                assert place(lid + 128 * n) == (row0 + row, blk0 + blk), (s.name, lid, n)
                assert (own, k) == ((row, 0) if s.minor == "k" else (blk * s.block, row))


@pytest.mark.skipif(shutil.which("clang++") is None, reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_the_emulation_takes_the_other_variants():
    """The CPU emulation compiles kernels as C++ for sm_90a (wgmma emulated) but not as CUDA: PJ_WARP_SPECIALISED is
    0 there, so its tests run the tile's other variants (the mbarriers and setmaxnreg run on a GPU only)."""
    src = render_cuda(strided_narrow_kernel(dtypes.bfloat16, 256, 256, 256), (128, 128, 1, "bfloat16")).source
    probe = cuda_emulation.host_source(src, wgmma=True) + "\nstatic_assert(PJ_WGMMA && !PJ_WARP_SPECIALISED, \"\");\n"
    done = subprocess.run(["clang++", "-std=c++17", "-fsyntax-only", "-w", *cuda_emulation.F16C, "-x", "c++", "-"],
                          input=probe, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_warp_specialised_tiles_compile_with_nvrtc_for_sm90a():
    """NVRTC (CUDA: PJ_WARP_SPECIALISED on sm_90a) compiles the variant, ptxas checking its inline PTX (mbarriers,
    cp.async.mbarrier.arrive, setmaxnreg), for operands along k or their own axes, computed and unaligned ones."""
    nvrtc = working_nvrtc()
    for ast, kind in ((strided_narrow_kernel(dtypes.bfloat16, 4096, 4096, 4096, True, True), "bfloat16"),
                      (strided_narrow_kernel(dtypes.float16, 1000, 520, 300, False, True, 2, 1, True), "float16")):
        src = render_cuda(ast, (128, 128, 1, kind))
        assert "#if PJ_WARP_SPECIALISED" in src.source
        nvrtc.compile(src.name, src.source, ["-arch=sm_90a", "-std=c++17", "--fmad=false"])


@EMULATED
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
def test_banded_grid_order_covers_every_tile(wgmma):
    """More tile rows than a band (RASTER_ROWS), the last band partial, a batch: every tile computed once."""
    m, n, k = 64 * (render_fragments.RASTER_ROWS + 2) + 5, 136, 40
    ast = strided_narrow_kernel(dtypes.bfloat16, m, n, k, batch=2)
    emulate(ast, ml_dtypes.bfloat16, m, n, k, batch=2, tile=(64, 64, 1, "bfloat16"), wgmma=wgmma)


def ws_case(case: str, np_dtype, m=4100, n=2056, k=1000, device="cuda"):
    """A matmul on `device` against NumPy: float32 sums of 16-bit products. `case`: "a@b", "a@b.T" (b along k),
    "computed" (b * 2 in its 16-bit float), "unaligned" (a's view one element in), "batch" (two of them)."""
    rng = np.random.default_rng(0)
    batch = (2,) if case == "batch" else ()
    a = rng.standard_normal((*batch, m, k + (case == "unaligned")), np.float32).astype(np_dtype)
    b = rng.standard_normal((*batch, n, k) if case == "a@b.T" else (*batch, k, n), np.float32).astype(np_dtype)

    def f(x, y):
        x = x[..., 1:] if case == "unaligned" else x
        y = y.T if case == "a@b.T" else y * np.asarray(2, np_dtype) if case == "computed" else y
        return pnp.matmul(x, y, preferred_element_type=pnp.float32)
    got = np.asarray(pj.prepare(f, device=device)(a, b))
    a32 = a[..., 1:].astype(np.float32) if case == "unaligned" else a.astype(np.float32)
    b32 = b.T.astype(np.float32) if case == "a@b.T" else b.astype(np.float32) * (2 if case == "computed" else 1)
    np.testing.assert_allclose(got, a32 @ b32, rtol=1e-5, atol=1e-4 * np.sqrt(k))


def test_the_cuda_cases_check_what_they_say_on_the_cpu():
    for case in ("a@b", "a@b.T", "computed", "unaligned", "batch"):
        ws_case(case, ml_dtypes.bfloat16, 40, 24, 16, device="cpu")


@pytest.mark.skipif("cuda" not in available_devices(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("np_dtype", [ml_dtypes.bfloat16, np.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("case", ["a@b", "a@b.T", "computed", "unaligned", "batch"])
def test_warp_specialised_tiles_on_cuda_equal_numpy(np_dtype, case):
    """Tiles of 128 x 128 (the policy's, for these sizes: warp-specialised on an H100 or H200), ragged on every side
    and a partial last slice, operands as `ws_case` says."""
    assert tile_shape(4100, 2056, 1) == (128, 128) and tile_shape(2100, 2056, 2) == (128, 128)
    ws_case(case, np_dtype, *((2100, 2056, 300) if case == "batch" else ()))
