"""Live export: one Prometheus exposition endpoint per node, for the job's ranks there.

The recorder of local rank 0 serves ``port`` over HTTP; the recorders of the node's other
ranks send their rows to it as datagrams on a Unix socket named by the port, in a directory
only the user can enter (``files.private_dir``): another user's process cannot send it rows
(a loopback UDP port took them from anyone on the node). A rank that does not see that
socket (a container per task with its own /tmp, or a TMPDIR of its own: another mount
namespace) sends over the endpoint's second door instead, an abstract Unix socket, which
mount namespaces share (network namespaces do not). Anyone on the node may name an
abstract socket, so both ends prove the other's user there through the kernel
(``SO_PEERCRED``): the endpoint takes rows only from this user's processes, and a rank
sends none to a socket another user's process holds. A lost datagram only delays a gauge
to the next sample. Gauges are updated from the same rows the recorders write to the
store, so the endpoint and the store agree; a row that is not one the store would take (a
name that is not text, a value that is not a number) is dropped, and nothing a datagram
holds stops the receiver.

Cardinality is bounded: labels are slurm_job, rank, node (and gpu for GPU metrics) plus
the metric or section name, of which at most ``MAX_NAMES`` per node are exported (more
are counted in ``hpcml_export_names_dropped_total`` and stay in the store). ``job`` is
left to Prometheus, which sets it to the scrape job's name.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import numbers
import os
import re
import selectors
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path

from hpcml.files import private_dir

MAX_NAMES = 64
MAX_DATAGRAM = 60_000
NAME_MAX = 1024                 # characters of a metric, section or host sample's name
SOCKET_PATH_MAX = 104           # bytes of a Unix socket's path, with room to spare (Linux: 108)
KINDS = ("host", "gpu", "metric", "section")
MAX_PEERS = 1024                # ranks connected through the abstract socket at once
RECV_MAX = 65536                # bytes the endpoint reads of one message: a chunk and its envelope
#: the endpoint's one message to a rank, once it took its connection: a connection is open at
#: the rank's end before the endpoint accepts it, so a first send there proves nothing
ACK = b"\x01"
SILENT_TRIES = 60               # samples a rank reaches no endpoint before it says so (once)
_CRED = struct.Struct("3i")     # struct ucred: pid, uid, gid

log = logging.getLogger(__name__)


def socket_path(port: int) -> Path:
    """Where the node's endpoint on ``port`` takes the other ranks' rows: this user's, in
    the temporary directory, or /tmp where that one's path is too long for a Unix socket
    (108 bytes on Linux). Every rank of the node works it out alike."""
    for tmp in (tempfile.gettempdir(), "/tmp"):
        path = Path(tmp) / f"hpcml-{os.geteuid()}" / f"export-{port}"
        if len(os.fsencode(path)) < SOCKET_PATH_MAX:
            return path
    return path


def abstract_name(port: int, job: str) -> bytes:
    """The endpoint's second door: an abstract Unix socket (a leading NUL; no file, so a
    rank in another mount namespace of the node reaches it), named by the job and the port,
    not the user: a rank in a container whose user namespace maps the user to root
    (enroot's remap, Apptainer's fakeroot) has another uid of its own, and the kernel's
    word on the peer (``SO_PEERCRED``) already reads the user in the caller's namespace."""
    return f"\0hpcml-export-{job_label(job)}-{port}".encode()


def job_label(job: str) -> str:
    """The job as the export's socket name and messages carry it: Slurm's id as it is (the
    array's ``_``, the het job's ``+``), anything else as a short digest."""
    return job if re.fullmatch(r"[A-Za-z0-9_.+-]{1,64}", job) else hashlib.sha256(job.encode(errors="replace")).hexdigest()[:32]


def peer_uid(sock: socket.socket) -> int:
    """The user of the process at the other end, as the kernel recorded it at connect."""
    _pid, uid, _gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return uid


def _row(r: object) -> tuple | None:
    """A forwarded row as the store takes it, or None: (ts_ns, kind, name, value, step, gpu)."""
    if not isinstance(r, (list, tuple)) or len(r) != 6:
        return None
    ts, kind, name, value, step, gpu = r
    if kind not in KINDS or not isinstance(name, str) or not 0 < len(name) <= NAME_MAX:
        return None
    try:
        name.encode()                               # a lone surrogate: no scrape could encode it
    except UnicodeEncodeError:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        value = float(value)                        # an integer past a float's range: OverflowError
    except (OverflowError, ValueError):
        return None
    if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral)
                             or not -(1 << 63) <= int(step) < 1 << 63):
        return None
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, (numbers.Integral, str))
                            or len(str(gpu)) > NAME_MAX or not str(gpu).isprintable()):
        return None
    return ts, kind, name, value, None if step is None else int(step), gpu


