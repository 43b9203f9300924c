"""Native worker threads for the cpu device: a parallel-for that splits a kernel's outermost range into chunks.

`prepjit_parallel(state, fn, bufs, vals, size, chunks)` runs fn(bufs, vals, start, end) over [0, size) cut into
`chunks` slices that the calling thread and the workers claim one at a time; it returns when all have run.
The replay program (cpu_replay.py) calls it for its split launches, so a plan replays without Python between
kernels, and a worker that the OS has not scheduled yet costs nothing: whoever is running takes the next chunk.

The state is one block of int64 words, each group on its own cache line:

    TICKET    (generation << 32) | next chunk: a task is published by storing (generation, 0); a chunk is
              claimed by adding 1 (atomicrmw), which also says which generation the chunk belongs to
    BUSY      1 while a thread publishes and waits for a task (another caller then runs its kernel alone)
    SLEEPERS  workers blocked on the condition variable (the publisher wakes them only when there are some)
    slots     two task slots (generation & 1): fn, bufs, vals, size, chunk length, chunk count; each with a
              count of the chunks done on a line of its own. A slot is rewritten only two generations later,
              after every chunk of its task has run, so a claimed chunk always reads its own task
    CONFIG    workers (0 after a fork: everything runs inline), the cycle-counter ticks an idle worker spins
              before it sleeps (WORKER_SPIN_S of this host's counter, measured when the threads start), spins
              before the waiting publisher yields, and the addresses of pthread_mutex_lock / unlock,
              pthread_cond_wait / broadcast and sched_yield (read by ctypes from the C library)
    COOLDOWN  the cycle count until which split launches run on the calling thread alone. When the publisher,
              done with its own chunks, waits more than STALL ticks of the cycle counter plus the time its own
              chunks took for a worker's (the OS preempted it: a loaded host; a chunk as long as the
              publisher's is no stall), split launches run alone for BACKOFF ticks from then on, and BACKOFF
              doubles (up to MAX_BACKOFF); a split launch that ran without a stall halves it (down to
              MIN_BACKOFF). A stall on a briefly busy host so costs about a millisecond alone, not a fixed
              count of launches (a decode step's worth), and a host whose other core stays busy soon runs alone
              most of the time, trying the workers again at most once every MAX_BACKOFF ticks
    mutex, condition variable: opaque, MUTEX_BYTES each (larger than any libc's)

Workers are Python threads that call `prepjit_worker(state)` through ctypes (which releases the GIL) and
never return: each spins on TICKET for a new generation for SPIN_TICKS of the cycle counter (read every
CLOCK_EVERY polls: a fixed count of polls lasts 10 us on one host and 50 on another), then sleeps on the condition
variable. A split launch that finds its workers asleep pays their wake (the broadcast and the scheduler putting
the worker back on a core: ~13 us on a 2-core Rocket Lake, a 576-column f32 matvec over 2048 rows split after an
idle gap) before the worker's first chunk; a worker that spins takes its core from the host's other processes (a
server's event loop and its clients, other programs), and from the publisher where they share a core. Spinning
about as long as a wake costs, then sleeping, never costs more than twice the better of the two, whether the
worker's core is free (spinning costs nothing, sleeping a wake) or shared (spinning takes the publisher's time).
Measured there (SmolLM2 decode steps, budgets alternating live in one process, 8 rounds): while the host's other
work left the process about one core (steps at twice their quiet time), 5-10 us was fastest and each step slower
with longer budgets (one-row gguf 11.6 ms at 10 us, 12.7 at 20, 14.0 at 40, 16.2 at 100; the paged step at B=1
11.1, 11.7, 12.7, 16.0; f32 36.2, 37.1, 37.9, 41.6); while it had both cores, longer budgets gained less (paged
B=1 5.97 ms at 12 us, 5.80 at 40, 5.76 at 100; f32 18.96, 18.77, 18.85; gguf 7.0, 6.2, 6.0 in noisier rounds).
1024 polls, the count used before, lasted 11.7 us there and take several times longer where a pause is slower.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import statistics
import threading
import time

TICKET, BUSY, SLEEPERS = 0, 8, 16
SLOTS = (24, 40)             # fn, bufs, vals, size, chunk, nchunks; its done count at +8
WORKERS, SPIN_TICKS, YIELD_AFTER, LOCK, UNLOCK, WAIT, BROADCAST, YIELD = range(56, 64)
COOLDOWN, STALL_CYCLES, BACKOFF, MIN_BACKOFF, MAX_BACKOFF = range(64, 69)
MUTEX, COND = 72, 104
STATE_WORDS = 136
MUTEX_BYTES = 256

WORKER_SPIN_S = 12e-6        # seconds an idle worker polls TICKET (with a pause) before it sleeps: about a wake's cost
CLOCK_EVERY = 32             # polls between reads of the cycle counter while a worker spins
CALIBRATION_S = 1e-3         # seconds of wall clock the cycle counter's rate is measured over,
CALIBRATION_ROUNDS = 5       # in this many rounds
WAIT_SPINS = 1 << 8          # polls of the done count before the publisher yields its core between polls
CHUNKS_PER_THREAD = 4        # chunks of a split range per thread: whoever runs takes the next
STALL = 1 << 18              # cycle-counter ticks (~0.1 ms) the publisher waits for a worker's chunk: a stall
AFTER_STALL = 1 << 21        # ticks (~1 ms) split launches run alone after a first stall (MIN_BACKOFF), doubling
MOST_AFTER_STALL = 1 << 26   # with each stall that follows up to ~25 ms (MAX_BACKOFF), halving with each clean launch

WORKER_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
CYCLES_FN = ctypes.CFUNCTYPE(ctypes.c_int64)
PARALLEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_int64, ctypes.c_int64)


def _pause(triple: str) -> tuple[str, str]:
    """(declaration, call) of the spin-wait hint of the target, or nothing."""
    if triple.startswith(("x86_64", "i686", "i386")):
        return "declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()"
    if triple.startswith(("aarch64", "arm64")):
        return "declare void @llvm.aarch64.hint(i32)", "call void @llvm.aarch64.hint(i32 1)"
    return "", ""


def _word(name: str, index) -> str:
    return f"  %{name} = getelementptr i64, ptr %s, i64 {index}"


def threads_ir(triple: str) -> str:
    """LLVM IR of prepjit_parallel and prepjit_worker for a target triple."""
    declare, pause = _pause(triple)
    fields = ("fn", "bufs", "vals", "size", "chunk", "n")
    read_slot = "\n".join(f"  %{f}.p = getelementptr i64, ptr %slot, i64 {i}\n"
                          f"  %{f}.i = load atomic i64, ptr %{f}.p monotonic, align 8" for i, f in enumerate(fields))
    write_slot = "\n".join(f"  %{f}.w = getelementptr i64, ptr %slot, i64 {i}\n"
                           f"  store atomic i64 %{v}, ptr %{f}.w monotonic, align 8"
                           for i, (f, v) in enumerate(zip(fields, ("fn.i", "bufs.i", "vals.i", "size", "chunk", "n"))))
    return f"""
{declare}

