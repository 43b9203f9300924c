"""Training an MLP classifier with one prepared step: forward, softmax cross-entropy, pj.value_and_grad backward
and an Adam (or SGD) update written in prepjit.numpy are ONE prepared function with a symbolic batch `n`, so the
last, smaller batch of every epoch replays the same plan (one trace for the whole run). Weights and the
synthetic data (Gaussian clusters, one per class) come from pj.random; nothing is downloaded.

    python examples/train_mlp.py                  # train, a loss curve per epoch (tqdm), the test accuracy
    python examples/train_mlp.py --check          # the same run with NumPy's hand-written gradients (and JAX's
                                                  # value_and_grad when installed), compared step for step
    python examples/train_mlp.py --optimizer sgd --lr 0.1 --epochs 3
    python examples/train_mlp.py --precision mixed --check   # bfloat16 forward and backward, float32 master
                                                              # weights and Adam state; loss curve vs float32's
    python examples/train_mlp.py --devices cpu,cpu     # data parallel: each batch split over two replicas, the
                                                      # gradients averaged with pj.pmean (cuda:0,cuda:1 on GPUs)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import mlp_train  # noqa: E402
from models.common import DTYPES, cast  # noqa: E402

COMPUTE = {"f32": DTYPES["f32"], "mixed": DTYPES["bf16"]}  # --precision -> the forward/backward compute dtype


def prepared_step(optimizer: str, lr: float, max_batch: int, device: str | None = None, devices=None,
                  precision: str = "f32"):
    """The whole training step, prepared with a symbolic batch: (params, state, x, labels) -> (loss, params,
    state) with Adam, (params, x, labels) -> (loss, params) with SGD. With `devices` (data parallel) each
    batch is split over the replicas and the loss and gradients are averaged across them with pj.pmean,
    each replica's weighted by its share of the rows (1 when they divide evenly): the full batch's.
    `precision="mixed"`: the forward and backward passes compute in bfloat16 (the float32 master weights and the
    batch cast to it inside the step, the loss in float32); the gradients reach the float32 weights through the
    casts, and the update and the optimizer state stay float32 (bfloat16 has float32's range: no loss scaling)."""
    import prepjit as pj
    import prepjit.numpy as pnp
    compute = COMPUTE[precision]

    def loss(params, x, labels):
        return mlp_train.loss(pnp, mlp_train.tree_map(lambda w: cast(w, compute), params), cast(x, compute), labels)

    def value_and_grad(params, x, labels):
        value, grads = pj.value_and_grad(lambda p: loss(p, x, labels))(params)
        if devices:
            rows = x.shape[0] * pnp.ones((), pnp.float32)  # one round of collectives: sums weighted by rows
            mean_rows, value, grads = pj.pmean((rows, value * rows, mlp_train.tree_map(lambda g: g * rows, grads)))
            value, grads = value / mean_rows, mlp_train.tree_map(lambda g: g / mean_rows, grads)
        return value, grads

    def adam_step(params, state, x, labels):
        value, grads = value_and_grad(params, x, labels)
        return (value, *mlp_train.adam(pnp, params, grads, state, lr))

    def sgd_step(params, x, labels):
        value, grads = value_and_grad(params, x, labels)
        return value, mlp_train.sgd(pnp, params, grads, lr)

    kwargs = {} if device is None else {"device": device}
    if devices:
        kwargs = {"devices": list(devices), "split": {"x": 0, "labels": 0}}
    return pj.prepare(adam_step if optimizer == "adam" else sgd_step, vars={"n": (1, max_batch)},
                      shapes={"x": ("n", None), "labels": ("n",)}, **kwargs)


def prepared_eval(max_batch: int, device: str | None = None):
    """(params, x, labels) -> (summed loss, correct predictions) of a batch, symbolic batch too."""
    import prepjit as pj
    import prepjit.numpy as pnp

    def evaluate(params, x, labels):
        return mlp_train.loss(pnp, params, x, labels) * x.shape[0], mlp_train.correct(pnp, params, x, labels)
    kwargs = {} if device is None else {"device": device}
    return pj.prepare(evaluate, vars={"n": (1, max_batch)}, shapes={"x": ("n", None), "labels": ("n",)}, **kwargs)


def make_data(seed: int, sizes, n_train: int, n_test: int, spread: float):
    """Train and test sets from the same class centres: ((x, labels), (x, labels)), and the run's key."""
    import prepjit as pj
    key = pj.random.key(seed)
    k_centres, k_train, k_test, k_run = pj.random.split(key, 4)
    centres = pj.random.normal(k_centres, (sizes[-1], sizes[0])) * np.float32(spread)
    return mlp_train.clusters(k_train, n_train, centres), mlp_train.clusters(k_test, n_test, centres), k_run


def batches(key, epoch: int, n: int, batch: int):
    """This epoch's shuffled batches of indices (the last one smaller when `batch` does not divide n)."""
    import prepjit as pj
    order = np.argsort(pj.random.uniform(pj.random.fold_in(key, epoch), (n,)), kind="stable")
    return [order[i:i + batch] for i in range(0, n, batch)]


def train(sizes=(32, 64, 64, 8), n_train=3000, n_test=1000, batch=128, epochs=5, lr=3e-3, optimizer="adam",
          seed=0, spread=0.6, device=None, progress=True, log=True, reference=None, devices=None,
          precision="f32") -> dict:
    """Train; returns the per-step losses, per-epoch mean losses, the test accuracy, the step's stats and the
    final parameters. `reference` ("numpy" or "jax") runs the same loop with that framework's gradients
    instead (same data, batches and initial weights; float32). `devices` trains data parallel and `precision`
    "mixed" in bfloat16 with float32 master weights (prepared_step)."""
    import prepjit as pj
    (x, y), (x_test, y_test), key = make_data(seed, sizes, n_train, n_test, spread)
    k_init, k_order = pj.random.split(key)
    params = mlp_train.init_params(k_init, sizes)
    state = mlp_train.adam_init(params) if optimizer == "adam" else None
    step = reference_step(reference, optimizer, lr) if reference else prepared_step(optimizer, lr, batch, device,
                                                                                    devices, precision)
    losses, curve = [], []
    bar = _progress(epochs * -(-n_train // batch), progress, log)
    for epoch in range(epochs):
        first = len(losses)
        for idx in batches(k_order, epoch, n_train, batch):
            out = step(params, state, x[idx], y[idx]) if state is not None else step(params, x[idx], y[idx])
            value, params, state = out if state is not None else (*out, None)
            losses.append(float(np.asarray(value)))
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}", epoch=epoch)
        curve.append(float(np.mean(losses[first:])))
        bar.write(f"epoch {epoch}: mean loss {curve[-1]:.4f}")
    bar.close()
    params = [{k: np.asarray(v) for k, v in layer.items()} for layer in params]
    accuracy = float(np.mean(np.argmax(mlp_train.logits(np, params, x_test), axis=1) == y_test))
    result = {"losses": losses, "curve": curve, "accuracy": accuracy, "params": params, "chance": 1 / sizes[-1]}
    if not reference:
        evaluate = prepared_eval(batch, device or (devices[0] if devices else None))
        summed, right = 0.0, 0
        for i in range(0, n_test, batch):  # the prepared evaluation, its last batch smaller too
            s, c = evaluate(params, x_test[i:i + batch], y_test[i:i + batch])
            summed, right = summed + float(np.asarray(s)), right + int(np.asarray(c))
        result.update(test_loss=summed / n_test, prepared_accuracy=right / n_test, stats=dict(step.stats),
                      eval_stats=dict(evaluate.stats))
    return result


def reference_step(framework: str, optimizer: str, lr: float):
    """The training step with NumPy's hand-written gradients or JAX's value_and_grad (jit), same update code."""
    if framework == "numpy":
        def value_and_grad(params, x, labels):
            return mlp_train.numpy_value_and_grad(params, x, labels)
        xp = np
    else:
        import jax
        import jax.numpy as jnp
        value_and_grad = jax.jit(jax.value_and_grad(lambda p, x, labels: mlp_train.loss(jnp, p, x, labels)))
        xp = jnp

    def step(params, *rest):
        *state, x, labels = rest
        value, grads = value_and_grad(params, x, labels)
        if optimizer == "adam":
            return (value, *mlp_train.adam(xp, params, grads, state[0], lr))
        return value, mlp_train.sgd(xp, params, grads, lr)
    return step


class _NoBar:
    def __init__(self, log: bool):
        self.log = log

    def update(self, n):
        pass

    def set_postfix(self, **kwargs):
        pass

    def write(self, text):
        if self.log:
            print(text)

    def close(self):
        pass


def _progress(total: int, enabled: bool, log: bool):
    if not (enabled and log):
        return _NoBar(log)
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar(log)
    return tqdm(total=total, unit="step", dynamic_ncols=True)


def compare(ours: dict, theirs: dict) -> tuple[float, float]:
    """(max relative difference of the per-step losses, max abs difference of the final weights)."""
    a, b = np.array(ours["losses"]), np.array(theirs["losses"])
    loss_diff = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))
    weight_diff = max(float(np.max(np.abs(p[k] - np.asarray(q[k])))) for p, q in zip(ours["params"], theirs["params"])
                      for k in p)
    return loss_diff, weight_diff


