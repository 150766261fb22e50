"""Free TCP ports: one place for the launcher's rendezvous, services and the test cluster.

Below ``run`` and ``service`` both (each picks ports; neither should import the other).
A port found free is only free *now*: the caller binds it later (rank 0's TCPStore after its
imports, seconds on; a service after its start). A port the kernel handed out itself
(``bind(('', 0))``) comes from its ephemeral range, the same range every outgoing connection
on the node takes its local port from: on a busy node one of those may hold it by then, and
rank 0 dies with EADDRINUSE. So the port is picked outside that range
(``/proc/sys/net/ipv4/ip_local_port_range``), where only another deliberate listener can take
it, as torchrun's fixed default 29500 is. What is left of the race (another job's listener
in the gap) fails with a clear message.
"""

from __future__ import annotations

import logging
import random
import socket
from pathlib import Path

log = logging.getLogger(__name__)

#: the same question asked on another node (``srun ... python -c FREE_PORT``), with the same
#: interpreter (hpcml is importable there: the ranks' task wrapper needs it too)
FREE_PORT = "from hpcml.ports import free_port; print(free_port())"

#: the kernel's own (the file's default when it cannot be read)
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)
#: below this are the well-known and commonly configured service ports
LOWEST = 10000
#: candidates tried before leaving the choice to the kernel
TRIES = 64


def ephemeral_range(path: Path = EPHEMERAL) -> tuple[int, int]:
    """The kernel's ephemeral port range (``lo hi``, inclusive)."""
    try:
        lo, hi = (int(w) for w in path.read_text(encoding="ascii").split()[:2])
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return (lo, hi) if 0 < lo <= hi <= 65535 else DEFAULT_EPHEMERAL


def candidates(ephemeral: tuple[int, int], rng: random.Random, n: int = TRIES) -> list[int]:
    """Up to ``n`` distinct ports from LOWEST-65535 outside ``ephemeral``, in random order
    (two launchers on one node do not try the same port first)."""
    lo, hi = ephemeral
    spans = [(a, b) for a, b in ((LOWEST, min(lo - 1, 65535)), (max(hi + 1, LOWEST), 65535)) if a <= b]
    size = sum(b - a + 1 for a, b in spans)
    out: list[int] = []
    for k in rng.sample(range(size), min(n, size)):
        for a, b in spans:
            if k <= b - a:
                out.append(a + k)
                break
            k -= b - a + 1
    return out


def free_port(host: str = "", *, ephemeral: tuple[int, int] | None = None) -> int:
    """A port free now on ``host`` ('' for every address), outside the ephemeral range
    where one is free there; the kernel's own choice otherwise (a node whose range covers
    every port above LOWEST), which is said."""
    for port in candidates(ephemeral or ephemeral_range(), random.SystemRandom()):
        if port_free(host, port):
            return port
    log.info("no free port outside the kernel's ephemeral range on this node: using one inside it")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free(host: str, port: int, *, reuse: bool = False) -> bool:
    """Whether ``port`` can be bound on ``host`` now (``reuse``: ignore TIME_WAIT leftovers,
    as a server that sets SO_REUSEADDR does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
