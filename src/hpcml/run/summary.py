"""A job's compact summary for the centre (``hpcml.job.summary/1``), spooled and sent.

The report (``hpcml.run.report``) is for the researcher; the summary is the few numbers
the centre joins across jobs: who ran, where, which nodes the job named (excluded by
vetting, stragglers, hang culprits, lost), the GPU score and what bound it, throughput,
duration, exit code, attempts, and the time and GPU-hours its faults cost.

Delivery: the summary is written to ``JOBDIR/summary/attempt-N.json`` first (atomically),
then sent to the collector (``--collector`` or ``$HPCML_COLLECTOR``) with a short overall
timeout; a collector that is down costs the job at most that timeout and one warning line,
and the summary waits in the spool for ``hpcml report JOBDIR --send``. A sent summary is
marked by ``attempt-N.sent``. Exactly once: the collector stores a (cluster, job,
attempt) once however often it arrives, so a crash between the send and the mark, or two
senders at once, cost nothing.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from hpcml import logs
from hpcml.errors import UsageError
from hpcml.files import load_json_bounded, remove_dead_temps, write_atomic
from hpcml.jobmodel import SUMMARY_SCHEMA as SCHEMA
from hpcml.jobmodel import Attempt, JobSummary, RunRecord, dumps, reason, validate
from hpcml.run.jobdir import read_run
from hpcml.words import printable

log = logs.get(__name__)

SPOOL = "summary"
TOKEN_ENVS = ("HPCML_COLLECTOR_TOKEN", "HPCML_VET_TOKEN")
SEND_TIMEOUT = 3.0                   # seconds, for every summary together
MAX_SUMMARY = 1 << 20                 # the collector's default body limit


def who(env: os._Environ | dict = os.environ) -> dict[str, str | None]:
    """The job's owner and where it ran, from Slurm's environment (kept in run.json, so that
    a summary built later outside the job says the same)."""
    user = env.get("SLURM_JOB_USER") or env.get("USER")
    if not user:
        try:
            import pwd
            user = pwd.getpwuid(os.getuid()).pw_name
        except (KeyError, ImportError):
            user = None
    return {"user": user, "account": env.get("SLURM_JOB_ACCOUNT"), "partition": env.get("SLURM_JOB_PARTITION"),
            "cluster": env.get("SLURM_CLUSTER_NAME") or ""}


def _events(rep: dict[str, Any], records: list[Attempt]) -> dict[str, list[dict[str, Any]]]:
    """Every node the job names, per role, once per (node, attempt); ``records`` are run.json's
    attempts and the current one (its vetting exclusions included)."""
    out: dict[str, dict[tuple, dict[str, Any]]] = {"excluded": {}, "stragglers": {}, "culprits": {}, "lost": {},
                                                   "crashed": {}}

    def add(role: str, node: Any, attempt: int, rank: Any = None, detail: str = "") -> None:
        if isinstance(node, str) and node:     # an exclusion carries over to later attempts: once, at its first
            key = (node,) if role == "excluded" else (node, attempt)
            out[role].setdefault(key, {"node": node, "rank": rank if isinstance(rank, int) else None,
                                       "attempt": attempt, "detail": printable(detail, 1000)})

    lost_anywhere = {n for rec in records for n in rec.lost_nodes or {}}
    observes = [(int(a.get("attempt") or 0), a.get("observe")) for a in rep.get("attempts") or []]
    observes.append((int(rep["job"].get("attempt") or 0), rep.get("observe")))
    for n, obs in observes:
        for s in (obs or {}).get("stragglers") or []:
            uuids = s.get("gpu_uuids")
            add("stragglers", s.get("node"), n, s.get("rank"), f"chronic straggler, score {s.get('score')}"
                + (f" on {', '.join(map(str, uuids))}" if isinstance(uuids, list) and uuids else ""))
    for rec in records:
        n = rec.attempt
        for st in rec.stragglers or []:
            add("stragglers", st.node, n, st.rank, f"named by the live watch from step {st.since_step}"
                + (f" on {', '.join(st.gpu_uuids)}" if st.gpu_uuids else ""))
        verdict = rec.hang.verdict if rec.hang is not None else None
        for c in verdict.culprits if verdict is not None else []:
            add("culprits", c.node, n, c.rank, f"hang culprit: {c.why or ''}".strip())
        for node in set(rec.lost_nodes or {}):
            add("lost", node, n, detail="lost during the attempt")
        failure = rec.first_failure
        if failure is not None and failure.node and verdict is None and not rec.requeued and not rec.stopped_at:
            add("crashed", failure.node, n, failure.rank, f"rank {failure.rank} exited {failure.exit_code}")
        for node, reasons in rec.excluded.items():
            if node not in lost_anywhere:      # a lost node is lost, not excluded too
                add("excluded", node, n, detail=", ".join(map(str, reasons or []))[:1000] or "failed vetting")
    return {k: list(v.values()) for k, v in out.items()}


def _vetting(d: Path, nodes: list[str]) -> list[dict[str, Any]]:
    """What ``hpcml run --vet`` found on each of ``nodes`` (the start's vetting and each
    restart's again-N), for the centre's vetting history. A node no result of which measured
    anything (every check skipped) is left out: unknown is never good, and the summary's
    verdicts are good or bad only (an older collector refuses any other)."""
    from hpcml.centre.sources import UNREACHABLE, results_of_report
    from hpcml.run.jobdir import vet_dir
    held = set(nodes)
    out: list[dict[str, Any]] = []
    reports = [(0, vet_dir(d) / "report.json")] + sorted(
        (int(p.name.removeprefix("again-")), p / "report.json") for p in vet_dir(d).glob("again-*")
        if p.name.removeprefix("again-").isdigit())
    for attempt, path in reports:
        try:
            rep = load_json_bounded(path, 64 << 20, follow_symlinks=False)
            results = list(results_of_report(rep))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        bad: dict[str, set[str]] = {n: set() for n in rep.get("nodes") or {} if n in held}
        measured: set[str] = set()
        for r in results:
            if r.node in bad and r.outcome in ("fail", "error"):
                bad[r.node].add(r.check)
            if r.outcome != "skipped":
                measured.add(r.node)
        when = results[0].time.timestamp() if results else None
        out += [{"node": n, "attempt": attempt, "time": when, "verdict": "bad" if checks else "good",
                 "failing": sorted(printable(c, 255) for c in checks - {UNREACHABLE})[:64]}
                for n, checks in bad.items() if when is not None and n in measured]
    return out


def _outcome(rep: dict[str, Any], run: RunRecord) -> str:
    end = rep["ending"]
    if run.aborted:
        return "aborted"
    if end.get("requeued"):
        return "requeued"
    if run.ended is None:
        return "running"
    if run.hang is not None and run.hang.verdict is not None and run.hang.action in ("stop", "ended"):
        return "hung"
    if end.get("exit_code") == 0:
        return "completed"
    # a Ctrl-C, scancel or the time limit (a TERM or INT to hpcml run, passed on) is not the job's failure
    return "interrupted" if end.get("interrupted") else "failed"


def _job_score(d: Path, records: list[Attempt], last: dict[str, Any]) -> float | None:
    """The GPU score of the whole job, which the centre weighs its GPU-hours by: the last
    attempt's where it is the only one, else each attempt's weighted by the seconds it ran,
    where every attempt that ran has one (one attempt's score is not the others' hours:
    unknown, never the last attempt's said as the job's)."""
    if last.get("score") is None or len(records) <= 1:
        return last.get("score")
    from hpcml.run.report import _score
    total = weighted = 0.0
    for rec in records[:-1]:
        if rec.launch is None and rec.ended is not None:    # aborted: it ran nothing
            continue
        if rec.ended is None:                                # its end not known
            return None
        got, _why = _score(d, rec.attempt)
        if got is None or got.get("score") is None:
            return None
        secs = max(0.0, rec.ended - rec.started)
        total, weighted = total + secs, weighted + secs * float(got["score"])
    cur = records[-1]
    secs = max(0.0, (cur.ended or cur.started) - cur.started)
    total, weighted = total + secs, weighted + secs * float(last["score"])
    return round(weighted / total, 4) if total > 0 else None


def _gpus(rep: dict[str, Any], d: Path, records: list[Attempt]) -> int | None:
    """The job's GPUs: the score's count (the GPUs its samplers read), else the distinct
    GPUs its ranks were given, from each rank's metadata (known without sampling them:
    ``--gpu-metrics none``, or NVML failing on the node), the most of any attempt: 0 where
    ranks ran and none was given a GPU (a CPU job). None where no rank's metadata says
    (no rank ran: aborted by vetting, stopped before the command): unknown, not 0.

    Only an attempt whose ranks' metadata came from every node it ran on counts: a node
    none of whose ranks wrote any (its store lost, its ranks dead before they recorded) held
    GPUs nobody counted, and the others' count would be sent as the job's (the score's
    samples come from the same ranks, so it counts only where the last attempt is whole)."""
    from hpcml.files import JSON_MAX
    from hpcml.run.jobpaths import observe_dir
    most: int | None = None
    whole: dict[int, bool] = {}
    for rec in records:
        held: set[tuple[str, str]] = set()
        seen: set[str] = set()
        read = False
        for f in sorted(observe_dir(d, rec.attempt).glob("rank-*.json")):
            try:
                meta = load_json_bounded(f, JSON_MAX)
            except (OSError, ValueError):
                continue
            ids = meta.get("gpus") if isinstance(meta, dict) else None
            if isinstance(ids, list):
                read = True
                where = str(meta.get("node") or meta.get("host") or "")
                seen.add(where)
                held |= {(where, str(g)) for g in ids if isinstance(g, (int, str))}
        whole[rec.attempt] = read and len(seen) >= len(set(rec.nodes or []))
        if whole[rec.attempt]:
            most = max(most or 0, len(held))
    gpus = (rep.get("score") or {}).get("gpus")
    if isinstance(gpus, int) and gpus > 0 and records and whole.get(records[-1].attempt):
        return gpus
    return most


def build(d: str | Path, rep: dict[str, Any] | None = None) -> JobSummary:
    """The summary of the job in ``d`` as it stands (its report, built if not given),
    validated by the model the collector validates it with: a summary this builder makes
    is one the collector takes (``UsageError`` naming the field otherwise)."""
    return validate(JobSummary, _document(Path(d), rep), SCHEMA, f"{d}/summary")


def _document(d: Path, rep: dict[str, Any] | None) -> dict[str, Any]:
    from hpcml.run.report import build as build_report
    rep = build_report(d) if rep is None else rep
    run = read_run(d)
    records = run.records()
    job = rep["job"]
    owner = run.who.to_json() if run.who is not None else who()   # a job directory from before summaries
    attempt = int(job.get("attempt") or 0)
    run_id = run.run_id or hashlib.sha256(f"{run.started}:{d.resolve()}".encode()).hexdigest()[:16]
    job_id = str(job["job_id"]) if job.get("job_id") else f"local-{run_id}"
    started = float(job.get("started") or run.started or time.time())
    duration = job.get("duration_s")
    nodes = list(job.get("allocation") or job.get("nodes") or [])     # every node the job held
    gpus = _gpus(rep, d, records)
    led = rep.get("ledger")
    # the hours the job held its nodes: its time in Slurm's queue after a requeue held none
    queued = sum(p.get("seconds") or 0.0 for p in (led or {}).get("parts") or [] if p.get("part") == "queued")
    hours = max(0.0, (duration or 0.0) - queued) / 3600
    recovery = rep.get("recovery") or {}
    lost_s = recovery.get("time_lost_s")
    score = rep.get("score") or {}
    tp = (rep.get("observe") or {}).get("throughput") or {}
    events = _events(rep, records)
    hangs = sum(1 for rec in records if rec.hang is not None and rec.hang.verdict is not None)
    return {
        "schema": SCHEMA, "cluster": owner.get("cluster") or "", "job_id": job_id, "attempt": attempt,
        **({"requeues": run.restart_of} if job.get("job_id") else {}),
        "user": owner.get("user"), "account": owner.get("account"), "partition": owner.get("partition"),
        "started": started, "ended": job.get("ended"), "duration_s": duration,
        "exit_code": rep["ending"].get("exit_code"), "outcome": _outcome(rep, run),
        "nodes": nodes, "ntasks": int(job.get("ntasks") or 0), **events,
        "vetting": _vetting(d, nodes), "hangs": hangs,
        "gpu": {"score": _job_score(d, records, score), "bound": score.get("bound")},
        "throughput": {"median": tp["median"], "unit": tp.get("unit") or ""} if tp.get("median") is not None else None,
        "attempts": len(records), "time_lost_s": lost_s,
        **({"ettr": led["ettr"], "ettr_bound": led.get("ettr_bound"), "productive_s": led["productive_s"]}
           if led else {}),
        "node_hours": round(hours * len(nodes), 4),
        # GPUs nobody counted are left out, not null: a collector of the version before refused
        # null (400) and the sender set the summary aside for good; left out, it takes its default
        **({"gpus": gpus, "gpu_hours": round(hours * gpus, 4)} if gpus is not None else {}),
        "gpu_hours_lost": round(lost_s / 3600 * gpus, 4) if lost_s is not None and gpus is not None else None,
        **_not_training(rep.get("ledger"), gpus, len(nodes)),
    }


def _not_training(led: dict[str, Any] | None, gpus: int | None, nodes: int) -> dict[str, Any]:
    """The ledger's node time that did not train (its node-seconds less the productive ones),
    in node-hours and, at the job's GPUs per node, GPU-hours; and the part that cost most."""
    if not led or led.get("node_s") is None or led.get("productive_node_s") is None:    # not measured
        return {"node_hours_not_training": None, "gpu_hours_not_training": None, "not_training_why": None}
    from hpcml.jobmodel import Ledger
    ledger = Ledger.model_validate({k: v for k, v in led.items() if k != "line"})
    hours = max(0.0, (ledger.node_s or 0.0) - (ledger.productive_node_s or 0.0)) / 3600
    lost = ledger.lost()
    return {"node_hours_not_training": round(hours, 4),
            "gpu_hours_not_training": round(hours * gpus / nodes, 4) if gpus is not None and nodes else None,
            "not_training_why": lost[0][0] if lost else None}


