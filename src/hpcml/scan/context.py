"""One file's scan in progress: findings aggregated per name, errors, notes, verdict."""

from __future__ import annotations

from collections.abc import Callable

from hpcml.scan.model import FileResult, Finding, Location, Verdict
from hpcml.scan.picklewalk import Event
from hpcml.scan.policy import Policy

_EVENT_VERDICT = {
    "ext": (Verdict.UNKNOWN, "a copyreg extension code imports whatever the loading process registered"),
    "unresolved": (Verdict.UNKNOWN, "the global's name is computed at load time"),
    "call": (Verdict.UNKNOWN, "calls something that is not a named global"),
    "mutate": (Verdict.DANGEROUS, "changes attributes or items of an imported global"),
    "argument": (Verdict.UNKNOWN, ""),              # hpcml.scan.argchecks: the event says why
    "argument-dangerous": (Verdict.DANGEROUS, ""),
}


class FileScan:
    """Collects what the format handlers find in one file (and its members)."""

    def __init__(self, path: str, policy: Policy, size: int, nested: Callable[..., None] | None = None) -> None:
        """``nested``: how content the load reaches from this file is scanned (the scanner's
        ``scan_content``; given, not imported, as the scanner imports the pickle walk)."""
        self.policy = policy
        self.nested = nested
        self.result = FileResult(path=path, format="unrecognised", verdict=Verdict.SAFE, size=size)
        self._by_key: dict[tuple, Finding] = {}
        policy.start_file()             # the source analysis's per-file budget

    def set_format(self, fmt: str) -> None:
        current = self.result.format
        if current in ("unrecognised", "pickle"):
            self.result.format = fmt
        elif current.endswith("-compressed") and fmt == "joblib":
            self.result.format = f"joblib ({current})"

    def events(self, events: list[Event], member: str = "") -> None:
        for ev in events:
            verdict, name, why = self.judge(ev)
            self.add(verdict, name, why, member, ev.offset, ev.opcode, ev.count)

    def judge(self, ev: Event) -> tuple[Verdict, str, str]:
        """(verdict, name, why) of one event under this scan's policy."""
        if ev.kind == "global":
            verdict, why = self.policy.judge(ev.module, ev.name)
            return verdict, f"{ev.module}.{ev.name}", why
        verdict, why = _EVENT_VERDICT[ev.kind]
        return verdict, f"{ev.module}.{ev.name}" if ev.module else ev.detail, why or ev.detail

    def add(self, verdict: Verdict, name: str, why: str, member: str = "", offset: int | None = None,
            opcode: str = "", count: int = 1) -> None:
        """One finding (a global, or in another format the construct: ``opcode`` names it);
        the same name again under the same member only counts."""
        key = (name, verdict, member)
        found = self._by_key.get(key)
        if found:
            found.count += count
            return
        finding = Finding(verdict=verdict, name=name, why=why, location=Location(member, offset), opcode=opcode,
                          count=count)
        self._by_key[key] = finding
        self.result.findings.append(finding)

    def not_scanned(self, what: str, why: str, member: str = "") -> None:
        """Content recognised but not read (HDF5 weights, a GGUF's tensors): never ``safe``."""
        self.add(Verdict.NOT_SCANNED, what, why, member, opcode="not read")

    def error(self, problem: str, member: str = "") -> None:
        self.result.errors.append(f"{member}: {problem}" if member else problem)

    def note(self, note: str) -> None:
        self.result.notes.append(note)

    def finish(self) -> FileResult:
        res = self.result
        note = self.policy.analysis_note()
        if note:
            res.notes.append(note)
        verdicts = [f.verdict for f in res.findings]
        if res.errors:
            verdicts.append(Verdict.ERROR)
        res.verdict = Verdict.worst(verdicts)
        res.findings.sort(key=lambda f: (-f.verdict.rank, f.location.member, f.location.offset or 0))
        return res
