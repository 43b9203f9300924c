"""benchmarks/gpu_llm.py, the one-call GPU benchmark of SmolLM2 decode and serving, runs end to end at a tiny size on
every device here (so the GPU run does not fail on a typo), its checks pass, and its weights are the float weights
stored in blocks (no timing claims)."""
import json

import attrs
import numpy as np

from benchmarks import gpu_llm
from examples.models import llama


def test_stored_blocks_hold_the_float_weights():
    cfg = attrs.evolve(gpu_llm.SMOLLM2, layers=1, vocab=64)
    params32 = llama.random_params(np.random.default_rng(0), cfg)
    for kind, error in (("q8_0", 0.01), ("q4_1", 0.1)):
        stored = gpu_llm.stored_params(params32, kind)
        assert stored["head"] is stored["embed"]
        back = llama.dequantized(stored)
        for name, w in params32["blocks"][0].items():
            got = back["blocks"][0][name]
            assert got.shape == w.shape, (kind, name)
            assert np.abs(got - w).max() <= error * np.abs(w).max(), (kind, name)
        np.testing.assert_allclose(back["embed"], params32["embed"], atol=error * np.abs(params32["embed"]).max())


def test_runs_every_row_and_its_checks_pass(device, tmp_path):
    out = tmp_path / "rows.jsonl"
    # two streams: the var batch's plans are the same at 2 as at 3, and the padded buckets (1, 2) are each a plan of
    # their own (a third costs ~7 s of compiles on opencl, more than a tenth of the test)
    rc = gpu_llm.main(["--device", device, "--layers", "1", "--vocab", "1024", "--streams", "2", "--new-tokens", "3",
                       "--prompt-tokens", "5", "--reps", "1", "--out", str(out)])
    rows = {row["case"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rc == 0, [row for row in rows.values() if not row.get("ok", True)]
    assert set(rows) == {"meta", "decode_bf16", "decode_q4_1", "decode_q8_0", "decode_q4_1_vs_bf16",
                         "serve_step_b1_vs_b2", "serve_2_vs_1", "serve_lockstep_2_vs_1", "serve_padded_buckets"}
    assert all(rows[f"decode_{w}"]["same_argmax"] for w in ("bf16", "q4_1", "q8_0"))
    assert rows["decode_q4_1"]["weight_bytes"] < rows["decode_bf16"]["weight_bytes"] / 3
    serve = rows["serve_2_vs_1"]
    assert serve["same_tokens_alone_and_batched"] and serve["one_plan_a_range_no_recompiles"]
    assert serve["plan_stats"]["decode"]["plans"] == 1
    assert rows["serve_lockstep_2_vs_1"]["same_tokens_as_engine"]
    assert rows["serve_padded_buckets"]["buckets"] == [1, 2] and rows["serve_padded_buckets"]["same_tokens"]


def test_the_tinyllama_shapes_decode(tmp_path):
    """--model tinyllama: TinyLlama-1.1B's block shapes (dim 2048, ff 5632, 32 / 4 heads), one block here."""
    out = tmp_path / "rows.jsonl"
    rc = gpu_llm.main(["--device", "cpu", "--model", "tinyllama", "--layers", "1", "--vocab", "512", "--only",
                       "decode", "--reps", "1", "--out", str(out)])
    rows = {row["case"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rc == 0 and rows["meta"]["config"]["dim"] == 2048 and rows["meta"]["config"]["ff"] == 5632
    assert all(rows[f"decode_{w}"]["same_argmax"] for w in ("bf16", "q4_1", "q8_0"))


def test_a_decode_step_of_two_batch_ranges_is_one_plan_a_range():
    """On a GPU with tensor cores the engine's decode step is llama_paged.BatchRanges of two plans (B 1-31, 32-64):
    two traces and two plans are one a range, as long as nothing was traced or compiled after the warm-up."""
    from examples.models.llama_paged import BatchRanges

    class Engine:
        decode = BatchRanges({(1, 31): None, (32, 64): None})
    warm = {"decode": {"traces": 2, "compiles": 12, "plans": 2}, "prefill": {"traces": 1, "compiles": 7, "plans": 1}}
    assert gpu_llm._one_plan_a_range(Engine, warm, warm)
    later = {**warm, "decode": {"traces": 3, "compiles": 13, "plans": 3}}
    assert not gpu_llm._one_plan_a_range(Engine, later, warm)
    assert not gpu_llm._one_plan_a_range(Engine, later, later)   # a third trace of two ranges
    class OnePlan:
        decode = object()
    assert not gpu_llm._one_plan_a_range(OnePlan, warm, warm)   # one prepared step traced twice
