"""Fusion decisions: which elementwise values to materialise instead of inlining into every reader, and which
scatters to compute where they are read.

Inlining an elementwise value into a kernel that reads it computes the value once for every
iteration of that kernel that reaches it. That is free when each value is computed once (one reader,
no broadcast), and costs recomputation when several kernels read it or one kernel reads each value
many times: a contraction operand is read once per output column, a value broadcast into a
reduction once per broadcast element. Fusion counts those evaluations (each reader's iterations),
and a value is materialised (computed once into a buffer) when the recomputation it saves outweighs
writing it and reading it back, or when inlining it would make kernels grow without bound (a Python
loop chaining reductions recomputes the whole chain in every kernel otherwise).

Which reductions are computed inside the one kernel that reads them is fused_reductions.py's.

A scatter that writes each element at most once at indices the same everywhere (a KV cache's new row at `pos`)
is read as a select by the kernels that read it (`inlined_scatters`): no copy of its target, no kernel of its own.

Which output axes of a kernel the index of each node it reads depends on is read_axes.py's.
"""
from __future__ import annotations

import functools
from collections import Counter

from ..uop import Ops, UOp
from ..uop.ops import ELEMENTWISE, MOVEMENT
from .fusion_classes import local_classes
from .lower import REALIZED
from .read_axes import UNKNOWN, per_row, read_axes, reads_with_axes, uniform, walk_order

MEMORY_COST = 6        # ops-equivalent of writing an element and reading it back once
LAUNCH_COST = 2000     # ops-equivalent of one more kernel launch
MAX_INLINE_COST = 256  # a value this costly is materialised whenever two kernels, or two places, read it
MAX_KERNEL_COST = 4096  # and one this costly always: LLVM's time grows faster than linearly in a kernel's size
ROW_VALUE_COST = 8     # a kept-dims value of reductions this cheap is recomputed where it is read
STREAM_INLINE_COST = 16  # a value unpacked from integer data this cheap is recomputed by a streaming reader,
STREAM_REUSE = 4         # one that uses each element it loads at most this many times (4-bit weights: twice)
GROUP_RECOMPUTE_MAX = 1 << 24  # and, on a GPU, one a projection's work-groups evaluate at most this much in all (its
# ops x _group_evaluations; more costs more than a launch: a 1B-sized decode's down projection, 2048 x 8192, 55 us)
CONTRACTION_INLINE_COST = 64  # and one this cheap by a sum of products (q4_k's weight: 48; q8_0's 11)
STREAM_OPERAND_COST = 24  # a float value this cheap is recomputed by the streaming kernels that read it
OPERAND_MAX = 1 << 15  # a value that streaming kernels of several rows recompute holds at most this many elements
# in all (a decode batch's normalised rows, its SiLU(gate) * up): the cpu computes it into an array of its own once per
# call (operand_prologue.py), and a larger one (a prefill's rows) is materialised
STORE_ROWS_REDUCED_ACROSS = True   # _reduced_along_its_rows (False: as before, a knob for timing; the same bits)
OP_COST = {Ops.EXP: 4, Ops.EXP2: 4, Ops.LOG: 8, Ops.LOG2: 8, Ops.SQRT: 2, Ops.FDIV: 2, Ops.IDIV: 8, Ops.MOD: 8,
           Ops.SIN: 16, Ops.COS: 16, Ops.TANH: 24, Ops.ERF: 24, Ops.POW: 24, Ops.ATAN2: 32}  # ops-equivalents; others cost 1


def _elements(node: UOp) -> int:
    size = 1
    for d in node.shape:
        size *= d if isinstance(d, int) else max(0, d.vmax)
    return max(size, 1)


def _iterations(root: UOp) -> int:
    """Iterations of the kernel computing `root`: its elements, times the reduced ones for a reduction."""
    return _elements(root.src[0] if root.op is Ops.REDUCE_AXIS else root)


