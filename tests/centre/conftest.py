"""The collector under test: one per test, on SQLite or on a private PostgreSQL cluster
(``db_url``, ``pg_cluster``: tests/conftest.py, shared with tests/centre)."""

from __future__ import annotations

import pytest

TOKEN = "test-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdef"
TRUSTED_TOKEN = "trusted-token-0123456789abcdef"     # the centre's own tools: reports taken as the node's


@pytest.fixture
def collector(db_url):
    from hpcml.centre.collector.server import Tokens, start
    from hpcml.centre.collector.store import open_store
    server = start(open_store(db_url), Tokens([TOKEN], [READ_TOKEN], trusted=[TRUSTED_TOKEN]), max_body=64 * 1024)
    try:
        yield server
    finally:
        server.close()
