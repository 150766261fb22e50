"""The collector under test: one per test, on SQLite or on a private PostgreSQL cluster."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests import needs
from tests.vet.fleet.pgcluster import PgCluster, PgUnavailable

TOKEN = "test-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdef"
_seq = itertools.count()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    needs.module("psycopg")
    try:
        cluster = PgCluster().start()
    except PgUnavailable as exc:
        needs.missing("postgresql", f"PostgreSQL cannot run here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/vet.db"
    cluster = request.getfixturevalue("pg_cluster")
    return cluster.create_db(f"t{next(_seq)}")


@pytest.fixture
def collector(db_url):
    from hpcml.vet.fleet.collector.server import Tokens, start
    from hpcml.vet.fleet.collector.store import open_store
    server = start(open_store(db_url), Tokens([TOKEN], [READ_TOKEN]), max_body=64 * 1024)
    try:
        yield server
    finally:
        server.close()
