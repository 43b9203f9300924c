"""What the cuda device reads from a cubin itself (an ELF64 file, little-endian), values of its module's symbols
(codegen/render_cuda.py defines them): the dynamic local memory a kernel declares, `pj_dynamic_local_bytes`
(DYNAMIC_LOCAL), which the launch must pass and allow (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), and whether
it waits for the grids launched before it (`pj_waits_for_earlier_grids`, GRID_DEPENDENCY_MARK), which lets a CUDA
graph launch it early. Read from the file rather than from the loaded module: no device memory copy at load, and
testable wherever NVRTC compiles."""
from __future__ import annotations

import struct

DYNAMIC_LOCAL_SYMBOL = b"pj_dynamic_local_bytes"
GRID_WAIT_SYMBOL = b"pj_waits_for_earlier_grids"
_SECTION = struct.Struct("<IIQQQQIIQQ")   # Elf64_Shdr: name, type, flags, address, offset, size, link, info, align,
                                          # entry size
_SYMBOL = struct.Struct("<IBBHQQ")        # Elf64_Sym: name, info, other, section index, value, size
_SYMTAB = 2                               # SHT_SYMTAB


def dynamic_local_bytes(cubin: bytes) -> int:
    """The bytes of dynamic local memory the cubin's kernel declares (0 where it declares none)."""
    return _symbol_value(cubin, DYNAMIC_LOCAL_SYMBOL) or 0


def waits_for_earlier_grids(cubin: bytes) -> bool:
    """Whether the cubin's kernel waits for the grids launched before it before it accesses global memory."""
    return bool(_symbol_value(cubin, GRID_WAIT_SYMBOL))


def _symbol_value(cubin: bytes, symbol: bytes) -> int | None:
    """The 32-bit value of the cubin's symbol `symbol`, or None where it has none."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [_SECTION.unpack_from(cubin, shoff + i * shentsize) for i in range(shnum)]
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SYMTAB:
            continue
        names = sections[link][4]
        for at in range(offset, offset + size, entsize):
            name, _, _, section, value, _ = _SYMBOL.unpack_from(cubin, at)
            start = names + name
            if cubin[start:cubin.index(b"\0", start)] == symbol:
                return struct.unpack_from("<I", cubin, sections[section][4] + value)[0]
    return None