def kernel_roots(outputs: list[UOp]) -> tuple[list[UOp], list[UOp]]:
    """(all graph nodes parents-first, the nodes some kernel computes: outputs, reductions, loop results)."""
    if not outputs:
        return [], []
    roots = list(outputs)
    graph = UOp(Ops.SINK, outputs[0].dtype, tuple(outputs)).toposort()
    for node in graph:
        if node.op is Ops.LOOP:
            roots += list(node.src) + list(node.arg.body_roots)
    if len(roots) > len(outputs):  # loops: their bodies' nodes too
        graph = UOp(Ops.SINK, outputs[0].dtype, tuple(roots)).toposort()
    graph = graph[::-1]
    roots += [n for n in graph if n.op in (Ops.REDUCE_AXIS, Ops.SCATTER)]
    return graph, roots


def choose_materialized(outputs: list[UOp], row_values: bool = False, walk: tuple | None = None,
                        operand_prologues: bool = False, in_contractions: frozenset = frozenset()) -> set[UOp]:
    """The elementwise values to compute once into a buffer; with `row_values` (kernels that give each row a
    work-group: the C-style renderers), never a cheap kept-dims value of reductions (a row's mean or scale),
    which is recomputed where it is read, so its reductions fuse into the readers (layernorm: one kernel); with
    `operand_prologues` (kernels that compute a contraction's computed operand once per call: the cpu's,
    operand_prologue.py), a kernel of several rows recomputes such an operand as a kernel of one row does.
    `in_contractions`: the nodes of softmaxes computed inside their contraction's kernel (softmax_contraction.py),
    never chosen. `walk` is kernel_roots(outputs) where the caller has it (schedule: one walk of the graph for every
    pass).

    The values that several kernels read and that add a reduction's result (a residual stream: each block's
    projection added to it) are decided first as cut (`_guessed_cuts`): what reads them sees a buffer, so a
    block's decisions see that block only (not every block below it through the uncut stream). The guess stands if
    the decisions then materialise every guessed value (a fixed point); else the decisions are made again without
    it. With the guess, a node's decision is kept by its local class (fusion_classes.py), its cost and its readers'
    classes: each of a model's identical blocks is decided once."""
    graph, roots = walk or kernel_roots(outputs)
    readers_of = Counter(s for node in graph for s in set(node.src))
    decide = functools.partial(_decide, graph, set(roots), in_contractions, readers_of, row_values, operand_prologues)
    guessed = _guessed_cuts(graph, set(roots) | in_contractions, readers_of)
    chosen = decide(guessed) if guessed else None
    return decide(frozenset()) if chosen is None else chosen


def _guessed_cuts(graph: list[UOp], never_chosen: set, readers_of: Counter) -> frozenset:
    """The elementwise values read by several nodes that combine a reduction's result (through views and casts) with
    a value several nodes read: a residual stream's values (each block's projection added to the stream value below,
    which that block's norm reads too), which choose_materialized guesses materialised; not a bias added to a
    projection, which its activation reads twice. A 16-bit value counts the readers of its float32 copy (a bfloat16
    model's last stream value, which only the final norm's widening reads)."""
    def of_reduction(s):
        while s.op in MOVEMENT or s.op is Ops.CAST:
            s = s.src[0]
        return s.op is Ops.REDUCE_AXIS
    widened = {n.src[0]: readers_of[n] for n in graph if _widening(n)}  # a 16-bit value -> its float32 copy's readers
    return frozenset(n for n in graph if n.op in ELEMENTWISE and len(n.src) > 1 and n.shape and
                     (readers_of[n] > 1 or widened.get(n, 0) > 1) and n not in never_chosen and
                     any(map(of_reduction, n.src)) and any(readers_of[s] > 1 and not of_reduction(s) for s in n.src))


