"""examples/train_mlp.py: the whole training step is one prepared function (one trace, the smaller last batch
included), the loss falls, the test accuracy is far above chance, and the run equals the same loop with NumPy's
hand-written gradients step for step."""
import numpy as np

from examples import train_mlp

CONFIG = dict(sizes=(16, 32, 4), n_train=600, n_test=300, batch=64, epochs=3, seed=1, spread=1.0)


def test_adam_run_trains_on_one_trace():
    result = train_mlp.train(**CONFIG, progress=False, log=False)
    losses = result["losses"]
    assert len(losses) == 3 * 10  # 9 full batches and one of 24 per epoch
    assert result["stats"]["traces"] == 1 and result["stats"]["replays"] == len(losses)
    assert result["eval_stats"]["traces"] == 1  # the evaluation's last batch (300 = 4 * 64 + 44) replays too
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert result["curve"][-1] < result["curve"][0]
    assert result["accuracy"] > 0.8 > 3 * result["chance"]
    assert abs(result["prepared_accuracy"] - result["accuracy"]) < 1e-9  # prepared evaluation == NumPy's
    reference = train_mlp.train(**CONFIG, progress=False, log=False, reference="numpy")
    loss_diff, weight_diff = train_mlp.compare(result, reference)
    assert loss_diff < 1e-4 and weight_diff < 1e-4


def test_command_line_checks_against_numpy_and_jax(capsys):
    """The same sizes as above (its kernels come from the kernel cache); --check runs NumPy's and JAX's loops."""
    assert train_mlp.main(["--sizes", "16,32,4", "--train", "600", "--test", "300", "--batch", "64", "--epochs", "1",
                           "--seed", "1", "--no-progress", "--check"]) == 0
    text = capsys.readouterr().out
    assert "'traces': 1" in text and "epoch 0: mean loss" in text and "test accuracy" in text
    assert "check vs NumPy (hand-written gradients)" in text and "FAILED" not in text


def test_sgd_step_is_sgd():
    """One prepared SGD step equals params - lr * the hand-written gradient (the last, smaller batch shape)."""
    from examples.models import mlp_train
    (x, y), _, key = train_mlp.make_data(1, (16, 32, 4), 40, 1, 1.0)
    params = mlp_train.init_params(key, (16, 32, 4))
    step = train_mlp.prepared_step("sgd", 0.1, 64)
    value, new = step(params, x, y)
    want_value, grads = mlp_train.numpy_value_and_grad(params, x, y)
    np.testing.assert_allclose(np.asarray(value), want_value, rtol=1e-5)
    for got, p, g in zip(new, params, grads):
        for k in p:
            np.testing.assert_allclose(np.asarray(got[k]), p[k] - 0.1 * g[k], rtol=1e-5, atol=1e-6)
