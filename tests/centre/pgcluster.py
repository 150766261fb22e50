"""A private PostgreSQL cluster from Debian's packages, for the collector's tests and benchmark.

``initdb`` into a temporary directory and ``pg_ctl start`` on a free loopback port, as the
``postgres`` user when we are root (PostgreSQL refuses to run as root). Installs
``postgresql`` with apt when root and it is missing.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from hpcml.ports import free_port


class PgUnavailable(RuntimeError):
    pass


def _bindir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    return Path(dirs[-1]) if dirs else None


def _free_port() -> int:
    return free_port("127.0.0.1")


class PgCluster:
    def __init__(self) -> None:
        self.bindir = _bindir()
        if self.bindir is None:            # scripts/test installs Debian's postgresql as root
            raise PgUnavailable("PostgreSQL is not installed (no pg_ctl)")
        self.root = Path(tempfile.mkdtemp(prefix="hpcml-pg-"))
        self.port = _free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *argv: str) -> None:
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            log = self.root / "log"
            tail = log.read_text()[-500:] if log.exists() else ""
            raise PgUnavailable(f"{argv[0]} failed: {r.stderr.strip()[-500:]} {tail}")

    def start(self, password: str | None = None) -> PgCluster:
        """``password``: the superuser's, and every connection must give it (scram-sha-256),
        as a site's server would; else trust."""
        data = self.root / "data"
        auth = ["-A", "trust"]
        if password is not None:
            pwfile = self.root / "pw"
            pwfile.write_text(password + "\n")
            if self.as_root:
                shutil.chown(pwfile, "postgres", "postgres")
            auth = ["-A", "scram-sha-256", f"--pwfile={pwfile}"]
        self._run("initdb", "-D", str(data), *auth, "-U", "postgres", "-E", "UTF8", "--no-sync")
        return self.start_again()

    def start_again(self) -> PgCluster:
        """Start the server of an initialised cluster (after ``halt``)."""
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._run("pg_ctl", "-D", str(self.root / "data"), "-o", opts, "-l", str(self.root / "log"), "-w",
                  "-t", "60", "start")
        return self

    def halt(self) -> None:
        """Stop the server, keeping its data (an outage, not the end)."""
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def create_db(self, name: str) -> str:
        import psycopg
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")
        except PgUnavailable:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
