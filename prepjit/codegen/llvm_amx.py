"""How the LLVM renderer renders a register block of bfloat16 contractions on AMX tiles (amx.py's rule: a sum
whose pair range is of kind "tile"), with LLVM's AMX intrinsics on fixed tile registers. A mixin of
llvm_reductions' ReductionRendering: it reads the renderer's state and emitters.

The block's sums are C tiles (0 and 1: one per 16-lane column vector, a row per block row) that start at zero
(tilezero); each step of TILE_K products copies the block's rows of A (64 bytes each) into a stack tile and
each column vector's 16 pairs of B rows, interleaved, into another (VNNI layout), loads them into tiles 2 and 3,
4 and runs tdpbf16ps per column tile; a B already in VNNI layout (packing.py's panels for tiled contractions) is
loaded into its tile straight from memory. At the end the C tiles are stored to the stack and each sum is its row
there. The tile configuration (palette 1, each tile's rows and bytes a row) is loaded per block: a var or
clamped row block configures fewer rows.
"""
from __future__ import annotations

from ..uop import UOp, simplify
from .amx import TILE_K, TILE_LANES, TILE_ROWS
from .optimize import stride_along

ROW_BYTES = 64            # bytes of a tile row (the most: 16 floats, 32 bfloat16)
TILE_BYTES = TILE_ROWS * ROW_BYTES
C_TILE, A_TILE, B_TILE = 0, 2, 3  # tile registers: C 0-1, A 2, B 3-4
AMX = {"cfg": "void @llvm.x86.ldtilecfg(ptr)", "release": "void @llvm.x86.tilerelease()",
       "zero": "void @llvm.x86.tilezero(i8)", "load": "void @llvm.x86.tileloadd64(i8, ptr, i64)",
       "store": "void @llvm.x86.tilestored64(i8, ptr, i64)", "dot": "void @llvm.x86.tdpbf16ps(i8, i8, i8)"}


