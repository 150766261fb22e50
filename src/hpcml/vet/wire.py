"""How a node's results travel back on srun's stdout.

srun forwards each task's output in messages of at most 1024 bytes: a shorter line arrives
whole, a longer one is cut and interleaved with other nodes' output. So a report goes as
JSON, zlib-compressed and base64-encoded, in numbered lines well under that size, and the
launcher reassembles them per node; a report that does not reassemble is no report.
"""

from __future__ import annotations

import base64
import json
import zlib

PREFIX = "HPCML-VET-RESULT"
#: check modules the launcher asks each worker to import before its spec arrives
PRELOAD_ENV = "HPCML_VET_PRELOAD"
CHUNK = 800


def encode(node: str, payload: dict) -> str:
    """The lines (newline-terminated) that carry ``payload`` from ``node``."""
    blob = base64.b64encode(zlib.compress(json.dumps(payload, default=str).encode(), 6)).decode()
    parts = [blob[i:i + CHUNK] for i in range(0, len(blob), CHUNK)] or [""]
    return "".join(f"{PREFIX} {node} {i} {len(parts)} {part}\n" for i, part in enumerate(parts))


class Reassembler:
    """Collects result lines from many nodes; ``feed`` returns (node, payload) when complete."""

    def __init__(self) -> None:
        self._parts: dict[str, dict[int, str]] = {}

    def feed(self, line: str) -> tuple[str, dict] | None:
        fields = line.strip().split(" ")
        if len(fields) != 5 or fields[0] != PREFIX:
            return None
        _, node, index, total, part = fields
        try:
            i, n = int(index), int(total)
        except ValueError:
            return None
        parts = self._parts.setdefault(node, {})
        parts[i] = part
        if len(parts) < n:
            return None
        del self._parts[node]
        try:
            blob = "".join(parts[k] for k in range(n))
            return node, json.loads(zlib.decompress(base64.b64decode(blob)))
        except (KeyError, ValueError, zlib.error):
            return None