class PromExporter:
    """The node's endpoint (local rank 0)."""

    def __init__(self, port: int, addr: str, *, job: str, rank: int, node: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
        self.registry = CollectorRegistry()
        base = ("slurm_job", "rank", "node")
        self.job, self.rank, self.node = job, rank, node
        self.label = job_label(job)
        self.host = Gauge("hpcml_host", "Host sample (see the name label)", base + ("name",),
                          registry=self.registry)
        self.gpu = Gauge("hpcml_gpu", "GPU sample from NVML", base + ("gpu", "name"),
                         registry=self.registry)
        self.metric = Gauge("hpcml_metric", "Last value logged with observe.log", base + ("name",),
                            registry=self.registry)
        self.section = Gauge("hpcml_section_seconds", "Last duration of an observe.section",
                             base + ("name",), registry=self.registry)
        self.step = Gauge("hpcml_step", "Last step logged", base, registry=self.registry)
        self.dropped = Counter("hpcml_export_names_dropped", "Names beyond the export limit",
                               base, registry=self.registry)
        self._names: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)
        # the HTTP port is ours now: a socket left at its path is a dead endpoint's
        self.path: Path | None = None             # the socket this endpoint bound, once it has
        self.udp = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.side: socket.socket | None = None    # the abstract door, once listening
        self._closed = threading.Event()
        self._said_accept = self._door_rests = self._said_full = False
        path = socket_path(port)
        try:
            problem = private_dir(path.parent) or self._bind(path)
        except BaseException:
            self.close()
            raise
        if problem is None:
            self.path = path
        else:
            log.warning(f"hpcml observe: {path}: {problem}: only ranks that reach the endpoint's "
                        "abstract socket are exported")
        self.side = self._listen(port, job)
        if self.path is not None or self.side is not None:
            threading.Thread(target=self._receive, name="hpcml-export-rows", daemon=True).start()

    @staticmethod
    def _listen(port: int, job: str) -> socket.socket | None:
        """The abstract door, listening; None (said once) where it cannot be had: another
        process of the node holds the name (another user's: rows could not be proven ours)."""
        side = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            side.bind(abstract_name(port, job))
            side.listen(64)
            side.setblocking(False)
        except OSError as exc:
            side.close()
            log.warning(f"hpcml observe: the abstract socket of port {port}: {exc.strerror or exc} (another "
                        "process of the node holds its name): ranks in another mount namespace are not exported")
            return None
        return side

    def _bind(self, path: Path) -> str | None:
        """Take the socket at ``path``; why not (None: taken). One left by an endpoint that
        died is replaced; one a live endpoint holds (another job of this user's on this port,
        at another address) is refused as the port would be."""
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(str(path))
            raise OSError(errno.EADDRINUSE, f"another endpoint of this user's takes rows at {path}")
        except (FileNotFoundError, ConnectionRefusedError):
            pass                                     # none, or a dead one's: ours to take
        finally:
            probe.close()
        try:
            path.unlink(missing_ok=True)
            self.udp.bind(str(path))
        except OSError as exc:
            return exc.strerror or str(exc)
        return None

    def _receive(self) -> None:
        """One thread takes the rows of both doors: the datagrams of the private socket, and
        the messages of every rank connected through the abstract one (each proven this
        user's when it connects; at most ``MAX_PEERS`` at once). Nothing but ``close``
        ends it: a failed accept (no descriptor left) rests the door for a second."""
        sel = selectors.DefaultSelector()
        if self.path is not None:
            sel.register(self.udp, selectors.EVENT_READ, "rows")
        door_rests_until: float | None = None
        if self.side is not None:
            sel.register(self.side, selectors.EVENT_READ, "door")
        peers = 0
        try:
            while not self._closed.is_set():
                if door_rests_until is not None and time.monotonic() >= door_rests_until:
                    door_rests_until = None
                    sel.register(self.side, selectors.EVENT_READ, "door")   # type: ignore[arg-type]
                for key, _ in sel.select(timeout=0.5):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if key.data == "door":
                        if self._accept(sock, sel, peers):
                            peers += 1
                        elif self._door_rests:
                            self._door_rests = False
                            sel.unregister(sock)
                            door_rests_until = time.monotonic() + 1.0
                        continue
                    try:
                        data = sock.recv(RECV_MAX)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                        if key.data != "peer":
                            continue                 # closed (the loop's test ends it), or a passing error
                    if key.data == "peer" and not data:      # the rank's recorder ended
                        sel.unregister(sock)
                        sock.close()
                        peers -= 1
                        continue
                    self._take(data)
        except (OSError, ValueError):
            if not self._closed.is_set():
                log.warning("hpcml observe: the export's receiver stopped: the node's other ranks are not exported",
                            exc_info=True)
        finally:
            for key in list(sel.get_map().values()):
                if key.data == "peer":
                    key.fileobj.close()              # type: ignore[union-attr]
            sel.close()

    def _accept(self, door: socket.socket, sel: selectors.BaseSelector, peers: int) -> bool:
        """A rank connected through the abstract door, registered: True; its connection
        refused (another user's, or one too many) or the accept failed: False, and where
        no descriptor was left, ``_door_rests`` (the pending connection would wake the
        selector at once, for ever)."""
        try:
            conn, _ = door.accept()
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            if not self._said_accept:
                self._said_accept = True
                log.warning(f"hpcml observe: the export's abstract socket could not accept a rank: {exc.strerror or exc}")
            self._door_rests = True
            return False
        try:
            if peers >= MAX_PEERS:
                conn.close()                          # the rank counts the lost connection and says so
                if not self._said_full:
                    self._said_full = True
                    log.warning(f"hpcml observe: the export endpoint has {MAX_PEERS} ranks connected through "
                                "its abstract socket: more are refused, and their rows are not exported")
                return False
            if peer_uid(conn) != os.geteuid():
                conn.close()                          # another user's process: not one row of it
                return False
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ, "peer")
            conn.send(ACK)                            # the rank counts itself connected from this
        except (OSError, ValueError):
            conn.close()
            return False
        return True

    def _take(self, data: bytes) -> None:
        try:
            msg = json.loads(data)
            rank = msg["rank"]
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < 1 << 31:
                return
            if msg.get("job") != self.label:     # another job of the user's on this port (or one that does not say)
                return
            self.update(msg["rows"], rank=rank)
        except Exception:  # noqa: BLE001 - no message may end the receiver: the other ranks' rows come here
            return

    def _allowed(self, kind: str, name: str) -> bool:
        key = (kind, name)
        if key in self._names:
            return True
        if len(self._names) >= MAX_NAMES:
            return False
        self._names.add(key)
        return True

    def update(self, rows: list[tuple], rank: int | None = None) -> None:
        """Rows as the store takes them: (ts_ns, kind, name, value, step, gpu)."""
        lab = {"slurm_job": self.job, "rank": str(self.rank if rank is None else rank), "node": self.node}
        gauges = {"host": self.host, "metric": self.metric, "section": self.section}
        with self._lock:
            for row in rows:
                checked = _row(row)                 # this rank's own rows too: its names are the job's
                if checked is None:
                    continue
                _ts, kind, name, value, step, gpu = checked
                if not self._allowed(kind, name):
                    self.dropped.labels(**lab).inc()
                elif kind == "gpu":
                    self.gpu.labels(**lab, gpu=str(gpu), name=name).set(value)
                else:
                    gauges[kind].labels(**lab, name=name).set(value)
                if step is not None and kind in ("metric", "section"):
                    self.step.labels(**lab).set(step)

    def update_batch(self, batch) -> None:
        self.update(batch_rows(batch))

    def close(self) -> None:
        self._closed.set()
        if self.path is not None:           # while the port is still ours: no later endpoint's socket yet
            self.path.unlink(missing_ok=True)
        self.udp.close()
        if self.side is not None:
            self.side.close()
        self.server.shutdown()
        self.server.server_close()


