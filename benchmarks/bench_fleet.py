"""The default rules' and the checks' precision and recall on a simulated fleet with known
truth, as the centre report computes them beside what was true (issue 68).

    python benchmarks/bench_fleet.py [--nodes 1000] [--days 28] [--bad 0.02] [--jobs 600] [--seed 1] [--avoid]
                                     [--vettings 4] [--rules FILE]

``hpcml.testing.fleet.simulate`` writes the fleet's vetting results and proven job
summaries into a collector store (SQLite) while the node handler's real ``plan`` drains and
resumes nodes with the default rules (or ``--rules``, to try others) after each of the
day's ``--vettings`` health-check rounds and its jobs; then ``hpcml.centre.report.build`` over
the whole window with the handler's drains; with ``--avoid`` the jobs keep off the centre's
avoid list (``hpcml.centre.plan``), read at each day's end. Per check and rule: the report's precision
(with its 95% interval) and recall, and the truth's (a flag or drain is right when the node
was really bad then; a bad node is caught when flagged before the first job it hurt; a
rule's true recall: the really bad nodes it drained, of all bad ones), and
the avoid list's precision against the truth (each day a node is on it). Writes
benchmarks/results/fleet.json and prints one table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAY = 86400.0


def main() -> None:
    from hpcml.centre.collector.store import open_store
    from hpcml.centre.report import build
    from hpcml.centre.rules import DEFAULT_RULES, load
    from hpcml.testing.fleet import simulate
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--days", type=int, default=28)
    ap.add_argument("--bad", type=float, default=0.02)
    ap.add_argument("--jobs", type=int, default=600, help="jobs a day")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--avoid", action="store_true", help="The jobs keep off the centre's avoid list (read daily).")
    ap.add_argument("--vettings", type=int, default=4, help="health-check rounds a day")
    ap.add_argument("--rules", type=Path, default=None, help="the handler's rules (default: the default rules)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fleet.json")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fleet-"))
    store = open_store(f"sqlite:///{work}/centre.db")
    end = time.time() - 3600
    t0 = time.perf_counter()
    try:
        catalog = load(a.rules or DEFAULT_RULES)
        truth = simulate(store, nodes=a.nodes, days=a.days, bad_share=a.bad, jobs_per_day=a.jobs, end=end, seed=a.seed,
                         avoid=a.avoid, vettings=a.vettings, rules=catalog)
        sim_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        rep = build(store, a.days * DAY, now=end, drains=truth.drains,
                    declared={r.name: r.evidence for r in catalog.rules})
        report_s = time.perf_counter() - t1
    finally:
        store.close()
    bad_nodes = {n for n, k in truth.kind.items() if k != "liar"}
    rows = []
    for c in rep["verdicts"]["checks"]:
        rows.append({"what": f"check {c['check']}", "flags": c["flags"], "precision": c["precision"],
                     "precision_ci": c["precision_ci"], "truth_precision": truth.precision(c["check"]),
                     "recall": c["recall"], "caught": c["caught"], "bad_nodes": c["bad_nodes"]})
    for r in rep["verdicts"]["rules"]:
        rows.append({"what": f"rule {r['rule']}", "flags": r["drains"], "precision": r["precision"],
                     "precision_ci": r["precision_ci"], "truth_precision": truth.rule_precision(r["rule"]),
                     "recall": r["recall"], "caught": r["caught"], "bad_nodes": r["bad_nodes"],
                     "truth_drained_bad": len({d["node"] for d in truth.drains if d["rule"] == r["rule"]} & bad_nodes),
                     "truth_recall": round(len({d["node"] for d in truth.drains if d["rule"] == r["rule"]} & bad_nodes)
                                           / len(bad_nodes), 4) if bad_nodes else None,
                     "floor": r["floor"], "below_floor": r["below_floor"]})
    doc = {"schema": "hpcml.bench.fleet/1", "nodes": a.nodes, "days": a.days, "bad_share": a.bad,
           "vettings_per_day": a.vettings, "rules": str(a.rules or "default"),
           "jobs_per_day": a.jobs, "seed": a.seed, "kinds": {k: list(truth.kind.values()).count(k)
                                                             for k in sorted(set(truth.kind.values()))},
           "bad_nodes": len(bad_nodes), "drains": len(truth.drains), "simulate_s": round(sim_s, 1),
           "report_s": round(report_s, 2), "rows": rows,
           "avoid": None if not a.avoid else {"entries": len(truth.avoids), "nodes": len({n for n, *_ in truth.avoids}),
                     "bad_nodes_avoided": len({n for n, *_ in truth.avoids} & bad_nodes),
                     "truth_precision": truth.avoid_precision()}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")

    def f(v: float | None) -> str:
        return "–" if v is None else f"{v:.2f}"
    print(f"{a.nodes} nodes, {a.days} days, {len(bad_nodes)} bad + {doc['kinds'].get('liar', 0)} lied about, "
          f"{len(truth.drains)} drains; simulated in {sim_s:.0f} s, report in {report_s:.2f} s")
    print("| verdict | flags | precision [95%] | truth | recall (caught/bad) | true recall (drained/bad) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["precision_ci"]
        ci = f" [{lo:.2f}-{hi:.2f}]" if lo is not None else ""
        below = " (below its floor)" if r.get("below_floor") else ""
        true_recall = f"{f(r['truth_recall'])} ({r['truth_drained_bad']}/{len(bad_nodes)})" if "truth_recall" in r else "–"
        print(f"| {r['what']} | {r['flags']} | {f(r['precision'])}{ci}{below} | {f(r['truth_precision'])} | "
              f"{f(r['recall'])} ({r['caught']}/{r['bad_nodes']}) | {true_recall} |")
    av = doc["avoid"]
    if av is not None:
        print(f"avoid list: {av['entries']} node-days on it, {av['nodes']} nodes ({av['bad_nodes_avoided']} of "
              f"{len(bad_nodes)} bad ones); precision against the truth {f(av['truth_precision'])}")


if __name__ == "__main__":
    main()
