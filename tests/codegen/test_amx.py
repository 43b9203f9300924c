"""bfloat16 contractions on AMX tiles (amx.py's rule, llvm_amx.py's rendering): where the target has AMX_BF16 a
register-blocked contraction of two bfloat16 operands over a static k, a multiple of 32, is blocked in 16 rows and
rendered with tdpbf16ps; every result is the float32 sum of the exact products, rounded once (NumPy float32 on the
widened values), for every shape class: tails in rows (clamped, var), columns (peeled) and k (not tiled)."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import packing
from prepjit.codegen.optimize import optimize
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.target import AMX_BF16, AVX2, AVX512_BF16, host_target
from .test_contraction_16bit import _check, _ranges

bfloat16 = ml_dtypes.bfloat16
on_host = pytest.mark.skipif(not host_target().amx_bf16,
                             reason="the host has no AMX_BF16 tiles (amx-bf16) or Linux refused the tile state")


def _kernel(f, *args):
    return f.plan(*args).kernels[-1].kernel.scheduled


def _tiled(ast, target) -> bool:
    return "@llvm.x86.tdpbf16ps(" in render_llvm(optimize(ast, "llvm", target), target).source


@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (37, 128, 40), (100, 96, 48), (16, 32, 16)])
def test_bfloat16_contraction_is_tiled_on_an_amx_target(rng, m, k, n, monkeypatch):
    """On an AMX_BF16 target the blocked reduction pairs k in a "tile" range over blocks of 16 rows, rendered as
    tdpbf16ps; on targets without tiles it is not (AVX512_BF16 keeps vdpbf16ps' choice, AVX2 widens). The schedule
    packs operands as an AMX host's does (16-bit panels for the tiles: packing.py), whatever this host is."""
    monkeypatch.setattr(packing, "host_target", lambda: AMX_BF16)
    a, b = rng.standard_normal((m, k)).astype(bfloat16), rng.standard_normal((k, n)).astype(bfloat16)
    ast = _kernel(pj.prepare(lambda a, b: a @ b, device="cpu"), a, b)
    blocked = optimize(ast, "llvm", AMX_BF16)
    assert [r.src[0].arg for r in _ranges(blocked, "tile")] == [2]
    assert _tiled(ast, AMX_BF16)
    for target in (AVX512_BF16, AVX2):
        assert not _ranges(optimize(ast, "llvm", target), "tile") and not _tiled(ast, target)


def test_short_or_odd_reductions_and_float16_are_not_tiled(rng):
    for dtype, k in ((bfloat16, 16), (bfloat16, 65), (np.float16, 64)):
        a, b = rng.standard_normal((16, k)).astype(dtype), rng.standard_normal((k, 64)).astype(dtype)
        f = pj.prepare(lambda a, b: a @ b, device="cpu")
        _check(f(a, b), a, b, dtype)
        assert not _tiled(_kernel(f, a, b), AMX_BF16)


_SHAPES = [(64, 64, 64), (16, 32, 16), (37, 128, 40), (100, 96, 48), (5, 64, 96), (200, 384, 64), (33, 1536, 31),
           (40, 48, 64), (19, 1000, 33), (300, 90, 256)]


@on_host
@pytest.mark.parametrize("m,k,n", _SHAPES)
def test_tiled_contractions_match_numpy_float32(rng, m, k, n):
    """On the host's tiles: clamped or short row blocks (37, 100, 5, 33, 19 rows), peeled column tails (40, 31, 33),
    k past the last full tile step (48, 1000, 90: its tiles zero-padded; 90 with packed panels), x @ W, W @ x and
    x @ W.T."""
    a, b = rng.standard_normal((m, k)).astype(bfloat16), rng.standard_normal((k, n)).astype(bfloat16)
    f = pj.prepare(lambda a, b: a @ b, device="cpu")
    _check(f(a, b), a, b, bfloat16)
    assert _tiled(_kernel(f, a, b), host_target())
    _check(np.asarray(pj.prepare(lambda b, a: b.T @ a.T, device="cpu")(b, a)).T, a, b, bfloat16)
    _check(pj.prepare(lambda a, b: a @ b.T.T, device="cpu")(a, b), a, b, bfloat16)


@on_host
def test_tiled_contractions_with_var_rows_and_columns(rng):
    """A var row count (a batch: blocks of 16, then 8, 4, 2, 1 rows) and var columns, one plan for all."""
    f = pj.prepare(lambda x, w: x @ w, vars={"n": (1, 300), "m": (1, 40)}, shapes={"x": ("m", 96), "w": (96, "n")},
                   device="cpu")
    for m, n in ((1, 1), (1, 299), (7, 64), (40, 300), (33, 31), (16, 16)):
        x, w = rng.standard_normal((m, 96)).astype(bfloat16), rng.standard_normal((96, n)).astype(bfloat16)
        _check(f(x, w), x, w, bfloat16)
    assert _tiled(_kernel(f, x, w), host_target())


@on_host
def test_tiled_epilogue_and_float32_output(rng):
    """A bias and tanh after the tiled sums, and a float32 result of bfloat16 operands."""
    a, b = rng.standard_normal((50, 64)).astype(bfloat16), rng.standard_normal((64, 80)).astype(bfloat16)
    bias = rng.standard_normal(80).astype(np.float32)
    f = pj.prepare(lambda a, b, c: pnp.tanh(a.astype(np.float32) @ b.astype(np.float32) + c), device="cpu")
    want = np.tanh(a.astype(np.float32) @ b.astype(np.float32) + bias)
    np.testing.assert_allclose(np.asarray(f(a, b, bias)), want, rtol=1e-5, atol=1e-5)
    assert _tiled(_kernel(f, a, b, bias), host_target())


@on_host
def test_packed_panels_are_in_vnni_layout_and_loaded_straight_into_tiles(rng):
    """A large B is packed for the tiles, (J / 32, K / 2, 32, 2): its tiles load from the panels (rows 128 bytes
    apart), no interleaving in the kernel."""
    a, b = rng.standard_normal((512, 256)).astype(bfloat16), rng.standard_normal((256, 512)).astype(bfloat16)
    f = pj.prepare(lambda a, b: a @ b, device="cpu")
    _check(f(a, b), a, b, bfloat16)
    *packs, kernel = f.plan(a, b).kernels
    assert [p.ast.arg for p in packs] == ["pack_16_128_32_2"]
    source = render_llvm(optimize(kernel.kernel.scheduled, "llvm", host_target()), host_target()).source
    assert "@llvm.x86.tileloadd64(i8 3, ptr %p" in source and ", i64 128)" in source
    assert "shufflevector" not in source


@on_host
def test_tiled_contraction_matches_jax(rng):
    """JAX's bfloat16 matmul summed in float32 (preferred_element_type) on the same values: float32 sums of exact
    products, so the two differ by float32 summation order only."""
    jnp = pytest.importorskip("jax.numpy")
    a, b = rng.standard_normal((70, 160)).astype(bfloat16), rng.standard_normal((160, 96)).astype(bfloat16)
    f = pj.prepare(lambda a, b: a.astype(np.float32) @ b.astype(np.float32), device="cpu")
    want = np.asarray(jnp.matmul(jnp.asarray(a), jnp.asarray(b), preferred_element_type=jnp.float32))
    scale = np.abs(a.astype(np.float32)) @ np.abs(b.astype(np.float32))
    np.testing.assert_array_less(np.abs(np.asarray(f(a, b)) - want), 1e-5 * scale + 1e-30)
    assert _tiled(_kernel(f, a, b), host_target())
