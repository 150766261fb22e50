"""``hpcml vet --prolog`` and ``hpcml vet prolog-script``: the CLI side of ``vet.prolog``.

Exit codes in prolog mode: 0 healthy, or not vetted (every check skipped: nothing to drain
for); 1 a check failed or errored (or did not finish in the budget, unless ``--overrun-ok``),
or the run itself broke (one line, never a traceback); 2 bad input (protocol, budget); 3 bad,
and ``--drain`` could not drain the node (scontrol failed: named on stderr and stdout, and in
the report). Any non-zero exit makes Slurm drain the node and requeue the job, so a broken
protocol drains nodes too: fail closed, with ``--drain`` naming the cause in the node's
reason. The collector is never part of the verdict: a send that fails (a bad token file, the
collector down) is a warning line and the report waits in the spool.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import NoReturn, Optional

import typer

PROLOG_PROTOCOL = Path(__file__).parents[1] / "protocols" / "prolog.yaml"
ME = "hpcml vet --prolog"


def run_prolog_cli(protocol: Optional[Path], *, budget: Optional[str] = None, drain: bool = False,
                   overrun_ok: bool = False, as_json: bool = False, report_to: Optional[str] = None,
                   report_token_file: Optional[Path] = None, report_spool: Optional[Path] = None) -> NoReturn:
    """Vet this node with the fast checks of PROTOCOL (default: the built-in prolog one);
    print one line per problem on stderr; exit 0 healthy or not vetted, 1 bad, 2 bad input.

    Bad input is this command's own case, not the group's: it is worded ``hpcml vet --prolog:
    error: ...`` and, with ``--drain``, drains the node naming the cause (fail closed). So is
    any other exception while loading or running: a prolog that dies of a traceback would
    drain the node as a bare "Prolog error", with nothing saying why."""
    from hpcml.errors import UsageError
    from hpcml.vet import prolog
    started = prolog.process_start()
    try:
        limit, proto = validated(protocol, budget)
    except UsageError as exc:
        _fail_closed(str(exc), f"bad input: {exc}", drain, exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - whatever breaks, the node is not passed unvetted
        why = f"cannot load the protocol: {_what(exc)}"
        _fail_closed(why, why, drain, prolog.EXIT_BAD)
    send_s = min(SEND_S, limit / 4) if report_to else 0.0
    try:
        result = prolog.run_prolog(proto, budget=limit - send_s, started=started, overrun_ok=overrun_ok,
                                   drain=drain)
    except Exception as exc:  # noqa: BLE001 - as above: drained with a reason, one line
        why = f"vetting failed: {_what(exc)}"
        _fail_closed(why, why, drain, prolog.EXIT_BAD)
    result.budget = limit
    if report_to:
        try:
            _report(result.node_report(proto.name, started), report_to, report_token_file, started + limit,
                    report_spool)
        except Exception as exc:  # noqa: BLE001 - the collector never changes the verdict
            print(f"{ME}: warning: report not sent to {report_to}: {_what(exc)}", file=sys.stderr)
    for line in result.bad:
        print(f"{ME}: {result.node}: {line}", file=sys.stderr)
    if result.drain_failed:                 # the operator must see it: stderr, stdout (slurmd's log), exit 3
        failed = f"{ME}: error: {result.node} is bad and was not drained: {result.drain_failed}"
        print(failed, file=sys.stderr)
        if not as_json:
            print(failed)
    for note in result.notes:
        print(f"{ME}: note: {note}", file=sys.stderr)
    if as_json:
        print(json.dumps(result.to_json(), separators=(",", ":"), default=str))
    else:
        # Slurm 22.05 logs a failed prolog's stdout (not stderr) in slurmd's log: name the cause
        state = (f"bad ({'; '.join(result.bad)})" if result.bad else "healthy" if result.healthy
                 else "not vetted (no check measured anything)")
        print(f"{ME}: {result.node} {state}: {len(result.results)} fast checks in "
              f"{result.duration:.2f} s (budget {limit:g} s)")
    sys.stdout.flush()
    raise typer.Exit(result.exit_code)


def validated(protocol: Optional[Path], budget: Optional[str]):
    """(budget in seconds, protocol) as the prolog takes them, or a UsageError naming the
    flag or file: one function, so ``prolog-script`` refuses exactly what the prolog would
    (a script that fails on every node drains the whole cluster)."""
    import math

    from hpcml.errors import UsageError
    from hpcml.units import parse_seconds
    from hpcml.vet import prolog
    from hpcml.vet.protocol import load
    try:
        limit = parse_seconds(budget) if budget is not None else prolog.DEFAULT_BUDGET
    except ValueError as exc:
        raise UsageError(str(exc), key="--budget") from None
    if not (math.isfinite(limit) and limit > 0):
        raise UsageError(f"expected a budget above 0 s, found {budget!r}", key="--budget")
    source = protocol or PROLOG_PROTOCOL
    try:
        proto = load(source)
        prolog.select_fast(proto)            # what the prolog asks of each check (a plugin's class loads)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - a plugin that cannot be loaded here fails on the nodes too
        raise UsageError(f"cannot load it: {_what(exc)}", file=str(source)) from None
    return limit, proto


def _what(exc: BaseException) -> str:
    """An exception as a few words on one line: its type where its message is empty."""
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _fail_closed(line: str, reason: str, drain: bool, code: int) -> NoReturn:
    """One line on stderr (the script sends it to stdout, which slurmd logs), the node drained
    naming ``reason`` where ``--drain`` asks, and a non-zero exit: a prolog that cannot vet
    never passes a node. A drain that fails is said too (exit 3, as for a bad node)."""
    from hpcml.vet import prolog
    print(f"{ME}: error: {line}", file=sys.stderr)
    node = os.environ.get("SLURMD_NODENAME")
    if drain and node:
        try:
            _, failed = prolog.drain_node(node, [reason])
        except Exception as exc:  # noqa: BLE001 - still one line, and the exit that drains
            failed = f"cannot set the drain reason: {_what(exc)}"
        if failed:
            print(f"{ME}: error: {node} was not drained: {failed}", file=sys.stderr)
            code = prolog.EXIT_DRAIN_FAILED
    sys.stdout.flush()
    raise typer.Exit(code)


#: seconds of the budget kept for sending to the collector (at most a quarter of it): the
#: checks end that much earlier, so the send never takes the prolog past its budget
SEND_S = 1.0


def _report(doc: dict, url: str, token_file: Optional[Path], budget_end: float, spool_dir: Optional[Path]) -> None:
    """Send this node's result to the collector, after what earlier runs could not send
    (``centre.spool``, oldest first). Made by root or SlurmUser on this node, its MUNGE
    credential makes it the node's own evidence (``collector.proof``). Within the budget
    (the checks left it ``SEND_S``); what is not taken (the collector down, slow, no token)
    waits in the spool for the next run. A failure is a warning: the prolog's verdict is its exit code,
    never the collector's."""
    import time

    from hpcml.centre.client import read_token
    from hpcml.centre.spool import DEFAULT_DIR, Spool
    spool = Spool(spool_dir or DEFAULT_DIR)
    deadline = time.monotonic() + max(0.1, budget_end - time.time())
    token, why = read_token(token_file)
    doc = {**doc, "spool_waiting": len(spool.pending())}     # the collector's gauge of what waits
    kept = spool.put(doc)                 # first: a prolog killed mid-send loses nothing
    with spool.sending() as mine:
        if mine or kept is None:
            _send_and_flush(doc, url, token, why, spool, kept, deadline)
        else:
            print(f"{ME}: note: another run of this node is sending; report kept in {spool.folder}", file=sys.stderr)


