"""The scanner's differential harness for longer than the suite runs it (issue 62 item 2):
``python benchmarks/bench_scan_fuzz.py --seconds 600 --seed 1 --keep DIR [--joblib 1.2.0]``.
Prints inputs run, inputs the scan called safe (each then loaded by the real loader in a
capped child), inputs per second, the same per kind of file, and every failure kept in DIR
(a regression file to add to the tests). Other scanners' corpora (``--peers``, default
``../shared/testdata``) add their pickles and torch zips as seeds, malicious ones included.

``--joblib VERSION`` runs it with that joblib (the oldest hpcml allows is 1.2.0), installed
once from PyPI into ``benchmarks/.work/joblib-VERSION`` and put first on the path, so it
writes the joblib seeds and reads every joblib input."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _joblib(version: str) -> None:
    target = ROOT / "benchmarks" / ".work" / f"joblib-{version}"
    if not (target / "joblib").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        f"joblib=={version}"], check=True)
    sys.path.insert(0, str(target))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, default=None, help="where failures are kept (default: a temporary folder)")
    ap.add_argument("--joblib", default=None, metavar="VERSION", help="run with this joblib (e.g. 1.2.0)")
    ap.add_argument("--peers", type=Path, default=ROOT.parent / "shared" / "testdata",
                    help="other scanners' corpora, read in place, as more seeds (default ../shared/testdata)")
    a = ap.parse_args()
    if a.joblib:
        _joblib(a.joblib)
    import joblib

    from tests.scan.differential import peer_seeds, run
    extra = peer_seeds(a.peers) if a.peers.is_dir() else []
    print(f"joblib {joblib.__version__} from {Path(joblib.__file__).parent}; {len(extra)} seeds from {a.peers}")
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = run(Path(tmp), seconds=a.seconds, seed=a.seed, keep=a.keep or Path(tmp) / "failures", extra=extra)
        print(f"inputs {c.ran:,}, called safe and loaded {c.safe:,}, {c.per_second:.1f} inputs/s, "
              f"{len(c.failures)} failures")
        for kind, (ran, safe) in sorted(c.by_kind.items()):
            print(f"  {kind}: {ran:,} inputs, {safe:,} called safe and loaded")
        for kept, why in c.failures:
            print(f"  {kept}: {why}")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
