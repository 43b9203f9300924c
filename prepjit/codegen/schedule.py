"""Scheduling: cut a traced graph into kernels, give every realized value a buffer, unroll fori_loops.

A value is realized (gets a buffer) when it is an input, a reduction, a scatter, a loop carry, an
output, or an elementwise value that fusion.py finds worth computing once; everything else elementwise
or a view is inlined into the kernels that read it, and so are the reductions fused_reductions.py computes
inside their only reader, and the scatters fusion.py inlines as a select into their readers (a cache's new row).
Kernels are emitted in dependency order.

A scatter's buffer first takes its target's value: the target computed straight into it when the
scatter is its only reader (a chain `x.at[i].set(a).at[j].add(b)` then writes one buffer in place), else
a copy of the target's buffer; then one kernel per scatter of the chain writes the updates (lower.py).
"""
from __future__ import annotations

import functools
from collections import Counter

import attrs

from ..uop import DType, Ops, UOp, dtypes, sint
from ..uop.segments import Run, Segments
from .dynamic_loop import DynamicLoop, dynamic_loop
from .fused_reductions import fused_reductions
from .fusion import choose_materialized, inlined_scatters, kernel_roots
from .read_axes import read_axes
from .lower import REALIZED, lower_copy, lower_kernel, lower_scatter
from .offsets import shifted, without_starts
from .packing import pack_contraction
from .softmax_contraction import joins, softmax_contractions


@attrs.frozen
class BufferSpec:
    dtype: DType
    shape: tuple  # ints and symbolic UOps: the live shape
    max_size: int  # elements at the vars' maxima


@attrs.frozen
class ScheduledKernel:
    ast: UOp
    buffers: tuple[int, ...]  # plan buffer indices in kernel slot order; slot 0 is written
    fixedvars: tuple[tuple[str, int], ...] = ()


@attrs.frozen
class LoopKernels(Run):
    """A fori_loop's kernels: `body` once per k in [lower, upper) with fixedvar name = k first; odd
    iterations (counted from lower) read and write the buffers `swap` exchanges (its ping-pong carries)."""

    body: tuple[ScheduledKernel, ...]
    name: str
    lower: int
    upper: int
    swap: tuple[tuple[int, int], ...]

    def __len__(self) -> int:
        return len(self.body) * (self.upper - self.lower)

    def parity(self, odd: bool) -> tuple[tuple[int, ...], ...]:
        """The buffer slots of each body kernel in an even or odd iteration."""
        swap = dict(self.swap)
        return tuple(tuple(swap.get(b, b) for b in k.buffers) if odd else k.buffers for k in self.body)

    def item(self, i: int) -> ScheduledKernel:
        """The i-th kernel of the unrolled loop."""
        k, j = self.lower + i // len(self.body), i % len(self.body)
        body = self.body[j]
        return ScheduledKernel(body.ast, self.parity((k - self.lower) % 2 == 1)[j], ((self.name, k),) + body.fixedvars)


