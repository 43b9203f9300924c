"""The device registry: names -> device objects, created on first use ("cuda" is "cuda:0", "cuda:N" GPU N)."""
from __future__ import annotations

import os
import threading

from ..errors import DeviceError

_devices: dict = {}
_lock = threading.Lock()
KNOWN = ("cpu", "opencl", "cuda")


def default_device() -> str:
    """PREPJIT_DEVICE, read on every call (a prepared call's too). Read from os.environ's own store, where
    os.environ writes: its `get` raises and catches a KeyError when the variable is unset, 0.6 us a call."""
    value = _ENVIRON.get(_DEVICE_VARIABLE)
    return "cpu" if value is None else os.environ.decodevalue(value)


_ENVIRON = os.environ._data
_DEVICE_VARIABLE = os.environ.encodekey("PREPJIT_DEVICE")


def _canonical(name: str) -> str:
    """The registry's name for a device: "cuda:0" is "cuda", "cuda:N" stays; other names must be known."""
    kind, _, index = name.partition(":")
    if kind == "cuda" and index:
        if not index.isdigit():
            raise DeviceError(f"unknown device {name!r}; CUDA devices are 'cuda' or 'cuda:N' (N a GPU index)")
        return "cuda" if int(index) == 0 else f"cuda:{int(index)}"
    if name not in KNOWN:
        raise DeviceError(f"unknown device {name!r}; choose one of {', '.join(KNOWN)} (or cuda:N)")
    return name


def get_device(name: str | None = None):
    name = _canonical((name or default_device()).lower())
    with _lock:
        if name not in _devices:
            _devices[name] = _create(name)
        return _devices[name]


def available_devices() -> list[str]:
    """The devices that can run here (cpu always; others when their driver loads)."""
    return [name for name in KNOWN if unavailable_reason(name) is None]


def unavailable_reason(name: str) -> str | None:
    """Why device `name` cannot run here (its DeviceError's message, which says what to install), or None."""
    try:
        get_device(name)
    except DeviceError as e:
        return str(e)
    return None


def _create(name: str):
    if name == "cpu":
        from .cpu import CPUDevice
        return CPUDevice()
    if name == "opencl":
        from .opencl import OpenCLDevice
        return OpenCLDevice()
    from .cuda import CUDADevice
    return CUDADevice(int(name.partition(":")[2] or 0))