def _decide(graph: list[UOp], is_root: set, in_contractions: frozenset, readers_of: Counter, row_values: bool,
            operand_prologues: bool, cuts: frozenset) -> set[UOp] | None:
    """choose_materialized's decisions, what reads a node of `cuts` reading it as a buffer; None where one of `cuts`
    is then not chosen."""
    never_chosen = is_root | in_contractions  # kernel roots have buffers of their own
    places = _places(graph)
    position = {n: k for k, n in enumerate(graph)}  # (parents first: a node's operands come after it)
    cost: dict[UOp, int] = {}
    chosen: set[UOp] = set()
    loaded = set(cuts)  # what the expressions reading a node read as a load
    classes = local_classes(graph, cuts) if cuts else None
    costs: dict[tuple, tuple] = {}  # a node's class -> (its cost, whether the cost chooses it): alike nodes' exprs
    # are left out, until a reader needs them (_Exprs)
    exprs = _Exprs(cost, loaded, readers_of)  # what a node's inlined expression evaluates: (what, cost) terms
    for node in reversed(graph):  # children first: inline cost (its ops and loads), ignoring later cuts
        key = classes.key(node) if classes and node not in cuts else None
        known = costs.get(key) if key else None
        if known is None:
            cost[node] = exprs.compute(node)
            if node in cuts:  # its own decisions count the cuts below it inline, as the plain pass does (none cut)
                cost[node] += sum(cost[t[0][1]] - 1 for t in exprs[node] if type(t[0]) is tuple and t[0][1] in cuts)
            known = cost[node], node.op in ELEMENTWISE and node not in is_root and node.shape and (
                cost[node] >= MAX_KERNEL_COST or places[node] >= 2 and cost[node] >= MAX_INLINE_COST)
            if key:
                costs[key] = known
        cost[node], first = known
        if first:  # read at several places, its expression would double with each (a concatenate chain)
            chosen.add(node)
            loaded.add(node)
            cost[node] = 1
    readers: dict[UOp, set] = {}  # node -> the kernel roots whose kernels compute it inline
    streams: dict[UOp, _Stream] = {}  # kernel root -> how it reads its operands (_recomputed_in_stream)
    realized_reads = _RealizedReads(cuts)  # node -> the computed nodes its expression reads
    shared = {n for n, k in readers_of.items() if k > 1 and n.op not in REALIZED} - cuts
    loads = functools.partial(_loads, memo={}, shared=shared, cuts=cuts)  # (its walks' memo: read_axes.walk_order)
    decided: dict[tuple, bool] = {}  # a node's class, cost and readers' classes -> its decision (fusion_classes)
    for node in graph:  # parents first, so a node's readers are final when it is reached
        mine = readers.get(node, set())
        choose = node in chosen
        if not choose and node.op in ELEMENTWISE and node not in never_chosen and node.shape and not _widening(node):
            key = classes and (classes.key(node), cost[node], frozenset([classes.key(r) for r in mine]))
            choose = decided.get(key) if key else None
            if choose is None:
                choose = _worth_materialising(node, mine, cost, row_values, chosen, operand_prologues,
                                              realized_reads, position) and \
                    not _recomputed_in_stream(node, mine, cost, streams, realized_reads, chosen, readers_of,
                                              operand_prologues, row_values, position, loads)
                if key:
                    decided[key] = choose
        if choose:
            chosen.add(node)
            mine = set()
        elif node in cuts:
            return None
        passes = {node} if node in is_root or node in chosen else mine
        for s in node.src:
            if s.op not in REALIZED:
                readers.setdefault(s, set()).update(passes)
    return chosen


def _places(graph: list[UOp]) -> Counter:
    """How many index maps read each node: its elementwise readers read it at their own index (one place, one
    evaluation however many they are); each movement or gather reader reads it through a view of its own."""
    places = Counter(s for node in graph if node.op not in ELEMENTWISE for s in node.src)
    places.update({s for node in graph if node.op in ELEMENTWISE for s in node.src})
    return places


