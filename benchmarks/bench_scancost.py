"""What a scan costs against what the file holds (issue 47): hpcml scan against picklescan on
files built to make a scanner's time or memory grow, side by side.

    python benchmarks/bench_scancost.py [--runs 3] [--cases abc-37,...] [--big-dir /tmp]
                                        [--timeout 600] [--mem-limit-mb 8192] [--keep-big]
                                        [--hpcml-cmd "python -m hpcml"] [--variant NAME=CMD ...]

Files (generated once into benchmarks/.work/files/, the 10 GiB one into ``--big-dir`` and
deleted after its runs unless ``--keep-big``):

- ``abc-37``, ``abc-200``: ``pickle.dump([{'a': i, 'b': str(i), 'c': [i, i+1]} ...],
  protocol=4)`` of 1,000,000 and 5,200,000 dicts (37.5 and 201 MB): object-heavy plain data;
- ``tuples-66``: ``pickle.dump([(i, float(i), 'x'*8) ...], protocol=2)`` of 3,000,000 tuples
  (66 MB): plain data without FRAMEs, which the C fast path (``fastload``) may prove;
- ``mixed-37``: 300,000 times each of ``collections.OrderedDict``, ``argparse.Namespace``,
  ``datetime.datetime``, ``numpy.float32``, ``numpy.int64`` and ``torch.Size`` (allowlisted
  classes, built with REDUCE/NEWOBJ/BUILD and the memo), protocol 4, 37 MB;
- ``globals-24k``: 23,917 GLOBAL opcodes of distinct names, as an attacker would write them:
  half real functions and classes of the standard library, torch and numpy (every top-level
  name of their modules' sources, shuffled), a quarter made-up names in those modules
  (``module.name_123``), a quarter in made-up modules (``madeup7.sub123.name_123``);
- ``events-10m``: 10,000,000 STACK_GLOBALs of one allowlisted name whose strings come from
  the memo (6 bytes each, 60 MB): one event per opcode;
- ``nested-calls``: 5,000,000 calls nested in one another (``f(f(f(...)))``, 20 MB): a
  structure the walker has to keep;
- ``bytes-10g``: a protocol-4 pickle of a list of 160 bytes objects of 64 MiB each (in-band
  BINBYTES8, 10 GiB).

Per (tool, file): wall time of the whole command (median of ``--runs``, alternated between
the tools, one run once a run took over 60 s) and peak RSS of the process tree
(``benchmarks/measure.py``: the larger of the kernel's ru_maxrss and a 20 ms psutil poll of
the tree, summed), exit codes, and for hpcml what its JSON says (verdict, findings, names
the analysis left unread, errors). ``--variant NAME=CMD`` adds another hpcml command (for
instance with changes on PYTHONPATH) measured the same way. Prints Markdown tables; writes
benchmarks/results/scancost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scan import FILES, SLOW_S, WORK, _venv_tool, measure, warm_page_cache  # noqa: E402
from measure import MB  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = ("abc-37", "abc-200", "tuples-66", "mixed-37", "globals-24k", "events-10m", "nested-calls", "bytes-10g")
N_GLOBALS = 23_917


# --------------------------------------------------------------------------- files

def _real_names(want: int) -> list[tuple[str, str]]:
    """Top-level functions and classes of the standard library's, torch's and numpy's
    modules, read from their sources (nothing imported), shuffled."""
    import ast
    import random
    import sysconfig
    rng = random.Random(0)
    std = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    modules = sorted((p.stem, p) for p in std.glob("*.py") if p.stem.isidentifier())
    for pkg in ("torch", "numpy"):
        for p in sorted((site / pkg).rglob("*.py")):
            parts = list(p.relative_to(site).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if all(x.isidentifier() for x in parts):
                modules.append((".".join(parts), p))
    rng.shuffle(modules)
    out: list[tuple[str, str]] = []
    for name, path in modules:
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue
        out += [(name, n.name) for n in tree.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        if len(out) >= want:
            break
    rng.shuffle(out)
    return out[:want]


def _globals_pickle(path: Path) -> None:
    real = _real_names(N_GLOBALS // 2)
    modules = sorted({m for m, _ in real})
    names = list(real)
    i = 0
    while len(names) < N_GLOBALS * 3 // 4:
        names.append((modules[i * 7919 % len(modules)], f"name_{i}"))
        i += 1
    while len(names) < N_GLOBALS:
        names.append((f"madeup{i % 500}.sub{i}", f"name_{i}"))
        i += 1
    body = b"".join(b"c%s\n%s\n0" % (m.encode(), n.encode()) for m, n in names)
    path.write_bytes(b"\x80\x02" + body + b"N.")


def _generate(key: str, path: Path) -> None:
    """Runs in a child process (the object graphs go back at its exit)."""
    import gc
    import pickle
    gc.disable()
    tmp = path.with_name(path.name + ".tmp")
    if key.startswith("abc-"):
        n = 1_000_000 if key == "abc-37" else 5_200_000
        with open(tmp, "wb") as f:
            pickle.dump([{"a": i, "b": str(i), "c": [i, i + 1]} for i in range(n)], f, protocol=4)
    elif key == "tuples-66":
        with open(tmp, "wb") as f:
            pickle.dump([(i, float(i), "x" * 8) for i in range(3_000_000)], f, protocol=2)
    elif key == "mixed-37":
        import argparse as ap
        import collections
        import datetime

        import numpy as np
        import torch
        start = datetime.datetime(2020, 1, 1)
        data: list = []
        for i in range(300_000):
            data += [collections.OrderedDict(a=i, b=str(i)), ap.Namespace(lr=float(i), name=f"r{i}"),
                     start + datetime.timedelta(seconds=i), np.float32(i), np.int64(i), torch.Size([i, 3])]
        with open(tmp, "wb") as f:
            pickle.dump(data, f, protocol=4)
    elif key == "globals-24k":
        _globals_pickle(tmp)
    elif key == "events-10m":
        head = b"\x80\x04\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94"
        tmp.write_bytes(head + b"h\x00h\x01\x930" * 10_000_000 + b"N.")
    elif key == "nested-calls":
        n = 5_000_000
        # n BINGETs of the function, then None, then n times TUPLE1 REDUCE
        tmp.write_bytes(b"\x80\x02ccollections\nOrderedDict\nq\x01" + b"h\x01" * n + b"N" + b"\x85R" * n + b".")
    elif key == "bytes-10g":
        chunk = os.urandom(1 << 20) * 64
        with open(tmp, "wb") as f:
            f.write(b"\x80\x04]\x94(")
            for _ in range(160):
                f.write(b"\x8e" + len(chunk).to_bytes(8, "little"))
                f.write(chunk)
            f.write(b"e.")
    os.replace(tmp, path)


def ensure(key: str, big_dir: Path) -> Path:
    path = (big_dir if key == "bytes-10g" else FILES) / f"scancost-{key}.pkl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"generating {path} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--generate", key, str(path)], check=True)
        print(f"  {path.stat().st_size:,} bytes in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return path


# --------------------------------------------------------------------------- running

def hpcml_report(stdout: str) -> dict:
    try:
        doc = json.JSONDecoder().raw_decode(stdout[stdout.index("{"):])[0]
    except ValueError:
        return {"json": False}
    f = doc["files"][0]
    verdicts: dict[str, int] = {}
    for x in f["findings"]:
        verdicts[x["verdict"]] = verdicts.get(x["verdict"], 0) + 1
    return {"verdict": f["verdict"], "findings": verdicts,
            "not_analysed": sum("not analysed" in x["why"] for x in f["findings"]),
            "errors": f.get("errors", [])[:2], "notes": f.get("notes", [])[:3]}


def report(argv: list[str], path: Path, run: dict) -> dict:
    """What hpcml's JSON said; from one more run when it was past measure's 4 MiB of stdout."""
    out = hpcml_report(run["stdout"])
    if out.get("json") is False and run["status"] == "ok":
        with open(WORK / "scancost-report.json", "w+") as fh:
            subprocess.run([*argv, str(path)], stdout=fh, stderr=subprocess.DEVNULL, check=False, cwd=WORK)
            fh.seek(0)
            out = hpcml_report(fh.read())
        (WORK / "scancost-report.json").unlink()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--big-dir", default="/tmp", help="where the 10 GiB file is written (and removed)")
    ap.add_argument("--keep-big", action="store_true")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--mem-limit-mb", type=int, default=8192, help="kill a run whose tree exceeds this RSS")
    ap.add_argument("--tools", default="hpcml,picklescan")
    ap.add_argument("--hpcml-cmd", default=f"{shlex.quote(sys.executable)} -m hpcml")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=CMD",
                    help="another hpcml command to measure beside it (repeatable)")
    ap.add_argument("--generate", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        _generate(args.generate[0], Path(args.generate[1]))
        return
    WORK.mkdir(parents=True, exist_ok=True)
    tools: dict[str, list[str]] = {}
    for t in args.tools.split(","):
        if t == "hpcml":
            tools["hpcml"] = shlex.split(args.hpcml_cmd) + ["scan", "--json"]
        elif t == "picklescan":
            exe, why = _venv_tool("picklescan")
            if exe:
                tools["picklescan"] = [*exe, "--path"]
            else:
                print(f"picklescan not measured: {why}", file=sys.stderr)
    for v in args.variant:
        name, _, cmd = v.partition("=")
        tools[name] = shlex.split(cmd) + ["scan", "--json"]
    results: dict[str, dict] = {}
    for key in args.cases.split(","):
        path = ensure(key, Path(args.big_dir))
        size = path.stat().st_size
        if size < 32 << 30:
            warm_page_cache(path)
        runs: dict[str, list[dict]] = {t: [] for t in tools}
        active = list(tools)
        for i in range(args.runs):
            for tool in list(active):
                r = measure([*tools[tool], str(path)], args.timeout, args.mem_limit_mb)
                runs[tool].append(r)
                print(f"  {key:13} {tool:12} run {i + 1}: {r['seconds']:8.2f} s rc={r['rc']} {r['status']} "
                      f"peak {r['peak_rss_mb']:,.0f} MB", file=sys.stderr, flush=True)
                if r["status"] != "ok" or r["seconds"] > SLOW_S:
                    active.remove(tool)
        results[key] = {"bytes": size, "tools": {}}
        for tool, rs in runs.items():
            ok = [r["seconds"] for r in rs if r["status"] == "ok"]
            med = statistics.median(ok) if ok else None
            results[key]["tools"][tool] = {
                "median_s": med, "times_s": [r["seconds"] for r in rs], "statuses": [r["status"] for r in rs],
                "exit_codes": sorted({r["rc"] for r in rs}), "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
                "mb_per_s": size / MB / med if med else None,
                **({"report": report(tools[tool], path, rs[0])} if tool != "picklescan" else {})}
        if key == "bytes-10g" and not args.keep_big:
            path.unlink()

    lines = ["| file | MB | tool | median s | MB/s | peak RSS MB | exit | what hpcml said |", "|---|---|---|---|---|---|---|---|"]
    for key, res in results.items():
        for tool, s in res["tools"].items():
            rep = s.get("report") or {}
            said = ""
            if rep.get("verdict"):
                said = f"{rep['verdict']}, {sum(rep['findings'].values()):,} names"
                if rep["not_analysed"]:
                    said += f", {rep['not_analysed']:,} not analysed"
                if rep["errors"]:
                    said += f"; error: {rep['errors'][0][:80]}"
            status = "" if set(s["statuses"]) == {"ok"} else f" ({', '.join(sorted(set(s['statuses']) - {'ok'}))})"
            med = "–" if s["median_s"] is None else f"{s['median_s']:.2f}"
            mbs = "–" if s["mb_per_s"] is None else f"{s['mb_per_s']:,.1f}"
            lines.append(f"| {key} | {res['bytes'] / MB:,.1f} | {tool} | {med}{status} | {mbs} | "
                         f"{s['peak_rss_mb']:,.0f} | {','.join(map(str, s['exit_codes']))} | {said} |")
    print("\n".join(lines))
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "scancost.json").write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "tools": tools,
        "args": {k: v for k, v in vars(args).items() if k != "generate"}, "results": results}, indent=1))


if __name__ == "__main__":
    main()
