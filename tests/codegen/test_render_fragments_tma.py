"""Hopper's wide tiles on bulk tensor copies (render_fragments_tma.py, tensor_maps.py): which launches take
them, the tensor maps an operand gets (or not), and that NVRTC compiles them for sm_90a (they run on an H100 only:
no emulation)."""
import collections
import re

import pytest

from prepjit.codegen import gpu_launch, render_fragments_tma, tensor_maps as tm
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


def test_tf32_takes_wide_tiles_where_a_is_along_k(monkeypatch):
    """Under precision "tf32" a float32 x @ W.T (both tiles minor along k, which wgmma's tf32 form needs) takes the
    wide tile, 32 float32 elements a 128-byte row of its maps' boxes; so does a @ b (b's tiles transposed in local
    memory: its map's boxes 32 columns by 32 rows of k, one a block), unless gpu_launch.WIDE_TF32_TRANSPOSED is off;
    a.T @ b keeps today's tiles."""
    launched = launch(float32_kernel(4096, 4096, 4096, "tf32", False, True), CUDA_HOPPER, Blocking())
    assert launch_of(launched) == ("tile", 128, 256, 1, "tf32", "tma")
    a, b = tm.tensor_maps(launched)
    assert a.dtype == b.dtype == dtypes.float32 and (a.box, b.box) == ((32, 128), (32, 256))
    assert [int(s.arg) for s in a.strides] == [4096, 4096 * 4096]
    launched = launch(float32_kernel(4096, 4096, 4096, "tf32"), CUDA_HOPPER, Blocking())
    assert launch_of(launched) == ("tile", 128, 256, 1, "tf32", "tma")
    a, b = tm.tensor_maps(launched)
    assert (a.box, b.box) == ((32, 128), (32, 32)) and [int(s.arg) for s in b.strides] == [4096, 4096 * 4096]
    assert launch_of(launch(float32_kernel(4096, 4096, 4096, "tf32", True, False), CUDA_HOPPER, Blocking())) == \
        ("tile", 128, 128, 1, "tf32")
    assert launch_of(launch(float32_kernel(4096, 4096, 4096, None, False, True), CUDA_HOPPER, Blocking()))[4:] == ()
    monkeypatch.setattr(gpu_launch, "WIDE_TF32_TRANSPOSED", False)
    assert launch_of(launch(float32_kernel(4096, 4096, 4096, "tf32"), CUDA_HOPPER, Blocking())) == \
        ("tile", 128, 128, 1, "tf32")