define internal void @pj_run_chunks(ptr %s) nounwind {{
entry:
  br label %claim
claim:
  %t = atomicrmw add ptr %s, i64 1 acq_rel
  %g = lshr i64 %t, 32
  %c = and i64 %t, 4294967295
  %k = and i64 %g, 1
  %k16 = mul i64 %k, 16
  %base = add i64 %k16, {SLOTS[0]}
  %slot = getelementptr i64, ptr %s, i64 %base
{read_slot}
  %more = icmp ult i64 %c, %n.i
  br i1 %more, label %run, label %out
run:
  %fn = inttoptr i64 %fn.i to ptr
  %bufs = inttoptr i64 %bufs.i to ptr
  %vals = inttoptr i64 %vals.i to ptr
  %lo = mul i64 %c, %chunk.i
  %hi.0 = add i64 %lo, %chunk.i
  %over = icmp ugt i64 %hi.0, %size.i
  %hi = select i1 %over, i64 %size.i, i64 %hi.0
  call void %fn(ptr %bufs, ptr %vals, i64 %lo, i64 %hi)
  %done.p = getelementptr i64, ptr %slot, i64 8
  %ignored = atomicrmw add ptr %done.p, i64 1 release
  br label %claim
out:
  ret void
}}

define internal void @pj_call(ptr %s, i64 %index, i64 %arg) nounwind {{
entry:
{_word("f.p", "%index")}
  %f.i = load atomic i64, ptr %f.p monotonic, align 8
  %f = inttoptr i64 %f.i to ptr
{_word("a.p", "%arg")}
  call i32 %f(ptr %a.p)
  ret void
}}

