"""The cpu device's replay module compiles on a thread while the device's creator goes on (a first call traces
meanwhile); its parts are loaded at their first use, and a fork waits for the compile."""
import subprocess
import sys
import textwrap

import pytest


def _run(script: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_replay_module_is_loaded_at_its_first_use_not_at_the_devices_start():
    out = _run("""
        from prepjit.runtime.cpu import CPUDevice
        device = CPUDevice()
        print(sorted(CPUDevice.NATIVE_PARTS & set(device.__dict__)))
        device.replay_fn
        print(sorted(CPUDevice.NATIVE_PARTS - set(device.__dict__)))
    """)
    assert out.split("\n")[:2] == ["[]", "[]"]


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork")
def test_a_child_forked_at_once_after_the_devices_start_runs_plans():
    out = _run("""
        import os
        import numpy as np
        import prepjit as pj
        from prepjit.runtime.devices import get_device
        get_device("cpu")
        pid = os.fork()
        f = pj.prepare(lambda x: (x * 2).sum(), device="cpu")
        value = float(np.asarray(f(np.ones(8, np.float32))))
        if pid == 0:
            os._exit(0 if value == 16 else 1)
        _, status = os.waitpid(pid, 0)
        print(value, os.waitstatus_to_exitcode(status))
    """)
    assert out.split() == ["16.0", "0"]
