"""The entry points of the call layer: `pj.prepare` (a PreparedFunction, or a MultiDeviceFunction for several
devices), `pj.trace` (the traced graph without compiling) and `pj.profile` (one call, kernel by kernel)."""
from __future__ import annotations

import functools

from ..distributed.multi_device import MultiDeviceFunction
from ..tracing.core import Traced
from .function import PreparedFunction
from .profiler import Profile, timed_call


def prepare(fn=None, *, vars=None, shapes=None, device=None, static_argnums=(), static_argnames=(), devices=None,
            split=None, donate_argnums=(), donate_argnames=()):
    """Prepare `fn` for replay: trace it once per signature, compile its kernels once, replay the plan after.

    Use as `@pj.prepare`, `@pj.prepare(vars=..., shapes=..., device=...)` or `pj.prepare(fn, ...)`::

        @pj.prepare(vars={"n": (1, 1024), "pos": (0, 511)}, shapes={"x": ("n", 64)})
        def f(x, w, pos):
            return pnp.tanh(x @ w)[:, :pos + 1]

    vars: symbolic ints, {name: (min, max)} with inclusive bounds (or pj.Var objects). Intermediate
        buffers are sized for the maxima; every value is checked against its bounds before anything runs.
    shapes: per array parameter, one spec per dim: an int (static, checked), a var name or pj.Var
        (symbolic: the call's size is the var's value), or None (static, any size); a tuple or a string
        like "n, 64"; a pytree parameter takes a pytree of specs. Unnamed parameters are fully static.
        A parameter named in `vars` but not in `shapes` is a scalar var: the caller passes an int.
    device: "cpu" (LLVM, the default), "opencl", "cuda" or "cuda:N"; None reads PREPJIT_DEVICE.
    static_argnums / static_argnames: parameters (by position or name, as in jax.jit) whose whole value is
        static even when it is array-like (a NumPy scalar, an object with __array__): it must be hashable,
        a new value traces a new plan, and `fn` sees the value itself.
    donate_argnums / donate_argnames: parameters (as jax.jit's) whose pj.Arrays a call may reuse for its
        results: an output of the same dtype and shape that the plan can write in place (a KV cache updated
        with .at[pos].set) goes into the donated array's memory, and that array is deleted (pj.DeletedArrayError,
        a RuntimeError, on use); not while a NumPy view of it lives. NumPy arguments are never written.
    devices, split: several devices (["cuda:0", "cuda:1"], or "cpu" once per replica) run one replica each,
        data parallel: the arguments named in split={"x": 0} are cut along that axis, the others replicated;
        pj.psum / pj.pmean / pj.all_gather / pj.device_index talk across the replicas (docs/devices.md).

    The signature of a call is its pytree structure, static values (non-array arguments), static dims,
    dtypes and device. The first call with a signature runs `fn` on traced arrays (write it with
    `prepjit.numpy`) and prepares a pj.ExecutionPlan; later calls replay it without running `fn` or
    compiling. Results are fresh pj.Arrays in `fn`'s output pytree; inputs are never written (but donated
    pj.Arrays); calls may come from several threads. Errors: pj.VarBoundError (a var out of bounds),
    pj.SignatureError (arguments that contradict `shapes` or disagree on a var), pj.IndexBoundError (an index
    or gather id out of range for this call), pj.TraceError (untraceable code such as `if x.sum() > 0`),
    pj.DeviceError, pj.CompileError; after one, the function keeps working.

    The prepared function also has `.stats` (traces, compiles, disk_hits, replays, plans, ...), `.plan(*args)`
    (the ExecutionPlan, prepared without running) and `.trace(*args)`; see pj.profile for per-kernel
    timing, and docs/ in the prepjit repository for the full reference.
    """
    options = dict(vars=vars, shapes=shapes, device=device, static_argnums=static_argnums,
                   static_argnames=static_argnames)
    make = functools.partial(PreparedFunction, donate_argnums=donate_argnums, donate_argnames=donate_argnames,
                             hint_retraces=True)
    if devices is not None or split is not None:
        if devices is None or device is not None:
            raise ValueError("split= goes with devices=[...] (several devices), and devices= replaces device=")
        if donate_argnums != () or donate_argnames != ():
            raise ValueError("donate_argnums / donate_argnames are not supported with devices= yet")
        del options["device"]
        make = functools.partial(MultiDeviceFunction, devices=devices, split=split)
    if fn is None:
        return lambda f: make(f, **options)
    return make(fn, **options)


def trace(fn, *args, **kwargs) -> Traced:
    """The traced UOp graph of `fn` (a prepared function, or any function with static shapes) on these arguments."""
    prepared = fn if isinstance(fn, PreparedFunction) else PreparedFunction(fn)
    return prepared.trace(*args, **kwargs)


def profile(f, *args, **kwargs) -> Profile:
    """Run `f(*args, **kwargs)` (preparing it first if needed) one kernel at a time, each waited for and
    timed, and return the Profile. `f` is a prepared function; a plain one is prepared with static shapes."""
    f = f if isinstance(f, PreparedFunction) else PreparedFunction(f)
    info = f.signature.read(args, kwargs)
    return timed_call(f, f._entry(info), info)[1]
