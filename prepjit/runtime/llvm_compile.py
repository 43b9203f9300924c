"""LLVM IR -> object code for one target machine: the cpu device's pure compile step, and its worker process.

It imports only the standard library and llvmlite, so it also runs as a compile worker
(`python -I llvm_compile.py TARGET_OPTIONS_JSON LLVMLITE_PARENT_DIR`, started by compile_pool.py):
the worker builds the same target machine as its parent from the options (triple, cpu, features,
opt, reloc, codemodel), then answers requests on stdin/stdout until stdin closes. A request is
REQUEST (the source length) + LLVM IR in UTF-8; a reply is REPLY (status, length) + the object code
(OK) or an error message (LLVM_ERROR: the text of LLVM's RuntimeError; OTHER_ERROR).
"""
from __future__ import annotations

import json
import os
import signal
import struct
import sys

REQUEST = struct.Struct("<Q")
REPLY = struct.Struct("<BQ")
OK, LLVM_ERROR, OTHER_ERROR = 0, 1, 2


def target_machine(llvm, options: dict):
    """A target machine for `options` (llvmlite's native target and asm printer must be initialised)."""
    return llvm.Target.from_triple(options["triple"]).create_target_machine(
        cpu=options["cpu"], features=options["features"], opt=options["opt"], reloc=options["reloc"],
        codemodel=options["codemodel"])


def compile_object(llvm, machine, source: str) -> bytes:
    """`source` optimised (optimised_module) and emitted as object code."""
    return bytes(machine.emit_object(optimised_module(llvm, machine, source)))


def optimised_module(llvm, machine, source: str):
    """Parse, verify and optimise (-O2 with loop and SLP vectorisation) `source` for `machine`: the module a kernel's
    object code is emitted from. Raises LLVM's RuntimeError for IR it rejects. Not thread-safe: callers serialise calls.

    -O2, not -O3: a kernel is one function whose loops the AST passes already blocked and vectorised, and -O3's
    extra passes cost compile time without faster code. SmolLM2's 38 kernels (both plans) compiled in 1.54 s at
    -O3 and 1.11 s at -O2 (in one process, warm); their run times at -O2 were those of -O3 within noise (decode
    step kernels 9.2-9.4 ms, a 100-token prefill 194-207 ms vs 196-211, tanh(a @ b) 1024^2 34.8-35.0 ms)."""
    module = llvm.parse_assembly(source)
    module.triple = machine.triple
    module.data_layout = str(machine.target_data)
    module.verify()
    options = llvm.create_pipeline_tuning_options(speed_level=2)
    options.loop_vectorization = True
    options.slp_vectorization = True
    builder = llvm.create_pass_builder(machine, options)
    builder.getModulePassManager().run(module, builder)
    return module


def read_exact(stream, size: int) -> bytes | None:
    """`size` bytes from `stream`, or None at end of stream."""
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def serve(options: dict):
    """The worker loop: compile each request on stdin, reply on the original stdout (fd 1 then points to stderr,
    so nothing LLVM or Python prints can corrupt the replies). Ctrl-C is the parent's to handle; a parent gone
    before reading its reply (a process that created the cpu device and ended before using it: compile_pool's
    CompileAside) ends the worker quietly."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = target_machine(llvm, options)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while (header := read_exact(requests, REQUEST.size)) is not None:
        source = read_exact(requests, REQUEST.unpack(header)[0])
        if source is None:
            return
        try:
            status, out = OK, compile_object(llvm, machine, source.decode())
        except RuntimeError as e:
            status, out = LLVM_ERROR, str(e).encode()
        except Exception as e:  # reported to the parent, which raises it with the kernel's source
            status, out = OTHER_ERROR, f"{type(e).__name__}: {e}".encode()
        try:
            replies.write(REPLY.pack(status, len(out)) + out)
            replies.flush()
        except BrokenPipeError:
            os._exit(0)  # (not a return: closing `replies` would flush what the pipe refused, and print its error)


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[2])
    serve(json.loads(sys.argv[1]))
