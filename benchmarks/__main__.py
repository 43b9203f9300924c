"""`python -m benchmarks [--smoke] [--case NAME ...] [--peers numpy,jax,...] [--out FILE]`: run and report."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import llama_cpp
from .blas import describe
from .cases import CASES
from .peers import available_peers
from .runner import machine_info, run_case


def _fmt_seconds(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def format_row(record: dict, peer_names: list[str]) -> str:
    times = record["seconds"]
    if "prepjit" not in times:
        return record["case"].ljust(28) + "  skipped: " + record.get("skipped", "no prepjit figure")
    cells = [record["case"].ljust(28), _fmt_seconds(times["prepjit"]).rjust(10)]
    for p in peer_names:
        if p in times:
            cells.append(f"{_fmt_seconds(times[p]):>10} ({record['ratio_vs'][p]:.2f}x)")
        else:
            cells.append("-".rjust(18))
    extra = []
    if "rates" in record:
        extra.append(f"{record['rates']['prepjit']:.1f} {record['rate_unit']}")
    if "disk_cache_seconds" in record:
        extra.append(f"a second process with the disk cache: {_fmt_seconds(record['disk_cache_seconds'])}")
    if "goal" in record:
        g = record["goal"]
        verdict = "n/a" if g["met"] is None else "met" if g["met"] else "NOT met"
        extra.append(f"goal <= {g['max_ratio']}x {g['peer']}: {verdict}")
    return "  ".join(cells) + ("  | " + "; ".join(extra) if extra else "")


def llama_cpp_build(machine: dict) -> str:
    """The machine line's words on the llama.cpp build that ran (none in results from before it was recorded)."""
    b = machine.get("llama_cpp_build")
    return f", llama.cpp built for {' '.join(b['features'])} ({b['path']})" if b else ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one run each (a check, not a measurement)")
    parser.add_argument("--case", action="append", help="run only cases whose name contains this (repeatable)")
    parser.add_argument("--peers", help="comma-separated peers to compare with (default: all installed)")
    parser.add_argument("--out", help="write the results as JSON here (default benchmarks/results/<machine>.json)")
    args = parser.parse_args(argv)
    os.environ.setdefault("DEV", "CPU")
    peers = available_peers(args.peers.split(",") if args.peers else None)
    cases = [c for c in CASES if any(s in c.name for s in args.case)] if args.case else [
        c for c in CASES if c.smoke or not args.smoke]
    machine = machine_info(measure_bandwidth=not args.smoke)
    if any(p.name == "llama.cpp" for p in peers):  # which build runs: PYTHONPATH may put another one first
        machine["llama_cpp_build"] = llama_cpp.build()
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}, NumPy {machine['numpy']}"
          + (f", memory copy {machine['copy_gb_per_s']} GB/s" if "copy_gb_per_s" in machine else "")
          + f", BLAS {describe(machine['blas'])}, prepjit kernels for {machine['kernel_cpu']['name']}"
          + f" ({machine['kernel_cpu']['vector_bytes'] * 8}-bit vectors)" + llama_cpp_build(machine))
    print("peers: " + (", ".join(f"{p.name} {p.version()}" for p in peers) or "none"))
    names = [p.name for p in peers]
    print("case".ljust(28) + "  " + "prepjit".rjust(10) + "  " + "  ".join(n.rjust(18) for n in names)
          + "   (ratio = prepjit time / peer time; < 1 is faster)")
    records = []
    for case in cases:
        record = run_case(case, peers, smoke=args.smoke)
        records.append(record)
        print(format_row(record, names), flush=True)
    result = {"machine": machine, "peers": {p.name: p.version() for p in peers}, "smoke": args.smoke,
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": "python -m benchmarks " + " ".join(argv or sys.argv[1:]),
              "cases": records}
    if args.out or not args.smoke:
        out = args.out or os.path.join(os.path.dirname(__file__), "results", "cpu-latest.json")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
