"""Tensor map arguments of the cuda device's kernels (codegen/tensor_maps.py: the maps a Hopper tile of bulk tensor
copies reads its operands through): each map is encoded on the host by the driver (cuTensorMapEncodeTiled) from its
buffer's address and its offset, dims and strides evaluated at the launch's var values, and written into the
kernel's packed arguments (a 128-byte slot after the vars, handed to the launch by pointer: cuda_driver.PackedArgs).

A launcher re-encodes its maps whenever a buffer address or a var changes (`TensorMapArgs.refresh`; a CUDA graph's
node of it is then updated as for any argument change). Encodings are kept per (map, address, values): a replay
that alternates between a few buffers encodes each once. A map that cannot be encoded there (TensorMap.usable: an
unaligned view, a stride not a multiple of 16 bytes) is left zero, and the kernel, testing the same, copies that
operand chunk by chunk.
"""
from __future__ import annotations

import ctypes

from ..uop import dtypes

MAP_BYTES = 128           # a CUtensorMap
MAP_TYPES = {dtypes.bfloat16: 9, dtypes.float16: 6, dtypes.float32: 7}   # CU_TENSOR_MAP_DATA_TYPE_*

SWIZZLE_128B = 3          # CU_TENSOR_MAP_SWIZZLE_128B: the local tiles' 128-byte rows (render_fragments.Staged.chunk)
L2_PROMOTION_256B = 3     # CU_TENSOR_MAP_L2_PROMOTION_L2_256B
INTERLEAVE_NONE = OOB_FILL_ZEROS = 0
CACHE_SIZE = 4096         # encodings kept (each 128 bytes)
ZERO = bytes(MAP_BYTES)


class TensorMapEncoder:
    """cuTensorMapEncodeTiled through ctypes on libcuda (the driver's `lib`), with its encodings cached."""

    def __init__(self, lib):
        self.encode_tiled = fn = lib.cuTensorMapEncodeTiled
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                       ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.cache: dict = {}
        self._out = (ctypes.c_uint64 * (MAP_BYTES // 8 + 8))()   # (room to align it to 64 bytes)

    def encode(self, m, address: int, values: tuple) -> bytes:
        """Map `m`'s 128 bytes (a codegen/tensor_maps.TensorMap, handed over by the planner) at buffer `address` and
        its evaluated `values` (m.values()), or zeros where it is not usable there (m.usable)."""
        key = (m, address, values)
        found = self.cache.get(key)
        if found is not None:
            return found
        if not m.usable(address, values):
            return ZERO
        rank, size = len(m.dims), m.dtype.itemsize
        offset, dims, strides = values[0], values[1:1 + rank], values[1 + rank:]
        out = ctypes.addressof(self._out) + (-ctypes.addressof(self._out)) % 64
        status = self.encode_tiled(
            out, MAP_TYPES[m.dtype], rank, address + offset * size, (ctypes.c_uint64 * rank)(*dims),
            (ctypes.c_uint64 * max(1, rank - 1))(*(s * size for s in strides)),
            (ctypes.c_uint32 * rank)(*m.box, *[1] * (rank - len(m.box))), (ctypes.c_uint32 * rank)(*[1] * rank),
            INTERLEAVE_NONE, SWIZZLE_128B, L2_PROMOTION_256B, OOB_FILL_ZEROS)
        if status != 0:   # (usable holds: the driver refusing it is a bug here, not a fallback)
            raise RuntimeError(f"CUDA cuTensorMapEncodeTiled failed ({status}) for {m.name} at {address:#x}, "
                               f"offset {offset}, dims {dims}, strides {strides}, box {m.box}")
        found = ctypes.string_at(out, MAP_BYTES)
        if len(self.cache) >= CACHE_SIZE:
            self.cache.clear()
        self.cache[key] = found
        return found


class TensorMapArgs:
    """A launcher's tensor maps: `maps` (codegen/tensor_maps.py's, in parameter order), `values_fn` (positional var
    values -> every map's TensorMap.values, flattened in order), written at `offsets` of the packed arguments."""

    def __init__(self, encoder: TensorMapEncoder, maps: tuple, values_fn, offsets: list[int]):
        self.encoder, self.maps, self.values_fn, self.offsets = encoder, maps, values_fn, offsets
        self.counts = [len(m.values()) for m in maps]

    def refresh(self, buffer: ctypes.Array, addresses, vals) -> bool:
        """Encode every map at the buffers' `addresses` (slot -> address) and var values `vals` into `buffer` (the
        packed arguments); whether any changed."""
        flat, start, changed = self.values_fn(vals), 0, False
        for m, count, at in zip(self.maps, self.counts, self.offsets):
            encoded = self.encoder.encode(m, addresses(m.buffer), tuple(flat[start:start + count]))
            start += count
            if buffer[at:at + MAP_BYTES] != encoded:
                ctypes.memmove(ctypes.addressof(buffer) + at, encoded, MAP_BYTES)
                changed = True
        return changed
