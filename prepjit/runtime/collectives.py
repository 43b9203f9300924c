"""The collectives between a multi-device function's stages: which backend runs them, and the host one.

`communicator(devices, job)` picks: replicas on CUDA GPUs talk through NCCL (nccl.py; without it,
DeviceError saying what to install); other replicas (the cpu, listed once per replica, or opencl) through
host memory here. A communicator's `run(kind, arrays)` takes one array per local replica (in `devices` order)
and returns each replica's result on its device: "psum" sums them, "all_gather" stacks them along a new
leading axis, both in replica order over the whole job (this process's replicas come after those of lower
ranks).

HostCollectives reads the replicas' values to NumPy, combines them in replica order (a sum accumulates
replica 0 + 1 + 2 ... in the values' dtype, as NCCL does), across processes through the job's TCP star
(collectives_job.py), and gives each replica the result on its device. It is for CPU replicas and tests; it
moves every value through the host.
"""
from __future__ import annotations

import threading

import numpy as np

from .array import Array


def to_device(device, host: np.ndarray) -> Array:
    """`host` as a pj.Array of `device` (the cpu holds it as it is; a GPU gets a copy uploaded)."""
    if not device.device_memory:
        return Array(host, host.shape, host.dtype, device)
    _, (memory, _) = device.input_handle(host)
    return Array(memory, host.shape, host.dtype, device)


def combine(kind: str, stacked: np.ndarray) -> np.ndarray:
    """The collective's result from every replica's value stacked in replica order."""
    if kind == "all_gather":
        return stacked
    out = np.array(stacked[0])  # an ndarray, 0-d ones too
    with np.errstate(over="ignore"):  # integers wrap, as on the device
        for value in stacked[1:]:
            out += value
    return out


class HostCollectives:
    """Collectives through host memory, for `devices` (this process's replicas) in `job` (or one process)."""

    def __init__(self, devices: list, job=None):
        self.devices, self.job = devices, job

    def run(self, kind: str, arrays: list) -> list:
        if len(arrays) == 1 and kind == "psum" and (self.job is None or self.job.world == 1):
            return list(arrays)  # a sum over one replica: its value (read-only to the stages after)
        stacked = np.stack([np.asarray(a) for a in arrays])
        if self.job is not None and self.job.world > 1:
            stacked = self.job.gather_to_all(stacked)
        result = combine(kind, stacked)
        return [to_device(device, result) for device in self.devices]


_communicators: dict = {}
_lock = threading.Lock()


def communicator(devices: list, job=None):
    """The collectives backend of replicas on `devices`: NCCL for CUDA GPUs, the host otherwise; made once per
    list of devices (and job) and shared by every function replicated on them (NCCL's setup is collective and
    slow: once)."""
    key = (tuple(d.name for d in devices), id(job))
    with _lock:
        if key not in _communicators:
            if getattr(devices[0], "language", None) == "cuda":
                from .nccl import NCCLCollectives
                _communicators[key] = NCCLCollectives(devices, job)
            else:
                _communicators[key] = HostCollectives(devices, job)
        return _communicators[key]