@pytest.mark.parametrize("offset", [0, 3])
def test_tf32_a_at_b_wide_tiles_transpose_b_and_compile_for_sm90a(offset):
    """The tf32 wide tile of a @ b: the rounders' warps transpose b's blocks in place (32 k rows of 32 columns, as
    the bulk copies or the chunk copies write them with the 128-byte swizzle) into the layout wgmma m64n256k8 reads
    minor along k, rounding each element (simulated below from the rendered statements: every element lands where
    the k-minor swizzled layout puts it, once), a's chunks rounded in place; the producer keeps 88 registers, the
    consumers 208; NVRTC compiles it for sm_90a (maps usable or not: an unaligned view). (A computed b is staged
    minor along k, element by element: no transposes.)"""
    nvrtc = working_nvrtc()
    src = render_cuda(float32_kernel(4096, 4096, 4096, "tf32", offset=offset), None, CUDA_HOPPER).source
    assert src.count("const __grid_constant__ pj_tensor_map pj_map") == 2
    assert src.count("pj_wgmma_tf32_n256_00(wacc0,") == 4 and "pj_mbar_wait(&ready[st]" in src
    producer, consumer = render_fragments_tma.TRANSPOSER_REGISTERS
    assert f"pj_setmaxnreg<{producer}, false>" in src and f"pj_setmaxnreg<{consumer}, true>" in src
    assert producer + 2 * consumer <= 512
    assert len(re.findall(r"for \(int q0 = lid - 32; q0 < 1024; q0 \+= \d+\)", src)) == 2   # (a's chunks)
    assert src.count("for (int b = lid / 32 - 1; b < 8; b += 3) {") == 2 and src.count("__syncwarp();") == 2
    body = src[src.index("unsigned *blk = (unsigned *)&Bs[st][b][0][0];"):]
    body = body[:body.index("}")]
    reads = re.findall(r"const uint4 t(\d) = \*\(uint4 \*\)\(blk \+ ([^;]+)\);", body)
    writes = re.findall(r"blk\[([^\]]+)\] = pj_round_tf32\(t(\d)\.([xyzw])\);", body)
    assert len(reads) == 8 and len(writes) == 32

    def at(expr: str, lane: int) -> int:   # a C index expression of non-negative ints, evaluated for one lane
        return eval(expr.replace("/", "//"), {"lane": lane})

    def swizzled(row: int, col: int) -> int:   # a 32-bit element's place in 128-byte rows, the 128-byte swizzle
        return row * 32 + (col // 4 ^ row % 8) * 4 + col % 4
    block = {swizzled(k, n): ("k", k, "n", n) for k in range(32) for n in range(32)}   # as copied: rows of k
    held = {lane: {int(t): [block[at(e, lane) + j] for j in range(4)] for t, e in reads} for lane in range(32)}
    written = collections.Counter()
    for lane in range(32):
        for e, t, part in writes:
            written[at(e, lane)] += 1
            block[at(e, lane)] = held[lane][int(t)]["xyzw".index(part)]
    assert sorted(written) == list(range(1024)) and set(written.values()) == {1}
    assert all(block[swizzled(n, k)] == ("k", k, "n", n) for k in range(32) for n in range(32))   # rows of n
    nvrtc.compile("r_p_m_n", src, ["-arch=sm_90a", "-std=c++17", "--fmad=false"])


@pytest.mark.parametrize("offset, scale_b", [(0, False), (3, False), (0, True)])
def test_tf32_wide_tiles_round_their_stages_and_compile_for_sm90a(offset, scale_b):
    """The tf32 wide tile: the producer's last three warps round each stage in place (pj_round_tf32 on 16-byte
    chunks, ROUND_AHEAD of them read before any is written back) and arrive on `ready`, which the consumers wait on;
    wgmma m64n256k8, four steps a 32-deep slice; NVRTC compiles it for sm_90a (maps usable or not: an unaligned
    view, a computed operand)."""
    nvrtc = working_nvrtc()
    src = render_cuda(float32_kernel(4096, 4096, 4096, "tf32", False, True, offset=offset, scale_b=scale_b), None,
                      CUDA_HOPPER)
    assert src.source.count("const __grid_constant__ pj_tensor_map pj_map") == (1 if scale_b else 2)
    assert "pj_mbar_init(&ready[s], 96)" in src.source and "pj_mbar_wait(&ready[st]" in src.source
    _check_rounding_loops(src.source, loops=2)   # (by their maps, and chunk by chunk)
    assert src.source.count("pj_wgmma_tf32_n256_00(wacc0,") == 4 and "(kt * 32)" in src.source
    nvrtc.compile(src.name, src.source, ["-arch=sm_90a", "-std=c++17", "--fmad=false"])


def _check_rounding_loops(source: str, loops: int):
    """Each of the source's `loops` rounding loops reads its ROUND_AHEAD chunks before it rounds and writes any,
    and its rounders' (lid 32 ... 127) slots cover every chunk of A's and B's stage tiles (128 x 32 and 256 x 32
    float32: 1024 and 2048 chunks) exactly once."""
    ahead = render_fragments_tma.ROUND_AHEAD
    headers = re.findall(r"for \(int q0 = lid - 32; q0 < (\d+); q0 \+= (\d+)\) \{", source)
    assert headers == [("3072", str(96 * ahead))] * loops
    body = source.split("for (int q0 = lid - 32;")[1]
    reads = [re.search(rf"x{e} = (q0 \+ \d+ < 3072 \? )?\*v{e}\b", body).start() for e in range(ahead)]
    assert max(reads) < body.index("pj_round_tf32(") and body.count("pj_round_tf32(") >= 4 * ahead
    slots = re.findall(r"uint4 \*v\d+ = q0 \+ (\d+) < (\d+) \? \(uint4 \*\)&As\[st\]\[0\]\[0\]\[0\] \+ "
                       r"\(q0 \+ \1\) : \(uint4 \*\)&Bs\[st\]\[0\]\[0\]\[0\] \+ \(q0 \+ \1 - \2\)", body)
    assert len(slots) == ahead and {a for _, a in slots} == {"1024"}
    covered = collections.Counter()
    for lid in range(32, 128):
        for q0 in range(lid - 32, 3072, 96 * ahead):
            for e, _ in slots:   # (a slot that may pass the last chunk reads and writes under a test)
                q = q0 + int(e)
                assert q < 3072 or f"if (q0 + {e} < 3072)" in body and f"q0 + {e} < 3072 ? *v" in body
                covered.update([("A", q) if q < 1024 else ("B", q - 1024)] if q < 3072 else [])
    assert covered == collections.Counter([("A", q) for q in range(1024)] + [("B", q) for q in range(2048)])


def test_a_cpu_plan_loads_its_kernels_without_this_module():
    """tensor_maps imports this module only for a kernel of the bulk variant (one with maps), so a cpu first call
    does not pay its imports (~5 ms, this module and the warp-specialised renderer it builds on); the matmul is
    NumPy's."""
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import prepjit as pj
        a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(20, dtype=np.float32).reshape(4, 5)
        np.testing.assert_array_equal(np.asarray(pj.prepare(lambda x, y: x @ y + 1, device="cpu")(a, b)), a @ b + 1)
        print(sorted(m for m in sys.modules if m.startswith("prepjit.codegen.render_fragments")))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "render_fragments_tma" not in out.stdout, out.stdout