def compare_curves(ours: dict, theirs: dict) -> tuple[float, float]:
    """(max abs difference of the per-step losses, max relative difference of the per-epoch mean losses): how far a
    mixed-precision run's loss curve is from a float32 run's."""
    step = float(np.max(np.abs(np.array(ours["losses"]) - np.array(theirs["losses"]))))
    epoch = float(np.max(np.abs(np.array(ours["curve"]) - theirs["curve"]) / np.array(theirs["curve"])))
    return step, epoch


CURVE_TOLERANCE = (0.02, 0.02)  # mixed vs float32: per-step loss within 0.02, per-epoch mean within 2%


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="32,64,64,8", help="layer widths, input first; the last is the classes")
    parser.add_argument("--train", type=int, default=3000, help="training points (3000)")
    parser.add_argument("--test", type=int, default=1000, help="test points (1000)")
    parser.add_argument("--batch", type=int, default=128, help="batch size, the bound of the symbolic batch (128)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (adam 3e-3, sgd 0.1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="prepjit device (cpu, opencl, cuda)")
    parser.add_argument("--devices", default=None, help="data parallel over these devices, comma-separated "
                        "(cuda:0,cuda:1; cpu,cpu for replicas on the host)")
    parser.add_argument("--precision", choices=tuple(COMPUTE), default="f32",
                        help="mixed: bfloat16 forward and backward, float32 master weights and optimizer state")
    parser.add_argument("--check", action="store_true", help="compare with NumPy's hand-written gradients (and JAX)")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bar (epoch lines only)")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    lr = args.lr if args.lr is not None else 3e-3 if args.optimizer == "adam" else 0.1
    config = dict(sizes=sizes, n_train=args.train, n_test=args.test, batch=args.batch, epochs=args.epochs, lr=lr,
                  optimizer=args.optimizer, seed=args.seed)
    mixed = args.precision == "mixed"
    print(f"MLP {' -> '.join(map(str, sizes))}, {args.optimizer} lr {lr}, {args.train} points in batches of "
          f"{args.batch} (last {args.train % args.batch or args.batch}): one prepared step, symbolic batch n <= "
          f"{args.batch}" + ("; mixed precision: bfloat16 compute, float32 master weights" if mixed else ""))
    start = time.perf_counter()
    devices = args.devices.split(",") if args.devices else None
    result = train(**config, device=args.device, devices=devices, progress=not args.no_progress,
                   precision=args.precision)
    seconds = time.perf_counter() - start
    steps = len(result["losses"])
    print(f"loss {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f} over {steps} steps "
          f"({seconds:.2f} s, first step's trace + compile included)")
    print(f"test accuracy {result['accuracy']:.3f} (chance {result['chance']:.3f}); prepared evaluation: accuracy "
          f"{result['prepared_accuracy']:.3f}, loss {result['test_loss']:.4f}")
    print(f"step stats: {result['stats']} (one trace for every batch size)")
    ok = result["stats"]["traces"] == 1 and result["losses"][-1] < result["losses"][0]
    if args.check:
        import importlib.util
        for framework in ("numpy", "jax"):
            if framework == "jax" and importlib.util.find_spec("jax") is None:
                print("check vs JAX: jax not installed")
                continue
            theirs = train(**config, progress=False, log=False, reference=framework)
            what = "NumPy (hand-written gradients)" if framework == "numpy" else "JAX (value_and_grad)"
            if mixed:  # bfloat16's rounding moves every step a little: the loss curves agree within a tolerance
                step_diff, epoch_diff = compare_curves(result, theirs)
                good = step_diff < CURVE_TOLERANCE[0] and epoch_diff < CURVE_TOLERANCE[1]
                print(f"check mixed vs float32 {what}: {steps} steps, per-step loss max |diff| {step_diff:.1e}, "
                      f"per-epoch mean loss max rel diff {epoch_diff:.1e}, test accuracy {result['accuracy']:.3f} vs "
                      f"{theirs['accuracy']:.3f}: {'OK' if good else 'FAILED'}")
            else:
                loss_diff, weight_diff = compare(result, theirs)
                good = loss_diff < 1e-3 and weight_diff < 1e-3
                print(f"check vs {what}: {steps} steps, per-step loss max rel diff {loss_diff:.1e}, final weights "
                      f"max |diff| {weight_diff:.1e}: {'OK' if good else 'FAILED'}")
            ok &= good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
