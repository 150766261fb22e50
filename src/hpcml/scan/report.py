"""What a scan hands to people (a Rich table), to scripts (JSON) and to CI (SARIF 2.1.0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcml import __version__
from hpcml.scan.model import FileResult, Verdict
from hpcml.schemas import tag
from hpcml.words import plural, printable

SCHEMA = tag("scan", 1)
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_STYLE = {Verdict.SAFE: "green", Verdict.UNKNOWN: "bold yellow", Verdict.DANGEROUS: "bold red",
          Verdict.ERROR: "bold magenta", Verdict.NOT_SCANNED: "bold cyan"}
#: SARIF rule per verdict: id, short text, level
_RULES = {
    Verdict.DANGEROUS: ("HPCML-SCAN-DANGEROUS", "Loading the file runs a known code-execution gadget", "error"),
    Verdict.UNKNOWN: ("HPCML-SCAN-UNKNOWN", "Loading the file imports or calls something not on the allowlist", "error"),
    Verdict.ERROR: ("HPCML-SCAN-ERROR", "The file could not be read or parsed to the end", "warning"),
    Verdict.NOT_SCANNED: ("HPCML-SCAN-NOT-SCANNED", "The file is in a format hpcml recognises but does not read: "
                          "not checked, so never safe", "warning"),
}
FULL_TABLE_FILES = 40


def to_json(results: list[FileResult], exit_code: int, policy_sources: list[str]) -> dict[str, Any]:
    counts = {v.value: sum(r.verdict is v for r in results) for v in Verdict}
    return {
        "schema": SCHEMA,
        "version": __version__,
        "policy": policy_sources,
        "exit_code": exit_code,
        "summary": {"files": len(results), **counts,
                    "skipped": sum(not r.scanned for r in results)},
        "files": [
            {"path": r.path, "format": r.format, "verdict": r.verdict.value, "size": r.size,
             "scanned": r.scanned, "errors": r.errors, "notes": r.notes,
             "findings": [{"verdict": f.verdict.value, "name": f.name, "why": f.why,
                           "member": f.location.member, "offset": f.location.offset,
                           "opcode": f.opcode, "count": f.count} for f in r.findings]}
            for r in results],
    }


def _sarif_location(path: str, member: str = "", offset: int | None = None) -> dict[str, Any]:
    phys: dict[str, Any] = {"artifactLocation": {"uri": Path(path).as_posix()}}
    if offset is not None and not member:
        phys["region"] = {"byteOffset": offset}
    loc: dict[str, Any] = {"physicalLocation": phys}
    if member:
        where = f"{member}@{offset}" if offset is not None else member
        loc["logicalLocations"] = [{"fullyQualifiedName": where, "kind": "member"}]
    return loc


def sarif_log(rules: list[dict[str, Any]], results: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": name, "version": __version__,
                                "informationUri": "https://github.com/hpcml/hpcml", "rules": rules}},
            "results": results,
        }],
    }


def to_sarif(results: list[FileResult]) -> dict[str, Any]:
    rules = [{"id": rid, "shortDescription": {"text": text}, "defaultConfiguration": {"level": level}}
             for rid, text, level in _RULES.values()]
    out: list[dict[str, Any]] = []
    for r in results:
        for f in r.findings:
            if f.verdict is Verdict.SAFE:
                continue
            rid, _, level = _RULES[f.verdict]
            out.append({"ruleId": rid, "level": level,
                        "message": {"text": f"{f.name}: {f.why} ({f.opcode}, {f.count}x)"},
                        "locations": [_sarif_location(r.path, f.location.member, f.location.offset)]})
        for e in r.errors:
            rid, _, level = _RULES[Verdict.ERROR]
            out.append({"ruleId": rid, "level": level, "message": {"text": e},
                        "locations": [_sarif_location(r.path)]})
    return sarif_log(rules, out, "hpcml scan")


def write_json(data: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def advice(results: list[FileResult], shown: int = 8, policy: Any = None) -> list[str]:
    """What to do about ``unknown`` files: the site-policy lines that would allow exactly
    their globals (only lines the policy parser accepts, never one ``policy`` allows
    already), which calls of allowed names an argument check refused and why, what no
    policy can allow (a callable built at load time), and why a whole pickled model has
    them; and which formats were recognised but not read (``not-scanned``)."""
    from hpcml.scan.policy import default_policy, is_name, not_advised
    policy = policy or default_policy()
    unknown = {f.name for r in results for f in r.findings if f.verdict is Verdict.UNKNOWN}
    named = sorted(n for n in unknown if is_name(n))
    from hpcml.scan.formats.zipped import TORCHSCRIPT_FINDING
    script = TORCHSCRIPT_FINDING in unknown
    built = sorted(unknown - set(named) - {TORCHSCRIPT_FINDING})
    allowed = {n for n in named if policy.classify(*n.rsplit(".", 1))[0] is Verdict.SAFE}
    checked: dict[str, str] = {}
    for r in results:
        for f in r.findings:
            if f.name in allowed and f.verdict is not Verdict.SAFE:
                checked.setdefault(f.name, f.why)
    named = [n for n in named if n not in allowed]
    refused = {n: why for n in named if (why := not_advised(n))}
    names = [n for n in named if n not in refused]
    out = []
    if checked:
        out.append("Allowed already, but a call was refused by its argument check (allowing the name changes "
                   "nothing): " + "; ".join(f"{n}: {checked[n]}" for n in sorted(checked)[:shown])
                   + (f"; and {len(checked) - shown} more" if len(checked) > shown else ""))
    if refused:
        shown_refused = sorted(refused)[:shown]
        out.append("Do not allow " + "; ".join(f"{n} ({refused[n]})" for n in shown_refused)
                   + (f"; and {len(refused) - shown} more" if len(refused) > shown else "")
                   + ": a pickle that calls them can do what those modules do. No trusted "
                   "checkpoint needs them; ask for a state_dict or safetensors.")
    if names:
        listed = "\n".join(f"  - {n}" for n in names[:shown]) + \
            (f"\n  # ... and {len(names) - shown} more" if len(names) > shown else "")
        out += [f"{plural(len(names), 'imported global')} {'is' if len(names) == 1 else 'are'} not on the "
                "allowlist, so loading would run code nobody vetted.",
                "If you trust where the files came from, allow them in a site policy and pass it with --policy "
                "(or HPCML_SCAN_POLICY):",
                f"safe:\n{listed}"]
    if built:
        out.append(f"No policy can allow what is not a named global ({'; '.join(map(printable, built[:3]))}): the pickle builds "
                   "what it calls while it loads, which no checkpoint needs. Do not load these files; ask for a "
                   "state_dict or safetensors.")
    if script:
        out.append("A TorchScript archive (torch.jit.save) runs its own code when it is loaded, and torch.load "
                   "loads it with torch.jit.load: no policy can allow it. Load it with torch.jit.load only if you "
                   "trust where it came from; else ask for a state_dict or safetensors.")
    if names:
        out.append("A model saved whole (torch.save(model)) imports its own classes: save model.state_dict() "
                   "instead and load it into code you wrote; safetensors holds tensors only.")
    unread = sorted({r.format for r in results if r.verdict is Verdict.NOT_SCANNED})
    if unread:
        out.append(f"Not scanned ({', '.join(unread)}): hpcml recognises these formats but does not read them, "
                   "so it cannot call them safe. Load them only if you trust where they came from, or ask "
                   "for safetensors.")
    return out


def table(results: list[FileResult], *, show_all: bool = False):
    """Rich table: every file that is not safe, and safe ones too when few or asked for."""
    from rich.markup import escape
    from rich.table import Table
    t = Table(title="hpcml scan", show_lines=False)
    for col in ("verdict", "file", "format", "what"):
        t.add_column(col, overflow="fold")
    quiet = [r for r in results if r.verdict is Verdict.SAFE]
    fold = not show_all and len(results) > FULL_TABLE_FILES
    for r in sorted(results, key=lambda r: (-r.verdict.rank, r.path)):
        if r.verdict is Verdict.SAFE and fold:
            continue
        bad = [f for f in r.findings if f.verdict is not Verdict.SAFE]
        # names, reasons, members and errors come from the file: never markup
        lines = [f"{escape(printable(f.name))} [dim]({escape(f.why)}; {escape(str(f.location) or 'top')})[/]"
                 for f in bad[:4]]
        if len(bad) > 4:
            lines.append(f"... and {len(bad) - 4} more")
        lines += [escape(e) for e in r.errors[:3]]
        if not lines:
            lines = [("not a model file" if not r.scanned else
                      f"{len(r.findings)} allowlisted globals" if r.findings else "no imports")]
        style = _STYLE[r.verdict] if r.scanned else "dim"
        t.add_row(f"[{style}]{r.verdict.value if r.scanned else 'skipped'}[/]", escape(r.path), r.format,
                  "\n".join(lines))
    if fold and quiet:
        skipped = sum(not r.scanned for r in quiet)
        t.add_row("[green]safe[/]", f"{len(quiet)} files", "",
                  f"not listed (--all lists them); {skipped} are not model files")
    return t