def tile_config(rows: int, columns: int) -> str:
    """The 64-byte tile configuration (palette 1) of a block of `rows` rows and `columns` column tiles, as an
    LLVM <64 x i8> constant: bytes 16-47 each tile's bytes a row (i16), 48-63 its rows."""
    config = [0] * 64
    config[0] = 1
    shapes = {C_TILE + c: rows for c in range(columns)} | {A_TILE: rows} | \
        {B_TILE + c: TILE_K // 2 for c in range(columns)}
    for tile, tile_rows in shapes.items():
        config[16 + 2 * tile], config[17 + 2 * tile] = ROW_BYTES & 255, ROW_BYTES >> 8
        config[48 + tile] = tile_rows
    return "<" + ", ".join(f"i8 {b}" for b in config) + ">"


class AMXRendering:
    """The AMX method of render_llvm._Renderer."""

    def tile_sums(self, group: list[UOp]) -> list[str] | None:
        """Per sum of `group` (a block's sums over (k2, p), p of kind "tile"), its 16 float32 lanes computed on
        AMX tiles; None when the block is not rows x column vectors of products of one row and one column
        operand (the caller then renders it with vdpbf16ps)."""
        k2, pair = group[0].src[-2:]
        products = [r.src[0] for r in group]
        rows = list(dict.fromkeys(s for x in products for s in x.src if s not in self.laned))
        columns = list(dict.fromkeys(s for x in products for s in x.src if s in self.laned))
        cells = [(rows.index(a), columns.index(b)) for a, b in
                 (sorted(x.src, key=lambda s: s in self.laned) for x in products)]
        if self.width != TILE_LANES or len(rows) > TILE_ROWS or len(columns) > 2 or len(set(cells)) != len(group):
            return None
        for name in AMX.values():
            self.decls.add(f"declare {name}")
        cfg, a_buf, b_buf, c_buf = (self.tmp(name) for name in ("cfg", "atile", "btile", "ctile"))
        for buf, size in ((cfg, 64), (a_buf, TILE_BYTES), (b_buf, 2 * TILE_BYTES), (c_buf, 2 * TILE_BYTES)):
            self.allocas.append(f"  {buf} = alloca [{size} x i8], align 64")
        self.emit(f"store <64 x i8> {tile_config(len(rows), len(columns))}, ptr {cfg}, align 64")
        self.emit(f"call void @llvm.x86.ldtilecfg(ptr {cfg})")
        for c in range(len(columns)):
            self.emit(f"call void @llvm.x86.tilezero(i8 {C_TILE + c})")
        pairs = k2.src[0].arg
        steps, rest = divmod(pairs, TILE_K // 2)
        packed = [self.vnni_rows(b.src[0], k2, pair) for b in columns]
        buffers = (a_buf, b_buf)
        if steps:
            loop = self.open_loop(None, "0", str(steps))
            self.tile_step(self.op(f"mul i64 {loop[2]}, {TILE_K // 2}"), TILE_K // 2, rows, columns, k2, pair,
                           packed, buffers)
            self.close_loop(loop)
        if rest:  # the last pairs, the tiles' other rows zero (and B interleaved here: the panel ends)
            self.tile_step(str(steps * TILE_K // 2), rest, rows, columns, k2, pair, [None] * len(columns), buffers)
        for c in range(len(columns)):
            self.emit(f"call void @llvm.x86.tilestored64(i8 {C_TILE + c}, ptr {self.at(c_buf, c * TILE_BYTES)}, "
                      f"i64 {ROW_BYTES})")
        self.emit("call void @llvm.x86.tilerelease()")
        return [self.op(f"load <{self.width} x float>, ptr {self.at(c_buf, c * TILE_BYTES + r * ROW_BYTES)}, "
                        f"align 64") for r, c in cells]

    def tile_step(self, base: str, pairs: int, rows: list[UOp], columns: list[UOp], k2: UOp, pair: UOp,
                  packed: list, buffers: tuple[str, str]):
        """One tdpbf16ps per column tile over the `pairs` (at most TILE_K / 2) pairs of k from pair `base`:
        A's rows copied into the A buffer, B's tiles loaded from their panels where `packed` says where, else
        interleaved into the B buffer; past `pairs` both are zero."""
        a_buf, b_buf = buffers
        mask = "<" + ", ".join(f"i1 {int(e < 2 * pairs)}" for e in range(TILE_K)) + ">"
        self.scopes.append({k2: base, pair: "0"})
        for r, a in enumerate(rows):  # A's rows: TILE_K contiguous bfloat16 each (amx.py)
            ld = a.src[0]
            at = self.address(ld.src[0], self.value(ld.src[1]))
            vt = f"<{TILE_K} x i16>"
            bits = self.op(f"load {vt}, ptr {at}, align 2") if pairs == TILE_K // 2 else \
                self.call(f"llvm.masked.load.v{TILE_K}i16.p0", vt,
                          [("ptr", at), ("i32", "2"), (f"<{TILE_K} x i1>", mask), (vt, "zeroinitializer")])
            self.emit(f"store {vt} {bits}, ptr {self.at(a_buf, r * ROW_BYTES)}, align 64")
        self.scopes.pop()
        vt, wide = f"<{self.width} x i16>", f"<{2 * self.width} x i16>"
        lanes = ", ".join(f"i32 {k // 2 + (k % 2) * self.width}" for k in range(2 * self.width))
        for s in range(TILE_K // 2 if None in packed else 0):  # B's pairs of rows, interleaved as vdpbf16ps does
            if s >= pairs:
                for c in range(len(columns)):
                    self.emit(f"store {wide} zeroinitializer, ptr {self.at(b_buf, c * TILE_BYTES + s * ROW_BYTES)}, "
                              f"align 64")
                continue
            step = self.op(f"add i64 {base}, {s}")
            halves = []
            for p in range(2):
                self.scopes.append({k2: step, pair: str(p)})
                halves.append([self.lane_bits(b.src[0]) for b in columns])
                self.scopes.pop()
            for c, (even, odd) in enumerate(zip(*halves)):
                both = self.op(f"shufflevector {vt} {even}, {vt} {odd}, <{2 * self.width} x i32> <{lanes}>")
                self.emit(f"store {wide} {both}, ptr {self.at(b_buf, c * TILE_BYTES + s * ROW_BYTES)}, align 64")
        self.emit(f"call void @llvm.x86.tileloadd64(i8 {A_TILE}, ptr {a_buf}, i64 {ROW_BYTES})")
        for c, b in enumerate(columns):
            if None in packed:
                at, stride = self.at(b_buf, c * TILE_BYTES), ROW_BYTES
            else:  # straight from the packed panel (packing.py's VNNI layout)
                start, stride = packed[c]
                self.scopes.append({k2: base, pair: "0"})
                at = self.address(b.src[0].src[0], self.value(start))
                self.scopes.pop()
            self.emit(f"call void @llvm.x86.tileloadd64(i8 {B_TILE + c}, ptr {at}, i64 {stride})")
            self.emit(f"call void @llvm.x86.tdpbf16ps(i8 {C_TILE + c}, i8 {A_TILE}, i8 {B_TILE + c})")

    def vnni_rows(self, load: UOp, k2: UOp, pair: UOp) -> tuple[UOp, int] | None:
        """(B's index at lane 0, bytes between its pairs of rows) when the ungated bfloat16 `load` already holds
        a tile's rows in VNNI layout (lane l's pair at 2l and 2l + 1, contiguous: packing.py's panels), else None."""
        index = load.src[1]
        if len(load.src) != 2 or stride_along(index, self.lane) != 2 or stride_along(index, pair) != 1:
            return None
        step = stride_along(index, k2)
        return None if step is None else (simplify(index.substitute({self.lane: UOp.const(0)})), 2 * step)

    def at(self, buf: str, offset: int) -> str:
        """The address `offset` bytes into a stack buffer."""
        return self.op(f"getelementptr i8, ptr {buf}, i64 {offset}", "p") if offset else buf
