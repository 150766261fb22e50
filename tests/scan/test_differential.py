"""The differential harness (tests/scan/differential.py) on 1,500 inputs (the same on every
machine: a count, not a time, bounds it; about 10 s here): mutated
pickles, numpy, joblib, npz, WebDataset tar and torch zip files; every one the scan calls safe is loaded by the real
unpickler in a capped, forked child, and none may import more than the scan reported, die
by a signal, or run out of memory or time. Longer runs: benchmarks/bench_scan_fuzz.py."""

from __future__ import annotations

import gzip
import warnings
from pathlib import Path

import pytest

from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file
from tests.scan.differential import real_load, run


def test_nothing_the_scan_calls_safe_does_more_when_really_loaded(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # numpy's datetime pickles warn about event data
        c = run(tmp_path / "work", inputs=1500, seed=20261126, keep=tmp_path / "failures")
    assert c.ran == 1500 and c.safe > 50, (c.ran, c.safe)           # the harness reached the loader
    assert all(safe >= 5 for _, safe in c.by_kind.values()), c.by_kind  # through every kind's loader
    assert set(c.by_kind) == {"pickle", "joblib", "npz", "tar", "torch"}, c.by_kind
    assert not c.failures, c.failures


REGRESSIONS = Path(__file__).resolve().parents[1] / "fixtures" / "scan_regressions"


@pytest.mark.parametrize("name", sorted(p.name for p in REGRESSIONS.glob("*.gz")))
def test_what_the_harness_found_stays_found(name, tmp_path):
    """Inputs the harness kept as failures (gzipped; ``fail-N-SEED.KIND``): each is one the
    scan once called safe whose real load died. The real load still dies (the file is the
    class, not a stale one), and the scan no longer calls it safe."""
    stem = name[:-3]
    kind = stem.rsplit(".", 1)[1]
    path = tmp_path / stem
    path.write_bytes(gzip.decompress((REGRESSIONS / name).read_bytes()))
    assert real_load(path, kind)["status"].startswith("signal"), name
    res = scan_file(path)
    assert res.verdict is not Verdict.SAFE, (res.verdict, res.errors)