declare i64 @llvm.readcyclecounter()
declare i64 @llvm.umin.i64(i64, i64)
declare i64 @llvm.umax.i64(i64, i64)

define void @prepjit_parallel(ptr %s, ptr %fn, ptr %bufs, ptr %vals, i64 %size, i64 %chunks) nounwind {{
entry:
{_word("workers.p", WORKERS)}
  %workers = load atomic i64, ptr %workers.p monotonic, align 8
{_word("cool.p", COOLDOWN)}
  %cool = load atomic i64, ptr %cool.p monotonic, align 8
  %entered = call i64 @llvm.readcyclecounter()
  %warm = icmp uge i64 %entered, %cool
  br i1 %warm, label %check, label %inline
check:
  %has = icmp sgt i64 %workers, 0
  %split = icmp sgt i64 %chunks, 1
  %big = icmp sgt i64 %size, 1
  %try.0 = and i1 %has, %split
  %try = and i1 %try.0, %big
  br i1 %try, label %lock, label %inline
lock:
{_word("busy.p", BUSY)}
  %cx = cmpxchg ptr %busy.p, i64 0, i64 1 acquire monotonic
  %ok = extractvalue {{ i64, i1 }} %cx, 1
  br i1 %ok, label %publish, label %inline
inline:
  call void %fn(ptr %bufs, ptr %vals, i64 0, i64 %size)
  ret void
publish:
  %t = load atomic i64, ptr %s monotonic, align 8
  %g.0 = lshr i64 %t, 32
  %g = add i64 %g.0, 1
  %k = and i64 %g, 1
  %k16 = mul i64 %k, 16
  %base = add i64 %k16, {SLOTS[0]}
  %slot = getelementptr i64, ptr %s, i64 %base
  %fewer = icmp slt i64 %size, %chunks
  %parts = select i1 %fewer, i64 %size, i64 %chunks
  %parts.m1 = sub i64 %parts, 1
  %sum = add i64 %size, %parts.m1
  %chunk = udiv i64 %sum, %parts
  %chunk.m1 = sub i64 %chunk, 1
  %sum2 = add i64 %size, %chunk.m1
  %n = udiv i64 %sum2, %chunk
  %fn.i = ptrtoint ptr %fn to i64
  %bufs.i = ptrtoint ptr %bufs to i64
  %vals.i = ptrtoint ptr %vals to i64
{write_slot}
  %done.p = getelementptr i64, ptr %slot, i64 8
  store atomic i64 0, ptr %done.p monotonic, align 8
  %ticket = shl i64 %g, 32
  store atomic i64 %ticket, ptr %s seq_cst, align 8
{_word("sleepers.p", SLEEPERS)}
  %sleepers = load atomic i64, ptr %sleepers.p seq_cst, align 8
  %asleep = icmp sgt i64 %sleepers, 0
  br i1 %asleep, label %wake, label %work
wake:
  call void @pj_call(ptr %s, i64 {LOCK}, i64 {MUTEX})
  call void @pj_call(ptr %s, i64 {BROADCAST}, i64 {COND})
  call void @pj_call(ptr %s, i64 {UNLOCK}, i64 {MUTEX})
  br label %work
work:
  %begin = call i64 @llvm.readcyclecounter()
  call void @pj_run_chunks(ptr %s)
{_word("patience.p", YIELD_AFTER)}
  %patience = load atomic i64, ptr %patience.p monotonic, align 8
{_word("stall.p", STALL_CYCLES)}
  %stall.min = load atomic i64, ptr %stall.p monotonic, align 8
  %since = call i64 @llvm.readcyclecounter()
  %own = sub i64 %since, %begin
  %stall = add i64 %stall.min, %own
  br label %wait
wait:
  %spins = phi i64 [0, %work], [%spins.next, %idle], [%spins.next, %yield]
  %noted = phi i1 [false, %work], [%noted, %idle], [%noted.next, %yield]
  %done = load atomic i64, ptr %done.p acquire, align 8
  %finished = icmp uge i64 %done, %n
  br i1 %finished, label %exit, label %idle
idle:
  %spins.next = add i64 %spins, 1
  {pause}
  %impatient = icmp sgt i64 %spins, %patience
  br i1 %impatient, label %yield, label %wait
yield:
  call void @pj_call(ptr %s, i64 {YIELD}, i64 {0})
  %now = call i64 @llvm.readcyclecounter()
  %waited = sub i64 %now, %since
  %long = icmp ugt i64 %waited, %stall
  %noted.next = or i1 %noted, %long
  br label %wait
exit:
{_word("backoff.p", BACKOFF)}
  %backoff = load atomic i64, ptr %backoff.p monotonic, align 8
{_word("most.p", MAX_BACKOFF)}
  %most = load atomic i64, ptr %most.p monotonic, align 8
{_word("least.p", MIN_BACKOFF)}
  %least = load atomic i64, ptr %least.p monotonic, align 8
  %doubled = shl i64 %backoff, 1
  %longer = call i64 @llvm.umin.i64(i64 %doubled, i64 %most)
  %halved = lshr i64 %backoff, 1
  %shorter = call i64 @llvm.umax.i64(i64 %halved, i64 %least)
  %next = select i1 %noted, i64 %longer, i64 %shorter
  store atomic i64 %next, ptr %backoff.p monotonic, align 8
  br i1 %noted, label %slower, label %release
slower:
  %ended = call i64 @llvm.readcyclecounter()
  %until = add i64 %ended, %backoff
  store atomic i64 %until, ptr %cool.p monotonic, align 8
  br label %release
release:
  store atomic i64 0, ptr %busy.p release, align 8
  ret void
}}

