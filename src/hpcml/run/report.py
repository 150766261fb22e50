"""``hpcml report JOBDIR``: one report for a job that ``hpcml run`` ran.

It gathers what the components already build, and builds nothing twice: the vet verdict
(``vet/report.json``), the environment (``env.json``), the observe report
(``hpcml.observe.report.build``), the GPU saturation score (``hpcml.score.report.build``
on the same store, when it holds GPU samples) and how the job ended (the first failing
rank, its exit code and the tail of its stderr). Findings of every part are ranked: how it
ended first, then the nodes vetting excluded, then the observe findings, then the score's.

The HTML page holds a section per part; the observe and score sections are those
components' own pages, embedded.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from hpcml.errors import HpcmlError, UsageError
from hpcml.run.jobdir import launcher_alive, log_path, observe_dir, read_run, tail, vet_dir
from hpcml.run.rankexec import NOT_EXECUTABLE, NOT_FOUND

SCHEMA = "hpcml.run.report/1"
TAIL_LINES = 20
UNENDED = ("launcher_killed", "running")         # _unended's kinds
NEVER_STARTED = (NOT_EXECUTABLE, NOT_FOUND)      # a shell's codes for a command that cannot start


def _vet(d: Path, run: dict) -> dict | None:
    info = run.get("vet")
    if not info:
        return None
    out = dict(info)
    p = vet_dir(d) / "report.json"
    if p.is_file():
        try:
            rep = json.loads(p.read_text())
            out["protocol"] = (rep.get("protocol") or {}).get("name")
        except (OSError, ValueError):
            pass
    return out


def _env(d: Path) -> dict | None:
    p = d / "env.json"
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"unreadable env.json: {exc}"}


def _observe(d: Path) -> tuple[Any, str | None]:
    from hpcml.observe.report import build
    from hpcml.observe.series import read_series
    try:
        return build(read_series(observe_dir(d))), None
    except HpcmlError as exc:
        return None, str(exc)


def _score(d: Path) -> tuple[dict | None, str | None]:
    from hpcml.score.importers import load
    from hpcml.score.report import build
    try:
        return build(load(observe_dir(d), "store")), None
    except HpcmlError as exc:
        why = str(exc)
        if "no GPU samples" in why:
            why = "no GPU samples" + (": no GPU visible to the tasks" if "none visible" in why else f" ({why})")
        return None, why


def _ending(d: Path, run: dict) -> dict:
    first = run.get("first_failure")
    out: dict[str, Any] = {"exit_code": run.get("exit_code"), "aborted": bool(run.get("aborted")),
                           "launcher_killed": run.get("ended") is None and launcher_alive(run) is False,
                           "first_failure": None}
    if first:
        r = first.get("rank")
        out["first_failure"] = {**first, "stderr_tail": tail(log_path(d, int(r), "err"), TAIL_LINES) if r is not None
                                else []}
    return out


def _unended(run: dict) -> dict[str, str]:
    """A run.json with no end: its launcher was killed (SIGKILL, the node's OOM killer), or
    it still runs; the ranks die with it (``hpcml.run.launcher``)."""
    who, alive = run.get("launcher") or {}, launcher_alive(run)
    name = f"hpcml run (pid {who.get('pid')} on {who.get('host')})"
    if alive:
        return {"source": "run", "kind": "running", "message": f"the job is still running: {name}",
                "advice": "run hpcml report again when it has ended"}
    return {"source": "run", "kind": "launcher_killed",
            "message": f"{name} was killed before the job ended" if alive is False
            else f"{name} did not record the end: it was killed, or still runs there",
            "advice": "its ranks were stopped with it; no exit code was recorded. Look for who killed it "
                      "(the node's OOM killer in dmesg, a kill -9, the end of the allocation)"}


def build(d: str | Path) -> dict[str, Any]:
    d = Path(d)
    run = read_run(d)
    vet = _vet(d, run)
    aborted = bool(run.get("aborted"))
    obs, obs_why = (None, "the command never started") if aborted else _observe(d)
    score, score_why = (None, "the command never started") if aborted else _score(d)
    ending = _ending(d, run)
    findings: list[dict[str, str]] = []
    if aborted:
        findings.append({"source": "vet", "kind": "aborted", "message": "vetting aborted the run before the command "
                         f"started: {len(vet['good']) if vet else 0} good nodes, fewer than needed",
                         "advice": "see the vet section for each bad node's reasons; resubmit excluding them"})
    if run.get("ended") is None:
        findings.append(_unended(run))
    first = ending["first_failure"]
    if first:
        last = next((line for line in reversed(first["stderr_tail"]) if line.strip()), "")
        findings.append({"source": "run", "kind": "failed_rank",
                         "message": f"rank {first['rank']} on {first.get('node')} failed first with exit code "
                                    f"{first['exit_code']}" + (f": {last.strip()}" if last else ""),
                         "advice": f"read {log_path(d, int(first['rank']), 'err')}"})
    if vet and vet.get("bad"):
        reasons = "; ".join(f"{n}: {', '.join(r) or 'failed'}" for n, r in sorted((run.get("excluded") or {}).items()))
        findings.append({"source": "vet", "kind": "excluded_nodes",
                         "message": f"vetting excluded {len(vet['bad'])} node(s): {reasons}",
                         "advice": "the job ran without them; drain or repair them (hpcml vet shows each check)"})
    if obs is not None:                  # what the run's own findings already say better is left out
        said = {"failed_rank"} | ({"missing_rank"} if first and first["exit_code"] in NEVER_STARTED else set())
        findings += [{"source": "observe", "kind": f.kind, "message": f.message, "advice": f.advice}
                     for f in obs.findings if not (first and f.kind in said)]
    if score is not None:
        findings += [{"source": "score", "kind": "score", "message": f, "advice": ""} for f in score["findings"]]
    started, ended = run.get("started"), run.get("ended")
    return {
        "schema": SCHEMA,
        "path": str(d),
        "job": {k: run.get(k) for k in ("command", "mode", "job_id", "allocation", "nodes", "ntasks",
                                        "ntasks_per_node", "master", "launch", "started", "ended")}
        | {"duration_s": round(ended - started, 3) if started and ended else None},
        "vet": vet,
        "excluded": run.get("excluded") or {},
        "env": _env(d),
        "ending": ending,
        "observe": obs.to_dict() if obs is not None else None,
        "observe_missing": obs_why,
        "score": {k: v for k, v in score.items() if k not in ("series", "heatmap")} if score is not None else None,
        "score_missing": score_why,
        "findings": findings,
        "_parts": {"observe": obs, "score": score},
    }


def to_json(rep: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rep.items() if not k.startswith("_")}


# -- terminal -------------------------------------------------------------------------------------

def summary(rep: dict[str, Any]) -> list[str]:
    job, end = rep["job"], rep["ending"]
    lines = [f"job {job.get('job_id') or 'local'} ({job.get('mode')}): {' '.join(job.get('command') or [])}",
             f"  {job.get('ntasks')} tasks on {', '.join(job.get('nodes') or [])}, exit code {end['exit_code']}"
             + (f", {job['duration_s']:.1f} s" if job.get("duration_s") is not None else "")]
    vet = rep["vet"]
    if vet:
        lines.append(f"  vet: {vet['decision']}, {len(vet['good'])} good, {len(vet['bad'])} bad"
                     + (f" (excluded {', '.join(vet['bad'])})" if vet["bad"] else ""))
    if rep["env"]:
        lines.append(f"  environment: {rep['env'].get('edf')}")
    obs = rep["observe"]
    if obs and obs.get("throughput"):
        tp = obs["throughput"]
        lines.append(f"  throughput: median {tp['median']} {tp['unit']}")
    score = rep["score"]
    if score:
        if score.get("temporal_only"):
            lines.append("  GPU: temporal utilisation only, no saturation score")
        elif score.get("score") is not None:
            b = score["breakdown"]
            lines.append(f"  GPU saturation {score['score']:.2f} ({score.get('bound') or 'no'}-bound): compute "
                         f"{b['compute']}, memory {b['memory']}, interconnect {b['interconnect']}")
    else:
        lines.append(f"  GPU: {rep.get('score_missing')}")
    first = end["first_failure"]
    if first:
        lines.append(f"  first failure: rank {first['rank']} exit {first['exit_code']}")
        lines += [f"    | {line}" for line in first["stderr_tail"][-5:]]
    for f in rep["findings"][:8]:
        lines.append(f"→ [{f['source']}] {f['message']}" + (f"  ({f['advice']})" if f["advice"] else ""))
    if not rep["findings"]:
        lines.append("→ no findings")
    return lines


# -- HTML -----------------------------------------------------------------------------------------

def _body(page: str) -> str:
    """A component's page without its document head: its sections, for embedding."""
    m = re.search(r"<body[^>]*>(.*)</body>", page, re.S)
    return m.group(1) if m else page


def render(rep: dict[str, Any]) -> str:
    from hpcml.htmlkit import CSS, table
    e = html.escape
    job, end = rep["job"], rep["ending"]
    out = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
           f"<title>hpcml run report {e(str(job.get('job_id') or 'local'))}</title><style>{CSS}</style></head><body>",
           f"<h1>hpcml run: job {e(str(job.get('job_id') or 'local'))}</h1><div class='muted'>{e(rep['path'])}</div>",
           "<section id='run-job'><h2>Job</h2>",
           table(["", ""], [["command", " ".join(job.get("command") or [])], ["mode", job.get("mode")],
                            ["tasks", job.get("ntasks")], ["nodes", ", ".join(job.get("nodes") or [])],
                            ["rendezvous", job.get("master")], ["launch", " ".join(map(str, job.get("launch") or []))],
                            ["duration", f"{job['duration_s']:.1f} s" if job.get("duration_s") is not None else "–"],
                            ["exit code", end["exit_code"]]]),
           "</section><section id='run-findings'><h2>Findings</h2>"]
    if rep["findings"]:
        out += [f"<div class='finding'><b>[{e(f['source'])}] {e(f['message'])}</b>"
                + (f"<br><span class='advice'>→ {e(f['advice'])}</span>" if f["advice"] else "") + "</div>"
                for f in rep["findings"]]
    else:
        out.append("<p>No findings.</p>")
    out.append("</section><section id='run-vet'><h2>Vetting</h2>")
    vet = rep["vet"]
    if vet:
        out.append(f"<p>{e(str(vet.get('protocol') or ''))}: <b>{e(vet['decision'])}</b>, {len(vet['good'])} good, "
                   f"{len(vet['bad'])} bad, {vet.get('duration_s')} s</p>")
        rows = [[n, "excluded", "; ".join(rep["excluded"].get(n, []))] for n in vet["bad"]]
        rows += [[n, "good", ""] for n in vet["good"]]
        out.append(table(["node", "verdict", "reasons"], rows))
    else:
        out.append("<p class='muted'>not vetted (no --vet)</p>")
    out.append("</section><section id='run-env'><h2>Environment</h2>")
    env = rep["env"]
    out.append(f"<pre>{e(json.dumps(env, indent=2, default=str))}</pre>" if env
               else "<p class='muted'>the host's environment (no --env)</p>")
    out.append("</section><section id='run-ending'><h2>How it ended</h2>")
    first = end["first_failure"]
    if first:
        out.append(f"<p>rank {first['rank']} on {e(str(first.get('node')))} failed first, exit code "
                   f"{first['exit_code']} ({first.get('failed_ranks')} rank(s) failed in all). Its stderr ends:</p>"
                   f"<pre>{e(chr(10).join(first['stderr_tail']))}</pre>")
    elif end.get("aborted"):
        out.append("<p>aborted by vetting before the command started.</p>")
    elif unended := [f for f in rep["findings"] if f["kind"] in UNENDED]:
        out.append(f"<p>{e(unended[0]['message'])}.</p>")
    else:
        out.append(f"<p>every rank ended with exit code 0; the run's exit code is {end['exit_code']}.</p>")
    out.append("</section><section id='run-observe'><h2>Throughput, stragglers, stalls</h2>")
    parts = rep.get("_parts") or {}
    if parts.get("observe") is not None:
        from hpcml.observe.html import render as observe_page
        out.append(_body(observe_page(parts["observe"])))
    else:
        out.append(f"<p class='muted'>{e(str(rep.get('observe_missing')))}</p>")
    out.append("</section><section id='run-score'><h2>GPU saturation</h2>")
    if parts.get("score") is not None:
        from hpcml.score.html import render as score_page
        out.append(_body(score_page(parts["score"])))
    else:
        out.append(f"<p class='muted'>no GPU score: {e(str(rep.get('score_missing')))}</p>")
    out.append("</section></body></html>")
    return "".join(out)


def write(rep: dict[str, Any], path: str | Path) -> Path:
    p = Path(path)
    try:
        p.write_text(render(rep), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write the report: {exc.strerror}", file=str(p)) from None
    return p
