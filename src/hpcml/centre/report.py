"""The centre's report (``hpcml centre report``, alias ``hpcml vet fleet-report``): what every
job's summary and every vetting result say together, over a time window.

- the nodes that hurt the most jobs (excluded by vetting, stragglers, hang culprits, lost),
  each beside its vetting history: a node that passes vetting but keeps slowing or hanging
  jobs is the one vetting misses, and the one to drain;
- per user and account, the GPU-hours, the mean GPU saturation score and the lowest
  scoring jobs, owners with the most idle GPU-hours (GPU-hours × (1 − score)) first;
- the GPU-hours and time the faults cost, in all and per account;
- where the allocations' time went (each job's ledger, ``hpcml.run.ledger``): the jobs and
  users whose allocations trained least, in GPU-hours (node-hours for jobs without GPUs)
  and the part that cost most (start-up, vetting, a hang's detection, idle spares, ...),
  and the nodes named as the cause of faults, by the time their jobs did not train.

Everything is one SQL aggregate per part (``centre.jobstore``), so 100,000 jobs and
10,000 nodes take seconds, not minutes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from hpcml.schemas import tag
from hpcml.words import plural, printable

SCHEMA = tag("vet.fleet", 1)    # kept from when it was vet's: readers of the JSON know this tag


class Facts(Protocol):
    """What the report asks of the collector's store (``centre.collector.store.Store``):
    one SQL aggregate per part, over jobs (``centre.jobstore``) and vetting results."""

    def node_harm(self, since: float, limit: int) -> list[dict[str, Any]]: ...

    def prolog_drains(self, since: float, limit: int) -> list[dict[str, Any]]: ...

    def vet_history(self, nodes: Sequence[str], since: float) -> dict[str, dict[str, Any]]: ...

    def node_details(self, nodes: Sequence[str], since: float) -> dict[str, dict[str, Any]]: ...

    def job_totals(self, since: float) -> dict[str, Any]: ...

    def scores_by_owner(self, since: float, per_owner: int, owners: int) -> list[dict[str, Any]]: ...

    def lost_by_account(self, since: float) -> list[dict[str, Any]]: ...

    def not_training_jobs(self, since: float, limit: int) -> list[dict[str, Any]]: ...

    def not_training_by_user(self, since: float, limit: int) -> list[dict[str, Any]]: ...

    def not_training_by_node(self, since: float, limit: int) -> list[dict[str, Any]]: ...

    def results_since(self, since: float) -> list[dict[str, Any]]: ...

    def job_events_since(self, since: float) -> list[dict[str, Any]]: ...


def build(store: Facts, since_s: float, *, top: int = 20, per_owner: int = 3, now: float | None = None,
          drains: list[dict[str, Any]] | None = None, declared: dict[str, dict[str, Any]] | None = None,
          with_verdicts: bool = True, states: dict[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """The report over the last ``since_s`` seconds; ``drains`` (the handler's audit log,
    ``precision.drains_from_audit``) and ``declared`` (each rule's ``Rule.evidence``) add the
    rules' precision to the checks'. ``with_verdicts=False`` (the collector's ``GET /v1/fleet``):
    no verdicts (null), whose every result of the window is read into memory: the command's,
    not a request's, work. ``states``: each node's Slurm state and reason now (the command
    reads them where Slurm answers; the collector does not), for the next action."""
    now = time.time() if now is None else now
    since = now - since_s
    nodes = store.node_harm(since, top)
    names = [n["node"] for n in nodes]
    vet = store.vet_history(names, since)
    details = store.node_details(names, since)
    for n in nodes:
        n["vet"] = vet.get(n["node"])
        n.update(details.get(n["node"]) or {})
        n["slurm"] = _slurm(states, n["node"])
        n["next"] = next_action(n)
    prolog = store.prolog_drains(since, top)
    for d in prolog:
        d["slurm"] = _slurm(states, d["node"])
        d["next"] = drain_next(d)
    return {"schema": SCHEMA, "generated": now, "since": since, "window_s": since_s,
            "totals": store.job_totals(since), "nodes": nodes, "prolog_drains": prolog,
            "owners": store.scores_by_owner(since, per_owner, top), "accounts": store.lost_by_account(since)[:top],
            "not_training": {"jobs": store.not_training_jobs(since, top), "users": store.not_training_by_user(since, top),
                             "nodes": store.not_training_by_node(since, top)},
            "verdicts": verdicts(store, since, now, drains, declared) if with_verdicts else None}


def _slurm(states: dict[str, tuple[str, str]] | None, node: str) -> dict[str, str] | None:
    """A node's Slurm state and reason now, where the command read them."""
    state = (states or {}).get(node)
    return None if state is None else {"state": state[0], "reason": state[1]}


def _state_text(slurm: dict[str, str] | None) -> str:
    """"IDLE+DRAIN (hpcml: scratch ...)", or "not read"."""
    if not slurm:
        return "not read"
    return slurm["state"] + (f" ({slurm['reason']})" if slurm.get("reason") else "")


def _drained_advice(slurm: dict[str, str] | None, wait: str) -> str | None:
    """``wait`` for a node hpcml drained, "repair" for one someone else drained or took
    down, None for one Slurm schedules (or whose state was not read)."""
    from hpcml.centre.rules import REASON_PREFIX
    state, reason = str((slurm or {}).get("state") or "").upper(), str((slurm or {}).get("reason") or "")
    if "DRAIN" not in state and "DOWN" not in state:
        return None
    if reason.startswith(REASON_PREFIX):
        return wait
    return f"repair: {state.lower()} by someone else ({reason or 'no reason'}); resume it by hand when fixed"


def next_action(n: dict[str, Any]) -> str:
    """What an operator does next about a node the jobs named, from what is known of it."""
    faults = n.get("straggler", 0) + n.get("culprit", 0) + n.get("lost", 0)
    vet = n.get("vet") or {}
    held = _drained_advice(n.get("slurm"), "wait: hpcml drained it; hpcml centre handle resumes it once its checks "
                                           "pass again")
    if held:
        return held
    if n.get("users", 0) >= 2 and faults >= 2:
        return (f"drain and test: proven jobs of {n['users']} users named it {faults}x "
                "(the hurts-jobs rule drains it; hpcml vet run --nodes NODE tests it)")
    if vet.get("bad"):
        checks = ", ".join(c["check"] for c in (vet.get("failing_checks") or [])[:3]) or "its checks"
        return f"test: its vetting failed ({checks}); vet it again before it takes jobs"
    if n.get("users", 0) <= 1 and faults:
        return "watch: one user's jobs named it; their code may be the cause"
    if faults and vet.get("reports") and vet["reports"] == (vet.get("unchecked") or 0):
        return "test: its vetting measured nothing in the window (not checked); vet it when it is idle"
    if faults and not vet.get("reports"):
        return "test: not vetted in the window; vet it when it is idle"
    return "watch: vetting never caught it; test it when it is idle" if faults else "none"


def drain_next(d: dict[str, Any]) -> str:
    """What an operator does next about a node the prolog or health check drained, or found
    bad and could not drain."""
    if d.get("slurm") is None:
        return "read its Slurm state (hpcml centre report does where scontrol answers)"
    held = _drained_advice(d["slurm"], "wait: hpcml drained it; hpcml centre handle resumes it once the failed "
                                       "checks pass twice (a rule's drain without resume_after waits for a person: "
                                       "the audit log says which)")
    if held:
        return held
    if d.get("last_failed"):
        return ("drain it by hand: the prolog found it bad and could not drain it, and Slurm still schedules it "
                "(give the health check SLURM_CONF; its error is in the collector)")
    return f"watch: back in service after {plural(d['drains'], 'drain')}"


def prolog_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Nodes the prolog or health check drained or could not drain, named by a job or not."""
    if not rows:
        return []
    out = ["", "drained by the prolog or health check (node evidence), newest first:"]
    for d in rows:
        failed = f", {plural(d['failed_drains'], 'failed drain')} (bad, left schedulable)" if d["failed_drains"] else ""
        checks = ", ".join(printable(c) for c in d["checks"]) or "no check named"
        out.append(f"  {printable(d['node'])}: {plural(d['drains'], 'drain')}{failed}; last {_when(d['last'])} "
                   f"({checks}); Slurm: {printable(_state_text(d.get('slurm')))}")
        out.append(f"    next: {printable(d['next'])}")
    return out


def verdicts(store: Facts, since: float, now: float, drains: list[dict[str, Any]] | None,
             declared: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """How often each check and rule was right (``centre.precision``), from the results and
    proven job outcomes of the window and one horizon before it."""
    from hpcml.centre.precision import HORIZON, Evidence, checks, rules
    ev = Evidence(store.results_since(since - HORIZON), store.job_events_since(since - HORIZON))
    return {"horizon_s": HORIZON, "checks": checks(ev, since, now, drains=drains or ()),
            "rules": rules(ev, drains or [], since, now, declared) if drains is not None else None}


def _hours(d: dict[str, Any]) -> str:
    """Time that did not train, in GPU-hours where every job's GPUs are known, else node-hours
    (known for every job): a sum that leaves some job out is never shown as the whole; "≥"
    where a job's ledger could only bound it."""
    at_least = "≥ " if d.get("lower_bound") else ""      # steps done again nobody measured: counted as training
    if d.get("gpu_hours_not_training") and not d.get("gpus_uncounted"):
        return f"{at_least}{d['gpu_hours_not_training']:,.2f} GPU-h"
    return f"{at_least}{d['node_hours_not_training']:,.2f} node-h"


def not_training_lines(nt: dict[str, Any]) -> list[str]:
    """The jobs, users and nodes whose allocations trained least, and why."""
    if not nt or not (nt["jobs"] or nt["users"]):
        return ["", "time that did not train: no job in the window has a ledger"]
    out = ["", "time that did not train (each job's ledger: allocation less productive steps), most first:"]
    out += [f"  job {printable(j['job'])} ({printable(j['user'] or '?')}): {_hours(j)}, most of it "
            f"{printable(j['why'] or '?')}" for j in nt["jobs"][:10]]
    out += [f"  user {printable(u['user'] or '?')}: {_hours(u)} over {plural(u['jobs'], 'job')}, most of it "
            f"{printable(u['why'] or '?')}" for u in nt["users"][:10]]
    out += [f"  node {printable(n['node'])}: {_hours(n)} in jobs that named it "
            + ", ".join(f"{r} {c}x" for r, c in sorted(n["roles"].items())) for n in nt["nodes"][:10]]
    return out


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)) if t else "–"