define void @prepjit_worker(ptr %s) nounwind {{
entry:
{_word("spins.p", SPIN_TICKS)}
{_word("sleepers.p", SLEEPERS)}
{_word("m.p", MUTEX)}
{_word("c.p", COND)}
{_word("wait.p", WAIT)}
  %t0 = load atomic i64, ptr %s acquire, align 8
  %seen0 = lshr i64 %t0, 32
  br label %poll.start
poll.start:
  %seen = phi i64 [%seen0, %entry], [%g.run, %run]
  %budget = load atomic i64, ptr %spins.p monotonic, align 8
  %idle.since = call i64 @llvm.readcyclecounter()
  br label %poll
poll:
  %i = phi i64 [0, %poll.start], [%i.next, %spin], [%i.next, %clock]
  %t = load atomic i64, ptr %s acquire, align 8
  %g = lshr i64 %t, 32
  %new = icmp ne i64 %g, %seen
  br i1 %new, label %run, label %spin
spin:
  {pause}
  %i.next = add i64 %i, 1
  %lap = and i64 %i.next, {CLOCK_EVERY - 1}
  %on.lap = icmp eq i64 %lap, 0
  br i1 %on.lap, label %clock, label %poll
clock:
  %now = call i64 @llvm.readcyclecounter()
  %spun = sub i64 %now, %idle.since
  %tired = icmp uge i64 %spun, %budget
  br i1 %tired, label %sleep, label %poll
sleep:
  call void @pj_call(ptr %s, i64 {LOCK}, i64 {MUTEX})
  %a = atomicrmw add ptr %sleepers.p, i64 1 seq_cst
  br label %sleep.check
sleep.check:
  %t2 = load atomic i64, ptr %s seq_cst, align 8
  %g2 = lshr i64 %t2, 32
  %woke = icmp ne i64 %g2, %seen
  br i1 %woke, label %sleep.done, label %sleep.wait
sleep.wait:
  %wait.i = load atomic i64, ptr %wait.p monotonic, align 8
  %wait = inttoptr i64 %wait.i to ptr
  call i32 %wait(ptr %c.p, ptr %m.p)
  br label %sleep.check
sleep.done:
  %b = atomicrmw sub ptr %sleepers.p, i64 1 seq_cst
  call void @pj_call(ptr %s, i64 {UNLOCK}, i64 {MUTEX})
  br label %run
run:
  %g.run = phi i64 [%g, %poll], [%g2, %sleep.done]
  call void @pj_run_chunks(ptr %s)
  br label %poll.start
}}

