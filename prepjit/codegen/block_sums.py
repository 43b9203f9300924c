"""A GPU matvec over a quantized weight summed a block's run at a time (row_plan.split_matvec_blocks), the block's
scales factored out of each run's sum.

block_split.split_at_blocks makes q4_1's x @ W.T a sum over ranges (kb, kh, kl) of (k / 32, 2, 16) of
x * (d * q + m): a lane's run of 16 weights rebuilt each weight from the block's scale and min (a multiply and an
add besides the product's FMA, with --fmad=false). As sums of runs,

    sum_kb,kh  d * sum_kl x * q  +  m * sum_kl x

each run's sum is a reduction nested in the row's (`block_sums`) over a "lane" range (steps the renderer writes
out as straight-line code, render_c.reduce: NVRTC then merges their loads), one FMA a weight; the row's reduction
is over (kb, kh), a lane taking one (block, half) at a time. m's run sums read no row: the work-group computes them
once (render_rows' shared operands), as it does a normalised row, held element by element for the runs' sums to read
(laid over the run's range first: a warp's lanes read neighbouring words).
A q8_0 block's 32 weights are two runs of 16 (RUN_WEIGHTS), so its lanes take the work of the flat runs before.
The sum is reassociated (and distributed over the scales): it differs from the sequential one by rounding only, as
the cpu's (block_scales.py); every row of a plan sums the same way.
"""
from __future__ import annotations

from ..uop import Ops, UOp, dtypes
from .block_scales import scale_terms
from .block_split import simplified_indices

RUN_WEIGHTS = 16   # weights of a block a run's sum takes, at most (a lane's 16 bytes of q8_0, of q4_1's nibbles)


def block_sums(u: UOp, body: UOp, ranges: list[UOp]) -> UOp | None:
    """The row reduction `u` (a sum) over `body` and `ranges` (split at the weight's blocks, outermost first) as a
    sum over the outer ranges of its runs' sums, the block's scales factored out (see the module docstring), or
    None where no range is outside the runs or some term of the product has no factor constant over a run."""
    *outer, last = ranges
    end = last.src[0].arg
    if body.op is Ops.MUL and body.arg is not None:   # ("tf32" / "bf16" allow tensor cores: a row kernel's is exact)
        body = UOp(Ops.MUL, body.dtype, body.src)
    if not outer or (end > RUN_WEIGHTS and end % RUN_WEIGHTS):
        return None
    axis = max(r.arg[0] for r in body.toposort() if r.op is Ops.RANGE) + 1
    step = UOp(Ops.RANGE, dtypes.index, (UOp.const(min(end, RUN_WEIGHTS)),), (axis + 1, "lane"))
    if end > RUN_WEIGHTS:   # (a q8_0 block: two runs)
        runs = UOp(Ops.RANGE, dtypes.index, (UOp.const(end // RUN_WEIGHTS),), (axis, "reduce"))
        body, outer = simplified_indices(body.substitute({last: runs * RUN_WEIGHTS + step})), [*outer, runs]
    else:
        body = body.substitute({last: step})
    last = step
    terms = scale_terms(body, {last})
    if terms is None:
        return None
    total = None
    for coef, rest in terms:
        term = coef * UOp(Ops.REDUCE, u.dtype, (rest, last), Ops.ADD)
        total = term if total is None else total + term
    return UOp(Ops.REDUCE, u.dtype, (total, *outer), u.arg)