class _Exprs(dict):
    """node -> its expression's terms (_expression), the cost pass's; a node whose cost is known from an alike one
    has none until a reader's expression needs it (`compute`, which computes what that needs first: an explicit
    stack, a chain of elementwise ops may be long)."""

    def __init__(self, cost: dict, loaded: set, readers_of: Counter):
        super().__init__()
        self.cost, self.loaded, self.readers_of = cost, loaded, readers_of

    def compute(self, node: UOp) -> int:
        """Computes node's terms (and those of the operands it reads them from, where left out); its cost."""
        stack = [node]
        while stack:
            n = stack[-1]
            missing = [s for s in n.src if s not in self and s.op not in REALIZED and s not in self.loaded] \
                if n.op in ELEMENTWISE else []
            if missing:
                stack += missing
                continue
            stack.pop()
            if n not in self or n is node:
                self[n], total = _expression(n, self, self.cost, self.loaded, self.readers_of)
        return total


def _expression(node: UOp, exprs: dict, cost: dict, loaded: set, readers_of: Counter) -> tuple[set, int]:
    """The terms, (what, cost) pairs, a kernel evaluates to compute `node` inline, and their cost. An elementwise
    node shares its operands' terms (a value two ops read at the same index is computed once: the cost of a DAG,
    not of its unfolded tree); a view (movement, gather) is one term of its own, its operands' cost (what two
    views read is computed once for each). An operand only this node reads hands its terms over (no copy)."""
    def cut(s):
        return s.op in REALIZED or s in loaded
    if node.op not in ELEMENTWISE:
        total = sum(1 if cut(s) else cost[s] for s in node.src)
        return {(node, total)}, total
    operands = list(dict.fromkeys(node.src))
    own = [s for s in operands if not cut(s) and readers_of[s] == 1]
    base = max(own, key=lambda s: len(exprs[s]), default=None)
    terms, total = (exprs[base], cost[base]) if base is not None else (set(), 0)
    for s in operands:
        if s is not base:
            for term in ({(("load", s), 1)} if cut(s) else exprs[s]):
                if term not in terms:
                    terms.add(term)
                    total += term[1]
    weight = 0 if _widening(node) or _rounded_reduction(node) else OP_COST.get(node.op, 1)
    terms.add((node, weight))
    return terms, total + weight


def _widening(node: UOp) -> bool:
    """Whether `node` widens a 16-bit float to its compute dtype: a register's worth of work where it is read, free,
    so a contraction reads the narrow operand itself (half the bytes) rather than a materialised float32 copy, and
    the narrow value is what is materialised, never its widened copy."""
    return node.op is Ops.CAST and node.src[0].dtype.narrow and node.dtype == node.src[0].dtype.compute


def _rounded_reduction(node: UOp) -> bool:
    """Whether `node` rounds a reduction's result (through views) to a 16-bit float (a bfloat16 model's matvec or
    attention scores): counted with the reduction, like a float32 model's reduction read as it is, so both
    precisions fuse alike (rounding is one cheap op per value, next to the load it follows)."""
    if not (node.op is Ops.CAST and node.dtype.narrow and node.src[0].dtype == node.dtype.compute):
        return False
    src = node.src[0]
    while src.op in MOVEMENT:
        src = src.src[0]
    return src.op is Ops.REDUCE_AXIS


def _worth_materialising(node: UOp, readers: set, cost: dict, row_values: bool, chosen: set,
                         operand_prologues: bool, realized_reads: _RealizedReads, position: dict) -> bool:
    if not readers:
        return False
    c, size = cost[node], _elements(node)
    if c <= ROW_VALUE_COST and _of_reductions(node, realized_reads) and (
            row_values and 1 in node.shape or _one_element(node) or
            len(readers) == 1 and operand_prologues and _read_per_row(next(iter(readers)), {node}, chosen, position)):
        return False  # recomputed where it is read, with its reductions (a one-element one: once per kernel, one
    # its only reader reads one element per row, a decode batch's row's norm, where that reader's kernel computes
    # it once per row, the cpu's: a GPU's many-row kernel would recompute it at every element it reads)
    if len(readers) >= 2 and c >= MAX_INLINE_COST:
        return True
    if row_values and _one_row_kernel(node, readers):
        return False
    if row_values and STORE_ROWS_REDUCED_ACROSS and _reduced_along_its_rows(node, readers, realized_reads):
        return True
    evaluations = sum(_iterations(r) for r in readers)  # inlined: each costs c; materialised: one load
    return (c - 1) * evaluations > (c + MEMORY_COST) * size + LAUNCH_COST


