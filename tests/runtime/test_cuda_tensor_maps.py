"""Tensor map arguments of the cuda device (runtime/cuda_tensor_maps.py) on the recording fake driver: the maps sit
after the vars, are encoded from the buffer's address and the vars' values, re-encoded when a buffer is rebound or
a var changes (a graph's node updated with them), zero where a map is not usable; a launch of a kernel with maps
hands the driver a pointer to each parameter (the driver places a map at the kernel's 64-byte aligned offset)."""
import ctypes
import struct

from prepjit.codegen.gpu_launch import launch
from prepjit.codegen.optimize import Blocking
from prepjit.codegen.render_cuda import CUDA_HOPPER
from prepjit.codegen.tensor_maps import tensor_maps
from prepjit.jit.planner import tensor_map_args
from prepjit.runtime import cuda, cuda_driver
from prepjit.runtime.cuda_tensor_maps import MAP_BYTES, TensorMapEncoder
from prepjit.uop import Ops, UOp, dtypes

from .cuda_stub import FakeProgram, params_of, stub_device
from .cuda_stub import launcher as stub_launcher
from ..codegen.test_render_fragments import kernel, load, loop


class FakeEncoder:
    """cuTensorMapEncodeTiled: writes (address, dims..., strides in bytes..., box...) as uint64s into the map."""

    def __init__(self):
        self.calls = 0

    def __call__(self, out, dtype, rank, address, dims, strides, box, element_strides, *modes):
        self.calls += 1
        words = [address, *dims[:rank], *strides[:rank - 1], *box[:rank]]
        ctypes.memmove(out, struct.pack(f"<{len(words)}Q", *words), 8 * len(words))
        return 0


def var_m_kernel():
    """out = a @ b (bfloat16 widened), a (m, 1024) with a var m, b (1024, 4096)."""
    m = UOp.variable("m", 1, 8192)
    i, j = loop(m, 1), loop(UOp.const(4096), 2)
    r = UOp(Ops.RANGE, dtypes.index, (UOp.const(1024),), (3, "reduce"))
    a = load(1, dtypes.bfloat16, i * 1024 + r).cast(dtypes.float32)
    b = load(2, dtypes.bfloat16, r * 4096 + j).cast(dtypes.float32)
    return kernel(UOp(Ops.REDUCE, dtypes.float32, (a * b, r), Ops.ADD), i * 4096 + j, "r_m_n")


def test_maps_are_encoded_per_address_and_var_and_patched_into_graph_nodes():
    device = stub_device()
    encoder = device.tensor_map_encoder = TensorMapEncoder.__new__(TensorMapEncoder)
    encoder.encode_tiled, encoder.cache = FakeEncoder(), {}
    encoder._out = (ctypes.c_uint64 * (MAP_BYTES // 8 + 8))()
    maps = tensor_maps(launch(var_m_kernel(), CUDA_HOPPER, Blocking()))
    assert [m.name for m in maps] == ["A", "B"]
    launcher = cuda.CUDALauncher(device, FakeProgram(1), [0x10000, 0x20000, 0x30000], [1000], None, 64,
                                 tensor_map_args(maps, ("m",)))
    launcher.var_slots, launcher.loop_slots = [], []
    args = launcher.args
    assert args.map_offsets == [32, 160]

    def words(n):   # map n's first words
        return struct.unpack_from("<5Q", args.buffer, args.map_offsets[n])
    assert words(0) == (0x20000, 1024, 1000, 2048, 64)         # a: address, dims (k, m), row stride, box (64, 128)
    assert words(1) == (0x30000, 4096, 1024, 8192, 64)         # b: dims (n, k), stride, box (64, 64)
    launcher.set_val(0, 4100)
    assert words(0)[:3] == (0x20000, 1024, 4100)
    launcher.buffer_ptrs[2] = 0x50000
    assert words(1)[0] == 0x50000
    launcher.buffer_ptrs[1] = 0x60002                          # an unaligned view: no map (the kernel copies chunks)
    assert bytes(args.buffer[32:160]) == bytes(MAP_BYTES)
    before = encoder.encode_tiled.calls
    launcher.buffer_ptrs[1] = 0x20000
    launcher.set_val(0, 1000)
    assert encoder.encode_tiled.calls == before                # (encodings seen before are cached)
    # a launch, and a graph's node of it, get a pointer to each parameter: 3 buffers, m, the maps
    sizes = [8] * 4 + [MAP_BYTES] * 2
    other = stub_launcher(device, 2, [0x10000], static_size=64)
    for m in (1000, 1000, 4100):
        launcher.set_val(0, m)
        device.run_all((launcher, other))
        device.flush()
    first, update = device.driver.calls[0], [c for c in device.driver.calls if c[0] == "update"][-1]
    assert first[:2] == ("launch", 1) and first[3] == update[3] == ctypes.addressof(args.params)
    values = params_of(update[3], sizes)
    assert values[:4] == [struct.pack("<Q", a) for a in (0x10000, 0x20000, 0x50000)] + [struct.pack("<q", 4100)]
    assert struct.unpack_from("<3Q", values[4])[2] == 4100 and values[5] == bytes(args.buffer[160:288])


def test_packed_args_without_maps_are_one_buffer_and_with_maps_one_pointer_a_parameter():
    plain = cuda_driver.PackedArgs(3)
    assert plain._size.value == 24 and plain.params is None and plain.addresses()[0] is None
    with_maps = cuda_driver.PackedArgs(3, 1)
    assert with_maps.extra is None and with_maps.map_offsets == [24]
    start = ctypes.addressof(with_maps.buffer)
    assert list(with_maps.params) == [start, start + 8, start + 16, start + 24]
