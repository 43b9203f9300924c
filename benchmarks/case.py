"""A benchmark case: what it computes, its inputs at full and smoke size, the peers it runs on, its goal."""
from __future__ import annotations

import attrs


@attrs.frozen
class Case:
    name: str
    fn: object                       # (xp, *arrays) -> array
    make_inputs: object              # (rng, smoke) -> list of arrays
    prepare_kwargs: dict = {}        # vars / shapes for @pj.prepare
    work: object = None              # (arrays) -> (amount, unit) e.g. (bytes, "GB/s") for a rate column
    goal: tuple | None = None        # (peer name, max prepjit/peer time ratio)
    rtol: float = 1e-5
    atol: float = 1e-5
    kind: str = "call"               # "call": time a replay; "prepare": time the first call (trace + compile)
    peers: tuple | None = None       # the namespace peers (numpy, jax, ...) that run `fn` (None: all of them)
    peer_fns: dict = {}              # peer name -> (arrays) -> call(*arrays): a library's own model (e.g. transformers)
    prepjit: object = None           # (arrays) -> (prepared function, its arguments), when prepjit is not fn on them
    smoke: bool = True               # in `--smoke`'s default selection
    # (peers, smoke) -> (times, record): figures of fresh processes taken in turn (low_precision_models.py);
    # such a case has no fn or make_inputs
    processes: object = None