def _recomputed_in_stream(node: UOp, readers: set, cost: dict, streams: dict, realized_reads: _RealizedReads,
                          chosen: set, readers_of: Counter, operand_prologues: bool, row_values: bool, position: dict,
                          loads) -> bool:
    """Whether `node` is recomputed by the kernels reading it, which stream their operands, instead of materialised.

    A cheap value unpacked from integer data (a quantized weight's block scale: bytes joined, bitcast to float16,
    widened) that only streaming kernels read is recomputed in registers there, where the loads bound the time,
    because materialising it would cost bytes quantization saved. A sum of products (a matmul of many rows over a
    quantized weight) is such a reader too: codegen unpacks each block once per register block of rows
    (block_matmul.py), so no float32 copy of the weight is made.

    A cheap float value (STREAM_OPERAND_COST: a normalised row x * rsqrt(mean(x^2)) * gain, SiLU(gate) * up) that
    only streaming kernels read (a decode step's matvecs, each weight element loaded used a few times at most; with
    `operand_prologues`, kernels that compute it once per call, the cpu's, by each of their rows: a decode batch's
    rows each stream the weight as one row does, the value at most OPERAND_MAX elements) is computed where it is
    read, where materialising it costs a launch and a pass over the value: once per weight element in a GPU's row
    kernel, a few ops next to a weight load; once per call in a cpu matvec, whose kernel
    computes it into an array of its own before its loops (operand_prologue.py: recomputed at each weight element
    in the vector loop, SmolLM2's f32 decode over GGUF weights took 64 ms a token instead of 20). A one-element
    reduction it reads (the norm's mean of squares) is then a prologue of the contraction's kernel
    (fused_reductions), and so is a row's one that the contraction reads one element per row (a batch row's mean of
    squares: its row's prologue); one that reads a row's reduction otherwise broadcast is not: it and its row's
    reductions are one row kernel, where the contraction would leave them kernels of their own. On a GPU
    (`row_values`) a projection's work-groups each compute such a value again (_group_evaluations): where that
    repeats more than GROUP_RECOMPUTE_MAX in all (a large model's SiLU(gate) * up read by 2048 outputs over 8192), it
    is materialised."""
    node_loads = realized_reads(node)
    unpacked = all(leaf.op is Ops.INPUT and leaf.dtype.is_int for leaf in node_loads)
    if unpacked:
        own = cost[node]
        if own > CONTRACTION_INLINE_COST:
            return False
    else:
        own, rows_read, shares = _own_expression(node, chosen, readers_of)
        if rows_read is None or own > STREAM_OPERAND_COST or rows_read and not (operand_prologues and all(
                _read_per_row(r, rows_read, chosen, position) for r in readers)):
            return False
    for r in readers:
        products = _products(r)
        if unpacked and products:  # (own <= CONTRACTION_INLINE_COST, its limit: no need of r's loads)
            continue
        if r not in streams:
            streams[r] = _Stream(r, loads(r), operand_prologues)
        streaming, rows = streams[r].rows(node_loads)
        limit = (STREAM_INLINE_COST if streaming else -1) if unpacked else \
            STREAM_OPERAND_COST if streaming and (products or len(readers) == 1 or not shares) else -1
        if own > limit or rows > 1 and not unpacked and _elements(node) > OPERAND_MAX:
            return False
        if row_values and not unpacked and own * _group_evaluations(node, r) > GROUP_RECOMPUTE_MAX:
            return False
    return True


