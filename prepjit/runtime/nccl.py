"""NCCL through ctypes: the collectives of replicas on CUDA GPUs, on each GPU's stream, in plan order.

libnccl.so.2 comes from the `nvidia-nccl-cu12` / `nvidia-nccl-cu13` wheel (`pip install 'prepjit[nccl]'`; torch's
CUDA wheels ship it too) or from the system. ctypes needs no binding package: CuPy's `cupy.cuda.nccl` would
pull CuPy (hundreds of MB, a CUDA version of its own) only to call five C functions.

One communicator per local GPU, all made at once (ncclGroupStart / ncclCommInitRank per GPU / ncclGroupEnd)
from one unique id: this process's own, or in a job of several processes rank 0's, sent over the job's TCP
star (collectives_job.py). A collective queues ncclAllReduce / ncclAllGather on every local GPU's stream in
one group, after that GPU's earlier kernels and before its later ones; nothing waits for it on the host.
NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 unless the environment says otherwise. Communicators
live as long as the process (collectives.py keeps one set per list of devices): destroying them at exit, after
the CUDA contexts may be gone, could hang it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

import numpy as np

from ..errors import DeviceError
from .array import Array

INSTALL_HINT = ("pip install 'prepjit[nccl]' (the nvidia-nccl-cu12 wheel; nvidia-nccl-cu13 for CUDA 13), or put "
                "libnccl.so.2 on the library path")
_TYPES = {np.dtype(t): code for t, code in (
    (np.int8, 0), (np.uint8, 1), (np.int32, 2), (np.uint32, 3), (np.int64, 4), (np.uint64, 5),
    (np.float16, 6), (np.float32, 7), (np.float64, 8))}
_SUM, _CHAR = 0, 0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]  # NCCL_UNIQUE_ID_BYTES


def id_bytes(uid: UniqueId) -> bytes:
    """All 128 bytes of a unique id (reading the field would stop at its first zero byte)."""
    return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))


def id_from_bytes(data: bytes) -> UniqueId:
    if len(data) != ctypes.sizeof(UniqueId):
        raise DeviceError(f"rank 0 sent an NCCL unique id of {len(data)} bytes, not {ctypes.sizeof(UniqueId)}")
    uid = UniqueId()
    ctypes.memmove(ctypes.addressof(uid), data, len(data))
    return uid


def _candidates() -> list[str]:
    paths = []
    try:
        import nvidia.nccl  # the nvidia-nccl-cu12 / -cu13 wheel (a namespace package)
        paths += [os.path.join(p, "lib", "libnccl.so.2") for p in nvidia.nccl.__path__]
    except ImportError:
        pass
    return paths + ["libnccl.so.2", ctypes.util.find_library("nccl") or "libnccl.so"]


def load_library() -> ctypes.CDLL:
    """libnccl.so.2, with its functions' signatures declared; DeviceError saying what to install otherwise."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            errors.append(str(e))
    else:
        raise DeviceError(f"collectives between CUDA replicas need NCCL, which is not installed here ({errors[0]}); "
                          f"{INSTALL_HINT}")
    p, i, z = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetErrorString.argtypes = [i]
    for name, args in (("ncclGetVersion", [ctypes.POINTER(i)]), ("ncclGetUniqueId", [ctypes.POINTER(UniqueId)]),
                       ("ncclCommInitRank", [ctypes.POINTER(p), i, UniqueId, i]), ("ncclGroupStart", []),
                       ("ncclGroupEnd", []),
                       ("ncclAllReduce", [p, p, z, i, i, p, p]), ("ncclAllGather", [p, p, z, i, p, p])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = i, args
    return lib


class NCCLCollectives:
    """NCCL communicators for this process's GPU replicas `devices` (CUDADevices, distinct GPUs) in `job`."""

    def __init__(self, devices: list, job=None):
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            raise DeviceError(f"NCCL needs one replica per GPU; devices lists {names}")
        self.lib, self.devices = load_library(), devices
        version = ctypes.c_int()
        self._check(self.lib.ncclGetVersion(ctypes.byref(version)), "ncclGetVersion")
        self.version = version.value
        world, rank = (job.world, job.rank) if job is not None else (1, 0)
        uid = UniqueId()
        if rank == 0:
            self._check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        if world > 1:
            uid = id_from_bytes(job.broadcast_bytes(id_bytes(uid) if rank == 0 else None))
        self.size = world * len(devices)
        self.comms = [ctypes.c_void_p() for _ in devices]
        self._group(lambda i, d: self.lib.ncclCommInitRank(ctypes.byref(self.comms[i]), self.size, uid,
                                                           rank * len(devices) + i), "ncclCommInitRank")

    def _check(self, result: int, what: str):
        if result != 0:
            raise DeviceError(f"NCCL {what} failed: {self.lib.ncclGetErrorString(result).decode()} (error {result})")

    def _group(self, call, what: str):
        """`call(i, device)` for every local GPU, its context current, inside one NCCL group."""
        self._check(self.lib.ncclGroupStart(), "ncclGroupStart")
        try:
            for i, device in enumerate(self.devices):
                device.current()
                self._check(call(i, device), what)
        finally:
            self._check(self.lib.ncclGroupEnd(), "ncclGroupEnd")

    def run(self, kind: str, arrays: list) -> list:
        a = arrays[0]
        shape = (self.size, *a.shape) if kind == "all_gather" else a.shape
        if kind == "psum" and a.dtype not in _TYPES:
            raise DeviceError(f"NCCL cannot sum {a.dtype} values; cast them (to int32 or float32) before pj.psum")
        outs = []
        for device in self.devices:
            device.current()
            device.flush()  # the kernels before the collective are on the stream first
            outs.append(Array(device.empty(shape, a.dtype), shape, a.dtype, device))
        if a.size:
            if kind == "psum":
                self._group(lambda i, d: self.lib.ncclAllReduce(
                    int(arrays[i].buffer), int(outs[i].buffer), a.size, _TYPES[a.dtype], _SUM, self.comms[i],
                    d._stream), "ncclAllReduce")
            else:  # bytes: exact for every dtype
                self._group(lambda i, d: self.lib.ncclAllGather(
                    int(arrays[i].buffer), int(outs[i].buffer), a.size * a.dtype.itemsize, _CHAR, self.comms[i],
                    d._stream), "ncclAllGather")
        return outs
