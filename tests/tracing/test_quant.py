"""pj.quant: llama.cpp's block formats against gguf's NumPy reference (gguf.quants), eagerly and traced, and the
bitcast view the float16 scales are read through."""
import numpy as np
import pytest

import prepjit as pj

gguf = pytest.importorskip("gguf")
gq = pytest.importorskip("gguf.quants")

KINDS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q6_k"]


def _qtype(kind):
    return getattr(gguf.GGMLQuantizationType, kind.upper())


def _random_blocks(rng, kind, rows=6, blocks_per_row=2):
    """Every bit pattern: random bytes (scales include infinities, NaNs and subnormals)."""
    return rng.integers(0, 256, (rows, blocks_per_row * pj.quant.block_bytes(kind)), dtype=np.uint8)


def _reference(blocks, kind):
    with np.errstate(all="ignore"):
        return gq.dequantize(blocks, _qtype(kind))


def _same_bits(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype == np.float32 and np.array_equal(a.view(np.uint32),
                                                                                       b.view(np.uint32))


def _same_or_both_nan(a, b) -> bool:
    """Bit for bit, but for NaNs (a GPU's float16 conversion may quiet a signalling NaN's payload)."""
    a, b = np.asarray(a), np.asarray(b)
    same = a.view(np.uint32) == b.view(np.uint32)
    return a.shape == b.shape and bool(np.all(same | (np.isnan(a) & np.isnan(b))))


@pytest.mark.parametrize("kind", KINDS)
def test_eager_dequantize_is_ggufs_bit_for_bit(kind, rng):
    blocks = _random_blocks(rng, kind)
    with np.errstate(all="ignore"):
        out = pj.quant.dequantize(blocks, kind)
    assert isinstance(out, np.ndarray) and _same_bits(out, _reference(blocks, kind))
    stacked = blocks.reshape(2, 3, -1)  # leading dims are kept, as gguf's
    with np.errstate(all="ignore"):
        assert _same_bits(pj.quant.dequantize(stacked, kind), _reference(stacked, kind))


@pytest.mark.parametrize("kind", KINDS)
def test_traced_dequantize_is_ggufs(kind, device, rng):
    blocks = _random_blocks(rng, kind)
    f = pj.prepare(lambda b: pj.quant.dequantize(b, kind), device=device)
    assert _same_or_both_nan(f(blocks), _reference(blocks, kind))
    captured = _random_blocks(rng, kind, rows=3)
    g = pj.prepare(lambda x: pj.quant.dequantize(captured, kind) * x, device=device)
    assert _same_or_both_nan(g(np.float32(1)), _reference(captured, kind))


@pytest.mark.parametrize("kind", KINDS)
def test_weights_of_one_shape_share_one_traced_dequantization(kind, device, rng):
    """The dequantization of traced blocks is traced once per format and shape and substituted over each input
    (quant_formats.traced_dequantize): the nodes are those tracing it for that input builds, and each weight of
    one shape is still dequantized from its own blocks."""
    from prepjit.tracing.quant_formats import FORMATS, traced_dequantize
    from prepjit.tracing.tracer import Tracer
    from prepjit.uop import Ops, UOp, dtypes
    fmt = FORMATS[kind]
    for number in (7, 8):
        x = Tracer(UOp(Ops.INPUT, dtypes.uint8, (), (number, (3, 2, fmt.nbytes))))
        direct = fmt.dequantize(x, pj.numpy)
        assert traced_dequantize(fmt, x, pj.numpy).uop is direct.uop
    a, b = _random_blocks(rng, kind), _random_blocks(rng, kind)
    f = pj.prepare(lambda a, b: (pj.quant.dequantize(a, kind), pj.quant.dequantize(b, kind)), device=device)
    got_a, got_b = f(a, b)
    assert _same_or_both_nan(got_a, _reference(a, kind)) and _same_or_both_nan(got_b, _reference(b, kind))


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1"])
def test_quantize_is_ggufs(kind, rng):
    w = rng.standard_normal((4, 256)).astype(np.float32)
    w[0, :32] = 0  # a zero block: scale 0, no division by it
    w[1, 32:64] = 3.5  # a constant block
    for x in (w, w.astype(np.float16), w.reshape(2, 2, 256)):
        blocks = pj.quant.quantize(x, kind)
        assert blocks.dtype == np.uint8 and np.array_equal(blocks, gq.quantize(x, _qtype(kind)))
    back = pj.quant.dequantize(pj.quant.quantize(w, kind), kind)
    assert np.abs(back - w).max() < (0.05 if kind == "q8_0" else 0.5)


def test_bad_blocks_and_kinds_are_value_errors(device):
    good = np.zeros((2, 34), np.uint8)
    with pytest.raises(ValueError, match=r"q8_0 blocks: a row of 33 bytes is not whole blocks of 34 bytes"):
        pj.quant.dequantize(good[:, :33], "q8_0")
    with pytest.raises(ValueError, match=r"unknown quantization kind 'q3_x'.*q4_k"):
        pj.quant.dequantize(good, "q3_x")
    with pytest.raises(ValueError, match="uint8"):
        pj.quant.dequantize(good.astype(np.int8), "q8_0")
    with pytest.raises(ValueError, match="q4_0 quantizes float rows of whole blocks of 32"):
        pj.quant.quantize(np.zeros((2, 40), np.float32), "q4_0")
    with pytest.raises(ValueError, match="expected one of q8_0, q4_0, q4_1"):
        pj.quant.quantize(np.zeros((2, 32), np.float32), "q6_k")

    f = pj.prepare(lambda b: pj.quant.dequantize(b, "q8_0"), device=device)
    with pytest.raises(ValueError, match="a row of 35 bytes") as e:
        f(np.zeros((2, 35), np.uint8))
    assert isinstance(e.value, pj.PrepjitError)
    assert np.array_equal(np.asarray(f(good)), np.zeros((2, 32), np.float32))  # still works
    with pytest.raises(pj.TraceError, match="outside prepared functions"):
        pj.prepare(lambda w: pj.quant.quantize(w, "q8_0"), device=device)(np.zeros((1, 32), np.float32))


def test_kinds_by_ggufs_names():
    w = np.full((1, 32), 127.0, np.float32)  # scale 1: exact
    blocks = pj.quant.quantize(w, "Q8_0")
    assert np.array_equal(pj.quant.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0), w)
    assert pj.quant.block_size("q4_k") == 256 and pj.quant.block_bytes("q6_k") == 210


