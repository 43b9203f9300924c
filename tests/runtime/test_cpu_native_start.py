"""The cpu device's replay module compiles in a worker process of its own while the device's creator goes on (a first
call traces meanwhile); its parts are loaded at their first use, in this process if no worker could do it."""
import subprocess
import sys
import textwrap

import pytest


def _run(script: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_replay_module_compiles_aside_and_loads_at_its_first_use():
    out = _run("""
        import threading
        from prepjit.runtime import cpu
        compiled_here = []
        own_compile = cpu.CPUDevice.compile
        cpu.CPUDevice.compile = lambda self, name, source: compiled_here.append(name) or own_compile(self, name, source)
        cpu.thread_count = lambda: 2  # (workers start on a one-core runner too)
        device = cpu.CPUDevice()
        print(sorted(cpu.CPUDevice.NATIVE_PARTS & set(device.__dict__)), threading.active_count())
        device.replay_fn
        print(sorted(cpu.CPUDevice.NATIVE_PARTS - set(device.__dict__)), compiled_here, device.native_reads_arrays)
    """)
    assert out.split("\n")[:2] == ["[] 1", "[] [] True"]


def test_the_replay_module_compiles_here_where_its_worker_fails():
    out = _run("""
        import sys
        from prepjit.runtime import compile_pool, cpu
        compile_pool._worker_command = lambda options: [sys.executable, "-c", "import sys; sys.stdin.read()"]
        cpu.thread_count = lambda: 2
        device = cpu.CPUDevice()
        print(device.native_reads_arrays)
    """)
    assert out.split() == ["True"]


def test_a_process_ending_before_it_used_the_device_prints_nothing():
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from prepjit.runtime import cpu
        cpu.thread_count = lambda: 2
        cpu.CPUDevice()
    """)], capture_output=True, text=True, timeout=120)  # (its stderr closes once the worker too has ended)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


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
