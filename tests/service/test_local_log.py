"""The lines of service.log a failed ``up`` quotes come from the log's end only: the log
gains a section on every ``up`` and may reach GBs, which read whole would fill the memory."""

from __future__ import annotations

import tracemalloc

import pytest

from hpcml.service import local
from hpcml.service.blueprint import loads

DIES = """name: dies
description: exits at once after one line
python: {own: true}
command: [python, -c, "import sys; print('boom: no database', flush=True); sys.exit(1)", "${port.http}"]
ports: [{name: http, port: 8000}]
health: {port: http, timeout: 20 s}
"""


def sparse_log(path, size: int = 64 << 20) -> None:
    """A log of ``size`` bytes that costs no disk: what earlier ``up``s left, read whole it is ``size``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)


def test_a_service_that_exits_is_quoted_from_a_huge_log_s_end(tmp_path):
    bp = loads(DIES, "dies.yaml")
    directory = tmp_path / "dies"
    sparse_log(directory / "service.log")
    s, proc = local.start(bp, directory)
    tracemalloc.start()
    try:
        with pytest.raises(local.ServiceFailed) as caught:
            local.wait_ready(bp, s, proc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(caught.value).endswith("boom: no database)"), caught.value
    assert "== hpcml service up dies" in str(caught.value)
    assert peak < 4 << 20, peak


def test_the_tail_drops_the_line_cut_by_the_read_and_escapes_control_characters(tmp_path):
    log = tmp_path / "service.log"
    log.write_bytes(b"x" * 100 + b"\nfirst whole\n\n\x1b[31mred\x1b[0m\n")
    assert local.tail_lines(log, 5, max_bytes=30) == ["first whole", "\\x1b[31mred\\x1b[0m"]
    assert local.tail_lines(log, 1) == ["\\x1b[31mred\\x1b[0m"]
    assert local.tail_lines(tmp_path / "missing.log") == []