def test_bitcast_view(device, rng):
    """x.view(dtype) of the same element size is NumPy's view; another size is refused."""
    bits = rng.integers(0, 2**16, 512).astype(np.uint16)
    f = pj.prepare(lambda b: (b.view(np.float16).astype(np.float32), b.view(np.int16), b.view(pj.numpy.bfloat16)
                              .astype(np.float32)), device=device)
    half, signed, brain = f(bits)
    assert _same_or_both_nan(half, bits.view(np.float16).astype(np.float32))
    assert np.array_equal(np.asarray(signed), bits.view(np.int16))
    assert _same_or_both_nan(brain, (bits.astype(np.uint32) << 16).view(np.float32))
    x = rng.standard_normal(100).astype(np.float32)
    g = pj.prepare(lambda x: (x.view(np.uint32) ^ np.uint32(1 << 31)).view(np.float32), device=device)
    assert np.array_equal(np.asarray(g(x)), -x)
    with pytest.raises(pj.TraceError, match="cannot view float32 as float16"):
        pj.prepare(lambda x: x.view(np.float16), device=device)(x)


@pytest.mark.parametrize("kind", ["q8_0", "q4_1", "q6_k"])
def test_a_matvec_unpacks_its_weight_in_registers(kind, device, rng):
    """x @ dequantize(b).T for one row of x is one kernel reading the blocks: no float32 weight, no scale copy;
    with many rows (a matmul) the weight is dequantized once into a buffer (the interim) and the result agrees."""
    n, k = 48, 512
    blocks = _random_blocks(rng, kind, rows=n, blocks_per_row=k // pj.quant.block_size(kind))
    with np.errstate(all="ignore"):
        finite = np.isfinite(pj.quant.dequantize(blocks, kind)).all(axis=1, keepdims=True)
    blocks = np.where(finite, blocks, 0).astype(np.uint8)
    w = pj.quant.dequantize(blocks, kind)
    f = pj.prepare(lambda x, b: x @ pj.quant.dequantize(b, kind).T, device=device)
    for rows in (1, 16):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
        np.testing.assert_allclose(np.asarray(f(x, blocks)), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
        plan = f.plan(x, blocks)
        if rows == 1:
            assert len(plan.kernels) == 1 and plan.memory_bytes == 0, str(plan)
