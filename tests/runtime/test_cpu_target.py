"""PREPJIT_CPU (prepjit/llvm_cpu.py): the cpu device compiles for the named LLVM CPU and codegen's
host_target() reports its vector unit; the results still match NumPy. Each setting runs in a fresh
process (the choice is read once per process)."""
import json
import os
import subprocess
import sys

import pytest

import prepjit as pj
from prepjit.llvm_cpu import compile_cpu

# Prepares a matmul, a softmax and an elementwise op, checks them against NumPy, and reports the target,
# the compiler id, and whether the kernels' machine code uses zmm (AVX-512) registers.
CHILD = r"""
import json, os, shutil, subprocess, sys, tempfile
import numpy as np
import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.target import host_target
from prepjit.runtime.devices import get_device

def softmax(x):
    e = pnp.exp(x - pnp.max(x, axis=-1, keepdims=True))
    return e / pnp.sum(e, axis=-1, keepdims=True)

rng = np.random.default_rng(0)
a = rng.standard_normal((96, 128)).astype(np.float32)
b = rng.standard_normal((128, 80)).astype(np.float32)
cases = [(pj.prepare(lambda a, b: a @ b), (a, b), a @ b),
         (pj.prepare(softmax), (a,), np.exp(a - a.max(-1, keepdims=True)) / np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True)),
         (pj.prepare(lambda a: a * 3 + 1), (a,), a * 3 + 1)]
asm = []
for f, args, want in cases:
    np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-4, atol=1e-5)
    if shutil.which("objdump"):
        for k in f.plan(*args).kernels:
            with tempfile.NamedTemporaryFile(suffix=".o") as obj:
                obj.write(k.kernel.binary)
                obj.flush()
                asm.append(subprocess.run(["objdump", "-d", obj.name], capture_output=True, text=True,
                                          check=True).stdout)
t = host_target()
print(json.dumps({"cpu": t.cpu, "vector_bytes": t.vector_bytes, "registers": t.vector_registers,
                  "compiler_id": get_device("cpu").compiler_id,
                  "disassembled": bool(asm), "zmm": any("zmm" in s for s in asm),
                  "ymm": any("ymm" in s for s in asm)}))
"""


def _run(cpu: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PREPJIT_CPU"}
    if cpu is not None:
        env["PREPJIT_CPU"] = cpu
    env["PREPJIT_CACHE"] = "0"  # compile here, for this target
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not compile_cpu().triple.startswith("x86_64"), reason="x86 CPU names")
def test_haswell_compiles_256_bit_kernels_that_match_numpy():
    got = _run("haswell")
    assert (got["cpu"], got["vector_bytes"], got["registers"]) == ("haswell", 32, 16)
    assert "-haswell-" in got["compiler_id"]
    if got["disassembled"]:
        assert not got["zmm"] and got["ymm"]


@pytest.mark.skipif(compile_cpu().vector_bytes != 64, reason="the host has no AVX-512")
def test_without_it_an_avx512_host_gets_zmm_kernels():
    got = _run(None)
    assert got["vector_bytes"] == 64 and got["cpu"] == compile_cpu().name
    if got["disassembled"]:
        assert got["zmm"]


def test_unknown_cpu_is_a_device_error():
    env = dict(os.environ, PREPJIT_CPU="no-such-cpu")
    code = ("import prepjit as pj\nfrom prepjit.runtime.devices import get_device\ntry:\n    get_device('cpu')\n"
            "except pj.DeviceError as e:\n    print('DeviceError', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "DeviceError" in done.stdout and "no-such-cpu" in done.stdout, done.stderr