def spool(d: str | Path, summary: JobSummary) -> Path | None:
    """Write an ended attempt's summary into the job's spool (replacing this attempt's
    unsent one); None, and nothing written, while the attempt still runs: a summary is
    sent once, so it must be the final one."""
    if summary.outcome == "running" or summary.ended is None:
        return None
    folder = Path(d) / SPOOL
    folder.mkdir(exist_ok=True)
    path = folder / f"attempt-{summary.attempt}.json"
    write_atomic(path, dumps(summary))
    path.with_suffix(".sent").unlink(missing_ok=True)       # a new summary was never sent
    return path


def _number(path: Path) -> int | None:
    tail = path.name.removeprefix("attempt-").removesuffix(".json")
    return int(tail) if tail.isdigit() and path.name.startswith("attempt-") else None


def pending(d: str | Path) -> list[Path]:
    """Spooled summaries neither sent nor refused, oldest attempt first."""
    folder = Path(d) / SPOOL
    if not folder.is_dir() or folder.is_symlink():
        return []
    files = [p for p in folder.glob("attempt-*.json") if _number(p) is not None and not p.is_symlink()
             and not p.with_suffix(".sent").exists() and not p.with_suffix(".refused").exists()]
    return sorted(files, key=lambda p: _number(p) or 0)


