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


def test_mixed_precision_trains_in_bfloat16_with_float32_master_weights():
    """--precision mixed: one trace still; the steps compute in bfloat16 (the losses move off float32's by more than
    float32's own error) while the weights and Adam's state stay float32, and the loss curve stays within the
    --check tolerance of the float32 NumPy loop's."""
    mixed = train_mlp.train(**CONFIG, progress=False, log=False, precision="mixed")
    reference = train_mlp.train(**CONFIG, progress=False, log=False, reference="numpy")
    assert mixed["stats"]["traces"] == 1 and mixed["stats"]["replays"] == len(reference["losses"])
    assert all(w.dtype == np.float32 for layer in mixed["params"] for w in layer.values())
    loss_diff, _ = train_mlp.compare(mixed, reference)
    assert loss_diff > 1e-4  # not float32's result (which agrees within 1e-4, test above)
    step_diff, epoch_diff = train_mlp.compare_curves(mixed, reference)
    assert step_diff < train_mlp.CURVE_TOLERANCE[0] and epoch_diff < train_mlp.CURVE_TOLERANCE[1]
    assert abs(mixed["accuracy"] - reference["accuracy"]) < 0.03


def test_mixed_state_is_float32_and_gradients_flow_through_the_casts():
    """One prepared mixed Adam step from float32 weights and state returns float32 weights and state, moved by
    the bfloat16 gradients: within a few percent (in norm) of NumPy's hand-written float32 ones, not equal."""
    from examples.models import mlp_train
    (x, y), _, key = train_mlp.make_data(1, (16, 32, 4), 40, 1, 1.0)
    params = mlp_train.init_params(key, (16, 32, 4))
    state = mlp_train.adam_init(params)
    value, new, new_state = train_mlp.prepared_step("adam", 0.01, 64, precision="mixed")(params, state, x, y)
    want_value, grads = mlp_train.numpy_value_and_grad(params, x, y)
    np.testing.assert_allclose(np.asarray(value), want_value, rtol=2e-2)
    for got, m, g in zip(new, new_state["m"], grads):
        for k in g:
            assert np.asarray(got[k]).dtype == np.asarray(m[k]).dtype == np.float32
            error = np.linalg.norm(np.asarray(m[k]) - 0.1 * g[k]) / np.linalg.norm(0.1 * g[k])
            assert 1e-6 < error < 0.06  # bfloat16's rounding, not float32's


def test_command_line_checks_against_numpy_and_jax(capsys):
    """The same sizes as above (its kernels come from the kernel cache); --check runs NumPy's and JAX's loops."""
    assert train_mlp.main(["--sizes", "16,32,4", "--train", "600", "--test", "300", "--batch", "64", "--epochs", "1",
                           "--seed", "1", "--no-progress", "--check"]) == 0
    text = capsys.readouterr().out
    assert "'traces': 1" in text and "epoch 0: mean loss" in text and "test accuracy" in text
    assert "check vs NumPy (hand-written gradients)" in text and "FAILED" not in text
    assert train_mlp.main(["--sizes", "16,32,4", "--train", "600", "--test", "300", "--batch", "64", "--epochs", "1",
                           "--seed", "1", "--no-progress", "--check", "--precision", "mixed"]) == 0
    text = capsys.readouterr().out
    assert "mixed precision: bfloat16 compute" in text and "check mixed vs float32 NumPy" in text
    assert "FAILED" not in text


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