def _group_evaluations(node: UOp, r: UOp) -> int:
    """How many times a GPU's kernel computing `r` (a projection of static shape) evaluates `node`'s elements: its
    work-groups of MATVEC_WARPS outputs compute an operand that fits SHARED_OPERAND_BYTES once each into local
    memory (render_rows._shared_operands), a larger one each output's warp at every element it reads."""
    from .row_plan import MATVEC_WARPS, SHARED_OPERAND_BYTES   # (row_plan imports fusion through block_split)
    if not all(isinstance(d, int) for d in r.shape):
        return 0
    outputs, size = _elements(r), _elements(node)
    return size * (outputs if size * node.dtype.itemsize > SHARED_OPERAND_BYTES else -(-outputs // MATVEC_WARPS))


def _loads(r: UOp, memo: dict, shared: set, cuts: frozenset = frozenset()) -> dict[UOp, set]:
    """Each computed node (REALIZED, or one of `cuts`) the kernel computing `r` loads -> the axes it is read at
    (reads_with_axes' walk, in its order: _Stream breaks ties by it; walk_order's, with its `memo` and `shared`
    nodes)."""
    def expand(item):
        n, axes = item
        return (True, ()) if n.op in REALIZED or n in cuts else (False, zip(n.src, read_axes(n, axes)))
    axes = tuple(frozenset((k,)) for k in range(len(r.shape)))
    loaded: dict[UOp, set] = {}
    for n, axes in walk_order(list(zip(r.src, read_axes(r, axes))), expand, shared, memo):
        loaded.setdefault(n, set()).add(axes)
    return loaded


class _RealizedReads:
    """Per node, the computed nodes (REALIZED, or one of `cuts` below it) its inlined expression reads: _loads' keys
    without their axes, built up from its operands' (memoised: the nodes' expressions share their lower parts)."""

    def __init__(self, cuts: frozenset):
        self.cuts, self.memo = cuts, {}

    def __call__(self, node: UOp) -> frozenset:
        memo, cuts = self.memo, self.cuts
        for n in node.postorder(lambda u: u not in memo and u.op not in REALIZED and (u is node or u not in cuts)):
            memo[n] = frozenset().union(*({s} if s.op in REALIZED or s in cuts else memo[s] for s in n.src))
        return memo[node]


class _Stream:
    """How the kernel computing kernel root `r` reads what it loads (`loaded`: _loads), its rows counted `by_row` or
    not: the nodes it loads largest first (ties in the walk's order) and their elements in all, and `rows`' answers
    by the weight it picks (they depend on that node alone)."""

    def __init__(self, r: UOp, loaded: dict, by_row: bool):
        self.r, self.loaded, self.by_row, self.answers = r, loaded, by_row, {}
        self.by_size = sorted(loaded, key=_elements, reverse=True)  # (a stable sort: max's first of the largest)
        self.total = sum(map(_elements, loaded))

    def rows(self, operand_loads: frozenset) -> tuple[bool, int]:
        """(whether the kernel streams what it loads, each element used at most STREAM_REUSE times by each of its
        rows, its rows: the product of its output axes along which the largest value it loads is broadcast (a decode
        batch's rows, the weight's elements read once by each)), but not of what the value it would recompute loads
        (`operand_loads`, unless it loads nothing else): that is no weight. A prefill's qkv projection reads its
        normalised rows through the residual stream, whose first term gathers the token embedding (not yet cut when
        `operand` is decided), and took that table for its weight, rows unknown: one row, so the norm was recomputed
        at each panel of the weight (SmolLM2 gguf's 126-token prefill, 2 threads: the qkv kernels 43-45 ms for 30
        layers, 16 with the norm materialised; the call 159-163 -> 130-133 ms)."""
        if not self.loaded:
            return True, 1
        largest = next((n for n in self.by_size if n not in operand_loads), self.by_size[0])
        if largest not in self.answers:
            r = self.r
            along = frozenset().union(*(a for axes in self.loaded[largest] for a in axes))
            if not self.by_row or UNKNOWN <= along:  # (a gathered weight: rows unknown)
                along = frozenset(range(len(r.shape)))
            rows = 1
            for k, d in enumerate(r.shape):
                if k not in along:
                    rows *= d if isinstance(d, int) else max(1, d.vmax)
            self.answers[largest] = _iterations(r) <= STREAM_REUSE * self.total * rows, rows
        return self.answers[largest]


def _products(r: UOp) -> bool:
    """Whether kernel root `r` is a sum of products (a matmul, a matvec)."""
    return r.op is Ops.REDUCE_AXIS and r.arg[0] is Ops.ADD and r.src[0].op is Ops.MUL


def _read_per_row(root: UOp, targets: set, chosen: set, position: dict) -> bool:
    """Whether the kernel computing `root`, computing inline what is not realized or `chosen`, reads every node of
    `targets` one element per row (_per_row): a row's reduction it can compute as the row's prologue. The walk
    skips what comes after the targets in the parents-first `position` (under none of them: a residual stream's
    earlier blocks)."""
    last = max(position[t] for t in targets)
    return all(per_row(n, axes, root) for n, axes in reads_with_axes(
        root, lambda n: n in targets or n.op in REALIZED or n in chosen or position[n] > last) if n in targets)


def _own_expression(node: UOp, chosen: set, readers_of: Counter) -> tuple[int, set | None, bool]:
    """(the cost of `node`'s inlined expression down to the values others read too, a load each: those are theirs
    to materialise or recompute, like a residual stream; None where materialising `node` costs no kernel of its own
    (the expression reads a reduction element for element, a residual add after a projection the contraction's
    kernel stores as its epilogue), else the values of reductions of more than one element it broadcasts (a row's
    max or sum, a row's mean of squares), which materialising `node` computes in its row's kernel, and which a
    reader computes as a prologue only where it reads them one element per row (_read_per_row); whether it reads
    a value others read too that is not materialised
    (yet: decided after its readers), which each kernel recomputing `node` would recompute too, and that reads
    some buffer and is more than a reduction rounded to 16 bits: one computed from indices alone (a concatenate's
    mask in RoPE) is index arithmetic wherever it is, and a rounded one a load and a rounding)."""
    total, kernel, rows, shares, stack, seen = 0, False, set(), False, [(node, True)], set()
    while stack:
        n, direct = stack.pop()
        if (n, direct) in seen:
            continue
        seen.add((n, direct))
        if n is not node and (n.op in REALIZED and n.op is not Ops.REDUCE_AXIS or n in chosen or
                              readers_of[n] > 1 and n.op in ELEMENTWISE):
            total += 1
            shares |= not (n.op in REALIZED or n in chosen or _rounded_reduction(n) or _reads(n, lambda leaf: False))
            continue
        if n.op is Ops.REDUCE_AXIS:
            total += 1
            kernel |= direct
            continue
        if n.op is Ops.EXPAND and not _one_element(n.src[0]) and not _reads(
                n.src[0], lambda leaf: leaf.op is not Ops.REDUCE_AXIS):
            rows.add(n.src[0])
        if n.op in ELEMENTWISE and (n, not direct) not in seen:  # each op counted once, however it is reached
            total += 0 if _widening(n) or _rounded_reduction(n) else OP_COST.get(n.op, 1)
        stack.extend((s, direct and (n.op in ELEMENTWISE or n.op is Ops.RESHAPE)) for s in n.src)
    return total, None if kernel else rows, shares


def _reads(node: UOp, ok) -> bool:
    """Whether `ok(leaf)` holds for every computed node (REALIZED) that `node`'s expression reads."""
    stack, seen = list(node.src) if node.op in REALIZED else [node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op in REALIZED:
            if not ok(n):
                return False
            continue
        stack.extend(n.src)
    return True


def _one_row_kernel(node: UOp, readers: set) -> bool:
    """Whether `node` is read by reductions along its trailing axes and one elementwise kernel of its shape (which
    reads them broadcast: softmax's exp(x - max) by the sum and the division, layernorm's x - mean by the variance
    and the output): on the C-style renderers they are one row kernel, whose work-group reads the row again from
    cache, so recomputing the value there costs its ops only, where materialising it costs a pass."""
    outs = [r for r in readers if r.op in ELEMENTWISE]
    reds = [r for r in readers if r.op is Ops.REDUCE_AXIS]
    return len(outs) == 1 and outs[0].shape == node.shape and len(reds) == len(readers) - 1 >= 1 and all(
        _along_trailing(r, node) for r in reds)


def _reduced_along_its_rows(node: UOp, readers: set, realized_reads: _RealizedReads) -> bool:
    """Whether a reduction reading `node` (elementwise over reductions it broadcasts: a LayerNorm's rows) reduces along
    an axis they keep (MiniLM's pooling over the sequence), where they cannot be computed (its every iteration another
    row: they were kernels of their own, x - mean stored in float32), so their row kernel stores `node`; a widened
    16-bit value of its shape is stored instead (`_widening`)."""
    if any(_widening(s) and s.shape == node.shape for s in node.src):
        return False
    kept = {k for red in realized_reads(node) if red.op is Ops.REDUCE_AXIS and
            len(red.shape) == len(node.shape) and any(a == 1 != b for a, b in zip(red.shape, node.shape))
            for k, (a, b) in enumerate(zip(red.shape, node.shape)) if a == b != 1}
    return any(r.op is Ops.REDUCE_AXIS and r.src[0].shape == node.shape and
               any(k in kept for k, (a, b) in enumerate(zip(r.shape, node.shape)) if a != b) for r in readers)


def _along_trailing(red: UOp, node: UOp) -> bool:
    """Whether the reduction `red` of `node` reduces trailing axes only (keeping the others: a row's)."""
    if red.src[0].shape != node.shape:
        return False
    kept = [k for k, (a, b) in enumerate(zip(red.shape, node.shape)) if a == b and not (isinstance(a, int) and a == 1)]
    reduced = [k for k, (a, b) in enumerate(zip(red.shape, node.shape)) if a != b]
    return bool(kept) and bool(reduced) and min(reduced) > max(kept)


def _of_reductions(node: UOp, realized_reads: _RealizedReads) -> bool:
    """Whether elementwise `node` is computed from reductions and constants only (no other buffer is read)."""
    return all(n.op is Ops.REDUCE_AXIS for n in realized_reads(node))


def inlined_scatters(outputs: list[UOp], walk: tuple | None = None) -> set[UOp]:
    """The scatters computed where they are read, as a select, instead of a copy of their target and a kernel
    writing the updates: those that write each target element at most once at an index the same everywhere
    (`.at[:, pos].set(row)` with a scalar `pos`: a KV cache's new row), into a view of a buffer, outside loops
    and not an output. A reader's element is then `update if its index is the written one else target`. `walk`: as
    choose_materialized's."""
    graph, _ = walk or kernel_roots(outputs)
    in_loops = {n for node in graph if node.op is Ops.LOOP
                for n in UOp(Ops.SINK, node.dtype, node.arg.body_roots).toposort()}
    return {n for n in graph if n.op is Ops.SCATTER and n not in in_loops and n not in outputs and _is_row_set(n)}


def _is_row_set(node: UOp) -> bool:
    """Whether SCATTER `node` maps every update dim longer than 1 to a target dim, reads uniform indices (so no two
    updates meet) and writes into a view of a buffer (not a scatter: its chain stays in place)."""
    target, updates, *indices = node.src
    mapped = {n for kind, n in node.arg[0] if kind == "dim"}
    if any(k not in mapped and not (isinstance(d, int) and d == 1) for k, d in enumerate(updates.shape)):
        return False
    while target.op in MOVEMENT:
        target = target.src[0]
    return target.op in REALIZED and target.op not in (Ops.SCATTER, Ops.CARRY) and all(map(uniform, indices))


def _one_element(node: UOp) -> bool:
    return all(isinstance(d, int) and d == 1 for d in node.shape)
