"""examples/models/common.sample, the sampler of examples/serve.py's engine: the token it draws (sorting only the
largest probabilities, and no token ids) is the one of the straightforward nucleus sampler that sorts the whole
vocabulary (ties in token order), for the same generator, which it leaves in the same state."""
import numpy as np
import pytest

from examples.models import common

VOCAB = 49152  # SmolLM2's
KINDS = ("spread", "ties", "bf16-ties", "masked")


def full_sort_sample(logits, temperature, top_p, rng):
    """Nucleus sampling over a stable sort of the whole vocabulary: the reference."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = order[:int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1]
    return int(rng.choice(keep, p=p[keep] / p[keep].sum()))


def logits_of(kind, rng, vocab):
    """float32 logits: spread like a language model's, rounded to few values (many ties), or half masked."""
    x = (rng.standard_normal(vocab) * rng.uniform(1, 4)).astype(np.float32)
    x[rng.integers(0, vocab, 8)] += rng.uniform(5, 15)  # a few likely tokens
    if kind == "ties":
        return np.round(x * 2) / 2
    if kind == "bf16-ties":
        return (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
    if kind == "masked":
        x[rng.random(vocab) < 0.5] = -np.inf
    return x


@pytest.fixture
def sorted_lengths(monkeypatch):
    """The length of every array the sampler sorts, recorded."""
    lengths, descending = [], getattr(common, "_descending", None)

    def recording(values):
        lengths.append(len(values))
        return descending(values)
    monkeypatch.setattr(common, "_descending", recording, raising=False)
    return lengths


@pytest.mark.parametrize("kind", KINDS)
def test_sample_draws_the_full_sort_token(kind):
    rng = np.random.default_rng(KINDS.index(kind))
    kept_all = kept_fewer = 0  # at top_p 1: the running sum stays under 1, or reaches it before the last tokens
    for case in range(60):
        vocab = VOCAB if case % 3 else int(rng.integers(2, 300))
        logits = logits_of(kind, rng, vocab)
        temperature = float(rng.choice([0.05, 0.3, 0.7, 1.0, 1.5, 4.0]))
        for top_p in (0.05, 0.5, 0.9, 0.95, 0.999999, 1.0):
            seed = int(rng.integers(1 << 31))
            fast, slow = np.random.default_rng(seed), np.random.default_rng(seed)
            token = common.sample(logits, temperature, top_p, fast)
            assert token == full_sort_sample(logits, temperature, top_p, slow), \
                (kind, case, vocab, temperature, top_p, seed)
            assert fast.random() == slow.random()  # as many draws from the generator
            if top_p == 1.0:
                p = np.exp(logits.astype(np.float64) / temperature - logits.max() / temperature)
                mass = np.cumsum(np.sort(p / p.sum())[::-1])
                kept_all += int(mass[-2] < 1.0)
                kept_fewer += int(mass[-2] >= 1.0)
    assert kept_all and kept_fewer


def test_only_the_largest_probabilities_are_sorted(sorted_lengths):
    """Logits spread like SmolLM2's (a normal of deviation 3.5, its largest a few units above the rest): at
    top_p <= 0.95 and temperature <= 1 the sampler sorts some thousand probabilities a call (SmolLM2's logits of 16
    prompts: 916), never the vocabulary; at top_p 1 it sorts the vocabulary's once."""
    rng = np.random.default_rng(7)
    calls = 0
    for case in range(16):
        logits = (rng.standard_normal(VOCAB) * 3.5).astype(np.float32)
        logits[rng.integers(0, VOCAB, 8)] += rng.uniform(0, 6, 8)
        for top_p in (0.5, 0.9, 0.95):
            for temperature in (0.3, 0.7, 1.0):
                common.sample(logits, temperature, top_p, np.random.default_rng(case))
                calls += 1
    assert sorted_lengths and max(sorted_lengths) < VOCAB // 2 and sum(sorted_lengths) / calls < VOCAB // 16
    sorted_lengths.clear()
    common.sample(logits, 1.0, 1.0, np.random.default_rng(0))
    assert sorted_lengths == [VOCAB]


def test_greedy_at_temperature_zero_and_bad_logits():
    logits = np.array([0.5, 3.0, 3.0, -1.0], np.float32)
    assert common.sample(logits, 0.0, 0.9, np.random.default_rng(0)) == 1
    with pytest.raises(ValueError, match="NaN or an infinity"):
        common.sample(np.array([0.5, np.nan, 1.0], np.float32), 1.0, 0.9, np.random.default_rng(0))
