"""prepjit's data file format (disk cache entries; saved plans), and reading such files safely.

A file is a fixed header, a JSON metadata block, a raw binary payload and a checksum:

    b"PREPJIT\\0" | kind (8 bytes, NUL-padded) | version (u32) | metadata length (u64) | payload length (u64)
    | metadata (UTF-8 JSON object) | payload | sha256(bind + everything before it)

Nothing in it is ever executed or unpickled: metadata is parsed as JSON and checked by the reader.
`bind` ties a file to where it belongs (a cache entry binds its key, so an intact entry copied
under another key is rejected). The checksum detects truncation and corruption; it is not a
signature, so files must come from a directory only their owner can write (disk_cache.py checks).
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct

MAGIC = b"PREPJIT\0"
_HEADER = struct.Struct("<8s8sIQQ")
_DIGEST = 32
# open flags for reading: never follow a symlink, never block on a FIFO or device
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class FormatError(ValueError):
    """Bytes that are not an intact file of the expected kind and version."""


def pack(kind: bytes, version: int, meta: dict, payload: bytes, bind: bytes = b"") -> bytes:
    text = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
    body = _HEADER.pack(MAGIC, kind, version, len(text), len(payload)) + text + payload
    return body + hashlib.sha256(bind + body).digest()


def unpack(data: bytes, kind: bytes, version: int, bind: bytes = b"") -> tuple[dict, bytes]:
    """(metadata, payload) of a file packed with the same kind, version and bind; FormatError otherwise."""
    if len(data) < _HEADER.size + _DIGEST:
        raise FormatError("too short for a prepjit file")
    magic, file_kind, file_version, meta_len, payload_len = _HEADER.unpack_from(data)
    if magic != MAGIC or file_kind != kind.ljust(8, b"\0"):
        raise FormatError(f"not a prepjit {kind.decode()} file")
    if file_version != version:
        raise FormatError(f"format version {file_version}, this prepjit reads version {version}")
    if len(data) != _HEADER.size + meta_len + payload_len + _DIGEST:
        raise FormatError("truncated or extended")
    if hashlib.sha256(bind + data[:-_DIGEST]).digest() != data[-_DIGEST:]:
        raise FormatError("checksum mismatch (corrupt, or not the file it claims to be)")
    try:
        meta = json.loads(data[_HEADER.size:_HEADER.size + meta_len].decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FormatError(f"unreadable metadata: {e}") from None
    if not isinstance(meta, dict):
        raise FormatError("metadata is not a JSON object")
    return meta, data[_HEADER.size + meta_len:-_DIGEST]


def read_regular(name, max_bytes: int, dir_fd: int | None = None) -> bytes:
    """The bytes of regular file `name` (relative to `dir_fd` if given) owned by this user; OSError for a
    symlink, FIFO, device, another user's file or one larger than `max_bytes` (nothing is read from those)."""
    fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{name} is not a regular file")
        if info.st_uid != os.geteuid():
            raise OSError(f"{name} belongs to another user")
        if info.st_size > max_bytes:
            raise OSError(f"{name} is larger than {max_bytes} bytes")
        chunks, left = [], info.st_size + 1  # one byte more, to see a file that grew since fstat
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise OSError(f"{name} grew while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)
