"""What a vetting run hands to people and to job scripts.

``to_json`` is the machine-readable record; ``write_outputs`` leaves the files a job script
acts on (an exclude list in Slurm hostlist syntax for ``srun --exclude``, the good nodes
for ``srun --nodelist``); ``table`` renders the node x check grid for people, folding the
healthy nodes into one line when the allocation is large.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hpcml.cluster.hostlist import fold
from hpcml.files import write_atomic
from hpcml.schemas import VET_REPORT as SCHEMA
from hpcml.units import fmt_bytes
from hpcml.vet.engine import VetRun
from hpcml.vet.model import Json, Outcome
from hpcml.words import LINE_MAX, plural, shown

_STYLE = {Outcome.PASS: "green", Outcome.WARN: "yellow", Outcome.FAIL: "bold red",
          Outcome.ERROR: "bold magenta", Outcome.SKIPPED: "dim"}
#: above this many nodes the table lists only the nodes that are not all-pass
FULL_TABLE_NODES = 32


def to_json(run: VetRun) -> dict[str, Json]:
    """The report's document, ``hpcml.jobmodel.VetReport``: built by hand, not through the
    model (10k nodes in a fraction of a second, no pydantic); ``tests/vet/test_report_model.py``
    holds the two to one set of keys."""
    v = run.verdict
    p = run.protocol
    return {
        "schema": SCHEMA,
        "protocol": {"name": p.name, "source": p.source, "vetnode": p.vetnode,
                     "checks": [{"name": e.name, "type": e.type, "scope": e.scope,
                                 "timeout": e.timeout, "severity": e.severity,
                                 "count_errors": e.count_errors, "params": e.params,
                                 "min_relative": e.min_relative, "max_relative": e.max_relative}
                                for e in p.evals]},
        "job_id": run.job_id,
        "launcher": run.launcher,
        "started_at": run.started_at,
        "duration": round(run.duration, 4),
        "nodes": {n: run.reports[n].to_dict() for n in run.nodes},
        "verdict": {"decision": v.decision.value, "exit_code": v.exit_code,
                    "min_nodes": v.min_nodes, "good": v.good_hostlist, "bad": v.bad_hostlist,
                    "good_count": len(v.good), "bad_count": len(v.bad), "reasons": v.reasons},
        "notes": run.notes,
    }


def dumps(data: dict[str, Json]) -> str:
    """Compact JSON: the C encoder only runs without ``indent`` (5x faster at 10k nodes)."""
    return json.dumps(data, separators=(",", ":"), default=str)


def output_paths(out_dir: str | Path, *, exclude_file: str | Path | None = None,
                 good_file: str | Path | None = None) -> dict[str, Path]:
    """Where report.json, bad-nodes and good-nodes go."""
    out = Path(out_dir)
    return {"report": out / "report.json",
            "exclude": Path(exclude_file) if exclude_file else out / "bad-nodes",
            "good": Path(good_file) if good_file else out / "good-nodes"}


#: the setting that names each output, for the one-line error (the CLI shows it as its flag)
_SETTING = {"report": "out", "exclude": "exclude_file", "good": "good_file"}


def check_writable(out_dir: str | Path, *, exclude_file: str | Path | None = None,
                   good_file: str | Path | None = None, workdir: str | Path | None = None) -> None:
    """Refuse, before any check runs, outputs that could not be written after it: a verdict
    reached in minutes on every node must not end in a traceback over a typo'd path. Creates
    the output directory (and the work directory), and a file in each output's folder to
    see that it can; a UsageError naming the setting otherwise."""
    import tempfile

    from hpcml.errors import UsageError

    def folder(path: Path, key: str) -> None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = "not a directory" if isinstance(exc, FileExistsError) else exc.strerror or str(exc)
            raise UsageError(f"cannot make the directory {path}: {why}", key=key) from None

    folder(Path(out_dir), "out")
    if workdir is not None:
        folder(Path(workdir), "workdir")
    for what, path in output_paths(out_dir, exclude_file=exclude_file, good_file=good_file).items():
        if path.is_dir():
            raise UsageError(f"cannot write {path}: it is a directory", key=_SETTING[what])
        try:
            fd, probe = tempfile.mkstemp(dir=path.parent, prefix=".hpcml-vet-probe-")
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror or exc}", key=_SETTING[what]) from None
        os.close(fd)
        os.unlink(probe)


def write_outputs(run: VetRun, out_dir: str | Path, *, exclude_file: str | Path | None = None,
                  good_file: str | Path | None = None) -> dict[str, Path]:
    """Write report.json, bad-nodes and good-nodes atomically (a reader never sees half).
    OSError naming the file that could not be written."""
    out = Path(out_dir)
    paths = output_paths(out, exclude_file=exclude_file, good_file=good_file)
    texts = {"report": dumps(to_json(run)) + "\n",
             "exclude": run.verdict.bad_hostlist + "\n",
             "good": run.verdict.good_hostlist + "\n"}
    for key, path in paths.items():
        try:
            if key == "report":
                out.mkdir(parents=True, exist_ok=True)
            write_atomic(path, texts[key])
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from None
    return paths


def _short(value, unit: str | None) -> str:
    if value is None or isinstance(value, bool):
        return ""
    if isinstance(value, (int, float)):
        if unit == "B":
            return fmt_bytes(value)
        return f"{value:.3g} {unit or ''}".rstrip()
    return str(value)[:20]


def _cell(result) -> str:
    text = _short(result.value, result.unit)      # a check's own value: a string may hold '[/]'
    return f"[{_STYLE[result.outcome]}]{result.outcome.value}[/]" + (f" {shown(text)}" if text else "")


def table(run: VetRun):
    """The node x check grid for a terminal. Every protocol, check and node name goes
    through ``shown``: Rich would read '[/bold]' in a name as markup (and end with an error)."""
    from rich.table import Table
    checks = [e.name for e in run.protocol.evals]
    t = Table(title=f"hpcml vet: {shown(run.protocol.name)}", show_lines=False)
    t.add_column("node", style="bold")
    for name in checks:
        t.add_column(shown(name))
    t.add_column("verdict")
    bad = set(run.verdict.bad)
    hidden: dict[tuple, list[str]] = {}     # folded: nodes whose every check passed or was skipped, alike
    for node in run.nodes:
        rep = run.reports[node]
        outcomes = {r.outcome for r in rep.results}
        if len(run.nodes) > FULL_TABLE_NODES and node not in bad and outcomes <= {Outcome.PASS, Outcome.SKIPPED}:
            by_check = {r.check: r.outcome for r in rep.results}
            hidden.setdefault(tuple(by_check.get(c) for c in checks), []).append(node)
            continue
        if not rep.reachable:
            t.add_row(shown(node), *(["[bold red]unreachable[/]"] + [""] * (len(checks) - 1)),
                      "[bold red]bad[/]")
            continue
        by_name = {r.check: r for r in rep.results}
        t.add_row(shown(node), *[_cell(by_name[c]) if c in by_name else "" for c in checks],
                  "[bold red]bad[/]" if node in bad else "[green]good[/]")
    for row, nodes in hidden.items():       # each column as it was: a skipped check is not a pass
        t.add_row(f"{shown(fold(nodes, sort=True), LINE_MAX)} ({len(nodes)})",
                  *["[green]pass[/]" if o is Outcome.PASS else "[dim]skipped[/]" if o is Outcome.SKIPPED else ""
                    for o in row], "[green]good[/]")
    return t


def log_lines(run: VetRun) -> list[str]:
    """The table for a batch log (no terminal: 80 columns would wrap every cell): one line
    per node with its counts, then one per check that did not pass."""
    out = [f"hpcml vet: {run.protocol.name}: {plural(len(run.nodes), 'node')}, {plural(len(run.protocol.evals), 'check')}"]
    bad = set(run.verdict.bad)
    for node in run.nodes:
        rep = run.reports[node]
        verdict = "bad" if node in bad else "good"
        if not rep.reachable:
            out.append(f"  {node}: {verdict}: unreachable: {rep.message}")
            continue
        counts: dict[str, int] = {}
        for r in rep.results:
            counts[r.outcome.value] = counts.get(r.outcome.value, 0) + 1
        out.append(f"  {node}: {verdict}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        for r in rep.results:
            if r.outcome is not Outcome.PASS:
                value = _short(r.value, r.unit)
                out.append(f"    {r.check}: {r.outcome.value}" + (f" {value}" if value else "")
                           + (f": {r.message}" if r.message else ""))
    return out


def problems(run: VetRun) -> list[str]:
    """One line per bad node and per warning, for people reading the log."""
    lines = [f"{node}: {'; '.join(why)}" for node, why in run.verdict.reasons.items()]
    for node in run.nodes:
        for r in run.reports[node].results:
            if r.outcome is Outcome.WARN or (r.outcome is Outcome.ERROR and node not in run.verdict.reasons):
                lines.append(f"{node}: {r.check}: {r.outcome.value}: {r.message}")
    return lines
