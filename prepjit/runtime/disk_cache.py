"""The disk cache: compiled kernels (and other costly results) kept across processes under PREPJIT_CACHE_DIR.

Records of one kind live in their own directory (`kernels/` for compiled kernels); `record_key`
makes a stable key for any other kind, such as a tuning winner or a bounds proof, which then gets
the same storage and the same trust rules through `read_record` / `write_record`.

An entry is one file named by a stable key: the sha256 of the kernel AST before optimisation (in the
canonical data form of uop/serial.py, never `id`/`hash`, which differ per process), the device name,
its compiler identity and a fingerprint of prepjit's own source code (so an edited or upgraded
prepjit never reuses a kernel an older code generator produced). A hit therefore skips optimising,
rendering and compiling. Entries are data files (datafile.py: JSON metadata, the binary, a checksum
bound to the key), never pickles.

The cache is a trust boundary, since it holds native code that will run: a directory that is not
owned by this user or is writable by group or others is refused (warned once; prepare then runs
without the disk cache); directories are created 0700 and entries 0600; only regular files of
this user up to MAX_ENTRY_BYTES are read (a symlink, FIFO or device is a miss, read without
blocking). Entries are written to a temporary name and renamed into place, so readers see a
whole entry or none. Every other failure (unreadable, corrupt, truncated, read-only or missing
directory) is a miss or a skipped write; a rebuilt entry replaces the bad one.
`PREPJIT_CACHE=0` turns reads and writes off.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import stat
import warnings

from ..uop import Ops, UOp, serial
from . import datafile

VERSION = 1
MAX_ENTRY_BYTES = 256 << 20
PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_HEX = frozenset("0123456789abcdef")
_code_fingerprint: str | None = None
_refused: set[str] = set()  # directories already warned about in this process


def cache_root() -> pathlib.Path | None:
    """PREPJIT_CACHE_DIR (default ~/.cache/prepjit), or None when PREPJIT_CACHE=0 (read on every use) or off
    POSIX (the trust checks need file owners, modes and directory fds)."""
    if os.environ.get("PREPJIT_CACHE", "1") == "0" or os.name != "posix":
        return None
    root = os.environ.get("PREPJIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "prepjit")
    return pathlib.Path(root)


def code_fingerprint() -> str:
    """sha256 over prepjit's .py files (computed once per process)."""
    global _code_fingerprint
    if _code_fingerprint is None:
        digest = hashlib.sha256()
        for path in sorted(PACKAGE_ROOT.rglob("*.py")):
            digest.update(path.relative_to(PACKAGE_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
        _code_fingerprint = digest.hexdigest()
    return _code_fingerprint


def record_key(*parts: str) -> str:
    """A stable key for a record described by `parts`, which also names this format version and prepjit's code."""
    text = "\n".join((f"prepjit-v{VERSION}", code_fingerprint(), *parts))
    return hashlib.sha256(text.encode()).hexdigest()


def kernel_key(ast: UOp, device_name: str, compiler_id: str) -> str | None:
    """The stable key of a kernel on a device, or None when its AST has no data form (it is then not cached)."""
    try:
        graph = json.dumps(serial.to_data((ast,)), separators=(",", ":"))
    except ValueError:
        return None
    return record_key("kernel", device_name, compiler_id, graph)


def _private(fd: int, path) -> bool:
    """Whether the open directory `fd` is this user's and writable by nobody else; warns (once) if not."""
    info = os.fstat(fd)
    if info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return True
    if str(path) not in _refused:
        _refused.add(str(path))
        warnings.warn(f"prepjit: not using the disk cache in {path}: it is "
                      f"{'not owned by this user' if info.st_uid != os.geteuid() else 'writable by group or others'} "
                      f"(mode {stat.filemode(info.st_mode)}); compiled kernels are native code, so the cache must be "
                      f"private: `chmod 700 {path}` or point PREPJIT_CACHE_DIR elsewhere", RuntimeWarning, stacklevel=2)
    return False


def _open_entries(kind: str) -> int | None:
    """An fd of the private directory of `kind` records (made 0700 if missing), or None: cache off, unusable
    or refused."""
    root = cache_root()
    if root is None:
        return None
    fds = []
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
        fds.append(os.open(root, _DIR_FLAGS))
        if not _private(fds[0], root):
            return None
        try:
            os.mkdir(f"{kind}s", 0o700, dir_fd=fds[0])
        except FileExistsError:
            pass
        fds.append(os.open(f"{kind}s", _DIR_FLAGS | getattr(os, "O_NOFOLLOW", 0), dir_fd=fds[0]))
        if not _private(fds[1], root / f"{kind}s"):
            return None
        return fds.pop()
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)


def _valid(kind: str, key: str) -> bool:
    return len(key) == 64 and set(key) <= _HEX and kind.isascii() and kind.isalpha() and 0 < len(kind) <= 8


def read_record(kind: str, key: str) -> tuple[dict, bytes] | None:
    """(metadata, payload) of the `kind` record under `key` (64 hex digits), or None when there is none or it
    cannot be read back intact. Kinds (short lowercase words) are separate stores: "kernel" holds compiled
    kernels; others suit any result that is costly to recompute and safe to keep, such as a tuning winner."""
    if not _valid(kind, key):
        return None
    fd = _open_entries(kind)
    if fd is None:
        return None
    try:
        return datafile.unpack(datafile.read_regular(key, MAX_ENTRY_BYTES, dir_fd=fd), kind.encode(), VERSION,
                               key.encode())
    except (OSError, MemoryError, ValueError):  # FormatError is a ValueError
        return None
    finally:
        os.close(fd)


def write_record(kind: str, key: str, meta: dict, payload: bytes = b"") -> bool:
    """Store a `kind` record (JSON-able `meta`, raw `payload`) under `key`, atomically; False (and nothing
    written) when the cache is off, refused or unwritable, or `meta` is not JSON data."""
    if not _valid(kind, key):
        return False
    try:
        data = datafile.pack(kind.encode(), VERSION, meta, payload, key.encode())
    except (ValueError, TypeError):
        return False
    fd = _open_entries(kind)
    if fd is None:
        return False
    temp = f".{key[:16]}-{os.urandom(8).hex()}.tmp"
    try:
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                      | getattr(os, "O_CLOEXEC", 0), 0o600, dir_fd=fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
        finally:
            os.close(out)
        os.replace(temp, key, src_dir_fd=fd, dst_dir_fd=fd)
        return True
    except OSError:
        try:
            os.unlink(temp, dir_fd=fd)
        except OSError:
            pass
        return False
    finally:
        os.close(fd)


def read(key: str) -> tuple[dict, bytes] | None:
    """(kernel fields, binary) stored under `key`, or None when there is none or it cannot be read back intact.
    The fields are CachedKernel's name, source, var_names, global_size (UOps), local_size and ast (the kernel
    as launched, so a hit needs no optimisation to know it)."""
    record = read_record("kernel", key)
    if record is None:
        return None
    meta, binary = record
    try:
        fields = {"name": meta.get("name"), "source": meta.get("source"), "var_names": meta.get("var_names"),
                  "global_size": serial.from_data(meta.get("global_size")), "local_size": meta.get("local_size"),
                  "ast": serial.from_data(meta.get("ast"))}
    except (ValueError, RecursionError):
        return None
    if len(fields["ast"]) != 1 or fields["ast"][0].op is not Ops.SINK:
        return None
    fields["ast"] = fields["ast"][0]
    if not (isinstance(fields["name"], str) and isinstance(fields["source"], str)
            and isinstance(fields["var_names"], list) and all(isinstance(n, str) for n in fields["var_names"])
            and isinstance(fields["local_size"], list) and all(type(n) is int for n in fields["local_size"])):
        return None
    fields["var_names"], fields["local_size"] = tuple(fields["var_names"]), tuple(fields["local_size"])
    return fields, binary


def write(key: str, fields: dict, binary: bytes) -> bool:
    """Store a kernel's fields (as `read` returns them) and binary under `key`; False when not written."""
    try:
        meta = {**fields, "global_size": serial.to_data(tuple(fields["global_size"])),
                "ast": serial.to_data((fields["ast"],))}
    except ValueError:
        return False
    return write_record("kernel", key, meta, binary)
