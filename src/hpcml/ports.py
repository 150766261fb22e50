"""Free TCP ports: one place for the launcher's rendezvous, services and the test cluster.

Below ``run`` and ``service`` both (each picks ports; neither should import the other).
A port found free is only free *now*: the caller binds it soon after, and the rendezvous
and service code handle the rare loss of that race by failing with a clear message.
"""

from __future__ import annotations

import socket

#: the same question asked on another node (``srun ... python -c FREE_PORT``)
FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def free_port(host: str = "") -> int:
    """A port the kernel calls free now on ``host`` ('' for every address)."""
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
