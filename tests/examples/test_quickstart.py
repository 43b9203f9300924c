"""The README's demo runs and checks itself against NumPy."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_quickstart_runs_and_matches_numpy():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    errors = [float(e) for e in re.findall(r"max \|err\| vs NumPy = (\S+)", out)]
    assert len(errors) == 4 and max(errors) < 1e-5
    assert "'traces': 1" in out and "'replays': 4" in out
    assert "define void" in out and "i64 %var_pos" in out  # the LLVM source of the kernel that takes pos
    assert "VarBoundError" not in out and "outside its bounds" in out
