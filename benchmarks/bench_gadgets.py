"""Gadgets no list names, and what judging them costs: hpcml scan against picklescan.

    python benchmarks/bench_gadgets.py [--runs 5]

One pickle per gadget of the public bypasses of pickle scanners (the standard library of
the interpreter running this, none of the names on hpcml's built-in lists), each calling
its gadget as an exploit would, plus benign unknown names a whole-model pickle holds
(torch.nn classes). For each file: both tools' verdicts and the wall time of the whole
command (median of --runs, alternated). Then the source analysis alone, in one process:
the cost of the first unknown name (modules parsed) and of each further one.
Writes benchmarks/results/gadgets.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_scan import WORK, _venv_tool  # noqa: E402

from tests.scan.payloads import assemble, call, global_, unicode  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GADGETS = [
    ("uuid", "_get_command_stdout", ["id"]),
    ("_osx_support", "_read_output", ["id"]),
    ("platform", "_syscmd_file", ["/bin/sh"]),
    ("mailcap", "findmatch", [{}, "x"]),
    ("imaplib", "IMAP4", ["127.0.0.1"]),
    ("smtpd", "SMTPServer", ["127.0.0.1", "x"]),
    ("logging", "FileHandler", ["/tmp/x"]),
    ("logging.config", "fileConfig", ["/tmp/x.ini"]),
    ("cgitb", "Hook", []),
    ("rlcompleter", "Completer.attr_matches", ["x"]),
    ("torch.storage", "_load_from_bytes", ["x"]),
    ("zipfile", "ZipFile", ["/tmp/x", "w"]),
]
BENIGN = [("torch.nn.modules.linear", "Linear", []), ("torch.nn.modules.container", "Sequential", []),
          ("torch.nn.modules.activation", "ReLU", []), ("collections", "ChainMap", [])]


def _pickle(path: Path, module: str, name: str, args: list) -> Path:
    ops = [unicode(a) if isinstance(a, str) else b"}" for a in args]      # "}" = EMPTY_DICT
    path.write_bytes(assemble(2, call(global_(module, name), *ops)))
    return path


def _timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    return time.perf_counter() - t, out


def _picklescan_verdict(out: subprocess.CompletedProcess) -> str:
    """Its summary: "Infected files: 1" (exit 1) or only "Suspicious globals: N" (exit 0)."""
    text = out.stdout + out.stderr
    if "Infected files: 1" in text:
        return "dangerous"
    if "Suspicious globals: 0" not in text and "Suspicious globals:" in text:
        return "suspicious, exit 0"
    if "error" in text.lower():
        return "error"
    return "not flagged"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = WORK / "gadgets"
    work.mkdir(parents=True, exist_ok=True)
    picklescan, why = _venv_tool("picklescan")
    if not picklescan:
        print(f"picklescan not measured: {why}", file=sys.stderr)
    hpcml = [str(Path(sys.executable).parent / "hpcml"), "scan", "--json"]
    rows = []
    for module, name, argv in GADGETS + BENIGN:
        f = _pickle(work / f"{module}.{name}.pkl", module, name, argv)
        t_h, t_p = [], []
        for _ in range(args.runs):
            dt, out = _timed([*hpcml, str(f)])
            t_h.append(dt)
            report = json.loads(out.stdout)["files"][0]
            if picklescan:
                dtp, outp = _timed([*picklescan, "--path", str(f)])
                t_p.append(dtp)
        finding = report["findings"][0] if report["findings"] else {}
        row = {"global": f"{module}.{name}", "hpcml": report["verdict"], "why": finding.get("why", ""),
               "hpcml_s": statistics.median(t_h),
               "picklescan": _picklescan_verdict(outp) if picklescan else None,
               "picklescan_s": statistics.median(t_p) if t_p else None}
        rows.append(row)
        print(f"{row['global']:40} hpcml {row['hpcml']:9} {row['hpcml_s']:.3f} s | picklescan "
              f"{row['picklescan'] or '-':18} {row['picklescan_s'] or 0:.3f} s | {row['why'][:70]}")
    # the analysis alone: first name (parses), then the rest
    code = ("import time, json; from hpcml.scan.gadgets import Analyser; a = Analyser(); out = []\n"
            f"for m, n in {[(m, n) for m, n, _ in GADGETS + BENIGN]!r}:\n"
            "    t = time.perf_counter(); a.reach(m, n); out.append((m + '.' + n, time.perf_counter() - t))\n"
            "print(json.dumps(out))")
    alone = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout)
    costs = [s for _, s in alone]
    print(f"analysis alone: {len(costs)} names in {sum(costs):.3f} s; median {statistics.median(costs) * 1000:.1f} ms, "
          f"max {max(costs) * 1000:.1f} ms ({max(alone, key=lambda x: x[1])[0]})")
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "gadgets.json").write_text(json.dumps({"rows": rows, "analysis_alone_s": alone}, indent=1))


if __name__ == "__main__":
    main()
