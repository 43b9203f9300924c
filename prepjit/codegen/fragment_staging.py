"""How a tensor-core tile's operand is staged in local memory (`Staged`, made by render_fragments._staged): its local
tile's geometry (blocks, rows, row length; 16-byte chunks), the swizzled place of a chunk, an element's place, and the
matrix descriptors the warpgroup instructions read it through (render_fragments.py's docstring: the layouts)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ..uop import UOp

if TYPE_CHECKING:
    from .render_fragments import Kind

CHUNK_BYTES = 16                # one asynchronous copy
SWIZZLES = {128: 1, 64: 2, 32: 3}   # a matrix descriptor's swizzle mode for rows of so many bytes


@attrs.frozen
class Staged:
    """How one operand is staged: its local tile `name` (A or B), the ranges it owns, their tile side, the minor axis
    of its local tile, and the plain load of the kind's elements it is (its LOAD node) with the step of its index
    from one slice to the next, where chunks may be copied asynchronously; `depth`: k of a slice (the kind's
    slice_k, or the warp-specialised tiles' 128-byte rows)."""
    kind: Kind
    name: str
    operand: UOp
    own: tuple
    width: int
    minor: str
    direct: UOp | None
    step: UOp | None
    depth: int

    @property
    def block(self) -> int:
        """Elements along the operand's own axis of one block of the tile (all of them where the minor axis is k)."""
        return self.width if self.minor == "k" else min(self.width, self.kind.own_block)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(blocks, rows, row length in elements) of one stage of the local tile."""
        if self.minor == "k":
            return 1, self.width, self.depth
        return self.width // self.block, self.depth, self.block

    @property
    def chunks(self) -> int:
        blocks, rows, length = self.shape
        return blocks * rows * length // self.kind.chunk

    def chunk(self, row: str, minor: str) -> str:
        """The stored position of the chunk starting at element `minor` (a multiple of a chunk) of tile row `row`: its
        chunk index xor the row's 3 bits (rows of 8 or more chunks), or of the row pair's 2 (rows of 4 chunks, two
        rows a 128-byte line): the 128- and 64-byte swizzles of the matrix descriptors, tiles 1024-byte aligned. An
        own-minor tile of 32-bit values (read a register a load: four rows t at eight neighbouring elements g, two
        chunks) takes its rows' 2 low bits as chunk bits 1-2 instead, so those 32 reads hit 32 distinct banks."""
        per_row, chunk = self.shape[2] // self.kind.chunk, self.kind.chunk
        if per_row >= 8:
            salt = f"({row}) % 4 * 2" if self.plain_loads else f"({row}) % 8"
        else:
            salt = f"({row}) / 2 % 4"
        return f"(({minor}) / {chunk} ^ {salt}) * {chunk}"

    def cell(self, stage: str, own: str, k: str) -> str:
        """The element of the stage at (own, k), `k` (k-minor) or `own` (own-minor) a multiple of a chunk."""
        if self.minor == "k":
            return f"{self.name}s[{stage}][0][{own}][{self.chunk(own, k)}]"
        return (f"{self.name}s[{stage}][({own}) / {self.block}][{k}]"
                f"[{self.chunk(k, f'({own}) % {self.block}')}]")

    @property
    def plain_loads(self) -> bool:
        """Whether its fragments are read a register a load: an own-minor tile of 32-bit values."""
        return self.minor == "own" and not self.kind.transposes

    def element(self, stage: str, own: str, k: str) -> str:
        """The element of the stage at any (own, k): in its chunk, at its offset from the chunk's start."""
        chunk = self.kind.chunk
        if self.minor == "k":
            return f"{self.name}s[{stage}][0][{own}][{self.chunk(own, k)} + ({k}) % {chunk}]"
        return (f"{self.name}s[{stage}][({own}) / {self.block}][{k}]"
                f"[{self.chunk(k, f'({own}) % {self.block}')} + ({own}) % {chunk}]")

    def descriptor(self, own: str, stage: str = "0", step: int = 0) -> str:
        """The matrix descriptor of the 16-deep step `step` of the stage's rows or columns from `own` (a multiple of
        GROUP_M for A): k-minor tiles are 8-row groups SBO bytes apart, the step's k 32 bytes into a row; own-minor
        ones blocks LBO bytes apart along their own axis, 8-row groups along k SBO bytes apart."""
        blocks, rows, length = self.shape
        row_bytes, depth = self.kind.bytes * length, self.kind.frag_k
        if self.minor == "k":
            first, lbo = f"&{self.name}s[{stage}][0][{own}][{step * depth}]", 16
        else:
            first, lbo = f"&{self.name}s[{stage}][({own}) / {self.block}][{step * depth}][0]", rows * row_bytes
        return f"pj_wgmma_desc({first}, {lbo}, {8 * row_bytes}, {SWIZZLES[row_bytes]})"

    def descriptor_offset(self, stage: str, step: int) -> str:
        """What the descriptor of stage `stage`'s step `step` adds to stage 0's first step's (`descriptor`): their start
        addresses' distance in 16-byte units (a stage further; the step's k 32 bytes into a k-minor row, 16 rows
        further in an own-minor block), which stays inside the descriptor's 14-bit address field (local memory is
        under 256 KB)."""
        row_bytes = self.kind.bytes * self.shape[2]
        step_bytes = step * self.kind.frag_k * (self.kind.bytes if self.minor == "k" else row_bytes)
        return f"({stage} * {CHUNK_BYTES * self.chunks // 16} + {step_bytes // 16})"
