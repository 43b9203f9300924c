"""A cuda device whose driver is a recording fake (no GPU, pycuda or libcuda needed): the real launchers, queue,
graph cache and Graph run on it, and the fake records what reached the driver."""
import collections
import ctypes
import threading

from prepjit.runtime import cuda, cuda_driver
from prepjit.runtime.device_base import DeviceBase


class FakeDriver(cuda_driver.Driver):
    """Records launches (kernel, grid, argument bytes), graph launches and node updates (node index, grid, bytes);
    the launchers' argument bytes are read through the pointers the calls pass, as the driver reads them (where a
    launch passes a pointer to each parameter instead, kernelParams, what is recorded is that array's address:
    the fake does not know the kernel's parameters, the test reads them with `params_of`)."""

    def __init__(self):
        self.calls = []
        self.lib = self
        self.node_count = 0
        self.edges = []   # (from node, to node, "completion" or "programmatic") of every graph built

    def _node(self, out_node, graph, deps, n_deps, params):
        self.node_count += 1
        ctypes.cast(out_node, ctypes.POINTER(ctypes.c_void_p))[0] = self.node_count
        if n_deps:
            self.edges.append((deps[0], self.node_count, "completion"))
        return 0

    def add_edges(self, graph, from_node, to_node, edge, n):
        data = ctypes.cast(edge, ctypes.POINTER(cuda_driver.EdgeData))[0]
        kind = "programmatic" if (data.from_port, data.type) == (1, 1) else (data.from_port, data.type)
        self.edges.append((ctypes.cast(from_node, ctypes.POINTER(ctypes.c_void_p))[0],
                           ctypes.cast(to_node, ctypes.POINTER(ctypes.c_void_p))[0], kind))
        return 0

    def add_kernel_node(self, out_node, graph, deps, n_deps, params):
        return self._node(out_node, graph, deps, n_deps, params)

    def set_kernel_node(self, exec_, node, params):
        p = ctypes.cast(params, ctypes.POINTER(cuda_driver.KernelNodeParams))[0]
        self.calls.append(("update", node.value, p.grid[0], _args_of(p.extra) if p.extra else p.kernel_params))
        return 0

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.calls.append(("launch", function.value, gx,
                           _args_of(ctypes.addressof(extra)) if extra is not None else ctypes.addressof(params)))
        return 0

    def cuGraphLaunch(self, exec_, stream):
        self.calls.append(("graph",))
        return 0

    def __getattr__(self, name):   # cuGraphCreate, cuGraphInstantiateWithFlags, cuGraphExecDestroy, ...
        return lambda *args: 0

    def make_current(self, context):
        pass


def _args_of(extra_address: int) -> bytes:
    """The argument bytes a launch's `extra` array (PackedArgs.extra) points at."""
    extra = (ctypes.c_void_p * 5).from_address(extra_address)
    size = ctypes.c_size_t.from_address(extra[3]).value
    return ctypes.string_at(extra[1], size)


def params_of(params_address: int, sizes: list[int]) -> list[bytes]:
    """The parameters a launch's kernelParams array (PackedArgs.params) points at, of `sizes` bytes each."""
    pointers = (ctypes.c_void_p * len(sizes)).from_address(params_address)
    return [ctypes.string_at(pointer, size) for pointer, size in zip(pointers, sizes)]


class FakeProgram:
    def __init__(self, function: int, block: int = 4, waits: bool = False):
        self.function, self.block, self.shared, self.waits = ctypes.c_void_p(function), block, 0, waits


class FakeStream:
    def synchronize(self):
        pass


def stub_device(use_graphs: bool = True, programmatic: bool = True) -> cuda.CUDADevice:
    device = object.__new__(cuda.CUDADevice)
    DeviceBase.__init__(device)
    device.driver, device._handle = FakeDriver(), ctypes.c_void_p(7)
    device.use_graphs, device._pending, device._graphs = use_graphs, [], collections.OrderedDict()
    device.programmatic = programmatic
    device._queue_lock, device._stream, device.stream = threading.Lock(), None, FakeStream()
    device.stats = {"graphs_built": 0, "graph_replays": 0, "node_updates": 0, "stream_launches": 0,
                    "programmatic_edges": 0}
    return device


def launcher(device, function: int, buffers: list, vals=(), size_fn=None, static_size=None, waits: bool = False):
    """A CUDALauncher of a fake kernel `function` (block 4) over buffer addresses `buffers` and int64 `vals`; with
    `size_fn` (vals -> (size,)) its grid follows its vals, else it is static_size's; `waits`: its kernel waits for
    the grids before it."""
    launch = cuda.CUDALauncher(device, FakeProgram(function, waits=waits), buffers, vals, size_fn, static_size)
    launch.var_slots, launch.loop_slots = [], []
    return launch
