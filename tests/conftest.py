"""Fixtures shared by the whole suite: the local Slurm cluster (see hpcml.testing.localslurm)."""

from __future__ import annotations

import itertools
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpcml.errors import SlurmError
from hpcml.testing.localslurm import LocalSlurm, SlurmNotInstalled
from tests import needs
from tests.s3server import s3, s3_server  # noqa: F401 - the S3 server fixtures, for every test

if TYPE_CHECKING:
    from tests.centre.pgcluster import PgCluster

_DB_SEQ = itertools.count()

# pytest rewrites each test module's asserts when it imports it (~8 s of CPU for this suite's
# modules) and keeps the result as a .pyc in __pycache__, but writes none while bytecode is off
# (PYTHONDONTWRITEBYTECODE, as on many CI machines): then every pytest process, each xdist
# worker of scripts/test-parts' second part included, rewrote the whole suite again. This
# process writes them (its subprocesses keep the variable): the first part's collection serves
# the workers'. A .pyc is used only while its module's size and mtime are the ones it was made from.
sys.dont_write_bytecode = False

# A suite started in the background of a non-interactive shell (``./scripts/test &``)
# inherits SIGINT ignored, and every process it starts would too (an ignored signal stays
# ignored across exec): the Ctrl-C tests would then test nothing. A terminal's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalSlurm]:
    """A running 2-node cluster (n1, n2) for the session; installs Slurm if root.

    Without Slurm and without root it fails, unless HPCML_ALLOW_SKIP_SLURM=1 says that
    skipping is acceptable (the suite's one skip policy, tests/needs.py). While it runs, ``os.environ`` has its SLURM_CONF and no
    SLURM_* variables of an enclosing job.
    """
    # HPCML_SLURM_ROOT and HPCML_SLURM_PORT let two suites on one host keep their own cluster.
    port = int(os.environ.get("HPCML_SLURM_PORT", "6917"))
    cluster = LocalSlurm(Path(os.environ.get("HPCML_SLURM_ROOT", "/tmp/hpcml-slurm")),
                         ctld_port=port, first_slurmd_port=port + 4)
    error: SlurmError | None = None
    try:
        cluster.install()
        cluster.start()
    except SlurmError as exc:
        error = exc
    if error is not None:
        if isinstance(error, SlurmNotInstalled) or os.geteuid() != 0:
            needs.missing("slurm", f"local Slurm cannot start here: {error}")    # HPCML_ALLOW_SKIP_SLURM=1
        pytest.fail(f"local Slurm did not start: {error}", pytrace=False)
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("SLURM_")]:
            patch.delenv(key)
        for key, value in cluster.env().items():
            patch.setenv(key, value)
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One private PostgreSQL cluster for the run (the collector's and the centre's tests)."""
    from tests.centre.pgcluster import PgCluster, PgUnavailable
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
    """A fresh store URL: SQLite, then a new database of ``pg_cluster``."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/vet.db"
    cluster = request.getfixturevalue("pg_cluster")
    return cluster.create_db(f"t{next(_DB_SEQ)}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A file system that fills up: a 20 MB tmpfs mounted for one test (ENOSPC for real)."""
    needs.root("mounting a small tmpfs needs root")
    import subprocess
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def slurm_env(slurm_cluster: LocalSlurm) -> dict[str, str]:
    """A whole environment for a Slurm client subprocess talking to ``slurm_cluster``."""
    return slurm_cluster.client_env()


# --- the checkout stays as it was --------------------------------------------------------
# Tests write only under tmp paths. A file a test leaves in the checkout (a job directory
# written to the working directory, a report beside a fixture) is found here and fails the
# run, naming it. Ignored files count too (``hpcml-run-*/`` is ignored for users, not for
# tests); only the build's own caches and the venv are expected.
_CHECKOUT = Path(__file__).resolve().parents[1]
_EXPECTED = ("__pycache__/", ".pytest_cache/", ".egg-info/", ".venv", ".mypy_cache/", ".ruff_cache/",
             "benchmarks/.work/", "build/")


def _checkout_files() -> set[str] | None:
    import subprocess
    try:
        out = subprocess.run(["git", "-C", str(_CHECKOUT), "ls-files", "--others", "--directory", "-z"],
                             capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None                    # not a git checkout (an sdist): nothing to compare
    return {p for p in out.decode(errors="replace").split("\0")
            if p and not any(e in p for e in _EXPECTED)}


_BEFORE: set[str] | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses the local cluster is a ``slurm`` test, marked or not: ``-m "not
    slurm"`` (a side run beside a whole suite) must never start a second cluster on the
    same root and ports, whose teardown stops the suite's. Runs before ``-m`` deselects
    (scripts/test runs ``machine`` alone, then ``slurm`` one at a time beside the rest on
    several workers)."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slurm") is None:
            item.add_marker(pytest.mark.slurm)


def pytest_sessionstart(session: pytest.Session) -> None:
    global _BEFORE
    _BEFORE = _checkout_files()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _BEFORE is None or getattr(session.config, "workerinput", None) is not None:
        return
    after = _checkout_files() or set()
    gained = sorted(after - _BEFORE)
    if gained:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = f"the tests left files in the checkout {_CHECKOUT}: {', '.join(gained[:20])}"
        if reporter is not None:
            reporter.write_line(line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
