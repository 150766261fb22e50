"""Fixtures shared by the whole suite: the local Slurm cluster (see hpcml.testing.localslurm)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcml.errors import SlurmError
from hpcml.testing.localslurm import LocalSlurm, SlurmNotInstalled

# A suite started in the background of a non-interactive shell (``./scripts/test &``)
# inherits SIGINT ignored, and every process it starts would too (an ignored signal stays
# ignored across exec): the Ctrl-C tests would then test nothing. A terminal's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalSlurm]:
    """A running 2-node cluster (n1, n2) for the session; installs Slurm if root.

    Without Slurm and without root it fails, unless HPCML_ALLOW_SKIP_SLURM=1 says that
    skipping is acceptable. While it runs, ``os.environ`` has its SLURM_CONF and no
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
        cannot = isinstance(error, SlurmNotInstalled) or os.geteuid() != 0
        if cannot and os.environ.get("HPCML_ALLOW_SKIP_SLURM") == "1":
            pytest.skip(f"local Slurm cannot start here: {error}")
        hint = " (not root: HPCML_ALLOW_SKIP_SLURM=1 skips these tests)" if cannot else ""
        pytest.fail(f"local Slurm did not start{hint}: {error}", pytrace=False)
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("SLURM_")]:
            patch.delenv(key)
        for key, value in cluster.env().items():
            patch.setenv(key, value)
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def slurm_env(slurm_cluster: LocalSlurm) -> dict[str, str]:
    """A whole environment for a Slurm client subprocess talking to ``slurm_cluster``."""
    return slurm_cluster.client_env()
