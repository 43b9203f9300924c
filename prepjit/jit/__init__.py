"""The call layer: `pj.prepare` and the prepared function (reading a call's signature, tracing, planning,
replaying), saved plans, the profiler and the prepare-time tuner. It builds on tracing/, codegen/ and runtime/."""