class PromForwarder:
    """Another rank of the node: sends its rows to local rank 0's endpoint, through its
    private socket, or where this rank does not see that one as this user's own (another
    mount namespace; a directory someone else made at its path), through its abstract
    socket once the kernel says this user's process holds it."""

    def __init__(self, port: int, *, rank: int, job: str) -> None:
        self.port, self.rank, self.job, self.path = port, rank, job, str(socket_path(port))
        # every message's start, up to '"rows": ' (the rank and the job do not change)
        self._head = json.dumps({"rank": rank, "job": job_label(job), "rows": []})[:-3]
        self.udp = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.udp.setblocking(False)           # a full queue drops the rows, never stalls this rank's recorder
        self.side: socket.socket | None = None
        self._warned = False                  # said: another user holds the abstract socket
        self._said_missing = False            # said: no endpoint reached (taken back once one is)
        self._misses = 0                      # samples in a row that reached no endpoint
        self._acked = False                   # the endpoint has said it took the abstract connection

    def update(self, rows: list[tuple]) -> None:
        for data in self._messages([r for r in rows if r[3] is not None and r[1] in KINDS]):
            if not self._send(data):
                return                  # endpoint not up (yet), or its queue full: the next sample tries again

    def _messages(self, rows: list[tuple]) -> list[bytes]:
        """The rows in messages of at most ``MAX_DATAGRAM`` bytes of rows each (a row alone
        longer than that is left out: the endpoint reads ``RECV_MAX`` bytes of a message)."""
        head = self._head
        out: list[bytes] = []
        chunk: list[str] = []
        size = 0
        for r in rows:
            text = json.dumps(r)
            if len(text) > MAX_DATAGRAM:
                continue
            if chunk and size + len(text) + 1 > MAX_DATAGRAM:
                out.append(f"{head}[{','.join(chunk)}]}}".encode())
                chunk, size = [], 0
            chunk.append(text)
            size += len(text) + 1
        if chunk:
            out.append(f"{head}[{','.join(chunk)}]}}".encode())
        return out

    def _send(self, data: bytes) -> bool:
        if self.side is None:
            if private_dir(Path(self.path).parent, create=False) is None:
                try:
                    self.udp.sendto(data, self.path)
                    return self._reached()
                except BlockingIOError:     # rank 0's queue is full
                    return False
                except OSError:             # no endpoint at the path this rank sees (none, refused, not a
                    pass                    # datagram socket): the abstract door
            self.side = self._connect()
            if self.side is None:
                self._missed()
                return False
            self._acked = False
        try:
            self.side.send(data)
            if not self._acked:         # what was sent proves nothing until the endpoint says it
                try:                    # took this rank (past MAX_PEERS it closes it unsaid)
                    said = self.side.recv(16)
                except BlockingIOError:
                    return True         # no word yet: sent, not counted as reaching it
                if said != ACK:
                    raise ConnectionResetError("the endpoint closed the connection")
                self._acked = True
        except BlockingIOError:         # the endpoint's queue is full
            return False
        except OSError:                 # the endpoint went away, or refused this rank: ask again
            self.side.close()           # at the next sample, and count it as a sample not sent
            self.side = None
            self._missed()
            return False
        return self._reached()

    def _reached(self) -> bool:
        self._misses = 0
        if self._said_missing:              # the warning is taken back: rank 0 came up late
            self._said_missing = False
            log.info(f"hpcml observe: rank {self.rank} reaches the export endpoint of port {self.port} now")
        return True

    def _missed(self) -> None:
        self._misses += 1
        if self._misses == SILENT_TRIES and not self._said_missing:
            self._said_missing = True
            log.warning(f"hpcml observe: rank {self.rank} reached no export endpoint of port {self.port} in "
                        f"{SILENT_TRIES} tries (not at {self.path}, nor its abstract socket): its rows are not "
                        "exported while this lasts (rank 0 not up yet, or a container with a network "
                        "namespace of its own?)")

    def _connect(self) -> socket.socket | None:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError:                 # no descriptor left: this sample's rows are dropped, the rank goes on
            return None
        try:
            s.setblocking(False)
            s.connect(abstract_name(self.port, self.job))
            uid = peer_uid(s)
        except OSError:                 # nobody listening (yet), or its backlog full
            s.close()
            return None
        if uid != os.geteuid():
            s.close()
            if not self._warned:
                self._warned = True
                log.warning(f"hpcml observe: the export socket of port {self.port} is held by another user "
                            f"(uid {uid} as this rank sees it), not this job's: rank {self.rank}'s rows are not sent to it")
            return None
        return s

    def update_batch(self, batch) -> None:
        self.update(batch_rows(batch))

    def close(self) -> None:
        self.udp.close()
        if self.side is not None:
            self.side.close()


def batch_rows(batch) -> list[tuple]:
    from hpcml.observe.schema import from_batch
    cols = from_batch(batch)
    return list(zip(cols["ts"], cols["kind"], cols["name"], cols["value"], cols["step"], cols["gpu"]))
