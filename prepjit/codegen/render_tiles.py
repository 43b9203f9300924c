"""Tiled contractions for the C-style renderers: a kernel whose value is sum_k a(i, k) * b(k, j) (a matmul, batched
or not, with any elementwise work on the operands and on the result) becomes a work-group of TILE_THREADS
work-items per TILE x TILE block of outputs. The group stages TILE_K-deep slices of both operands in local
memory, and each work-item accumulates a REG x REG block of outputs in registers (rows and columns
TILE / REG apart, so neighbouring work-items read and write neighbouring memory).

The rows (i) and columns (j) may each be several ranges (x @ w with x of shape (B, T, C): the rows are B x T),
flattened row-major. `match_contraction` finds the pattern; `emit_contraction` writes the kernel body through
the renderer, which renders the operand and result expressions with the ranges bound to the tile's indices.
"""
from __future__ import annotations

import math

import attrs

from ..uop import Ops, UOp, dtypes, sym_prod
from ..uop.uop import as_uop

TILE, TILE_K, REG = 128, 16, 8
TILE_THREADS = (TILE // REG) ** 2
SIDE = TILE // REG                # work-items along each side of the tile


@attrs.frozen
class Contraction:
    reduce: UOp          # the REDUCE(ADD) of a * b over one range k
    a: UOp               # depends on the row ranges i and k, not on the column ranges j
    b: UOp               # depends on j and k, not on i
    i: tuple             # the row ranges (flattened, the last fastest)
    j: tuple             # the column ranges
    k: UOp
    batch: tuple         # the other loop ranges (one work-group covers a single value of each)


def _ranges(u: UOp) -> set:
    return {x for x in u.toposort() if x.op is Ops.RANGE}


def match_contraction(ast: UOp) -> Contraction | None:
    """The contraction this kernel computes, or None (float32 only, one reduce range, row and column ranges, and
    the rows and the columns each at least half a tile and k a slice deep at the vars' maxima: thinner ones stay
    reductions)."""
    store = ast.src[0]
    reduces = [u for u in store.toposort() if u.op is Ops.REDUCE]
    if store.op is not Ops.STORE or len(reduces) != 1:
        return None
    red = reduces[0]
    if red.arg is not Ops.ADD or len(red.src) != 2 or red.dtype != dtypes.float32 or red.src[0].op is not Ops.MUL:
        return None
    k = red.src[1]
    loops = sorted((r for r in _ranges(store) if r.arg[1] == "loop"), key=lambda r: r.arg[0])
    for a, b in (red.src[0].src, reversed(red.src[0].src)):
        ra, rb = _ranges(a), _ranges(b)
        only_a = [r for r in loops if r in ra and r not in rb]
        only_b = [r for r in loops if r in rb and r not in ra]
        if a.dtype == b.dtype == dtypes.float32 and k in ra and k in rb and only_a and only_b \
                and not any(x.op is Ops.REDUCE for x in a.toposort() + b.toposort()):
            if min(math.prod(r.src[0].vmax for r in only_a), math.prod(r.src[0].vmax for r in only_b)) < TILE // 2 \
                    or k.src[0].vmax < TILE_K:
                return None
            return Contraction(red, a, b, tuple(only_a), tuple(only_b), k,
                               tuple(r for r in loops if r not in only_a and r not in only_b))
    return None


def _extent(ranges: tuple) -> UOp:
    return as_uop(sym_prod(r.src[0] for r in ranges))


def launch_size(c: Contraction) -> UOp:
    blocks = as_uop(sym_prod([r.src[0] for r in c.batch] + [(_extent(c.i) + (TILE - 1)) // TILE,
                                                            (_extent(c.j) + (TILE - 1)) // TILE]))
    return blocks * TILE_THREADS


def emit_contraction(r, c: Contraction):
    """The kernel body, emitted through the C-style renderer `r` (its dialect spells ids, locals, barriers)."""
    d, long, acc_t, fma = r.d, r.long, r.d.ctype(dtypes.float32), r.d.math("fma", dtypes.float32)
    m, n, kk_end = r.value(_extent(c.i)), r.value(_extent(c.j)), r.value(c.k.src[0])
    r.locals.append(d.local_array.format(type=acc_t, name="As", n=TILE_K) + f"[{TILE + 1}];")  # +1: no bank conflicts
    r.locals.append(d.local_array.format(type=acc_t, name="Bs", n=TILE_K) + f"[{TILE}];")
    r.emit(f"const int lid = {d.local_id};")
    r.emit(f"const int tx = lid % {SIDE}, ty = lid / {SIDE};")
    r.emit(f"const {long} bid = {d.group_id};")
    r.emit(f"const {long} nbn = ({n} + {TILE - 1}) / {TILE}, nbm = ({m} + {TILE - 1}) / {TILE};")
    r.emit(f"const {long} i0 = (bid / nbn) % nbm * {TILE}, j0 = bid % nbn * {TILE};")
    if c.batch:
        r.scopes[-1].update(r.unflatten(f"(bid / (nbn * nbm))", list(c.batch)))
    accs = [[f"acc{x}_{y}" for y in range(REG)] for x in range(REG)]
    for row in accs:
        r.emit(" ".join(f"{acc_t} {a} = 0.0f;" for a in row))
    r.open_block(f"for ({long} k0 = 0; k0 < {kk_end}; k0 += {TILE_K})", {})
    for name, operand in (("As", c.a), ("Bs", c.b)):
        # As[k][i] = a(i0 + i, k0 + k); Bs[k][j] = b(k0 + k, j0 + j); k varies fastest for a, j for b (coalesced)
        r.open_block(f"for (int l = lid; l < {TILE_K * TILE}; l += {TILE_THREADS})", {})
        if name == "As":
            r.emit(f"const int lk = l % {TILE_K}, li = l / {TILE_K};")
            r.emit(f"const {long} gk = k0 + lk, gi = i0 + li;")
            cond, bind, slot = f"gk < {kk_end} && gi < {m}", {c.k: "gk", **r.unflatten("gi", list(c.i))}, "As[lk][li]"
        else:
            r.emit(f"const int lj = l % {TILE}, lk = l / {TILE};")
            r.emit(f"const {long} gk = k0 + lk, gj = j0 + lj;")
            cond, bind, slot = f"gk < {kk_end} && gj < {n}", {c.k: "gk", **r.unflatten("gj", list(c.j))}, "Bs[lk][lj]"
        r.emit(f"{acc_t} v = 0.0f;")
        r.open_block(f"if ({cond})", bind)
        r.emit(f"v = {r.value(operand)};")
        r.close_block()
        r.emit(f"{slot} = v;")
        r.close_block()
    r.emit(d.barrier)
    r.emit("#pragma unroll")
    r.open_block(f"for (int kk = 0; kk < {TILE_K}; kk++)", {})
    r.emit(" ".join(f"const {acc_t} a{x} = As[kk][ty + {SIDE * x}];" for x in range(REG)))
    r.emit(" ".join(f"const {acc_t} b{y} = Bs[kk][tx + {SIDE * y}];" for y in range(REG)))
    for x in range(REG):
        r.emit(" ".join(f"{accs[x][y]} = {fma}(a{x}, b{y}, {accs[x][y]});" for y in range(REG)))
    r.close_block()
    r.emit(d.barrier)
    r.close_block()
    store = r.ast.src[0]
    for x in range(REG):
        for y in range(REG):
            r.open_block(f"if (i0 + {SIDE * x} + ty < {m} && j0 + {SIDE * y} + tx < {n})", {})
            r.emit(f"const {long} oi = i0 + {SIDE * x} + ty, oj = j0 + {SIDE * y} + tx;")
            r.scopes[-1].update({**r.unflatten("oi", list(c.i)), **r.unflatten("oj", list(c.j)),
                                 c.reduce: accs[x][y]})
            r.emit(r.store_line(store))
            r.close_block()
