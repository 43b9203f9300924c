"""`python -m benchmarks.report [results.json]`: the results as a Markdown table (for the README)."""
from __future__ import annotations

import json
import os
import sys

from .__main__ import _fmt_seconds, llama_cpp_build
from .blas import describe

PEERS = ("numpy", "jax", "tinygrad", "torch", "sentence-transformers", "transformers", "prepjit-args", "llama.cpp")


def markdown(result: dict) -> str:
    m = result["machine"]
    blas = f" (BLAS {describe(m['blas'])})" if "blas" in m else ""  # (results before it was recorded: none)
    copy = f", memory copy {m['copy_gb_per_s']} GB/s (read + write)" if "copy_gb_per_s" in m else ""
    if "kernel_cpu" in m:  # (results before it was recorded: the host's own)
        blas += f", prepjit kernels for {m['kernel_cpu']['name']} ({m['kernel_cpu']['vector_bytes'] * 8}-bit vectors)"
    blas += llama_cpp_build(m)
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores{copy}, {m['platform']}, Python {m['python']}, NumPy {m['numpy']}{blas}; "
             + ", ".join(f"{p} {v}" for p, v in result["peers"].items() if p != "numpy") + f" ({result['date']}).",
             "", "| case | prepjit | " + " | ".join(PEERS) + " | rate | goal |",
             "|---|---:|" + "---:|" * len(PEERS) + "---:|---|"]
    for r in result["cases"]:
        t = r["seconds"]
        if "prepjit" not in t:  # a case skipped (its model not installed)
            continue
        cells = [r["case"], _fmt_seconds(t["prepjit"])]
        cells += [f"{_fmt_seconds(t[p])} ({r['ratio_vs'][p]:.2f}x)" if p in t else "-" for p in PEERS]
        cells.append(f"{r['rates']['prepjit']:.1f} {r['rate_unit']}" if "rates" in r else
                     f"disk cache: {_fmt_seconds(r['disk_cache_seconds'])}" if "disk_cache_seconds" in r else "")
        g = r.get("goal")
        cells.append("" if g is None else f"<= {g['max_ratio']}x {g['peer']}: " + ("n/a" if g["met"] is None else "met" if g["met"] else "not met"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else os.path.join(os.path.dirname(__file__), "results", "cpu-latest.json")
    with open(path) as f:
        print(markdown(json.load(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
