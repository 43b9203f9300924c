"""NVRTC, NVIDIA's runtime compiler (CUDA C -> cubin), called through ctypes.

pycuda's own `compiler` module runs nvcc in a subprocess (hundreds of milliseconds a kernel); NVRTC
compiles in-process in a few milliseconds and ships with every CUDA toolkit pycuda is built against
(and in the nvidia-cuda-nvrtc wheels). The library is looked up as `libnvrtc` on the loader path, under
$CUDA_HOME / $CUDA_PATH / /usr/local/cuda, then in installed `nvidia` wheels.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

from ..errors import CompileError, DeviceError


def _candidates() -> list[str]:
    found = ctypes.util.find_library("nvrtc")
    paths = [found] if found else []
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            paths += sorted(glob.glob(os.path.join(root, "lib*", "libnvrtc.so*")), reverse=True)
    for site in sys.path:
        paths += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so*")), reverse=True)
    return [p for p in paths if "builtins" not in os.path.basename(p) and "alt" not in os.path.basename(p)]


class NVRTC:
    """The loaded library; `compile(name, source, options)` -> cubin bytes or a CompileError with the log."""

    def __init__(self):
        errors = []
        for path in _candidates():
            try:
                self.lib = ctypes.CDLL(path)
                break
            except OSError as e:
                errors.append(str(e))
        else:
            raise DeviceError("device 'cuda' needs NVRTC (libnvrtc.so), which was not found"
                              f"{' (' + '; '.join(errors) + ')' if errors else ''}; install the CUDA toolkit "
                              "or `pip install nvidia-cuda-nvrtc`, or set CUDA_HOME")
        self.path = path
        lib = self.lib
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)

    def _check(self, status: int, what: str):
        if status != 0:
            raise CompileError(f"NVRTC {what} failed: {self.lib.nvrtcGetErrorString(status).decode()}")

    def compile(self, name: str, source: str, options: list[str]) -> bytes:
        lib, prog = self.lib, ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(),
                                           0, None, None), "nvrtcCreateProgram")
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            status = lib.nvrtcCompileProgram(prog, len(options), opts)
            if status != 0:
                size = ctypes.c_size_t()
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value)
                lib.nvrtcGetProgramLog(prog, log)
                raise CompileError(f"NVRTC {'.'.join(map(str, self.version))} failed to compile kernel {name} "
                                   f"({' '.join(options)}):\n{log.value.decode(errors='replace')}\n"
                                   f"--- source ---\n{source}")
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            return cubin.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))