class KernelSequence(Segments):
    """Kernels in execution order, as a Sequence of ScheduledKernel; a fori_loop's iterations are one
    LoopKernels segment whose kernels are built on access."""

    def counted(self):
        """(kernel, how many times it runs with these buffers) for each kernel and each parity of a loop body
        (fixedvars aside): what a pass that does not depend on the loop var's value needs to see."""
        for seg in self.segments:
            if isinstance(seg, DynamicLoop):
                yield from ((k, 1) for k in seg.flat)
                continue
            if not isinstance(seg, LoopKernels):
                yield seg, 1
                continue
            n = seg.upper - seg.lower
            for odd, count in ((False, (n + 1) // 2), (True, n // 2)):
                if count:
                    for body, bufs in zip(seg.body, seg.parity(odd)):
                        yield ScheduledKernel(body.ast, bufs, body.fixedvars), count

    def boundary(self):
        """(index, kernel) for every kernel outside loops and for the first two and last two iterations of each
        loop: enough to find where each buffer is first and last used. A DynamicLoop's kernels come twice, at
        their own index and at its last, so all it uses lives until its end (an iteration reads them again)."""
        for seg, start in zip(self.segments, self.starts):
            if isinstance(seg, DynamicLoop):
                yield from enumerate(seg.flat, start)
                yield from ((start + len(seg) - 1, k) for k in seg.flat)
                continue
            if not isinstance(seg, LoopKernels):
                yield start, seg
                continue
            n, width = seg.upper - seg.lower, len(seg.body)
            for k in sorted(k for k in {0, 1, n - 2, n - 1} if 0 <= k < n):
                for j in range(width):
                    yield start + k * width + j, seg.item(k * width + j)

    def asts(self) -> list[UOp]:
        """The distinct kernel ASTs, in order of first use."""
        return list(dict.fromkeys(k.ast for k, _ in self.counted()))

    def loop_facts(self) -> list[UOp]:
        """lower <= var < upper for the var of every loop the plan runs natively (DynamicLoop.facts)."""
        return [f for seg in self.segments if isinstance(seg, DynamicLoop) for f in seg.facts()]


@attrs.frozen
class Schedule:
    buffers: tuple[BufferSpec, ...]
    kernels: KernelSequence
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


def _max_size(shape: tuple[sint, ...]) -> int:
    size = 1
    for d in shape:
        size *= d if isinstance(d, int) else max(0, d.vmax)
    return size


class _Scheduler:
    def __init__(self, materialized: set[UOp], fused: set[UOp], pack_contractions: bool, readers: dict):
        self.readers = readers  # node -> how many nodes (and outputs, loop bodies) read it
        self.in_place: set[UOp] = set()  # loop carries their body's scatter updates in their own buffer
        self.buffers: list[BufferSpec] = []
        self.kernels: list[ScheduledKernel | LoopKernels] = []
        self.materialized = materialized
        self.fused = fused
        self.pack_contractions = pack_contractions
        self.lowered: dict[UOp, tuple] = {}  # a kernel over placeholders (`canonical`) -> its lowering, packing

    def has_buffer(self, node: UOp) -> bool:
        return node.op in REALIZED and node not in self.fused or node in self.materialized

    def new_buffer(self, node: UOp) -> int:
        self.buffers.append(BufferSpec(node.dtype, tuple(node.shape), _max_size(node.shape)))
        return len(self.buffers) - 1

    def deps(self, node: UOp) -> list[UOp]:
        """The realized nodes a kernel computing `node` reads (the walk stops at them); for a scatter, those
        of every kernel of its chain (`scatter_chain`)."""
        if node.op is Ops.SCATTER:
            chain, base = self.scatter_chain(node)
            start = [s for c in chain for s in c.src[1:]]
            return self.reads(start) + ([base] if self.copies(base) else self.deps(base))
        computed_here = node.op is Ops.REDUCE_AXIS or node in self.materialized
        return self.reads(list(node.src) if computed_here else [node])

    def reads(self, start: list[UOp]) -> list[UOp]:
        out, seen, stack = [], set(), list(start)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if self.has_buffer(n):
                out.append(n)
            else:
                stack.extend(n.src)
        return out

    def copies(self, target: UOp) -> bool:
        """Whether a scatter of `target` copies its buffer (it has its own: an input, a carry, or a value others
        read too) rather than computing `target` into the scatter's buffer."""
        return self.has_buffer(target) and target not in self.in_place and (
            target.op in (Ops.INPUT, Ops.CARRY, Ops.LOOP_OUT) or self.readers.get(target, 0) > 1)

    def scatter_chain(self, node: UOp) -> tuple[list[UOp], UOp]:
        """(the scatters writing `node`'s buffer in place, innermost first, the target they start from)."""
        chain = [node]
        while chain[-1].src[0].op is Ops.SCATTER and not self.copies(chain[-1].src[0]):
            chain.append(chain[-1].src[0])
        return chain[::-1], chain[-1].src[0]

    def realize(self, node: UOp, env: dict) -> int:
        self.realize_all([node], env)
        return env[node]

    def realize_all(self, nodes: list[UOp], env: dict):
        """Realize `nodes` and, before each, the realized values it reads: a depth-first walk on an explicit
        stack (a user's Python loop can chain thousands of kernels)."""
        stack = [(None, None, iter(nodes))]  # (node to emit once its deps are done, its buffer, deps left)
        while stack:
            node = next(stack[-1][2], None)
            if node is None:
                done, buf, _ = stack.pop()
                if done is not None:
                    self.emit(done, buf, env)
                continue
            if node in env:
                continue
            if node.op is Ops.LOOP_OUT:
                self.schedule_loop(node.src[0], env)
            elif node.op in (Ops.REDUCE_AXIS, Ops.SCATTER) or node in self.materialized:
                stack.append((node, self.new_buffer(node), iter(self.deps(node))))
            else:
                raise RuntimeError(f"{node.op} has no buffer")

    def compute_into(self, node: UOp, buf: int, env: dict):
        self.realize_all(self.deps(node), env)
        self.emit(node, buf, env)

    def canonical(self, root: UOp) -> tuple[UOp, list[UOp], dict[UOp, set[UOp]]]:
        """The kernel computing `root` with each realized value it reads replaced by a placeholder (an INPUT of
        its dtype and shape numbered in walk order), those values, and each placeholder's readers: the same
        computation over other buffers (each of a model's identical layers) gives the same placeholder graph,
        lowered once."""
        memo: dict[UOp, UOp] = {}
        reads: list[UOp] = []
        readers: dict[UOp, set[UOp]] = {}  # realized value -> the placeholder graph's nodes reading it
        stack = [(root, iter(root.src))]  # depth first, sources in order: each node with its sources still to see
        while stack:
            n, sources = stack[-1]
            for x in sources:
                if x in memo:
                    continue
                if self.has_buffer(x):
                    memo[x] = UOp(Ops.INPUT, x.dtype, (), ((_SLOT, len(reads)), tuple(x.shape)))
                    reads.append(x)
                    readers[x] = set()
                else:
                    stack.append((x, iter(x.src)))
                    break
            else:
                stack.pop()
                src = tuple([memo[x] for x in n.src])
                new = memo[n] = n if src == n.src else UOp(n.op, n.dtype, src, n.arg)
                for x in n.src:
                    if x in readers:
                        readers[x].add(new)
        return memo[root], reads, {memo[x]: r for x, r in readers.items()}

    def lower(self, node: UOp) -> tuple[UOp, list[UOp], tuple | None]:
        """(the kernel AST computing `node`, the realized values it reads, pack_contraction's split or None),
        from the lowering of its placeholder graph when an identical kernel was lowered before."""
        if node.op in (Ops.INPUT, Ops.CARRY, Ops.LOOP_OUT):  # a copy of a buffer: lowered as it is
            ast, reads = lower_kernel(node, self.has_buffer)
            return ast, reads, self.packed(ast, len(reads))
        canon, values, readers = self.canonical(node)
        generic, starts = without_starts(canon, readers)  # a layer's slice of a stacked buffer: lowered at 0
        found = self.lowered.get(generic)
        if found is None:
            ast, slots = lower_kernel(generic, _is_slot)
            found = self.lowered[generic] = (ast, [p.arg[0][1] for p in slots], self.packed(ast, len(slots)))
        ast, order, packed = found
        moved = {order.index(k) + 1: c for p, c in starts.items() if (k := p.arg[0][1]) in order}
        if moved:
            ast = shifted(ast, moved)
            if ast is None:
                ast, slots = lower_kernel(canon, _is_slot)
                order = [p.arg[0][1] for p in slots]
            packed = self.packed(ast, len(order))
        return ast, [values[k] for k in order], packed

    def packed(self, ast: UOp, reads: int) -> tuple | None:
        return pack_contraction(ast, 1 + reads) if self.pack_contractions else None

    def emit(self, node: UOp, buf: int, env: dict, keep: bool = True):
        """The kernel(s) computing `node` into `buf`, once everything it reads is realized; `keep` records `buf`
        as `node`'s buffer (not so for a scatter's target: the scatter overwrites it)."""
        if node.op is Ops.SCATTER:
            return self.emit_scatter(node, buf, env)
        ast, reads, packed = self.lower(node)
        slots = (buf, *(env[r] for r in reads))
        if packed is not None:  # each packing kernel reads the contraction's inputs and writes slot 0
            ast, packs = packed
            inputs = slots[1:]
            for pack_ast, shape in packs:
                self.buffers.append(BufferSpec(pack_ast.src[0].src[2].dtype, shape, _max_size(shape)))
                self.kernels.append(ScheduledKernel(*_drop_unused_slots(pack_ast, (len(self.buffers) - 1, *inputs))))
                slots = (*slots, len(self.buffers) - 1)
        self.kernels.append(ScheduledKernel(*_drop_unused_slots(ast, slots)))
        if keep and (node.op is Ops.REDUCE_AXIS or node in self.materialized) and node not in env:
            env[node] = buf

    def emit_scatter(self, node: UOp, buf: int, env: dict):
        chain, base = self.scatter_chain(node)
        if env.get(base) == buf:  # a carry updated in place: its buffer is the scatter's
            pass
        elif base in env or self.copies(base):
            ast, reads = lower_copy(base, self.has_buffer)
            self.kernels.append(ScheduledKernel(*_drop_unused_slots(ast, (buf, *(env[r] for r in reads)))))
        else:
            self.emit(base, buf, env, keep=False)
        for s in chain:
            ast, reads = lower_scatter(s, self.has_buffer)
            self.kernels.append(ScheduledKernel(*_drop_unused_slots(ast, (buf, *(env[r] for r in reads)))))
        if node not in env:
            env[node] = buf

    def schedule_loop(self, loop: UOp, env: dict):
        info = loop.arg
        bufs_a = [self.new_buffer(c) for c in info.carries]
        in_place = _updated_in_place(info)
        self.in_place |= {info.carries[j] for j in in_place}
        bufs_b = [a if j in in_place else self.new_buffer(c) for j, (c, a) in enumerate(zip(info.carries, bufs_a))]
        for init, a in zip(loop.src, bufs_a):
            self.compute_into(init, a, env)
        inner = set(info.carries) | ({info.var} if info.var is not None else set())
        for node in UOp(Ops.SINK, loop.dtype, info.body_roots).toposort():  # hoist loop-invariant reductions
            if node.op in (Ops.REDUCE_AXIS, Ops.LOOP_OUT, Ops.SCATTER) and not node.depends_on(inner):
                self.realize(node, env)
        body_env = dict(env)
        body_env.update(zip(info.carries, bufs_a))
        start = len(self.kernels)
        for out, b in zip(info.body_outputs, bufs_b):
            self.compute_into(out, b, body_env)
        # a fori_loop with static bounds nested in the body is unrolled in it, one the plan runs natively is kept
        body = _unrolled(self.kernels[start:])
        del self.kernels[start:]
        swap = {a: b for a, b in zip(bufs_a, bufs_b) if a != b} | {b: a for a, b in zip(bufs_a, bufs_b) if a != b}
        if info.dynamic or any(isinstance(k, DynamicLoop) for k in body):
            self.kernels.append(self.dynamic(loop, body, bufs_a, bufs_b, swap, env))
            final = bufs_a
        else:
            if body:
                self.kernels.append(LoopKernels(body, info.var.arg[0], info.lower, info.upper, tuple(swap.items())))
            final = bufs_b if (info.upper - info.lower) % 2 else bufs_a
        for j, c in enumerate(info.carries):
            env[UOp(Ops.LOOP_OUT, c.dtype, (loop,), j)] = final[j]


    def dynamic(self, loop: UOp, body: tuple, bufs_a: list, bufs_b: list, swap: dict, env: dict) -> DynamicLoop:
        """The DynamicLoop of `loop` (its even iteration's body kernels given): a while_loop's predicate
        kernels (from the carries in `bufs_a`) and the copies back from `bufs_b`."""
        info, pred, pred_buffer = loop.arg, (), None
        start = len(self.kernels)
        if info.pred is not None:
            pred_buffer = self.new_buffer(info.pred)
            self.compute_into(info.pred, pred_buffer, {**env, **dict(zip(info.carries, bufs_a))})
            pred = _unrolled(self.kernels[start:])
            del self.kernels[start:]
        for c, a, b in zip(info.carries, bufs_a, bufs_b):
            if a != b:
                self.emit(c, a, {**env, c: b})
        copy = tuple(self.kernels[start:])
        del self.kernels[start:]
        return dynamic_loop(info, pred_buffer, pred, body, copy, swap)


def _updated_in_place(info) -> set[int]:
    """The carries whose body result is a scatter chain starting from the carry, and that nothing else in the
    body reads (a scan's stacked outputs, a cache written a row per step): the chain updates the carry's one
    buffer in place, instead of each iteration copying it into the other buffer of a ping-pong pair."""
    uses = Counter(s for n in UOp(Ops.SINK, dtypes.bool, info.body_roots).toposort() for s in n.src)
    uses.update(info.body_roots)
    out = set()
    for j, (carry, node) in enumerate(zip(info.carries, info.body_outputs)):
        while node.op is Ops.SCATTER and node.src[0] is not carry and node.src[0].op is Ops.SCATTER and \
                uses[node.src[0]] == 1:
            node = node.src[0]
        if node.op is Ops.SCATTER and node.src[0] is carry and uses[carry] == 1:
            out.add(j)
    return out


def _unrolled(segments: list) -> tuple:
    """Kernels inside a loop: a fori_loop with static bounds unrolled in place, one the plan runs natively kept."""
    return tuple(k for seg in segments for k in (
        (seg.item(i) for i in range(len(seg))) if isinstance(seg, LoopKernels) else (seg,)))


_SLOT = "slot"  # the number of a placeholder INPUT (_Scheduler.canonical) is (_SLOT, k)


def _is_slot(node: UOp) -> bool:
    return node.op is Ops.INPUT and type(node.arg[0]) is tuple and node.arg[0][0] == _SLOT


def _drop_unused_slots(ast: UOp, buffers: tuple[int, ...]) -> tuple[UOp, tuple[int, ...]]:
    """The kernel with its buffer slots renumbered to those it reads or writes, and those buffers."""
    ast, used = _used_slots(ast)
    return ast, tuple(buffers[i] for i in used)


@functools.lru_cache(maxsize=4096)
def _used_slots(ast: UOp) -> tuple[UOp, tuple[int, ...]]:
    """`ast` with its buffer slots renumbered to those it reads or writes, and their old numbers."""
    globals_ = [u for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL]
    used = sorted({u.arg for u in globals_})
    renumber = {old: new for new, old in enumerate(used)}
    return ast.substitute({u: UOp(Ops.DEFINE_GLOBAL, u.dtype, (), renumber[u.arg]) for u in globals_}), tuple(used)


def _readers(outputs: list[UOp], graph: list[UOp]) -> dict:
    """How many nodes read each node of `graph` (kernel_roots'), counting each output and loop body output as one
    reader more."""
    count: dict = {}
    extra = list(outputs) + [o for n in graph if n.op is Ops.LOOP for o in n.arg.body_outputs]
    for n in graph:
        for s in set(n.src):
            count[s] = count.get(s, 0) + 1
    for o in extra:
        count[o] = count.get(o, 0) + 1
    return count


def rounded_roots(graph: list[UOp], readers: dict, decided: set[UOp]) -> dict[UOp, UOp]:
    """The reductions that a kernel of their own computes only to have them rounded to a 16-bit float (a bfloat16
    model's projection, attention scores or p @ V: a CAST of the REDUCE_AXIS, through reshapes, that nothing else
    reads), each mapped to its rounding, which their kernel computes and stores instead (the reduction fused into
    it): the kernel writes half the bytes, and a tensor-core tile reading the value (the context that the output
    projection multiplies) reads a 16-bit operand it copies as it is (asynchronously) rather than float32 values it
    rounds one by one. The same rounding, once a value either way. `decided`: nodes that keep their place (materialised, fused, an output, a
    softmax computed inside its contraction); a loop body's nodes keep theirs too."""
    in_loops = {n for node in graph if node.op is Ops.LOOP
                for n in UOp(Ops.SINK, node.dtype, node.arg.body_roots).toposort()}
    found = {}
    for node in graph:
        if node.op is not Ops.CAST or not node.dtype.narrow or node in decided or node in in_loops:
            continue
        red = node.src[0]
        while red.op is Ops.RESHAPE and readers.get(red) == 1 and red not in decided:
            red = red.src[0]   # (the reduction's kept axis dropped)
        if red.op is Ops.REDUCE_AXIS and red.dtype == node.dtype.compute and readers.get(red) == 1 and \
                red not in decided:
            found[red] = node
    return found


def schedule(outputs: list[UOp], inputs: list[UOp], pack_contractions: bool = False,
             attention_tiles: bool = False) -> Schedule:
    """Kernels and buffers computing `outputs` from `inputs`; each output gets a fresh buffer.

    Row reductions are computed inside the kernel that broadcasts them (fused_reductions.py: llvm loop nests compute
    them where a row's loops are open, the C-style renderers give each row a work-group). With
    `pack_contractions` (for devices whose kernels are register-blocking loop nests: llvm), large
    contractions first copy their column operand into contiguous panels (packing.py). With `attention_tiles` (a
    target whose tensor cores run attention_tiles.py's kernel), an encoder's softmax is computed inside p @ V too.
    """
    walk = kernel_roots(outputs)  # the graph and its kernel roots, walked once for every pass below
    # a softmax only a contraction over its axis reads: computed inside that kernel (a work-group a row on a GPU, a
    # loop step a row on the cpu: llvm_softmax.py)
    found = softmax_contractions(walk[0], outputs, attention_tiles)
    in_contractions = frozenset().union(*found.values())
    materialized = choose_materialized(outputs, row_values=not pack_contractions, walk=walk,
                                       operand_prologues=pack_contractions, in_contractions=in_contractions) | joins(
        found, outputs)
    inlined = inlined_scatters(outputs, walk=walk)
    fused = inlined | fused_reductions(outputs, materialized, rows=True, one_contraction=pack_contractions,
                                       inlined=frozenset(inlined), walk=walk, row_prologues=pack_contractions,
                                       in_contractions=in_contractions)
    read_axes.cache_clear()   # (the fusion decisions' memo: its keys would keep this graph's nodes alive)
    readers = _readers(outputs, walk[0])
    if not pack_contractions:   # (the work-group targets; the cpu's kernels keep their float32 results)
        stored = rounded_roots(walk[0], readers, materialized | fused | in_contractions | set(outputs))
        materialized, fused = materialized | set(stored.values()), fused | set(stored)
    s = _Scheduler(materialized, fused, pack_contractions, readers)
    env = {node: s.new_buffer(node) for node in inputs}
    input_bufs = tuple(env[n] for n in inputs)
    output_bufs, done = [], {}
    for node in outputs:
        if node not in done:
            done[node] = s.new_buffer(node)
            s.compute_into(node, done[node], env)
        output_bufs.append(done[node])
    return Schedule(tuple(s.buffers), KernelSequence(s.kernels), input_bufs, tuple(output_bufs))
