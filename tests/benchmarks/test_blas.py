"""`python -m benchmarks` measures NumPy with its BLAS's own kernel for this CPU, whatever pins the environment
sets (benchmarks/blas.py), and names that kernel in its results; a program importing the package keeps the pins."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("threadpoolctl")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# a kernel OpenBLAS picks on no current x86-64 CPU (Prescott: SSE3), with a cache size to match
PINNED = {**os.environ, "OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_L2_SIZE": "262144"}


def _pinned_blas() -> list:
    """The BLAS libraries a program importing the benchmarks package loads under the pins."""
    done = subprocess.run([sys.executable, "-c", "import json, benchmarks.blas as b; print(json.dumps(b.blas_info()))"],
                          cwd=ROOT, env=PINNED, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_benchmark_process_drops_the_blas_pins(tmp_path):
    pinned = _pinned_blas()
    if not any(b["internal_api"] == "openblas" for b in pinned):
        pytest.skip("NumPy's BLAS here is not OpenBLAS")
    out = tmp_path / "results.json"
    subprocess.run([sys.executable, "-m", "benchmarks", "--smoke", "--peers", "numpy", "--case", "replay_elementwise",
                    "--out", str(out)], cwd=ROOT, env=PINNED, capture_output=True, text=True, timeout=600, check=True)
    blas = json.loads(out.read_text())["machine"]["blas"]
    assert [b["internal_api"] for b in blas] == [b["internal_api"] for b in pinned]
    assert all(b["architecture"] not in (None, p["architecture"]) for b, p in zip(blas, pinned))
    assert all(b["num_threads"] >= 1 and b["version"] for b in blas)
