"""``hpcml centre serve`` (alias ``hpcml vet serve``): run the results collector until SIGTERM or SIGINT.

Arguments only; the service is ``hpcml.centre.collector.server``. Registered in ``cli/__init__.py``
(and, as the alias, in ``hpcml.vet.cli``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

import typer

from hpcml.cli_support import command_words, parse_size
from hpcml.errors import HpcmlError, UsageError
from hpcml.signals import handling


def serve(
    ctx: typer.Context,
    db: str = typer.Option("sqlite:///./hpcml-vet.db", "--db",
                           help="sqlite:///PATH or postgresql://USER@HOST/DB."),
    bind: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8787, min=0, max=65535, help="Port; 0 picks a free one (printed)."),
    token_file: Optional[Path] = typer.Option(None, help="Tokens that may send and read, one per "
                                              "line (default: $HPCML_VET_TOKEN)."),
    read_token_file: Optional[Path] = typer.Option(None, help="Extra tokens that may only read."),
    job_token_file: Optional[Path] = typer.Option(None, help="Extra tokens that may only send job summaries "
                                                  "(POST /v1/jobs): the one to give every user's hpcml run. "
                                                  "A line USER:TOKEN is that user's token and proves the user "
                                                  "(sites without MUNGE)."),
    trusted_token_file: Optional[Path] = typer.Option(None, help="Tokens whose job summaries are taken as they "
                                                      "are (the centre's own tools, an import); never a user's."),
    slurm_check: str = typer.Option("auto", help="Check each user-sent summary's job against Slurm's records "
                                    "(scontrol, sacct): on, off, or auto (on where scontrol is installed)."),
    cluster: Optional[str] = typer.Option(None, help="The Slurm cluster whose jobs this collector checks "
                                          "(default: Slurm's ClusterName); summaries of others are refused."),
    munge_socket: Optional[str] = typer.Option(None, help="munged's socket for decoding credentials "
                                               "(default: $HPCML_MUNGE_SOCKET, else Slurm's AuthInfo, "
                                               "else munged's own)."),
    max_body: str = typer.Option("1 MiB", help="Largest request body accepted (413 above)."),
    threads: int = typer.Option(16, min=1, max=256, help="Requests handled at once (the rest wait, read)."),
    max_connections: int = typer.Option(1000, min=1, max=100_000, help="Open connections at most; idle "
                                        "ones are closed first when it fills up."),
    request_deadline: float = typer.Option(10.0, min=0.5, max=3600, help="Seconds from a request's first "
                                           "byte to its last; a slower one is dropped."),
    verbose: bool = typer.Option(False, "--verbose", help="Log every request to stderr."),
    log_json: bool = typer.Option(False, "--log-json", help="Log one JSON object a line (time, level, logger, "
                                  "message) instead of timestamped text."),
) -> None:
    """Collect vetting reports over HTTP and answer queries about nodes and jobs.

    Example:

        HPCML_VET_TOKEN=$(openssl rand -hex 24) hpcml centre serve --db sqlite:///vet.db

    Then `hpcml vet run --report-to http://127.0.0.1:8787` sends each run's report,
    `hpcml run --collector http://127.0.0.1:8787` each job's summary, and
    `curl -H "Authorization: Bearer $HPCML_VET_TOKEN" 127.0.0.1:8787/v1/nodes/failing?since=7d`
    lists the nodes failing most. The token files are read again when they change or on
    SIGHUP (a file that no longer reads keeps the tokens in force). Exit codes: 0 stopped by
    a signal, 1 database or port error, 2 bad option (no token, unreadable token file).
    """
    import importlib.util

    from hpcml.centre.collector.server import CollectorServer
    from hpcml.centre.collector.store import open_store, refuse_password
    if importlib.util.find_spec("waitress") is None:
        raise UsageError("the collector is served by waitress: pip install 'hpcml[collector]'", key="serve")
    name = " ".join(command_words(ctx))    # hpcml centre serve, or its alias hpcml vet serve
    refuse_password(db)                    # before anything starts: argv is public
    limit = parse_size(max_body, "--max-body")
    verifier = _verifier(name, slurm_check, cluster, munge_socket)
    files = (token_file, read_token_file, job_token_file, trusted_token_file)
    tokens = _load_tokens(*files)
    if bind in ("0.0.0.0", "::", ""):
        print(f"{name}: warning: listening on every interface ({bind or '*'}); "
              "anyone who can reach this host can try tokens", file=sys.stderr)
    store = open_store(db)              # a StoreError (exit 1) names the database's problem
    try:
        server = CollectorServer((bind, port), store, tokens, limit, verbose, verifier, threads=threads,
                                 connections=max_connections, deadline=request_deadline)
    except OSError as exc:
        store.close()
        raise HpcmlError(f"cannot listen on {bind}:{port}: {exc.strerror}") from None
    from hpcml import logs
    logs.for_service(log_json)
    stop, hup = threading.Event(), threading.Event()
    seen = _mtimes(files)
    with handling((signal.SIGTERM, signal.SIGINT), lambda *_: stop.set()), handling((signal.SIGHUP,), lambda *_: hup.set()):
        threading.Thread(target=server.serve_forever, name="collector", daemon=True).start()
        print(f"listening on {server.url}", flush=True)
        while not stop.wait(1):  # wake up now and then: signals reach the main thread
            now = _mtimes(files)
            if hup.is_set() or now != seen:
                hup.clear()
                seen = now
                _reload(server, files)
    server.close()


def _load_tokens(token_file, read_token_file, job_token_file, trusted_token_file):
    from hpcml.centre.collector.server import Tokens
    write = _tokens(token_file, "--token-file", env=True)
    if not write:
        raise UsageError("no token: give --token-file or set $HPCML_VET_TOKEN; the collector "
                         "does not run without one", key="--token-file")
    try:
        return Tokens(write, _tokens(read_token_file, "--read-token-file"), _tokens(job_token_file, "--job-token-file"),
                      _tokens(trusted_token_file, "--trusted-token-file"))
    except ValueError as exc:
        raise UsageError(str(exc), key="--job-token-file") from None


def _mtimes(files) -> tuple:
    out = []
    for f in files:
        try:
            st = os.stat(f) if f is not None else None
        except OSError:
            st = None
        out.append((st.st_mtime_ns, st.st_size, st.st_ino) if st else None)
    return tuple(out)


def _reload(server, files) -> None:
    """The token files again: a token added works at once, one removed no longer does."""
    from hpcml import logs
    log = logs.get(__name__)
    try:
        server.app.tokens = server.tokens = _load_tokens(*files)
    except UsageError as exc:
        log.warning(f"hpcml centre serve: token files not reloaded ({exc}); the tokens in force stay")
        return
    log.info(f"hpcml centre serve: token files reloaded ({len(server.app.tokens.grants)} tokens)")


def _tokens(path: Path | None, key: str, env: bool = False) -> list[str]:
    from hpcml.centre.collector.server import read_tokens
    if path is None and not env:
        return []
    try:
        return read_tokens(path) if env else read_tokens(path, None)
    except OSError as exc:
        raise UsageError(f"cannot read the token file: {exc.strerror}", key=key) from None
    except UnicodeDecodeError as exc:          # a half-written or foreign file
        raise UsageError(f"the token file is not UTF-8 text (bad byte at offset {exc.start})", key=key) from None
    except ValueError as exc:                  # a FIFO, a directory, a device, too large: read_bounded says which
        raise UsageError(f"the token file: {exc}", key=key) from None


def _verifier(name: str, slurm_check: str, cluster: str | None, munge_socket: str | None):
    """The proof of senders: Slurm's records where asked for (or found), MUNGE's socket."""
    from hpcml.centre.collector.proof import Verifier, slurm_uid
    from hpcml.cluster import jobrecord, munge, slurm
    if slurm_check not in ("auto", "on", "off"):
        raise UsageError(f"expected auto, on or off, found {slurm_check!r}", key="--slurm-check")
    use = slurm_check == "on" or (slurm_check == "auto" and slurm.available("scontrol"))
    if slurm_check == "on" and not slurm.available("scontrol"):
        raise UsageError("scontrol is not installed: Slurm's records cannot be read here", key="--slurm-check")
    config = _slurm_config() if use or munge_socket is None else {}      # one scontrol for both
    if use and cluster is None:
        cluster = config.get("ClusterName") or None
    if not use:
        print(f"{name}: warning: no Slurm checks (" + ("--slurm-check off" if slurm_check == "off" else
              "scontrol is not installed here") + "): a user's summary or vetting report counts on the "
              "user's proof alone, for whatever job and nodes it names, and root's or SlurmUser's report "
              "for whatever node it names", file=sys.stderr)
    socket = munge_socket or os.environ.get(munge.SOCKET_ENV) or munge.config_socket(config)
    return Verifier(munge_socket=socket, slurm=jobrecord.lookup if use else None, cluster=cluster,
                    slurm_user=slurm_uid(config))


def _slurm_config() -> dict[str, str]:
    from hpcml.cluster import slurm
    from hpcml.errors import SlurmError
    try:
        return slurm.show_config()
    except SlurmError:
        return {}