def collector_token() -> str | None:
    """The collector token of this environment (``TOKEN_ENVS``, in order)."""
    return next((os.environ[k].strip() for k in TOKEN_ENVS if os.environ.get(k, "").strip()), None)


def send_pending(d: str | Path, url: str, timeout: float = SEND_TIMEOUT, say=None) -> tuple[int, int]:
    """POST every waiting summary of ``d`` to ``url`` within ``timeout`` seconds in all;
    (sent, left). A summary the collector refuses for good (400, 413) is set aside as
    ``attempt-N.refused`` with the reason, so it does not hold back the others; a collector
    that is down or refuses the token stops the round. Never raises: a failure is one
    line through ``say`` (stderr)."""
    from hpcml.centre.client import post
    from hpcml.centre.collector.proof import credential
    say = say or (lambda line: log.info(line))
    if (Path(d) / SPOOL).is_dir():
        remove_dead_temps(Path(d) / SPOOL)        # a sender killed mid-mark left its temporary file
    files = pending(d)
    token = collector_token()
    sent = refused = 0
    deadline = time.monotonic() + timeout
    for path in files:
        try:
            body = load_json_bounded(path, MAX_SUMMARY, follow_symlinks=False)
            if isinstance(body, dict):
                body.pop("auth", None)           # a credential is made at each send, never kept
            body = validate(JobSummary, body, SCHEMA, str(path)).to_json()
            auth = credential(body)          # made now: a credential lives minutes, a spool days
            failure = post(url, "/v1/jobs", {**body, "auth": auth} if auth else body, token,
                           deadline - time.monotonic())
        except (OSError, ValueError, UsageError) as exc:
            failure = None
            why = getattr(exc, "problem", None) or getattr(exc, "strerror", None) or str(exc)
            say(f"hpcml: summary {path} not sent: not a summary this hpcml reads ({why})")
            _set_aside(path, why)
            refused += 1
            continue
        if failure is None:
            write_atomic(path.with_suffix(".sent"), orjson.dumps({"url": url, "time": time.time()}))
            sent += 1
        elif failure.final or failure.status == 403:     # 403: the cluster denies what it says
            say(f"hpcml: summary {path} refused by {url}: {failure.why}; set aside as {path.with_suffix('.refused').name}")
            _set_aside(path, failure.why)
            refused += 1
        else:
            say(f"hpcml: summary not sent to {url}: {failure.why}; kept in {path.parent} "
                f"(send later: hpcml report {d} --send)")
            break
    return sent, len(files) - sent - refused


def _set_aside(path: Path, why: str) -> None:
    try:
        write_atomic(path.with_suffix(".refused"), orjson.dumps({"why": why, "time": time.time()}))
    except OSError:
        pass


def deliver(d: str | Path, rep: dict[str, Any], url: str | None) -> None:
    """At the end of ``hpcml run``: spool this attempt's summary and send what waits."""
    try:
        summary = JobSummary.model_validate(_document(Path(d), rep))
    except ValidationError as exc:      # a summary no collector would take: said, never spooled
        log.info(f"hpcml run: summary not written: {reason(exc)}")
        return
    try:
        spool(d, summary)
    except OSError as exc:              # a full disk: the job's result stands, the summary is lost
        log.info(f"hpcml run: summary not written: {exc.strerror or exc}")
        return
    if url:
        send_pending(d, url)
