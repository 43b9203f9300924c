"""The benchmark suite runs: every case once at tiny size, prepjit checked against NumPy (no timing claims)."""
import json

import pytest

from benchmarks.__main__ import main
from benchmarks.cases import CASES
from benchmarks.peers import available_peers
from benchmarks.runner import run_case


@pytest.mark.parametrize("case", [c for c in CASES if c.smoke], ids=lambda c: c.name)  # as `--smoke` runs them
def test_case_runs_and_matches_numpy(case):
    record = run_case(case, available_peers(["numpy"]), smoke=True)
    assert record["seconds"]["prepjit"] > 0
    assert record["plan_bytes"] >= record["intermediate_bytes"] >= 0
    if case.kind == "call" and (case.peers is None or "numpy" in case.peers):
        assert "numpy" in record["ratio_vs"]


def test_command_line_writes_json(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert main(["--smoke", "--peers", "numpy", "--case", "replay", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {c["case"] for c in result["cases"]} == {"replay_elementwise_16", "replay_closure_25_weights",
                                                    "replay_reduction_chain_10"}
    assert result["machine"]["cores"] >= 1
    assert "replay_elementwise_16" in capsys.readouterr().out


def test_results_name_the_cpu_the_kernels_are_compiled_for():
    """The machine record names prepjit's kernel CPU: PREPJIT_CPU's (AVX2 code on an AVX-512 host gives other
    figures on the same machine) or the host's own."""
    from benchmarks.runner import machine_info
    from prepjit.llvm_cpu import compile_cpu
    kernels = machine_info(measure_bandwidth=False)["kernel_cpu"]
    assert kernels["name"] == compile_cpu().name and kernels["vector_bytes"] == compile_cpu().vector_bytes
