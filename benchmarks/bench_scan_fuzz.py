"""The scanner's differential harness for longer than the suite runs it (issue 62 item 2):
``python benchmarks/bench_scan_fuzz.py --seconds 600 --seed 1 --keep DIR``. Prints inputs
run, inputs the scan called safe (each then loaded by the real unpickler in a capped child),
inputs per second, and every failure kept in DIR (a regression file to add to the tests)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.scan.differential import run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, default=None, help="where failures are kept (default: a temporary folder)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = run(Path(tmp), seconds=a.seconds, seed=a.seed, keep=a.keep or Path(tmp) / "failures")
        print(f"inputs {c.ran:,}, called safe and loaded {c.safe:,}, {c.per_second:.1f} inputs/s, "
              f"{len(c.failures)} failures")
        for kept, why in c.failures:
            print(f"  {kept}: {why}")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
