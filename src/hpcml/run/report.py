"""``hpcml report JOBDIR``: one report for a job that ``hpcml run`` ran.

It gathers what the components already build, and builds nothing twice: the vet verdict
(``vet/report.json``), the environment (``env.json``), the observe report
(``hpcml.observe.report.build``), the GPU saturation score (``hpcml.score.report.build``
on the same store, when it holds GPU samples) and how the job ended (the first failing
rank, its exit code and the tail of its stderr). Findings of every part are ranked: how it
ended first, then the nodes vetting excluded, then the observe findings, then the score's.

A Slurm job that was requeued ran as several attempts in one job directory
(``hpcml.run.jobdir``): each attempt has its own observe store and its own ending, and the
time between two attempts is shown as the requeue it was, not as a stall of the job (one
store per attempt, so no stall can span it). The score is the last attempt's.

The HTML page is one page: one title, one findings list (every component's, as the
terminal summary has them), then a section per part; the observe and score sections hold
those components' sections (``embedded``), without their own titles, job tables and
findings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hpcml.cluster import requeue
from hpcml.errors import HpcmlError, UsageError
from hpcml.files import load_json_bounded
from hpcml.jobmodel import Attempt, Restart, RunRecord, Straggler
from hpcml.observe.mlflow_run import outcome
from hpcml.observe.snapshot import STACKS
from hpcml.run import slurmend
from hpcml.run.jobdir import attempt_dir, launcher_alive, log_path, observe_dir, read_run, tail, vet_dir
from hpcml.run.rankexec import NOT_EXECUTABLE, NOT_FOUND
from hpcml.run.ranklog import failure_of, own_lines
from hpcml.run.recovery import describe, resume_of, time_lost
from hpcml.run.watch import HANG, contention, gpu_named, held_back_by, slower
from hpcml.samplers import NONE_VISIBLE, NoGpuSamples
from hpcml.schemas import tag
from hpcml.words import node_name, plural

SCHEMA = tag("run.report", 1)
STOP_SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT")   # what Slurm sends the steps of a job it ends
TAIL_LINES = 20
TEMPLATE = "run.html.j2"                        # the page (hpcml.htmlkit; warmed while the ranks run)
UNENDED = ("launcher_killed", "running")         # _unended's kinds
NEVER_STARTED = (NOT_EXECUTABLE, NOT_FOUND)      # a shell's codes for a command that cannot start


def _vet(d: Path, run: RunRecord) -> dict | None:
    if run.vet is None:
        return None
    out = run.vet.to_json()
    p = vet_dir(d) / "report.json"
    if p.is_file():
        try:
            rep = load_json_bounded(p, 64 << 20)
            out["protocol"] = (rep.get("protocol") or {}).get("name")
        except (OSError, ValueError, AttributeError):
            pass
    return out


def _env(d: Path) -> dict | None:
    p = d / "env.json"
    if not p.is_file():
        return None
    try:
        return load_json_bounded(p, 16 << 20)
    except (OSError, ValueError) as exc:
        return {"error": f"unreadable env.json: {exc}"}


def _observe(d: Path, run: Attempt, requeued: bool = False) -> tuple[Any, str | None]:
    """The attempt's observe report, whose failed ranks are those that failed: not those
    Slurm's requeue ended (143, 137), nor those that ended once the run was being stopped
    (Ctrl-C, a TERM to hpcml run, its own stop for a hang, a straggler, a lost node:
    ``ending.failed_ranks``); its "exited non-zero" finding says only those."""
    from hpcml.observe.report import Limits, build, failed_finding
    from hpcml.observe.series import read_series
    from hpcml.run.ending import failed_ranks, stop_began
    limits = Limits() if run.straggler_window_s is None else Limits(min_straggler_s=run.straggler_window_s)
    try:
        obs = build(read_series(observe_dir(d, run.attempt)), limits=limits)
    except HpcmlError as exc:
        return None, str(exc)
    if obs.failed_ranks:
        failed = failed_ranks(d, run.attempt, requeued, stop_began(run))
        obs.failed_ranks = {r: ec for r, ec in obs.failed_ranks.items() if r in failed}
        obs.findings = [failed_finding(obs.failed_ranks) if f.kind == "failed_rank" else f for f in obs.findings
                        if f.kind != "failed_rank" or obs.failed_ranks]
    return obs, None


def _score(d: Path, attempt: int = 0) -> tuple[dict | None, str | None]:
    from hpcml.score.importers import load
    from hpcml.score.report import build
    try:
        return build(load(observe_dir(d, attempt), "store")), None
    except NoGpuSamples as exc:
        return None, "no GPU samples" + (": no GPU visible to the tasks" if NONE_VISIBLE in exc.reasons
                                         else f" ({exc})")
    except HpcmlError as exc:
        return None, str(exc)


def _ending(d: Path, run: Attempt) -> dict:
    first = run.first_failure
    requeued = run.requeued.to_json() if run.requeued is not None else None
    if requeued is None and run.ended is None:     # its launcher killed by the requeue itself
        requeued = requeue.find(attempt_dir(d, run.attempt), run.job_id, run.restart_of, ask_slurm=True)
    out: dict[str, Any] = {"exit_code": run.exit_code, "aborted": bool(run.aborted),
                           "launcher_killed": run.ended is None and not requeued and launcher_alive(run.to_json()) is False,
                           "requeued": requeued, "first_failure": None, "interrupted": _interrupted(run),
                           "slurm_state": run.slurm_state, "before_command": run.launch is None and run.ended is not None}
    if first is not None:
        r = first.rank
        out["first_failure"] = {**first.to_json(), "stderr_tail": tail(log_path(d, int(r), "err"), TAIL_LINES)
                                if r is not None else []}
    return out


def _interrupted(run: Attempt) -> str | None:
    """The TERM or INT that hpcml run got from outside and passed on to its ranks (Ctrl-C,
    kill, scancel, the time limit), if one stopped the attempt."""
    if run.signalled_at is None:
        return None
    sigs = run.signals_forwarded or []
    if run.launch is None and sigs and sigs[-1] in ("SIGTERM", "SIGINT", "SIGHUP"):
        return sigs[-1]                      # before the command started: the one that stopped it, last
    return next((s for s in sigs if s in ("SIGTERM", "SIGINT")), "SIGTERM")


def _unended(run: RunRecord) -> dict[str, str]:
    """A run.json with no end: its launcher was killed (SIGKILL, the node's OOM killer), or
    it still runs; the ranks die with it (``hpcml.run.launcher``)."""
    who, alive = run.launcher, launcher_alive(run.to_json())
    name = f"hpcml run (pid {who.pid if who else None} on {who.host if who else None})"
    if alive:
        return {"source": "run", "kind": "running", "message": f"the job is still running: {name}",
                "advice": "run hpcml report again when it has ended"}
    return {"source": "run", "kind": "launcher_killed",
            "message": f"{name} was killed before the job ended" if alive is False
            else f"{name} did not record the end: it was killed, or still runs there",
            "advice": "its ranks were stopped with it; no exit code was recorded. Look for who killed it "
                      "(the node's OOM killer in dmesg, a kill -9, the end of the allocation)"}


def _earlier(d: Path, records: list[Attempt], current: Attempt) -> tuple[list[dict], list[dict], list[dict[str, str]]]:
    """The attempts before this one: their summaries, their observe reports, their findings
    (each named by its attempt) and the requeue between each and the next."""
    out, parts, findings = [], [], []
    for i, rec in enumerate(records):
        n = rec.attempt
        nxt = records[i + 1] if i + 1 < len(records) else current
        gap = round(nxt.started - rec.ended, 1) if rec.ended and nxt.started else None
        ending = _ending(d, rec)
        obs, why = _observe(d, rec, bool(ending["requeued"]))
        restart = rec.restart
        if restart is not None and restart.action == "restart" and restart.resumed is None:
            restart = restart.model_copy(update={"resumed": resume_of(d, rec, nxt)})   # its launcher did not live to say
        out.append({"attempt": n, "started": rec.started, "ended": rec.ended,
                    "exit_code": rec.exit_code, "requeued": ending["requeued"],
                    "first_failure": ending["first_failure"], "signals_forwarded": rec.signals_forwarded or [],
                    "observe": obs.to_dict() if obs is not None else None, "observe_missing": why,
                    "requeue_gap_s": None if restart else gap, "nodes": rec.nodes,
                    "restart": _restart_json(restart), "timeline": [e.to_json() for e in rec.timeline or []],
                    "watch": _watch(rec)})
        parts.append(obs)
        findings += _watch_findings(_watch(rec), d, n, f"attempt {n}: ")
        if restart:                                   # hpcml run restarted it inside the allocation
            findings.append({"source": "run", "kind": "restarted", "message": f"attempt {n}: {describe(restart)}",
                             "advice": _resume_advice(restart)})
            continue
        what = requeue.describe(ending["requeued"]) if ending["requeued"] else "ended and Slurm ran the job again"
        findings.append({"source": "run", "kind": "requeued",
                         "message": f"attempt {n} {what}; attempt {nxt.attempt} started "
                                    + (f"{gap:.0f} s later" if gap is not None else "after it"),
                         "advice": (f"attempt {n} ended with {_exit(rec.exit_code)} before the requeue; "
                                    if rec.exit_code else "a requeue, not a failure: ")
                                   + "the time between them was spent in Slurm's queue, not stalled"})
        findings += _run_findings(d, ending, n, f"attempt {n}: ")
        findings += [{"source": "observe", "kind": f.kind, "message": f"attempt {n}: {f.message}", "advice": f.advice}
                     for f in (obs.findings if obs is not None else []) if f.kind != "failed_rank"]
    return out, parts, findings


def _restart_json(restart: Restart | None) -> dict[str, Any] | None:
    """A restart as the report shows it: every field, its resumption with its split."""
    if restart is None:
        return None
    out = restart.to_json()
    if restart.resumed is not None:
        out["resumed"] = restart.resumed.model_dump(mode="json")
    return out


def _resume_advice(restart: Restart) -> str:
    split = restart.resumed.split_s.model_dump() if restart.resumed is not None else {}
    took = ", ".join(f"{k} {v:.1f} s" for k, v in split.items() if isinstance(v, (int, float)))
    return (f"from the fault to the first step: {took}" if took else "the next attempt did not reach a step") \
        + "; the excluded nodes' reasons are in run.json (excluded)"


def _step_s(obs: dict | None) -> float | None:
    """The median seconds a step took, from the observe report's throughput."""
    from hpcml.observe.report import step_time
    return step_time((obs or {}).get("throughput"))


def _recovery(run: RunRecord, obs: dict | None) -> dict | None:
    """Every fault and restart of an in-job recovering run, and the time they cost."""
    return time_lost(run.records(), _step_s(obs))


def _ledger(d: Path, run: RunRecord, obs: dict | None) -> dict | None:
    from hpcml.run import ledger
    got = ledger.build(d, run, _step_s(obs))
    return None if got is None else {**got.to_json(), "line": ledger.line(got)}


#: how a live straggler was measured, as a finding says it
MEASURES = {"compute": "its compute (its steps less its waits in collectives)", "step": "its step times",
            "arrivals": "the Flight Recorder's arrivals"}


#: findings of an incident that ended an attempt: first in the report, whatever else cost more
ENDED_BY = ("restarted", "not_restarted", "hang", "failed_rank", "interrupted", "requeued", "aborted", "unended",
            "launcher_killed", "running")
_ATTEMPT = re.compile(r"^attempt (\d+)[: ]")


def finding_line(f: dict[str, Any]) -> str:
    """One finding, with what it cost where the ledger priced it ("≥" where a part of the
    cost went unmeasured), never a cost of 0 for one it could not price."""
    at_least = "≥ " if f.get("cost_bound") else ""
    cost = f" [cost {at_least}{f['cost_s']:.0f} s]" if f.get("cost_s") is not None else ""
    return f"→ [{f['source']}] {f['message']}{cost}" + (f"  ({f['advice']})" if f["advice"] else "")


def _share(value: Any) -> str:
    """A part of the GPU score: "no data" where it was not measured (None, NaN), never "None"."""
    return "no data" if value is None or value != value else str(value)


def _by_cost(findings: list[dict[str, Any]], led: dict | None, current: int) -> list[dict[str, Any]]:
    """Findings in the order of what they cost: the incidents that ended an attempt first
    (oldest first), then the others by their ``cost_s``, the seconds of the job the ledger
    puts on them (an ended attempt: its detection and stopping, and the next attempt's
    relaunch, start-up and steps done again); a finding the ledger cannot price keeps its
    place after those it can, with no ``cost_s`` (unknown, not 0); one whose cost has a part
    the ledger could not measure says ``cost_bound: "at least"``."""
    spent: dict[tuple[int, str], float] = {}
    unmeasured: set[tuple[int, str]] = set()
    for part in (led or {}).get("parts", []):
        key = (part["attempt"], part["part"])
        if part["seconds"] is not None:
            spent[key] = spent.get(key, 0.0) + part["seconds"]
        else:
            unmeasured.add(key)

    def keys(f: dict[str, Any]) -> list[tuple[int, str]]:
        m = _ATTEMPT.match(f["message"])
        n = int(m[1]) if m else current
        return [(n, "detection"), (n, "stopping"),
                *([(n + 1, k) for k in ("relaunch", "startup", "redone")] if n < current else [])]

    def cost(f: dict[str, Any]) -> float | None:
        if f["kind"] not in ENDED_BY or not led:
            return None
        measured = [spent[k] for k in keys(f) if k in spent]
        return round(sum(measured), 3) if measured else None      # no part of it measured: unknown, not 0

    def bound(f: dict[str, Any]) -> dict[str, Any]:
        """"at least" where a part of the finding's cost went unmeasured (steps done again)."""
        return {"cost_bound": "at least"} if any(k in unmeasured for k in keys(f)) else {}

    priced = [({**f, "cost_s": c, **bound(f)} if (c := cost(f)) is not None else f) for f in findings]
    ended = [f for f in priced if f["kind"] in ENDED_BY]
    ended.sort(key=lambda f: int(m[1]) if (m := _ATTEMPT.match(f["message"])) else current)
    rest = [f for f in priced if f["kind"] not in ENDED_BY]
    rest.sort(key=lambda f: -f["cost_s"] if f.get("cost_s") is not None else 0.0)
    return ended + rest


def _stopped_what(ending: dict) -> str:
    """What the signal stopped: the ranks, or (before the command started) nothing that ran."""
    if ending.get("before_command"):
        return f" before the command started: no rank ran; {_exit(ending['exit_code'])}"
    return f" and stopped its ranks: {_exit(ending['exit_code'])}, no rank failed"


def _run_findings(d: Path, ending: dict, attempt: int, prefix: str = "") -> list[dict[str, str]]:
    """How the attempt ended when a rank failed (quoting the rank's own last line, not
    hpcml's: ``hpcml.run.ranklog``), or when hpcml run got TERM or INT and stopped it."""
    first = ending["first_failure"]
    if not first:
        sig = ending.get("interrupted")
        if not sig or ending.get("requeued"):
            return []
        why = slurmend.told(ending.get("slurm_state"))
        return [{"source": "run", "kind": "interrupted",
                 "message": f"{prefix}hpcml run got {sig}" + (f" ({why})" if why else "") + _stopped_what(ending),
                 "advice": f"{why}: not a failure of the job" if why else
                           "an interruption from outside (Ctrl-C, kill, scancel, the time limit), not a failure"}]
    why = slurmend.told(ending.get("slurm_state"))
    if why and (first.get("signal") in STOP_SIGNALS or first.get("exit_code") in (130, 137, 143)):
        # Slurm signalled the ranks itself as it ended the job (they may end before hpcml run
        # noted its own TERM): its doing, not the rank's failure
        return [{"source": "run", "kind": "interrupted",
                 "message": f"{prefix}Slurm ended the job ({why}): rank {first['rank']} ended with exit code "
                            f"{first['exit_code']}" + (f" ({first['signal']})" if first.get("signal") else ""),
                 "advice": f"{why}: not a failure of the job"}]
    last = failure_of(own_lines(first["stderr_tail"], attempt),
                      chose=not first.get("signal") and 0 < int(first.get("exit_code") or 0) <= 128)
    return [{"source": "run", "kind": "failed_rank",
             "message": f"{prefix}rank {first['rank']} on {node_name(first.get('node'))} failed first with exit code "
                        f"{first['exit_code']}" + (f" (killed by {first['signal']}" + (
                            " from the kernel's OOM killer: its cgroup's oom_kill count rose" if first.get("oom_killer")
                            else "") + ")" if first.get("signal") else "")
                        + (f": {last}" if last else ""),
             "advice": f"read {log_path(d, int(first['rank']), 'err')}"}]


def _watch(run: Attempt) -> dict[str, Any]:
    """What the live watch saw (``hpcml.run.watch``): its timeline, the hang, the stragglers."""
    return {"timeline": [e.to_json() for e in run.timeline or []],
            "hang": run.hang.to_json() if run.hang is not None else None,
            "stragglers": [s.to_json() for s in run.stragglers or []],
            "contended": [s.to_json() for s in run.contended or []],
            "ignored_beats": [i.to_json() for i in run.ignored_beats or []]}


def stopped_hung(rep_or_watch: dict[str, Any]) -> bool:
    """The live watch found the job hung and stopped it (its ranks did not fail)."""
    watch = rep_or_watch.get("watch", rep_or_watch)
    return ((watch or {}).get("hang") or {}).get("action") == "stop"


def _watch_findings(watch: dict[str, Any], d: Path, attempt: int, prefix: str = "") -> list[dict[str, str]]:
    """What the live watch saw in one attempt, as findings (``prefix`` names the attempt
    when the job had several)."""
    out = []
    hang = watch["hang"]
    if hang:
        verdict = hang.get("verdict") or {}
        culprits = verdict.get("culprits") or []
        named = "; ".join(f"rank {c['rank']} on {node_name(c.get('node'))} at {c.get('where') or 'an unknown line'}"
                          for c in culprits[:4]) or f"no culprit named ({verdict.get('note') or 'no verdict'})"
        what = {"stop": f"stopped the job (exit {HANG})", "report": "let it run (--on-hang report)",
                "ended": "found the job ended by itself"}.get(hang.get("action"), "named it")
        out.append({"source": "run", "kind": "hang",
                    "message": f"the job hung: no rank completed a step for {hang['timeout']:.0f} s; culprit: {named}; "
                               f"the watch {what}",
                    "advice": f"the culprit's stack is in {observe_dir(d, attempt) / STACKS}; the other ranks waited "
                              "for it"})
    for i in watch.get("ignored_beats") or []:
        out.append({"source": "run", "kind": "ignored_heartbeat",
                    "message": f"the watch ignored heartbeats for rank {i['rank']} ({i['file']}): {i['why']}",
                    "advice": "something other than the rank's recorder wrote in the job directory's observe/beat "
                              "(the job's own program?): the watch judged the ranks by their own records only"})
    for s in watch["stragglers"]:
        st = Straggler.model_validate(s)
        out.append({"source": "run", "kind": "live_straggler",
                    "message": f"rank {s['rank']} on {node_name(s.get('node'))}{gpu_named(st)} was " + (
                        "the last to start most collectives (the Flight Recorder's arrivals) "
                        if s.get("measure") == "arrivals" else
                        f"{s['score']:.1f}x slower than the others from step {s['since_step']:,}"
                        f"{' or earlier' if s.get('since_before') else ''} ")
                    + f"(named while the job ran, by {MEASURES.get(s.get('measure'), 'its step times')}"
                    + (f", confidence {s['confidence']:.2f})" if s.get("confidence") is not None else ")"),
                    "advice": "vet that node (hpcml vet) or exclude it next time"})
    for s in watch.get("contended") or []:
        st = Straggler.model_validate(s)
        out.append({"source": "run", "kind": "contention",
                    "message": f"rank {st.rank} on {node_name(st.node)}{gpu_named(st)} was " + (
                        f"{slower(st)} " if st.measure == "arrivals" else       # no step ratio measured it
                        f"{st.score:.1f}x slower than the others from step {st.since_step:,}"
                        f"{' or earlier' if st.since_before else ''} ")
                    + f"while {contention(st)}: {held_back_by(st)} (named while the job ran)",
                    "advice": ("check that GPU's cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER) "
                               "and vet the node (hpcml vet)" if "GPU" in held_back_by(st) else
                               "look for processes outside the job on that node (another job, a daemon; "
                               "CPU steal: the hypervisor), or fewer threads per rank (OMP_NUM_THREADS, "
                               "DataLoader workers) than the cores it has")})
    return [{**f, "message": prefix + f["message"]} for f in out]


def build(d: str | Path) -> dict[str, Any]:
    d = Path(d)
    run = read_run(d)
    vet = _vet(d, run)
    aborted = bool(run.aborted)
    attempt = run.attempt
    ending = _ending(d, run)
    obs, obs_why = (None, "the command never started") if aborted else _observe(d, run, bool(ending["requeued"]))
    score, score_why = (None, "the command never started") if aborted else _score(d, attempt)
    earlier, earlier_obs, earlier_findings = _earlier(d, list(run.attempts or []), run)
    findings: list[dict[str, str]] = []
    if aborted and vet and vet.get("cluster_fault"):
        findings.append({"source": "vet", "kind": "cluster_fault", "message": "vetting could not judge the nodes: "
                         + vet["cluster_fault"].removeprefix("vetting: "),
                         "advice": "the cluster's fault, not the nodes': no node was excluded or reported bad; tell "
                                   "the centre (slurmctld, munged) and resubmit"})
    elif aborted:
        findings.append({"source": "vet", "kind": "aborted", "message": "vetting aborted the run before the command "
                         f"started: {plural(len(vet['good']) if vet else 0, 'good node')}, fewer than needed",
                         "advice": "see the vet section for each bad node's reasons; resubmit excluding them"})
    if ending["requeued"]:
        findings.append({"source": "run", "kind": "requeued",
                         "message": f"attempt {attempt} {requeue.describe(ending['requeued'])}",
                         "advice": "a requeue, not a failure: the job continues in this directory as its next attempt"})
    elif run.ended is None:
        findings.append(_unended(run))
    first = ending["first_failure"]
    watch = _watch(run)
    if run.restart is not None:           # the last fault, not restarted
        findings.append({"source": "run", "kind": "not_restarted", "message": f"attempt {attempt}: "
                         f"{describe(run.restart)}", "advice": "see the attempts in the report; fix what the "
                         "culprit's log says before resubmitting"})
    findings += _watch_findings(watch, d, attempt, f"attempt {attempt}: " if earlier else "")
    if not stopped_hung(watch):                                 # the ranks the watch stopped did not fail
        findings += _run_findings(d, ending, attempt)
    findings += earlier_findings
    if vet and vet.get("bad"):
        reasons = "; ".join(f"{n}: {', '.join(r) or 'failed'}" for n, r in sorted(run.excluded.items()))
        findings.append({"source": "vet", "kind": "excluded_nodes",
                         "message": f"vetting {'found' if aborted else 'excluded'} {plural(len(vet['bad']), 'bad node')}: {reasons}",
                         "advice": ("the command never started" if aborted else "the job ran without them")
                         + "; drain or repair them (hpcml vet shows each check)"})
    if vet and vet.get("avoided"):
        why = "; ".join(f"{n}: {', '.join((vet.get('reasons') or {}).get(n) or ['avoided'])}" for n in vet["avoided"])
        findings.append({"source": "vet", "kind": "avoided_nodes",
                         "message": f"the centre's avoid list left out {plural(len(vet['avoided']), 'node')}: {why}",
                         "advice": "the job ran without them; an operator who repaired one resumes it, and it leaves "
                                   "the list 7 days after the last job that named it"})
    if obs is not None:                  # what the run's own findings already say better is left out
        said = {"failed_rank"} | ({"missing_rank"} if first and first["exit_code"] in NEVER_STARTED else set())
        hung = {"job_hang"} if watch.get("hang") else set()       # the watch's own hang finding says more
        findings += [{"source": "observe", "kind": f.kind, "message": f.message, "advice": f.advice}
                     for f in obs.findings if not (first and f.kind in said) and f.kind not in hung]
    if score is not None:
        findings += [{"source": "score", "kind": "score", "message": f, "advice": ""} for f in score["findings"]]
    mlflow = None if aborted else outcome(observe_dir(d, attempt))
    if mlflow and mlflow["dropped"]:
        findings.append({"source": "mlflow", "kind": "mlflow_dropped", "message": f"MLflow: {mlflow['line']}",
                         "advice": mlflow.get("unreachable") or "the server refused some batches: see its log"})
    started, ended = (earlier[0]["started"] if earlier else run.started), run.ended
    obs_dict = obs.to_dict() if obs is not None else None
    led = None if aborted else _ledger(d, run, obs_dict)
    findings = _by_cost(findings, led, attempt)
    return {
        "schema": SCHEMA,
        "path": str(d),
        "job": {k: getattr(run, k) for k in ("command", "mode", "job_id", "allocation", "nodes", "ntasks",
                                             "ntasks_per_node", "master", "launch", "rank_launcher", "world", "ended",
                                             "attempt")}
        | {"started": started, "duration_s": round(ended - started, 3) if started and ended else None},
        "attempts": earlier,
        "vet": vet,
        "excluded": run.excluded,
        "env": _env(d),
        "ending": ending,
        "observe": obs_dict,
        "observe_missing": obs_why,
        "score": {k: v for k, v in score.items() if k not in ("series", "heatmap")} if score is not None else None,
        "score_missing": score_why,
        "mlflow": mlflow,
        "watch": watch,
        "recovery": _recovery(run, obs_dict),
        "ledger": led,
        "findings": findings,
        "_parts": {"observe": obs, "score": score, "attempts": earlier_obs},
    }


def to_json(rep: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rep.items() if not k.startswith("_")}


# -- terminal -------------------------------------------------------------------------------------

def _placed(job: dict[str, Any], end: dict[str, Any]) -> str:
    """Where the command ran, or that it never started (a vet abort has no tasks or nodes)."""
    if end.get("aborted"):
        return "not started (vetting aborted the run)"
    ranks = f" ({job['rank_launcher']}: {plural(int(job['world']), 'rank')})" if job.get("rank_launcher") and job.get("world") else ""
    return f"{plural(int(job.get('ntasks') or 0), 'task')}{ranks} on {', '.join(job.get('nodes') or []) or '–'}"


def _exit(code: Any) -> str:
    """"exit code N", or why there is none: never "None" for a person to read."""
    return f"exit code {code}" if code is not None else "no exit code (hpcml run was killed before it recorded one)"


def summary(rep: dict[str, Any]) -> list[str]:
    job, end = rep["job"], rep["ending"]
    lines = [f"job {job.get('job_id') or 'local'} ({job.get('mode')}): {' '.join(job.get('command') or [])}",
             f"  {_placed(job, end)}, {_exit(end['exit_code'])}"
             + (f", {job['duration_s']:.1f} s" if job.get("duration_s") is not None else "")]
    if rep.get("ledger"):
        lines.append(f"  {rep['ledger']['line']}")
    lines += [f"  {what}: {did}" for what, did in _did(rep)]
    lines += [f"  {line}" for line in _attempt_lines(rep)]
    vet = rep["vet"]
    if vet:
        bad = vet.get("bad") or []
        lines.append(f"  vet: {vet['decision']}, {len(vet.get('good') or [])} good, {len(bad)} bad"
                     + (f" ({'' if end.get('aborted') else 'excluded '}{', '.join(bad)})" if bad else ""))
        if vet.get("auto"):
            from hpcml.jobmodel import VetAuto
            from hpcml.vet.autoplan import lines as auto_lines
            lines += [f"    {line}" for line in auto_lines(VetAuto.model_validate(vet["auto"]))]
    if rep["env"]:
        lines.append(f"  environment: {rep['env'].get('edf')}")
    obs = rep["observe"]
    if obs and obs.get("throughput"):
        tp = obs["throughput"]
        lines.append(f"  throughput: median {'unknown' if tp.get('median') is None else tp['median']} {tp['unit']}")
    score = rep["score"]
    if score:
        if score.get("temporal_only"):
            lines.append("  GPU: temporal utilisation only, no saturation score")
        elif score.get("score") is not None:
            b = score["breakdown"]
            lines.append(f"  GPU saturation {score['score']:.2f} ({score.get('bound') or 'no'}-bound): compute "
                         f"{_share(b['compute'])}, memory {_share(b['memory'])}, interconnect {_share(b['interconnect'])}")
    else:
        lines.append(f"  GPU: {rep.get('score_missing')}")
    if rep.get("mlflow"):
        lines.append(f"  mlflow: {rep['mlflow']['line']}")
    lines += [f"  {line}" for line in timeline_lines(rep)]
    first = end["first_failure"]
    if first and not stopped_hung(rep):
        lines.append(f"  first failure: rank {first['rank']} exit {first['exit_code']}")
        lines += [f"    | {line}" for line in first["stderr_tail"][-5:]]
    lines += [finding_line(f) for f in rep["findings"][:8]]
    if not rep["findings"]:
        lines.append("→ no findings")
    return lines


def _watches(rep: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each attempt's live watch, oldest first, with the prefix that names its attempt (none
    for a job of one attempt): "While it ran" is the whole job's, never the last attempt's alone."""
    earlier = rep.get("attempts") or []
    out = [(f"attempt {a['attempt']}: ", a.get("watch") or {"timeline": a.get("timeline") or []}) for a in earlier]
    return out + [(f"attempt {rep['job'].get('attempt') or 0}: " if earlier else "", rep.get("watch") or {})]


def _did(rep: dict[str, Any]) -> list[tuple[str, str]]:
    """What the job did, from each attempt's observe store: steps, samples, the last value of
    each logged metric (rank 0's: ``hpcml.observe.progress``), first in every report."""
    from hpcml.observe.progress import line
    if rep["ending"].get("aborted"):
        return []
    attempts = [(a["attempt"], a.get("observe")) for a in rep.get("attempts") or []]
    attempts.append((rep["job"].get("attempt") or 0, rep.get("observe")))
    return [(f"did (attempt {n})" if len(attempts) > 1 else "did",
             line((obs or {}).get("progress")) if obs is not None else "no observe store")
            for n, obs in attempts]


def timeline_lines(rep: dict[str, Any]) -> list[str]:
    """The live watch's events of every attempt, as seconds from the job's start: began,
    detected, named, done."""
    t0 = rep["job"].get("started") or 0.0

    def at(t: Any) -> str:
        return f"{t - t0:.0f} s" if isinstance(t, (int, float)) else "unknown"
    out = []
    for prefix, watch in _watches(rep):
        for ev in watch.get("timeline") or []:
            line = f"{prefix}{ev['kind']}: {ev['what']} (began {at(ev.get('began'))}, detected {at(ev['detected'])}"
            line += f", named {at(ev['named'])}" if ev.get("named") else ""
            out.append(line + (f", {ev['action']}" if ev.get("action") else "") + ")")
    return out


def _culprits(rep: dict[str, Any]) -> list[dict[str, str]]:
    """The hang culprits the watch named, in every attempt."""
    return [{"attempt": prefix, "rank": c["rank"], "node": node_name(c.get("node")),
             "where": str(c.get("where") or "an unknown line"), "why": c["why"]}
            for prefix, watch in _watches(rep)
            for c in ((watch.get("hang") or {}).get("verdict") or {}).get("culprits") or []]


def _attempt_lines(rep: dict[str, Any]) -> list[str]:
    """One line per attempt of a requeued job: how each ended and the requeue before the next."""
    if not rep["attempts"]:
        return []
    out = []
    for a in rep["attempts"]:
        if a.get("restart"):
            out.append(f"attempt {a['attempt']} on {', '.join(a.get('nodes') or []) or 'unknown nodes'}: {describe(a['restart'])}")
            continue
        how = requeue.describe(a["requeued"]) if a["requeued"] else f"ended with {_exit(a['exit_code'])}"
        if a["requeued"] and a["exit_code"]:            # a rank failed for real, and the job was requeued
            how += f", exit code {a['exit_code']}"
        gap = f"; requeue gap {a['requeue_gap_s']:.0f} s" if a.get("requeue_gap_s") is not None else ""
        out.append(f"attempt {a['attempt']}: {how}{gap}")
    end = rep["ending"]
    how = requeue.describe(end["requeued"]) if end.get("requeued") else f"{_exit(end['exit_code'])}"
    if end.get("requeued") and end.get("exit_code"):
        how += f", {_exit(end['exit_code'])}"
    out.append(f"attempt {rep['job'].get('attempt') or 0} (this one) on {', '.join(rep['job'].get('nodes') or [])}: "
               f"{how}")
    lost = rep.get("recovery")
    if lost and lost.get("time_to_resume_s") is not None:
        redone = (f"steps done again: {lost['steps_lost_unknown']}" if lost.get("steps_lost_unknown")
                  else f"{plural(lost['steps_lost'], 'step')} done again"
                  + (f" ({lost['steps_lost'] * lost['step_s']:.0f} s)" if lost.get("step_s") else ""))
        cost = f"faults cost {lost['time_lost_s']:.0f} s: " if lost.get("time_lost_s") is not None else \
            "faults cost at least the time to resume: "
        unresumed = (f" (not counted: {plural(lost['not_resumed'], 'restart')} whose next attempt completed no step)"
                     if lost.get("not_resumed") else "")
        out.append(f"{cost}{lost['time_to_resume_s']:.0f} s from faults to resumed steps{unresumed}, {redone}")
    return out


# -- HTML -----------------------------------------------------------------------------------------

def _job_rows(rep: dict[str, Any]) -> list[list[Any]]:
    job, end = rep["job"], rep["ending"]
    never = "– (the command never started)" if end.get("aborted") else "–"
    code = end["exit_code"] if end["exit_code"] is not None else "none (hpcml run was killed before it recorded one)"
    time = [["time", rep["ledger"]["line"].removeprefix("time: ")]] if rep.get("ledger") else []
    return time + [[what, did] for what, did in _did(rep)] + [
        ["command", " ".join(job.get("command") or [])], ["mode", job.get("mode") or "–"],
        ["tasks", job.get("ntasks") or never],
        *([["ranks", f"{job['world']} ({job['rank_launcher']}'s workers)"]] if job.get("rank_launcher") and job.get("world") else []),
        ["nodes", ", ".join(job.get("nodes") or []) or never],
        ["rendezvous", job.get("master") or never], ["launch", " ".join(map(str, job.get("launch") or [])) or never],
        ["duration", f"{job['duration_s']:.1f} s" if job.get("duration_s") is not None else "–"],
        ["exit code", code]] + ([["mlflow", rep["mlflow"]["line"]]] if rep.get("mlflow") else [])


def _vet_rows(rep: dict[str, Any]) -> list[list[Any]]:
    vet, aborted = rep["vet"], rep["ending"].get("aborted")
    reasons = vet.get("reasons") or {}
    return [[n, "bad" if aborted else "excluded", "; ".join(rep["excluded"].get(n, []))] for n in vet.get("bad") or []] \
        + [[n, "avoided", "; ".join(reasons.get(n, []))] for n in vet.get("avoided") or []] \
        + [[n, "good", ""] for n in vet.get("good") or []]


def _ended(rep: dict[str, Any]) -> dict[str, Any]:
    """How it ended, for the page: one ``kind`` and what that kind shows."""
    end = rep["ending"]
    first = end["first_failure"]
    if stopped_hung(rep):
        return {"kind": "hung", "exit_code": HANG}
    if end.get("requeued"):
        return {"kind": "requeued", "what": requeue.describe(end["requeued"])}
    if first:
        return {"kind": "failed", "rank": first["rank"], "node": node_name(first.get("node")),
                "exit_code": first["exit_code"],
                "failed_ranks": first.get("failed_ranks"), "stderr": "\n".join(first["stderr_tail"])}
    if end.get("interrupted"):               # the page's one-line ending
        return {"kind": "unended", "message": f"hpcml run got {end['interrupted']}{_stopped_what(end)}"}
    if end.get("aborted"):
        return {"kind": "aborted"}
    if unended := [f for f in rep["findings"] if f["kind"] in UNENDED]:
        return {"kind": "unended", "message": unended[0]["message"]}
    return {"kind": "ok", "exit_code": end["exit_code"]}


def _parts_views(rep: dict[str, Any]) -> dict[str, Any]:
    """The observe sections of each attempt and the score's, as their own pages show them."""
    from hpcml.observe.html import view as observe_view
    from hpcml.score.html import view as score_view
    parts = rep.get("_parts") or {}
    observes = [{"heading": f"attempt {a['attempt']}", "view": observe_view(obs) if obs is not None else None,
                 "missing": str(a["observe_missing"])}
                for a, obs in zip(rep["attempts"], parts.get("attempts") or [])]      # a requeued job's earlier attempts
    observes.append({"heading": f"attempt {rep['job'].get('attempt') or 0}" if rep["attempts"] else None,
                     "view": observe_view(parts["observe"]) if parts.get("observe") is not None else None,
                     "missing": str(rep.get("observe_missing"))})
    return {"observes": observes, "score": score_view(parts["score"]) if parts.get("score") is not None else None,
            "score_missing": str(rep.get("score_missing"))}


#: findings of a fault in some attempt: with one, "the watch saw nothing" would contradict the page
FAULTS = frozenset({"failed_rank", "hang", "restarted", "not_restarted", "live_straggler", "job_hang"})


def _quiet(rep: dict[str, Any]) -> str:
    """What "While it ran" says when the watch recorded no event: that nothing went wrong
    only where no section of the report says something did."""
    if any(f["kind"] in FAULTS for f in rep["findings"]):
        return "the watch recorded no event; the faults are under Findings and How it ended"
    return "the watch saw no crash, hang or straggler"


def render(rep: dict[str, Any]) -> str:
    from hpcml.htmlkit import render as render_page
    vet, env = rep["vet"], rep["env"]
    return render_page(
        TEMPLATE, job_id=str(rep["job"].get("job_id") or "local"), path=rep["path"], job=_job_rows(rep),
        findings=[(f"[{f['source']}] {f['message']}", f["advice"]) for f in rep["findings"]],
        vet=None if not vet else {"protocol": str(vet.get("protocol") or ""), "decision": vet["decision"],
                                  "good": len(vet.get("good") or []), "bad": len(vet.get("bad") or []),
                                  "duration_s": vet.get("duration_s"),
                                  "rows": _vet_rows(rep)},
        env=json.dumps(env, indent=2, default=str) if env else None,
        attempts=None if not rep["attempts"] else {
            "how": "Restarted by hpcml run" if rep.get("recovery") else "A requeued Slurm job",
            "count": len(rep["attempts"]) + 1, "lines": _attempt_lines(rep)},
        ended=_ended(rep), events=timeline_lines(rep), quiet=_quiet(rep),
        culprits=_culprits(rep),
        **_parts_views(rep))


def write(rep: dict[str, Any], path: str | Path) -> Path:
    p = Path(path)
    try:
        p.write_text(render(rep), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write the report: {exc.strerror}", file=str(p)) from None
    return p