def _score(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def vet_line(v: dict[str, Any] | None) -> str:
    """A node's vetting history in a few words; a report that checked nothing is said so,
    never counted as a vetting it passed."""
    if not v or not v["reports"]:
        return "not vetted in the window"
    unchecked = v.get("unchecked") or 0
    checked = v["reports"] - unchecked
    if not checked:
        return f"not checked: {plural(unchecked, 'vetting')} in the window measured nothing"
    text = f"vetted {checked}x, {v['bad']} bad"
    if unchecked:
        text += f", not checked {unchecked}x (measured nothing)"
    if v["failing_checks"]:
        text += " (" + ", ".join(f"{printable(c['check'], 60)} {c['count']}x" for c in v["failing_checks"][:3]) + ")"
    if v["bad"] == 0:
        text += ": vetting never caught it"
    return text


def lines(rep: dict[str, Any]) -> list[str]:
    """The terminal report."""
    t = rep["totals"]
    days = rep["window_s"] / 86400
    out = [f"centre report: {plural(t['jobs'], 'job')} since {_when(rep['since'])} UTC ({days:g} days)",
           f"  {_totals(t)}", *_stopped(t), *_unverified(t), "",
           "nodes that hurt the most jobs (crashed ranks are their code's, not counted):"]
    if not rep["nodes"]:
        out.append("  none: no job named a node in the window")
    for n in rep["nodes"]:
        roles = ", ".join(f"{k} {n[k]}" for k in ("straggler", "culprit", "lost", "excluded") if n[k])
        code = f"; {n['crashed']} crashed ranks (their code's)" if n.get("crashed") else ""
        out.append(f"  {printable(n['node'])}: {plural(n['jobs'], 'job')} ({roles}){code}; last {_when(n['last'])}; "
                   f"{vet_line(n['vet'])}")
        out.append(f"    {_impact(n)}")
        out.append(f"    next: {printable(n.get('next') or 'none')}")
    out += ["", "lowest GPU scores, by user and account:"]
    if not rep["owners"]:
        out.append("  none: no job in the window has a GPU score")
    for o in rep["owners"]:
        worst = ", ".join(f"{printable(j['job'])} {_score(j['score'])}"
                          + (f" {printable(j['bound'])}-bound" if j["bound"] else "") for j in o["lowest"])
        out.append(f"  {printable(o['user'] or '?')} / {printable(o['account'] or '?')}: {o['jobs']} jobs, "
                   f"{_gpu_hours(o['gpu_hours'])} GPU-h, mean score {_score(o['mean_score'])}, "
                   f"{_gpu_hours(o['idle_gpu_hours'])} GPU-h idle; lowest: {worst}")
    lost = [a for a in rep["accounts"] if a["gpu_hours_lost"] or a["time_lost_s"] or a.get("lost_unmeasured")]
    if lost:
        out += ["", "time lost to faults, by account:"]
        out += [f"  {printable(a['account'] or '?')}: {_lost_text(a, 'GPU-h', 2)} of "
                f"{_gpu_hours(a['gpu_hours'], a.get('gpus_uncounted'))} GPU-h over {a['jobs']} jobs" for a in lost]
    return (out + prolog_lines(rep.get("prolog_drains") or []) + not_training_lines(rep.get("not_training") or {})
            + verdict_lines(rep.get("verdicts") or {}))


def _impact(n: dict[str, Any]) -> str:
    """Who and what a node hurt, what it cost, where it stands."""
    jobs = ", ".join(printable(j) for j in n.get("job_ids") or []) or "–"
    if n.get("node_hours_lost") is None:
        lost = "not measured (a slowdown is not priced)"
    else:
        counted = n.get("gpu_hours_lost") and not n.get("gpus_uncounted")     # else node-h: every job's is known
        lost = (f"{n['gpu_hours_lost']:,.1f} GPU-h" if counted else f"{n['node_hours_lost']:,.1f} node-h")
        if n.get("unpriced"):               # jobs it slowed or that recovered, whose loss nobody priced
            lost = f"at least {lost} ({plural(n['unpriced'], 'job')} not priced)"
    stopped = f", {plural(n['stopped'], 'job')} stopped (whole allocations, an upper bound)" if n.get("stopped") else ""
    prolog = f"; the prolog drained it {n['prolog_drains']}x" if n.get("prolog_drains") else ""
    return (f"{plural(n.get('users', 0), 'user')}; jobs {jobs}; lost {lost}{stopped}; "
            f"Slurm: {printable(_state_text(n.get('slurm')))}{prolog}")


def _ratio(v: float | None, ci: list | None) -> str:
    if v is None:
        return "–"
    lo, hi = ci or (None, None)
    return f"{v:.2f}" + (f" [{lo:.2f}-{hi:.2f}]" if lo is not None and hi is not None else "")


def _lead(s: float | None) -> str:
    return "–" if s is None else f"{s / 3600:,.1f} h"


def verdict_rows(rows: list[dict[str, Any]], key: str) -> list[list[str]]:
    """One row per check or rule: flags, confirmed, refuted, pending, precision, recall, lead."""
    return [[printable(r[key], 60), str(r["flags"]), str(r["confirmed"]), str(r["refuted"]), str(r["pending"]),
             _ratio(r["precision"], r["precision_ci"]), f"{r['caught']}/{r['bad_nodes']}",
             _ratio(r["recall"], r["recall_ci"]), _lead(r["lead_s_median"])] for r in rows]


def verdict_lines(v: dict[str, Any]) -> list[str]:
    """How often each check and rule was right, and the rules below their floor."""
    if not v:
        return []
    days = v["horizon_s"] / 86400
    out = ["", f"how often each verdict was right (confirmed: a proven job or another kind of check saw the node "
               f"fail within {days:g} days; precision [95% interval]; recall: bad nodes caught before the first "
               "job they hurt; lead: median time before it):"]
    flagged = [r for r in v["checks"] if r["flags"]]
    if not flagged:
        out.append("  no check flagged a node in the window")
    for r, row in zip(flagged, verdict_rows(flagged, "check")):
        held = f", {r['drained']} while drained (not judged)" if r.get("drained") else ""
        out.append(f"  check {row[0]}: {row[1]} flags, {row[2]} confirmed, {row[3]} refuted, {row[4]} pending{held}; "
                   f"precision {row[5]}; caught {row[6]} bad nodes, recall {row[7]}; lead {row[8]}")
    for r, row in zip(v.get("rules") or [], verdict_rows(v.get("rules") or [], "rule")):
        floor = f"; BELOW ITS FLOOR {r['floor']:.2f}: not to be trusted" if r["below_floor"] else ""
        out.append(f"  rule {row[0]}: {row[1]} drains, {row[2]} confirmed, {row[3]} refuted, {row[4]} pending; "
                   f"precision {row[5]}{floor}; caught {row[6]} bad nodes, recall {row[7]}; lead {row[8]}")
    return out


def _totals(t: dict[str, Any]) -> str:
    n = t.get("gpus_uncounted") or 0
    uncounted = f" ({plural(n, 'job')} whose GPUs nobody counted: no rank ran)" if n else ""
    return (f"{_gpu_hours(t['gpu_hours'], n)} GPU-hours{uncounted}, {t['node_hours']:,.1f} node-hours; faults cost "
            f"{_lost_text(t, 'GPU-hours', 1)}; {t['failed']:,} failed, {t['hung']:,} hung")


def _gpu_hours(value: float | None, uncounted: int | None = 0, digits: int = 1) -> str:
    """GPU-hours: the sum of those counted, "≥" it where some job's GPUs went uncounted (no
    rank ran to say), "not counted" where no job's were (``jobstore._lost``): unknown is
    never 0."""
    if value is None:
        return "not counted"
    return ("≥ " if uncounted else "") + f"{value:,.{digits}f}"


def _lost_text(t: dict[str, Any], unit: str, digits: int) -> str:
    """What faults cost: the measured sum ("at least" where some job's loss went unmeasured),
    or "not measured" where none was (``jobstore._lost``): unknown is never 0."""
    n = t.get("lost_unmeasured") or 0
    m = t.get("lost_gpus_uncounted") or 0
    jobs = plural(n, "failed, hung or restarted job")
    if t["time_lost_s"] is None:
        return f"not measured ({jobs}, no recovery priced their loss)"
    hours = f"{t['time_lost_s'] / 3600:,.{digits}f} h of job time"
    if t["gpu_hours_lost"] is None:          # time measured, GPUs of none of those jobs counted
        text = f"{unit} not counted ({hours}, {plural(m, 'job')} whose GPUs nobody counted)"
        return f"at least {text}, not measured for {jobs}" if n else text
    text = f"{t['gpu_hours_lost']:,.1f} {unit} ({hours})"
    said = ([f"not measured for {jobs}"] if n else []) + ([f"GPUs not counted for {plural(m, 'job')}"] if m else [])
    return f"at least {text}, {'; '.join(said)}" if said else text


def _figure(value: float | None, digits: int, row: dict[str, Any], gpus: bool = False) -> str:
    """A lost-time cell: the sum, "≥" it where some loss went unmeasured (or, for GPU-hours,
    some job's GPUs went uncounted), "not measured" / "not counted"."""
    lower = row.get("lost_unmeasured") or (gpus and row.get("lost_gpus_uncounted"))
    if value is None:
        return "not counted" if gpus and row.get("time_lost_s") is not None else "not measured"
    return ("≥ " if lower else "") + f"{value:,.{digits}f}"


def _stopped(t: dict[str, Any]) -> list[str]:
    """Jobs a node fault ended without a recovery: their allocations, not counted above."""
    n = t.get("stopped_by_node") or 0
    if not n:
        return []
    size = (f"{t['gpu_hours_stopped']:,.1f} GPU-h" if t.get("gpu_hours_stopped") and not t.get("stopped_gpus_uncounted") else
            f"{t.get('node_hours_stopped') or 0:,.1f} node-h")
    return [f"  {plural(n, 'job')} a node fault stopped without a recovery: {size} of allocations "
            "(an upper bound of what they lost)"]


def _unverified(t: dict[str, Any]) -> list[str]:
    n = t.get("unverified") or 0
    return [f"  {plural(n, 'summary', 'summaries')} whose sender nothing proved: shown per job, counted nowhere"] if n else []


def render_html(rep: dict[str, Any]) -> str:
    """One offline page (``templates/centre.html.j2``): no script, no external resource; every
    value escaped by the template."""
    from hpcml.htmlkit import render
    nodes = [[n["node"], n["jobs"], n["straggler"], n["culprit"], n["crashed"], n["lost"], n["excluded"], _when(n["last"]),
              vet_line(n["vet"]), _impact(n), n.get("next") or "none"] for n in rep["nodes"]]
    owners = [[o["user"] or "?", o["account"] or "?", o["jobs"], _gpu_hours(o["gpu_hours"]), _score(o["mean_score"]),
               _gpu_hours(o["idle_gpu_hours"]),
               "; ".join(f"{j['job']} {_score(j['score'])}" + (f" ({j['bound']}-bound)" if j["bound"] else "")
                         for j in o["lowest"])] for o in rep["owners"]]
    accounts = [[a["account"] or "?", a["jobs"], _gpu_hours(a["gpu_hours"], a.get("gpus_uncounted")),
                 _figure(a["gpu_hours_lost"], 1, a, gpus=True),
                 _figure(None if a["time_lost_s"] is None else a["time_lost_s"] / 3600, 2, a)] for a in rep["accounts"]]
    prolog = [[d["node"], d["drains"], d["failed_drains"], _when(d["last"]), ", ".join(d["checks"]) or "–",
               _state_text(d.get("slurm")), d["next"]] for d in rep.get("prolog_drains") or []]
    t = rep["totals"]
    totals = _totals(t)
    nt = rep.get("not_training") or {"jobs": [], "users": [], "nodes": []}
    nt_jobs = [[j["job"], j["user"] or "?", _hours(j), j["why"] or "?"] for j in nt["jobs"]]
    nt_users = [[u["user"] or "?", u["jobs"], _hours(u), u["why"] or "?"] for u in nt["users"]]
    nt_nodes = [[n["node"], _hours(n), ", ".join(f"{r} {c}x" for r, c in sorted(n["roles"].items()))]
                for n in nt["nodes"]]
    v = rep.get("verdicts") or {"horizon_s": 0, "checks": None, "rules": None}
    checks = None if v["checks"] is None else verdict_rows([r for r in v["checks"] if r["flags"]], "check")
    rules = None if v.get("rules") is None else [
        row + [("BELOW " if r["below_floor"] else "") + (f"{r['floor']:.2f}" if r["floor"] is not None else "–")]
        for r, row in zip(v["rules"], verdict_rows(v["rules"], "rule"))]
    note = (f"A flag is confirmed when a proven job or another kind of check saw the node fail within "
            f"{v['horizon_s'] / 86400:g} days of it, refuted when nothing did, pending while that time runs; "
            "recall counts the bad nodes (named by a proven job) a check flagged before the first job they hurt.")
    return render("centre.html.j2", since=_when(rep["since"]), jobs=f"{t['jobs']:,}", totals=totals,
                  unverified=[line.strip() for line in _unverified(t)], nodes=nodes, prolog=prolog, owners=owners, accounts=accounts,
                  nt_jobs=nt_jobs, nt_users=nt_users, nt_nodes=nt_nodes, checks=checks, rules=rules,
                  verdict_note=note)
