"""examples/mlp.py: one plan with a symbolic batch serves every batch size and matches NumPy."""
import re

from examples import mlp


def test_batches_replay_and_match_numpy(capsys):
    assert mlp.main(["--sizes", "16,32,5", "--batches", "1,5,33", "--check"]) == 0
    text = capsys.readouterr().out
    assert "check vs NumPy" in text and ": OK" in text
    assert "'traces': 1" in text and "'replays': 3" in text  # stats count every call
    assert text.count("probabilities (") == 3
    assert float(re.findall(r"accuracy (\S+),", text)[-1]) > 0.5  # the fitted head beats chance (0.2)
