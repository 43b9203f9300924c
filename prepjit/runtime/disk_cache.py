"""The disk cache: compiled kernels kept across processes under PREPJIT_CACHE_DIR.

An entry is one file named by a stable key: the sha256 of a canonical text dump of the kernel AST
(op, dtype, arg and sources by position; never `id`/`hash`, which differ per process), the device
name, its compiler identity and a fingerprint of prepjit's own source code (so an edited or
upgraded prepjit never reuses a kernel an older code generator produced). Files are written to a
temporary name in the same directory and renamed into place, so readers see a whole entry or none;
a checksum over the key and the payload rejects truncated, corrupt or misplaced files. Every failure (unreadable, corrupt, read-only or
missing directory) reads as a miss or a skipped write, never an error.
`PREPJIT_CACHE=0` turns reads and writes off. Entries are pickles: the cache directory must be as
trusted as the rest of the user's ~/.cache (pyopencl's and numba's caches make the same assumption).
"""
from __future__ import annotations

import enum
import hashlib
import os
import pathlib
import pickle
import tempfile

from ..uop import UOp
from ..uop.dtypes import DType

MAGIC = b"prepjit-kernel-cache-v1\n"
DIGEST_BYTES = 32
PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]
_code_fingerprint: str | None = None


def cache_dir() -> pathlib.Path | None:
    """The directory entries live in, or None when PREPJIT_CACHE=0 (read on every use)."""
    if os.environ.get("PREPJIT_CACHE", "1") == "0":
        return None
    root = os.environ.get("PREPJIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "prepjit")
    return pathlib.Path(root) / "kernels"


def code_fingerprint() -> str:
    """sha256 over prepjit's .py files (computed once per process)."""
    global _code_fingerprint
    if _code_fingerprint is None:
        digest = hashlib.sha256()
        for path in sorted(PACKAGE_ROOT.rglob("*.py")):
            digest.update(path.relative_to(PACKAGE_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
        _code_fingerprint = digest.hexdigest()
    return _code_fingerprint


class _Unsupported(Exception):
    """An AST arg with no canonical text: the kernel is simply not cached on disk."""


def _canonical_arg(arg) -> str:
    if arg is None:
        return "N"
    if isinstance(arg, bool):
        return "T" if arg else "F"
    if isinstance(arg, int):
        return f"i{arg}"
    if isinstance(arg, float):
        return f"f{arg.hex()}"  # exact, and tells -0.0 from 0.0
    if isinstance(arg, str):
        return "s" + repr(arg)
    if isinstance(arg, enum.Enum):
        return f"e{type(arg).__name__}.{arg.name}"
    if isinstance(arg, DType):
        return f"d{arg.name}"
    if isinstance(arg, (tuple, list)):
        return "(" + ",".join(_canonical_arg(a) for a in arg) + ")"
    raise _Unsupported(type(arg).__name__)


def canonical_dump(ast: UOp) -> str:
    """One line per node in topological order: op, dtype, canonical arg, source positions."""
    nodes = ast.toposort()
    position = {n: i for i, n in enumerate(nodes)}
    return "\n".join(f"{n.op.name} {n.dtype.name} {_canonical_arg(n.arg)} {[position[s] for s in n.src]}"
                     for n in nodes)


def kernel_key(ast: UOp, device_name: str, compiler_id: str) -> str | None:
    """The stable key of a kernel on a device, or None when its AST cannot be dumped canonically."""
    try:
        dump = canonical_dump(ast)
    except _Unsupported:
        return None
    text = "\n".join((MAGIC.decode().strip(), code_fingerprint(), device_name, compiler_id, dump))
    return hashlib.sha256(text.encode()).hexdigest()


def _checksum(key: str, payload: bytes) -> bytes:
    return hashlib.sha256(key.encode() + b"\0" + payload).digest()


def read(key: str):
    """The value stored under `key`, or None when there is none or it cannot be read back intact."""
    directory = cache_dir()
    if directory is None:
        return None
    try:
        data = (directory / key).read_bytes()
    except OSError:
        return None
    header = len(MAGIC) + DIGEST_BYTES
    payload = data[header:]
    if data[:len(MAGIC)] != MAGIC or data[len(MAGIC):header] != _checksum(key, payload):
        return None
    try:
        return pickle.loads(payload)
    except Exception:  # a checksummed payload from an incompatible build: treat as a miss
        return None


def write(key: str, value) -> bool:
    """Store `value` under `key` atomically; False (and nothing written) when the cache is off or unwritable."""
    directory = cache_dir()
    if directory is None:
        return False
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    temp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{key[:16]}-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + _checksum(key, payload) + payload)
        os.replace(temp, directory / key)
        return True
    except OSError:
        if temp is not None:
            try:
                os.unlink(temp)
            except OSError:
                pass
        return False
