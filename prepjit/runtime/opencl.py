"""The opencl device: OpenCL C kernels built and launched through pyopencl, buffers in device memory.

Picks a GPU when one is present, else the first device that builds a probe kernel (PoCL's CPU device from
PyPI runs on CPUs its LLVM knows; a distribution's PoCL covers newer ones); `PREPJIT_OPENCL_DEVICE` picks
one by index or by a substring of "platform device".
What prepjit keeps of a kernel (disk cache, saved plans) is the program binary, except on PoCL: fetching a PoCL
binary (CL_PROGRAM_BINARIES) compiles a generic work-group function of every kernel besides the one its first
launch specialises to the launch's sizes, which doubled the compiles of a first call. There prepjit keeps the
kernel's OpenCL C (trusted as a binary would be: disk_cache.py's rules) and PoCL's own cache (POCL_CACHE_DIR, keyed
by the preprocessed source, the options and the device) keeps what PoCL compiled: a later process rebuilds from
the source, which PoCL's cache serves in tens of ms a kernel (it preprocesses the source to find the entry; a
binary loads in a few ms), and its launches find their work-group functions there.
Each PreparedKernel gets its own `cl.Kernel` with every argument set once; replay only patches
var values and I/O buffers and enqueues it. Results stay on the device until read.

Threads: every call into the OpenCL runtime that sets a kernel argument, queues a command, allocates, builds a
program, creates a kernel or releases an event this device holds is made under the device's lock
(`DeviceBase.lock`); only a synchronize's wait (clFinish) happens outside it, so a thread waiting for its launches
never keeps another from queuing. OpenCL allows concurrent calls except on one kernel object, but NVIDIA's runtime
has crashed and hung on concurrent calls that the standard allows, and an uncontended lock costs well under a
microsecond (a build holds it for the build: a thread preparing a new signature delays other threads' launches,
never interleaves with them). A download is a blocking read made under the lock: a non-blocking read into pageable
host memory would leave the runtime host-side work (its staging copy into the array) for after the call, beside
other threads' calls. (The wrong values replays under threads once gave on NVIDIA's runtime were not the threads':
its compiler contracted a * b + c, which render_opencl.py now forbids.) A kernel object is never shared: each
launcher owns its own, and a plan's launches run under the plan's lock (plan.py).
Each thread keeps the events of its own uploads until it synchronises, so one call never waits for, or
drops, another thread's copies.
"""
from __future__ import annotations

import os
import re
import threading
import warnings

import numpy as np

from ..errors import CompileError, DeviceError
from .device_base import BufferSlots, DeviceBase
from .launch_steps import KernelStep

INSTALL_HINT = ("pip install 'prepjit[opencl]' (pyopencl and pocl-binary-distribution, a CPU OpenCL platform), "
                "or install your GPU vendor's OpenCL driver")
ELEMENTWISE_GROUP = 128   # work-group size of kernels that do not require one
_PROBE = "__kernel void pj_probe(__global int *a) { a[0] = 1; }"


def _import_pyopencl():
    try:
        import pyopencl
        import pyopencl.tools  # noqa: F401  (MemoryPool)
    except ImportError as e:
        raise DeviceError(f"device 'opencl' needs pyopencl, which failed to import ({e}); {INSTALL_HINT}") from e
    return pyopencl


def candidate_devices(cl, spec: str | None) -> list:
    """The OpenCL devices to try, in order: the one `spec` names (an index or a name substring), else every
    GPU, then every other device."""
    try:
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as e:
        raise DeviceError(f"no OpenCL platform found ({e}); {INSTALL_HINT}") from e
    if not devices:
        raise DeviceError(f"no OpenCL platform with a device found; {INSTALL_HINT}")
    names = [f"{d.platform.name} {d.name}" for d in devices]
    if spec:
        if spec.strip().isdigit() and int(spec) < len(devices):
            return [devices[int(spec)]]
        for d, name in zip(devices, names):
            if spec.lower() in name.lower():
                return [d]
        listing = "; ".join(f"{i}: {n}" for i, n in enumerate(names))
        raise DeviceError(f"PREPJIT_OPENCL_DEVICE={spec!r} matches no OpenCL device (found {listing})")
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    return gpus + [d for d in devices if d not in gpus]