define i64 @prepjit_cycles() nounwind {{
entry:
  %now = call i64 @llvm.readcyclecounter()
  ret i64 %now
}}
"""


def _libc_function(name: str) -> int | None:
    """The address of C function `name`: in this process's symbols, else libpthread's or libc's, looked up only then
    (find_library runs `ldconfig -p` in a subprocess: 14 of them made the cpu device's start 35 ms slower)."""
    for lib in (None, "pthread", "c"):
        try:
            return ctypes.cast(getattr(ctypes.CDLL(lib and ctypes.util.find_library(lib)), name), ctypes.c_void_p).value
        except (OSError, AttributeError, TypeError):
            continue
    return None


def cycles_per_second(cycles_address: int) -> float:
    """The rate of the cycle counter the native code reads (prepjit_cycles) against the wall clock: the median of
    CALIBRATION_ROUNDS short measurements (one the OS preempts between a pair of reads is off); 0 where the counter
    does not advance (a worker then sleeps at its first clock read)."""
    cycles, rates = CYCLES_FN(cycles_address), []
    for _ in range(CALIBRATION_ROUNDS):
        start, counted = time.perf_counter(), cycles()
        while (elapsed := time.perf_counter() - start) < CALIBRATION_S / CALIBRATION_ROUNDS:
            pass
        rates.append(max(cycles() - counted, 0) / elapsed)
    return statistics.median(rates)


class NativeThreads:
    """The state block and the worker threads; `parallel` is prepjit_parallel bound to this state (ctypes)."""

    def __init__(self, threads: int, parallel_address: int, worker_address: int, cycles_address: int):
        self.threads = threads
        self._memory = (ctypes.c_int64 * (STATE_WORDS + 8))()
        self.address = -(-ctypes.addressof(self._memory) // 64) * 64
        self.words = (ctypes.c_int64 * STATE_WORDS).from_address(self.address)
        names = {LOCK: "pthread_mutex_lock", UNLOCK: "pthread_mutex_unlock", WAIT: "pthread_cond_wait",
                 BROADCAST: "pthread_cond_broadcast", YIELD: "sched_yield"}
        addresses = {word: _libc_function(name) for word, name in names.items()}
        init_mutex, init_cond = _libc_function("pthread_mutex_init"), _libc_function("pthread_cond_init")
        self.parallel_address, self.worker_address = parallel_address, worker_address
        self.cycles_address = cycles_address
        self._parallel = PARALLEL_FN(parallel_address)
        self.workers = 0
        if threads < 2 or None in addresses.values() or not init_mutex or not init_cond:
            return  # no second thread, or no pthreads here: every kernel runs on the calling thread
        for word, address in addresses.items():
            self.words[word] = address
        self.cycles_per_second = cycles_per_second(cycles_address)
        self.words[SPIN_TICKS] = round(WORKER_SPIN_S * self.cycles_per_second)
        self.words[YIELD_AFTER] = WAIT_SPINS
        self.words[STALL_CYCLES], self.words[BACKOFF] = STALL, AFTER_STALL
        self.words[MIN_BACKOFF], self.words[MAX_BACKOFF] = AFTER_STALL, MOST_AFTER_STALL
        ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(init_mutex)(self.address + 8 * MUTEX, None)
        ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(init_cond)(self.address + 8 * COND, None)
        worker = self._worker = WORKER_FN(worker_address)
        for _ in range(threads - 1):
            threading.Thread(target=worker, args=(self.address,), daemon=True, name="prepjit-cpu").start()
        self.workers = self.words[WORKERS] = threads - 1
        if hasattr(os, "register_at_fork"):  # a forked child has none of the workers: run inline there
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self):
        self.workers = self.words[WORKERS] = 0

    def chunks(self, size: int, per_thread: int = CHUNKS_PER_THREAD) -> int:
        """Chunks to cut a split range of `size` iterations into, `per_thread` a thread at most."""
        return min(size, per_thread * (self.workers + 1)) if self.workers else 0

    def parallel(self, fn: int, bufs: int, vals: int, size: int, chunks: int):
        """fn over [0, size) in `chunks` slices over the threads (ctypes call: the GIL is released)."""
        self._parallel(self.address, fn, bufs, vals, size, chunks)