def _send_and_flush(doc: dict, url: str, token: Optional[str], why: Optional[str], spool, kept, deadline: float) -> None:
    from hpcml.centre.client import post_report
    from hpcml.centre.spool import FINAL

    def send(d: dict, by: float):
        return post_report(d, url, token, by)
    refused = send(doc, deadline) if token else None
    if token is None or (refused is not None and refused.status not in FINAL):
        print(f"{ME}: warning: report not sent to {url}: {why or refused.why}"   # type: ignore[union-attr]
              + (f"; kept in {kept.parent} for the next run" if kept else ""), file=sys.stderr)
        return
    spool.taken(kept)
    if refused is not None:
        print(f"{ME}: warning: report refused by {url}: {refused.why}", file=sys.stderr)
        return                            # the collector is there but refuses: the waiting ones wait
    sent, left = spool.flush(send, deadline)
    if sent or left:
        print(f"{ME}: note: {sent} earlier report{'s' if sent != 1 else ''} sent, {left} still waiting in "
              f"{spool.folder}", file=sys.stderr)


def render_script(protocol: Optional[Path] = None, *, budget: str = "5 s", drain: bool = True,
                  overrun_ok: bool = False, log: Optional[Path] = None,
                  python: Optional[str] = None, report_to: Optional[str] = None,
                  report_token_file: Optional[Path] = None, report_spool: Optional[Path] = None,
                  slurm_conf: Optional[Path] = None) -> str:
    """A POSIX sh wrapper for ``Prolog=`` / ``HealthCheckProgram=``. Slurm gives the prolog a
    minimal PATH, so it names the interpreter (and ``timeout``) by absolute path; and no
    ``SLURM_CONF`` to the health check, so the drain's scontrol is told where slurm.conf is."""
    from hpcml.units import parse_seconds
    python = python or sys.executable
    args = [os.path.abspath(python), "-m", "hpcml", "vet", "--prolog", "--budget", budget]
    args += ["--drain"] if drain else []
    args += ["--overrun-ok"] if overrun_ok else []
    args += ["--json"] if log else []
    if report_to:
        args += ["--report-to", report_to]
        args += ["--report-token-file", str(Path(report_token_file).absolute())] if report_token_file else []
        args += ["--report-spool", str(Path(report_spool).absolute())] if report_spool else []
    if protocol is not None:
        args.append(str(Path(protocol).absolute()))
    guard = shutil.which("timeout")
    if guard:  # a hard stop in case the interpreter itself hangs (e.g. on a dead filesystem)
        hard = parse_seconds(budget) + 2           # the send is inside the budget
        args = [guard, "-k", "1", f"{hard:g}", *args]
    command = " ".join(shlex.quote(a) for a in args)
    if log:
        command += f" >>{shlex.quote(str(Path(log).absolute()))}"
    command += " 2>&1"  # Slurm logs only a failed prolog's stdout
    return "\n".join([
        "#!/bin/sh",
        "# Slurm Prolog / HealthCheckProgram: vet this node with hpcml's fast checks.",
        "# Written by `hpcml vet prolog-script`. In slurm.conf:",
        "#   Prolog=/etc/slurm/prolog.sh",
        "#   PrologFlags=Alloc                          # vet every node at allocation",
        "#   HealthCheckProgram=/etc/slurm/prolog.sh    # rechecks, with HealthCheckInterval=60",
        "#   HealthCheckNodeState=ANY                   # on drained nodes too: a node that passes again",
        "#                                              # is resumed by `hpcml centre handle` (--report-to)",
        "#   SchedulerParameters=nohold_on_prolog_fail  # requeue the job that met a bad node without",
        "#                                              # holding it (else: held, `scontrol release JOBID`)",
        "# Exit 0: healthy. 1: a check failed; Slurm drains the node and requeues the job (for",
        "# HealthCheckProgram, --drain drains it: Slurm ignores that exit code). 3: bad, and the",
        "# drain failed (the line says why; SLURM_CONF must be set where slurm.conf is not the default).",
        *([f"export SLURM_CONF={shlex.quote(str(Path(slurm_conf).absolute()))}   # for the drain's scontrol"]
          if slurm_conf else []),
        f"exec {command}",
        ""])


