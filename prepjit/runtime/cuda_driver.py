"""The few CUDA driver calls the cuda device makes itself, through ctypes on libcuda: loading cubins, launching
kernels with a packed argument buffer, and CUDA graphs (pycuda wraps neither graphs nor raw launches), whose kernel
nodes may follow one another by programmatic edges where the later kernel waits for the grids before it (Hopper's
programmatic dependent launch, PREPJIT_CUDA_PROGRAMMATIC=1: it is launched early, its blocks waiting, so that it
starts as the earlier one ends).

pycuda still owns initialisation, the primary context, streams, memory and copies; everything here runs in
that context, made current by the device.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util

from ..errors import DeviceError
from .cuda_cubin import dynamic_local_bytes, waits_for_earlier_grids
from .cuda_tensor_maps import MAP_BYTES

CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_BUFFER_POINTER, _BUFFER_SIZE, _END = 1, 2, 0   # CU_LAUNCH_PARAM_*
_PORT_PROGRAMMATIC = 1         # CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
_DEPENDENCY_PROGRAMMATIC = 1   # CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC


class EdgeData(ctypes.Structure):
    """CUgraphEdgeData (CUDA 12.3): when the upstream node releases the downstream one (port 0: its completion)."""
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


class KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2 (its first fields are v1's)."""
    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("kernel_params", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class Driver:
    def __init__(self):
        try:
            self.lib = lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
        except OSError as e:
            raise DeviceError(f"the NVIDIA driver library libcuda could not be loaded ({e})") from e
        out, ptr, params = ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.POINTER(KernelNodeParams)
        self.add_kernel_node = getattr(lib, "cuGraphAddKernelNode_v2", None) or lib.cuGraphAddKernelNode
        self.set_kernel_node = getattr(lib, "cuGraphExecKernelNodeSetParams_v2", None) or \
            lib.cuGraphExecKernelNodeSetParams
        self.add_edges = getattr(lib, "cuGraphAddDependencies_v2", None)   # (None before CUDA 12.3: no edge data)
        if self.add_edges is not None:
            self.add_edges.argtypes = [ptr, out, out, ctypes.POINTER(EdgeData), ctypes.c_size_t]
        for fn, args in [(lib.cuGetErrorString, [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
                         (lib.cuCtxGetCurrent, [out]), (lib.cuCtxSetCurrent, [ptr]),
                         (lib.cuModuleLoadData, [out, ctypes.c_char_p]), (lib.cuModuleUnload, [ptr]),
                         (lib.cuModuleGetFunction, [out, ptr, ctypes.c_char_p]),
                         (lib.cuFuncGetAttribute, [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ptr]),
                         (lib.cuFuncSetAttribute, [ptr, ctypes.c_int, ctypes.c_int]),
                         (lib.cuLaunchKernel, [ptr] + [ctypes.c_uint] * 7 + [ptr] * 3),
                         (lib.cuGraphCreate, [out, ctypes.c_uint]),
                         (self.add_kernel_node, [out, ptr, out, ctypes.c_size_t, params]),
                         (lib.cuGraphInstantiateWithFlags, [out, ptr, ctypes.c_ulonglong]),
                         (self.set_kernel_node, [ptr, ptr, params]), (lib.cuGraphLaunch, [ptr, ptr]),
                         (lib.cuGraphExecDestroy, [ptr]), (lib.cuGraphDestroy, [ptr])]:
            fn.argtypes = args

    def check(self, status: int, what: str):
        if status != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(status, ctypes.byref(text))
            raise RuntimeError(f"CUDA {what} failed: {(text.value or b'error %d' % status).decode()}")

    # ---- contexts ----
    def make_current(self, context: ctypes.c_void_p):
        now = ctypes.c_void_p()
        self.lib.cuCtxGetCurrent(ctypes.byref(now))
        if now.value != context.value:
            self.check(self.lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")

    # ---- modules ----
    def load(self, cubin: bytes, name: str) -> tuple[ctypes.c_void_p, ctypes.c_void_p, int, int, bool]:
        """(module, function, its maximum threads per block, the dynamic local memory its launches pass, whether it
        waits for the grids before it) for kernel `name` of `cubin`, allowed that much dynamic local memory."""
        module, function, most = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode()), "cuModuleGetFunction")
        self.check(self.lib.cuFuncGetAttribute(ctypes.byref(most), CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                               function), "cuFuncGetAttribute")
        shared = dynamic_local_bytes(cubin)
        if shared:
            self.check(self.lib.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared),
                       "cuFuncSetAttribute")
        return module, function, most.value, shared, waits_for_earlier_grids(cubin)

    def unload(self, module: ctypes.c_void_p):
        self.lib.cuModuleUnload(module)


class PackedArgs:
    """A kernel's argument values (8-byte slots, then `maps` tensor maps of MAP_BYTES each: `map_offsets` says where)
    and what hands them to a launch: `extra`, the whole buffer, where it has only slots (8-byte parameters one after
    another: the kernel's own layout), else `params`, a pointer to each value, which the driver places at the
    kernel's offsets. (A map parameter is 64-byte aligned in the constant bank, where the parameters start at an
    offset of the arch's, 0x210 on sm_90: after 3 slots it lies 48 bytes in (NVRTC 12.9's cubin), not 64, and the
    kernel's parameters take 304 bytes, not 320; an H100 refused such launches of a buffer laid out at 64:
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES.)"""

    def __init__(self, slots: int, maps: int = 0):
        self.map_offsets = [8 * slots + MAP_BYTES * n for n in range(maps)]
        size = 8 * slots + MAP_BYTES * maps
        self.buffer = (ctypes.c_char * max(size, 8))()
        start = ctypes.addressof(self.buffer)
        self._size = ctypes.c_size_t(size)
        self.extra = self.params = None
        if maps:
            self.params = (ctypes.c_void_p * (slots + maps))(*[start + 8 * k for k in range(slots)],
                                                              *[start + at for at in self.map_offsets])
        else:
            self.extra = (ctypes.c_void_p * 5)(_BUFFER_POINTER, start, _BUFFER_SIZE, ctypes.addressof(self._size), _END)

    def addresses(self) -> tuple[int | None, int | None]:
        """(kernelParams, extra) of a launch or a graph node: one of them is None."""
        return tuple(None if a is None else ctypes.addressof(a) for a in (self.params, self.extra))


class Graph:
    """A CUDA graph of kernel nodes run one after another, instantiated once; replays update only the nodes
    whose launch changed (its `version`: grid or arguments) since the node was last set. With `programmatic`, a node
    whose kernel waits for the grids before it (its program's `waits`) follows the one before by a programmatic edge:
    released once every block of that one has started (its griddepcontrol.launch_dependents), it waits on the device
    for that grid to complete; `programmatic_edges` counts them."""

    def __init__(self, driver: Driver, launches: list, programmatic: bool = False):
        self.driver, lib = driver, driver.lib
        self.graph, self.exec = ctypes.c_void_p(), ctypes.c_void_p()
        driver.check(lib.cuGraphCreate(ctypes.byref(self.graph), 0), "cuGraphCreate")
        self.nodes, self.programmatic_edges = [], 0
        self.seen = [launch.version for launch in launches]
        early = programmatic and driver.add_edges is not None
        for launch in launches:
            node = ctypes.c_void_p()
            released = early and bool(self.nodes) and launch.program.waits
            deps = (ctypes.c_void_p * 1)(self.nodes[-1].value) if self.nodes and not released else None
            driver.check(driver.add_kernel_node(ctypes.byref(node), self.graph, deps, 1 if deps else 0,
                                                ctypes.byref(launch.node_params())), "cuGraphAddKernelNode")
            if released:
                edge = EdgeData(from_port=_PORT_PROGRAMMATIC, type=_DEPENDENCY_PROGRAMMATIC)
                driver.check(driver.add_edges(self.graph, ctypes.byref(self.nodes[-1]), ctypes.byref(node),
                                              ctypes.byref(edge), 1), "cuGraphAddDependencies_v2")
                self.programmatic_edges += 1
            self.nodes.append(node)
        driver.check(lib.cuGraphInstantiateWithFlags(ctypes.byref(self.exec), self.graph, 0),
                     "cuGraphInstantiateWithFlags")

    def launch(self, launches: list, stream: ctypes.c_void_p) -> int:
        """Update the nodes whose launch changed, launch the graph on `stream`; returns how many were updated."""
        updated, seen = 0, self.seen
        versions = [launch.version for launch in launches]
        if versions != seen:
            for k, launch in enumerate(launches):
                if versions[k] != seen[k]:
                    self.driver.check(self.driver.set_kernel_node(self.exec, self.nodes[k],
                                                                  ctypes.byref(launch.node_params())),
                                      "cuGraphExecKernelNodeSetParams")
                    seen[k] = versions[k]
                    updated += 1
        self.driver.check(self.driver.lib.cuGraphLaunch(self.exec, stream), "cuGraphLaunch")
        return updated

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter exit the driver may be gone already
            if self.exec:
                self.driver.lib.cuGraphExecDestroy(self.exec)
            if self.graph:
                self.driver.lib.cuGraphDestroy(self.graph)
