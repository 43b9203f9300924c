"""A job of several processes (one per GPU, or CPU replicas over processes): ranks from a torchrun-style
environment and a TCP star around rank 0 that carries what the processes exchange.

`Job.from_env()` reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (as `torchrun` sets them, or as a job
script exports them); rank 0 listens on MASTER_PORT (every interface), every other rank connects to
MASTER_ADDR:MASTER_PORT (retrying until `timeout`) and says its rank. The star carries NCCL's unique id from
rank 0 to the others (nccl.py) and, for the host collectives (collectives.py), each process's contribution to
rank 0 and the combined result back.
Messages are a length-prefixed JSON header and raw bytes: nothing received is unpickled or run.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time

import numpy as np

from ..errors import DeviceError, SignatureError

_LEN = struct.Struct("<Q")
ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _send(sock: socket.socket, header: dict, payload: bytes = b""):
    head = json.dumps(header).encode()
    sock.sendall(_LEN.pack(len(head)) + head + _LEN.pack(len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 22))
        if not chunk:
            raise DeviceError("a process of the job closed its connection (it failed or exited)")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> tuple[dict, bytes]:
    head = json.loads(_recv_exact(sock, _LEN.unpack(_recv_exact(sock, 8))[0]))
    return head, _recv_exact(sock, _LEN.unpack(_recv_exact(sock, 8))[0])


class Job:
    """This process's place in a job of `world` processes, and its connections (rank 0: one per other rank;
    the others: one to rank 0). Exchanges are collective: every process makes the same ones in the same order."""

    def __init__(self, rank: int, world: int, addr: str, port: int, timeout: float = 300.0):
        if not 0 <= rank < world:
            raise DeviceError(f"rank {rank} is outside a job of {world} processes (RANK, WORLD_SIZE)")
        self.rank, self.world, self.addr, self.port = rank, world, addr, port
        self.lock = threading.Lock()
        self.peers: list[socket.socket] = []  # rank 0: ranks 1.., in rank order; others: [rank 0]
        if world > 1:
            self._connect(timeout)

    @classmethod
    def from_env(cls, timeout: float = 300.0) -> "Job":
        missing = [k for k in ENV if k not in os.environ]
        if missing:
            raise DeviceError(f"pj.init_distributed() reads {', '.join(ENV)} from the environment (torchrun sets "
                              f"them); missing: {', '.join(missing)}")
        try:
            return cls(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ["MASTER_ADDR"],
                       int(os.environ["MASTER_PORT"]), timeout)
        except ValueError as e:
            raise DeviceError(f"RANK, WORLD_SIZE and MASTER_PORT must be integers ({e})") from None

    def _connect(self, timeout: float):
        deadline = time.monotonic() + timeout
        if self.rank == 0:
            # every interface, as torch's store listens: MASTER_ADDR names this host as the others reach it
            dual = socket.has_dualstack_ipv6()
            server = socket.create_server(("", self.port), family=socket.AF_INET6 if dual else socket.AF_INET,
                                          dualstack_ipv6=dual)
            server.settimeout(timeout)
            by_rank = {}
            try:
                while len(by_rank) < self.world - 1:
                    conn, _ = server.accept()
                    conn.settimeout(None)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    head, _ = _recv(conn)
                    by_rank[int(head["rank"])] = conn
            except socket.timeout:
                raise DeviceError(f"rank 0 waited {timeout:.0f} s on {self.addr}:{self.port} for the job's "
                                  f"{self.world - 1} other ranks; {len(by_rank)} connected") from None
            finally:
                server.close()
            self.peers = [by_rank[r] for r in range(1, self.world)]
            return
        while True:
            try:
                sock = socket.create_connection((self.addr, self.port), timeout=5)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise DeviceError(f"rank {self.rank} could not reach rank 0 at {self.addr}:{self.port} "
                                      f"within {timeout:.0f} s ({e})") from None
                time.sleep(0.05)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send(sock, {"rank": self.rank})
        self.peers = [sock]

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's `data` on every rank (the others pass None)."""
        with self.lock:
            if self.rank == 0:
                for peer in self.peers:
                    _send(peer, {"what": "bytes"}, data)
                return data
            return _recv(self.peers[0])[1]

    def gather_to_all(self, part: np.ndarray) -> np.ndarray:
        """Every rank's `part` (this process's replicas' values, stacked), concatenated in rank order, on every
        rank. The parts must agree in dtype and in every dim but the first, else SignatureError on every rank."""
        part = np.ascontiguousarray(part)
        header = {"dtype": part.dtype.str, "shape": list(part.shape)}
        with self.lock:
            if self.rank != 0:
                _send(self.peers[0], header, part.tobytes())
                head, payload = _recv(self.peers[0])
                if "error" in head:
                    raise SignatureError(head["error"])
                return np.frombuffer(payload, np.dtype(head["dtype"])).reshape(head["shape"]).copy()
            parts = [part]
            for peer in self.peers:
                head, payload = _recv(peer)
                parts.append(np.frombuffer(payload, np.dtype(head["dtype"])).reshape(head["shape"]))
            shapes = [(p.dtype.str, p.shape[1:]) for p in parts]
            if len(set(shapes)) > 1:
                error = ("a collective needs the same shape and dtype on every replica; the job's ranks gave "
                         + ", ".join(f"{np.dtype(d).name}{s}" for d, s in shapes))
                for peer in self.peers:
                    _send(peer, {"error": error})
                raise SignatureError(error)
            whole = np.concatenate(parts)
            for peer in self.peers:
                _send(peer, {"dtype": whole.dtype.str, "shape": list(whole.shape)}, whole.tobytes())
            return whole

    def close(self):
        for peer in self.peers:
            peer.close()
        self.peers = []


_job: Job | None = None


def init_distributed(rank: int | None = None, world_size: int | None = None, master_addr: str | None = None,
                     master_port: int | None = None, timeout: float = 300.0) -> Job:
    """Join this process to a job (torch.distributed's init_process_group with init_method="env://"): the
    arguments, or RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment. Multi-device prepared
    functions traced after it span every process of the job. Returns the Job (`.rank`, `.world`)."""
    global _job
    if _job is not None:
        raise DeviceError(f"this process already joined a job (rank {_job.rank} of {_job.world})")
    if rank is None and world_size is None and master_addr is None and master_port is None:
        _job = Job.from_env(timeout)
    else:
        if None in (rank, world_size):
            raise DeviceError("pj.init_distributed: give rank and world_size (and master_addr, master_port), or "
                              "none of them to read RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT")
        _job = Job(rank, world_size, master_addr or "127.0.0.1", int(master_port or 29500), timeout)
    return _job


def current_job() -> Job | None:
    """The job this process joined with init_distributed, or None (a single process)."""
    return _job
