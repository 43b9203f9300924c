"""The device registry: names -> device objects, created on first use."""
from __future__ import annotations

import os
import threading

from ..errors import DeviceError

_devices: dict = {}
_lock = threading.Lock()
KNOWN = ("cpu", "opencl", "cuda")


def default_device() -> str:
    return os.environ.get("PREPJIT_DEVICE", "cpu")


def get_device(name: str | None = None):
    name = (name or default_device()).lower()
    if name not in KNOWN:
        raise DeviceError(f"unknown device {name!r}; choose one of {', '.join(KNOWN)}")
    with _lock:
        if name not in _devices:
            _devices[name] = _create(name)
        return _devices[name]


def available_devices() -> list[str]:
    """The devices that can run here (cpu always; others when their driver loads)."""
    out = []
    for name in KNOWN:
        try:
            get_device(name)
        except DeviceError:
            continue
        out.append(name)
    return out


def _create(name: str):
    if name == "cpu":
        from .cpu import CPUDevice
        return CPUDevice()
    if name == "opencl":
        from .opencl import OpenCLDevice
        return OpenCLDevice()
    hint = {"cuda": "pip install 'prepjit[cuda]' (pycuda) on a machine with an NVIDIA GPU"}[name]
    raise DeviceError(f"device {name!r} is not available in this build of prepjit yet; it will need: {hint}")
