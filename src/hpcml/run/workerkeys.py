"""Heartbeat keys for a launcher's workers, handed out by the task wrapper that started the
launcher, to its own descendants only.

A rank's heartbeats are signed with its key (``hpcml.observe.beat.rank_key``), which the
wrapper holds and the rank's program does not inherit. A launcher's workers get their rank
from the launcher, after the wrapper started it, so the wrapper cannot hand keys out in
advance: each worker's recorder (``hpcml.run.worker``) asks over a Unix socket in the
abstract namespace. Who asks is proven by the kernel, not by anything sent: the peer's pid
and uid come from ``SO_PEERCRED``; the key is given only to a process of the same user that
descends from the wrapper, for the ``RANK`` its environment was started with, below the
launcher's world. What this keeps out is another user's process and a stray one of the
same user outside the job; a program of the job itself can read its wrapper's environment
under srun anyway (see ``hpcml.run.watch``: the keys guard against accidents, not the job).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Callable

from hpcml import logs
from hpcml.proctree import descends_from, environ

log = logs.get(__name__)

ENV_SOCKET = "HPCML_RUN_WORKER_KEYS"       # the abstract socket's name, without the leading NUL
_CRED = struct.Struct("3i")                # struct ucred: pid, uid, gid


def started_rank(pid: int) -> int | None:
    """``RANK`` as process ``pid`` was started with (its environment at exec, not what it
    set since)."""
    for item in environ(pid)[:1 << 20].split(b"\0"):
        if item.startswith(b"RANK="):
            value = item[5:]
            return int(value) if value.isdigit() else None
    return None


class KeyServer:
    """The wrapper's side: ``key(rank)`` for each worker that proves itself (a thread)."""

    def __init__(self, key: Callable[[int], bytes], world: int) -> None:
        self.key, self.world = key, world
        self.name = f"hpcml-keys-{os.getpid()}-{os.urandom(8).hex()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind("\0" + self.name)
        self.sock.listen(64)
        self.given: dict[int, int] = {}          # rank -> the pid it was given to
        threading.Thread(target=self._serve, name="hpcml-worker-keys", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(self._answer(conn))
                except OSError:
                    pass

    def _answer(self, conn: socket.socket) -> bytes:
        pid, uid, _ = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
        rank = started_rank(pid)
        if uid != os.getuid() or not descends_from(pid, os.getpid()):
            log.info(f"hpcml run: worker key refused to pid {pid} (uid {uid}): not a process of this task")
            return b""
        if rank is None or rank >= self.world:
            log.info(f"hpcml run: worker key refused to pid {pid}: RANK {rank} is not a rank of the launcher's "
                     f"{self.world}")
            return b""
        holder = self.given.get(rank)
        if holder is not None and holder != pid and os.path.exists(f"/proc/{holder}"):
            log.info(f"hpcml run: worker key refused to pid {pid}: rank {rank}'s key is held by pid {holder}, "
                     "which still runs")         # one rank, one live worker (a restarted one comes after)
            return b""
        self.given[rank] = pid
        return self.key(rank).hex().encode()

    def close(self) -> None:
        self.sock.close()


def ask(name: str, timeout: float = 10.0) -> bytes | None:
    """The worker's side: this process's key, or None when the wrapper gave none."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect("\0" + name)
            data = s.recv(256)
        return bytes.fromhex(data.decode()) if data else None
    except (OSError, ValueError):
        return None