def prolog_script(
    protocol: Optional[Path] = typer.Argument(None, help="Protocol whose fast checks to run "
                                              "(default: the built-in prolog protocol)."),
    budget: str = typer.Option("5 s", help="Time for the whole run; keep it under BatchStartTimeout."),
    drain: bool = typer.Option(True, "--drain/--no-drain",
                               help="Drain a bad node with hpcml's reason (needed for HealthCheckProgram)."),
    overrun_ok: bool = typer.Option(False, "--overrun-ok",
                                    help="A check that does not finish in the budget does not fail the node."),
    log: Optional[Path] = typer.Option(None, help="Append each run's JSON record and messages to this file."),
    report_to: Optional[str] = typer.Option(None, "--report-to", help="Send each run's result to this collector "
                                            "(signed by root's MUNGE: the node's own evidence)."),
    report_token_file: Optional[Path] = typer.Option(None, "--report-token-file",
                                                     help="With --report-to: file holding the collector token."),
    report_spool: Optional[Path] = typer.Option(None, "--report-spool", help="With --report-to: where results the "
                                                "collector did not take wait (default /var/spool/hpcml-reports)."),
    slurm_conf: Optional[Path] = typer.Option(None, "--slurm-conf",
                                              help="slurm.conf for the drain's scontrol, exported by the script "
                                              "(Slurm gives HealthCheckProgram no SLURM_CONF; default: $SLURM_CONF "
                                              "where that file is here)."),
) -> None:
    """Print a prolog wrapper script that calls this Python by absolute path.

    Example: [bold]hpcml vet prolog-script --log /var/log/hpcml-prolog.log > /etc/slurm/prolog.sh[/]
    """
    from hpcml.errors import UsageError
    validated(protocol, budget)     # refused here, not at every job start on every node
    if report_to is not None:
        from hpcml.urls import is_http_url
        if not is_http_url(report_to):
            raise UsageError(f"expected an http(s)://HOST[:PORT] URL of hpcml centre serve, found {report_to!r}",
                             key="--report-to")
    elif report_token_file is not None or report_spool is not None:
        raise UsageError("goes with --report-to", key="--report-token-file" if report_token_file else "--report-spool")
    if report_token_file is not None:
        from hpcml.centre.client import tokens_of
        tokens, why = tokens_of(report_token_file)     # what each run will read
        if why is not None or not tokens:
            raise UsageError(why or "holds no token", file=str(report_token_file))
    if slurm_conf is not None and not Path(slurm_conf).is_file():
        raise UsageError("file not found", file=str(slurm_conf))
    if slurm_conf is None and os.environ.get("SLURM_CONF"):
        if Path(os.environ["SLURM_CONF"]).is_file():
            slurm_conf = Path(os.environ["SLURM_CONF"])
        else:                  # configless Slurm, or this host's path only: the nodes find their own
            print(f"hpcml vet prolog-script: note: $SLURM_CONF ({os.environ['SLURM_CONF']}) is not a file here; "
                  "the script exports none (--slurm-conf PATH names one)", file=sys.stderr)
    sys.stdout.write(render_script(protocol, budget=budget, drain=drain, overrun_ok=overrun_ok,
                                   log=log, report_to=report_to, report_token_file=report_token_file,
                                   report_spool=report_spool, slurm_conf=slurm_conf))
