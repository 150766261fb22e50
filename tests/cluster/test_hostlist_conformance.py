"""hpcml's hostlists against other producers' own verdicts (../shared/testdata/hostlist:
Slurm's, flux-core's, submitit's, pyslurm's and python-hostlist's tests, transcribed).

hpcml implements the Slurm lineage's semantics: input order and duplicates kept. Checked,
by the row's ``compare``:

- ``ordered``, ``ordered-with-duplicates``: ``expand`` equals the list, exactly;
- ``set`` (Slurm's test2.20 counts matches), ``count``: the same hosts / the same number;
- ``error``: a UsageError (every producer refuses these, syntax not size);
- ``ordered-dedup`` (python-hostlist's default): ``expand`` with later duplicates dropped,
  which is that semantics on top of Slurm's, so its order is checked too;
- ``sorted``, ``sorted-dedup``, ``uniq-folded``: ``fold(sort=True)``, the explicit set.

Not checked: ``error-limit``: each producer's own size cap (python-hostlist's 100000 hosts
in all, flux's 2^20 a range), not Slurm's (65536 a range, test_hostlist has it).

folds.tsv: Slurm's ``hostlist_ranged_string`` rows are ``fold`` exactly (order kept).
python-hostlist's ``collect_hostlist`` rows are a sorted set: ``fold(sort=True)`` must
name the same hosts; the string is compared where python-hostlist folds in one dimension
(it also folds ``x1y4,x2y4`` into ``x[1-2]y4``, which Slurm does not) and where its sort
(by value) and Slurm's (by width, then value: ``n10`` before ``n009``) agree.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path

import pytest

from hpcml.cluster.hostlist import expand, fold
from hpcml.errors import UsageError
from tests.needs import shared_testdata

DATA: Path = shared_testdata("hostlist")
CHECKED = {"ordered", "ordered-with-duplicates", "set", "count", "error", "ordered-dedup",
           "sorted", "sorted-dedup", "uniq-folded"}


def rows(name: str) -> list[dict[str, str]]:
    with (DATA / name).open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


EXPANSIONS = rows("expansions.tsv")
FOLDS = rows("folds.tsv")


def hosts(text: str) -> list[str]:
    return [h for h in text.split(",") if h]


def conforms(row: dict[str, str]) -> bool:
    expr, want, kind = row["expression"], row["expected"], row["compare"]
    try:
        got = expand(expr)
    except UsageError:
        return kind == "error"
    if kind == "error":
        return False
    if kind in ("ordered", "ordered-with-duplicates"):
        return got == hosts(want)
    if kind == "ordered-dedup":
        return list(dict.fromkeys(got)) == hosts(want)
    if kind == "set":
        return sorted(got) == sorted(hosts(want))
    if kind == "count":
        return len(got) == int(want)
    if kind in ("sorted", "sorted-dedup"):
        return expand(fold(got, sort=True)) == hosts(want)
    return fold(got, sort=True) == want                         # uniq-folded


def test_every_kind_is_checked_or_said_why_not():
    assert {r["compare"] for r in EXPANSIONS} == CHECKED | {"error-limit"}


@pytest.mark.parametrize("row", [r for r in EXPANSIONS if r["compare"] in CHECKED],
                         ids=lambda r: f"{r['compare']}:{r['source'].split()[0]}:{r['expression']}")
def test_expansion(row):
    assert conforms(row), row


def test_slurm_lineage_rows_all_pass():
    """The count per kind, for the record: every checked row of Slurm's lineage passes."""
    lineage = [r for r in EXPANSIONS if r["compare"] in CHECKED and not r["source"].startswith("python-hostlist")]
    passed = Counter(r["compare"] for r in lineage if conforms(r))
    assert passed == Counter(r["compare"] for r in lineage)


def _one_dimensional(folded: str) -> bool:
    return all(t.count("[") <= 1 and not re.search(r"\][^,]", t + ",") for t in re.split(r",(?![^\[]*\])", folded))


def _sorts_agree(names: list[str]) -> bool:
    """python-hostlist sorts a prefix's numbers by value, Slurm by width then value."""
    parts = [m.groups() for n in set(names) if (m := re.fullmatch(r"(.*?)([0-9]+)", n))]
    return all(sorted(p, key=lambda x: (int(x[1]), len(x[1]))) == sorted(p, key=lambda x: (len(x[1]), int(x[1])))
               for p in ([q for q in parts if q[0] == prefix] for prefix in {q[0] for q in parts}))


@pytest.mark.parametrize("row", FOLDS, ids=lambda r: r["hosts"])
def test_fold(row):
    names, want = row["hosts"].split(","), row["expected_fold"]
    if row["source"].startswith("SchedMD/slurm"):
        assert fold(names) == want
        return
    assert sorted(expand(fold(names, sort=True))) == sorted(set(names)) == sorted(set(expand(want)))
    if _one_dimensional(want) and _sorts_agree(names):
        assert fold(names, sort=True) == want
