"""Shared fixtures: `device` runs a device-independent test once on every available device; every test
session (and the processes its tests start) uses a fresh kernel disk cache, never ~/.cache/prepjit."""
import os
import shutil
import tempfile

import numpy as np
import pytest

from prepjit.runtime.devices import KNOWN, available_devices, unavailable_reason
from prepjit.runtime.disk_cache import PACKAGE_ROOT

_session_cache = tempfile.TemporaryDirectory(prefix="prepjit-test-cache-")
os.environ["PREPJIT_CACHE_DIR"] = _session_cache.name  # read on every use, so setting it here covers every test
# JAX is the reference for bit-exact semantics (random streams, bfloat16 rounding): its CPU backend, also on a
# machine where jax sees a GPU (whose kernels round otherwise, and which preallocates most of the GPU's memory)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
DEVICES = available_devices()


def pytest_report_header(config):
    """Which devices the device-independent tests run on, and why each other one does not."""
    missing = [f"  {name}: {unavailable_reason(name)}" for name in KNOWN if name not in DEVICES]
    return [f"prepjit devices: {', '.join(DEVICES)}"] + (["not tested (why):"] + missing if missing else [])


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def frozen_code(tmp_path_factory):
    """A folder holding a frozen copy of the prepjit package, for test processes to import (PYTHONPATH). Disk-cache
    keys include a fingerprint of prepjit's source, so a source file edited between two processes (as in a shared
    working tree) would rightly make the second miss; a copy makes "two processes running the same code" hold.
    One copy serves the session, so only its first process compiles the package's bytecode."""
    root = tmp_path_factory.mktemp("code")
    shutil.copytree(PACKAGE_ROOT, root / "prepjit", ignore=shutil.ignore_patterns("__pycache__"))
    return root