def _built(cl, program, **options):
    """`program` built, without pyopencl's CompilerWarning for a non-empty build log (NVIDIA's compiler logs for
    every kernel: a user would get a warning at every compile); a failed build still raises with its log."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cl.CompilerWarning)
        return program.build(**options)


def _start(cl, device, build_options) -> tuple:
    """(context, queue) of `device` once it has built and can run a probe kernel, else DeviceError: a platform
    that builds nothing (a PoCL whose compiler does not know the host CPU, say) is no device."""
    description = f"{device.platform.name} / {device.name}"
    try:
        context = cl.Context([device])
        queue = cl.CommandQueue(context, device)
    except cl.Error as e:
        raise DeviceError(f"the OpenCL device {description} failed to start ({e})") from e
    try:
        _built(cl, cl.Program(context, _PROBE), options=build_options, cache_dir=False)
    except cl.Error as e:
        lines = str(e).strip().splitlines()
        reason = next((line.strip() for line in lines if line.strip().startswith("error:")), lines[0])
        raise DeviceError(f"the OpenCL device {description} cannot build kernels ({reason}; where PyPI's PoCL does "
                          "not know the CPU, a distribution's may: apt-get install pocl-opencl-icd)") from e
    return context, queue


def binary_fetch_compiles(device) -> bool:
    """Whether fetching a built program's binary compiles its kernels again on `device`'s platform (PoCL, any of
    its drivers: its CL_PROGRAM_BINARIES builds every kernel's generic work-group function), so that prepjit
    keeps the source instead (the module's docstring)."""
    return device.platform.name == "Portable Computing Language"


class BuiltSource(bytes):
    """A kernel's kept code where it is its OpenCL C (SOURCE_TAG + the source), still holding the program `compile`
    built from it, so that the `load` that follows in this process builds nothing again."""

    program = None


SOURCE_TAG = b"\0prepjit-opencl-c\0"   # starts kept code that is OpenCL C (no platform's binary starts so)


def _build_options(cl, device) -> list[str]:
    exact = device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT
    return ["-cl-fp32-correctly-rounded-divide-sqrt"] if exact else []


class OpenCLProgram:
    """A built program, the name of its kernel and the work-group size its launches use."""

    def __init__(self, program, name: str, local_size: int):
        self.program, self.name, self.local_size = program, name, local_size


class OpenCLLauncher(KernelStep):
    """One PreparedKernel's own `cl.Kernel`, arguments set once; replay patches slots and enqueues, each call
    under the device's lock."""

    def __init__(self, cl, device, program: OpenCLProgram, buffer_handles, vals, size_fn, static_size):
        self.enqueue, self.queue, self.lock = cl.enqueue_nd_range_kernel, device.queue, device.lock
        self.n_bufs, self.vals = len(buffer_handles), list(vals)
        with self.lock:
            self.kernel = cl.Kernel(program.program, program.name)
            self.buffer_ptrs = BufferSlots(buffer_handles, self._bind_buffer, device._address)  # (the PreparedKernel's buffer_ptrs)
            for slot, value in enumerate(self.vals):
                self.kernel.set_arg(self.n_bufs + slot, np.int64(value))
        self.local = (program.local_size,)
        self.size_fn, self.static_size = size_fn, static_size

    def _bind_buffer(self, slot: int, handle):
        with self.lock:
            self.kernel.set_arg(slot, handle)

    def set_val(self, slot: int, value: int):
        if self.vals[slot] != value:
            self.vals[slot] = value
            with self.lock:
                self.kernel.set_arg(self.n_bufs + slot, np.int64(value))

    def run(self):
        """Enqueue the kernel over its live size rounded up to whole work-groups; an empty launch (size 0, a
        zero-length var) is not enqueued: OpenCL 1.2 rejects a zero global size, and it would do nothing."""
        size = self.static_size if self.static_size is not None else self.size_fn(self.vals)[0]
        if size > 0:
            group = self.local[0]
            with self.lock:
                self.enqueue(self.queue, self.kernel, (-(-size // group) * group,), self.local)


# what a kernel asks an OpenCL extension for (render_opencl.py's pragmas; float16 needs none: it is stored through
# the core vstore_half_rte, read as its bits and computed in float)
EXTENSION_USES = {"cl_khr_fp64": "float64", "cl_khr_int64_base_atomics": "int64 atomics"}


class OpenCLDevice(DeviceBase):
    """Builds OpenCL C with pyopencl for one device and keeps results in its memory."""

    name = "opencl"
    language = "opencl"   # the kernels it runs (codegen/targets.py: their target)

    def __init__(self):
        super().__init__()
        cl = self.cl = _import_pyopencl()
        failures = []
        for device in candidate_devices(cl, os.environ.get("PREPJIT_OPENCL_DEVICE")):
            options = _build_options(cl, device)
            try:
                self.context, self.queue = _start(cl, device, options)
                break
            except DeviceError as e:
                failures.append(str(e))
        else:
            raise DeviceError(f"{'; '.join(failures)}; {INSTALL_HINT}")
        self.device, self.build_options = device, options
        self.keeps_source = binary_fetch_compiles(device)
        self._uploads = threading.local()   # .events: this thread's copies from the host not yet waited for
        self.pool = cl.tools.MemoryPool(cl.tools.ImmediateAllocator(self.queue))
        platform = device.platform
        self.description = f"{platform.name} / {device.name}"
        self.compiler_id = (f"opencl-{platform.name}-{platform.version}-{device.name}-"
                            f"{device.driver_version}-pyopencl-{cl.VERSION_TEXT}")
        self.extensions = set(device.extensions.split())

    # ---- compiling and launching ----
    def compile(self, name: str, source: str) -> bytes:
        """OpenCL C -> the code prepjit keeps of the kernel (the expensive step; `load` makes it launchable): the
        program binary, or where fetching that compiles again (PoCL) the source as BuiltSource.
        pyopencl's own binary cache is off: prepjit's disk cache (disk_cache.py) keeps this code."""
        cl = self.cl
        missing = [ext for ext in re.findall(r"#pragma OPENCL EXTENSION (\w+) : enable", source)
                   if ext not in self.extensions]
        if missing:
            needs = " and ".join(f"{EXTENSION_USES.get(ext, ext)} ({ext})" for ext in missing)
            raise DeviceError(f"kernel {name} needs {needs}, which the OpenCL device {self.description} does not "
                              f"support; run this signature on another device (device='cpu') or another dtype")
        try:
            with self.lock:
                program = _built(cl, cl.Program(self.context, source), options=self.build_options,
                                 cache_dir=False)
                required, most = self._group_sizes(cl.Kernel(program, name))
                if self.keeps_source:
                    code = BuiltSource(SOURCE_TAG + source.encode())
                    code.program = program
                else:
                    code = bytes(program.get_info(cl.program_info.BINARIES)[0])
                del program   # (its release, clReleaseProgram, under the lock too, unless `code` holds it)
        except cl.Error as e:
            raise CompileError(f"OpenCL ({self.description}) failed to build kernel {name}: {e}\n"
                               f"--- source ---\n{source}") from e
        if required > most:
            raise CompileError(f"kernel {name} needs work-groups of {required} work-items; the OpenCL device "
                               f"{self.description} allows at most {most} for it\n--- source ---\n{source}")
        return code

    def load(self, name: str, code: bytes) -> OpenCLProgram:
        """Kept code from `compile` (this process's, the disk cache's or a saved plan's) -> kernel `name`, ready to
        launch: the program `compile` built, else one built from the source or the binary."""
        cl = self.cl
        try:
            with self.lock:
                program = getattr(code, "program", None)
                if program is None and code.startswith(SOURCE_TAG):
                    program = _built(cl, cl.Program(self.context, code[len(SOURCE_TAG):].decode()),
                                     options=self.build_options, cache_dir=False)
                elif program is None:
                    program = _built(cl, cl.Program(self.context, [self.device], [code]),
                                     options=self.build_options)
                required, most = self._group_sizes(cl.Kernel(program, name))
        except (cl.Error, UnicodeDecodeError) as e:
            raise CompileError(f"OpenCL ({self.description}) failed to load the code of kernel {name}: {e}") from e
        return OpenCLProgram(program, name, required or min(ELEMENTWISE_GROUP, most))

    def _group_sizes(self, kernel) -> tuple[int, int]:
        """(the work-group size the kernel requires or 0, the most the device allows for it)."""
        info = self.cl.kernel_work_group_info
        return (kernel.get_work_group_info(info.COMPILE_WORK_GROUP_SIZE, self.device)[0],
                kernel.get_work_group_info(info.WORK_GROUP_SIZE, self.device))

    def launcher(self, program: OpenCLProgram, buffer_handles, vals, size_fn, static_size) -> OpenCLLauncher:
        return OpenCLLauncher(self.cl, self, program, buffer_handles, vals, size_fn, static_size)

    # ---- memory (DeviceBase's primitives) ----
    def _alloc(self, nbytes: int):
        most = self.device.max_mem_alloc_size
        if nbytes > most:  # (pyopencl says INVALID_BUFFER_SIZE, or a TypeError past size_t)
            raise MemoryError(f"cannot allocate {nbytes} bytes on {self.description}: it allocates at most {most}")
        with self.lock:
            return self.cl.Buffer(self.context, self.cl.mem_flags.READ_WRITE, nbytes)

    def _pool_alloc(self, nbytes: int):
        return self.pool.allocate(nbytes)   # (under the lock: DeviceBase._pooled; it may queue a migration)

    def _address(self, memory) -> int:
        return memory.int_ptr

    def arg(self, memory):
        return memory

    def _upload(self, memory, host: np.ndarray):
        """In queue order, not waited for: pyopencl's event keeps `host` alive and, dropped, would wait for the
        copy, so it is kept until this thread's next `synchronize` (the copies overlap the launches queued after
        them)."""
        with self.lock:
            event = self.cl.enqueue_copy(self.queue, memory, host, is_blocking=False)
        self.upload_events().append(event)

    def upload_events(self) -> list:
        """The calling thread's uploads not yet waited for (their events)."""
        events = getattr(self._uploads, "events", None)
        if events is None:
            events = self._uploads.events = []
        return events

    def _download(self, host: np.ndarray, memory):
        """Blocking, under the lock (the module's docstring says why): `host` is filled when it returns."""
        with self.lock:
            self.cl.enqueue_copy(self.queue, host, memory, is_blocking=True)

    def _copy(self, dst, src, nbytes: int):
        with self.lock:
            self.cl.enqueue_copy(self.queue, dst, src, byte_count=nbytes)

    def synchronize(self):
        """Wait for everything queued so far (clFinish, a wait: outside the lock), then let go of this thread's
        upload events (their release under the lock). With `before_wait` set, the queue is flushed (its work
        submitted) and before_wait called first."""
        if self.before_wait is not None:
            self.queue.flush()
            self.before_wait()
        self.queue.finish()
        events = self.upload_events()
        if events:
            with self.lock:
                events.clear()
