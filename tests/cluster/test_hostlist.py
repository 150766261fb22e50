"""Slurm's hostlist rules in hpcml.cluster.hostlist, case by case, beyond the peers' rows
(test_hostlist_conformance); where Slurm's own ``scontrol show hostnames`` runs here, it
is the oracle for the same expressions."""

from __future__ import annotations

import random
import re
import shutil
import subprocess

import pytest

from hpcml.cluster.hostlist import MAX_RANGE, expand, fold
from hpcml.errors import UsageError


@pytest.mark.parametrize(("expr", "hosts"), [
    ("n[009-11]", ["n009", "n010", "n011"]),                # width of the first bound
    ("n[9-011]", ["n9", "n10", "n11"]),                     # the last bound's zeros say nothing
    ("n[98-101]", ["n98", "n99", "n100", "n101"]),
    ("n[08-10,7,0007]", ["n08", "n09", "n10", "n7", "n0007"]),
    ("p[00-3]p", ["p00p", "p01p", "p02p", "p03p"]),         # text after the bracket (Slurm 23.02+)
    ("b,a[2,1],c", ["b", "a2", "a1", "c"]),                 # input order
    ("n[1-3,2],n1", ["n1", "n2", "n3", "n2", "n1"]),        # duplicates kept
    ("n1 n2\tn3\nn4,,n5,", ["n1", "n2", "n3", "n4", "n5"]),  # Slurm's separators
    ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
    ("row[0,1]_rack[2-3]_blade[4,5]",                       # Slurm: last fastest, then first, second...
     ["row0_rack2_blade4", "row0_rack2_blade5", "row1_rack2_blade4", "row1_rack2_blade5",
      "row0_rack3_blade4", "row0_rack3_blade5", "row1_rack3_blade4", "row1_rack3_blade5"]),
    ("a[1-2]b[3-4]c[5]d[7,8]", ["a1b3c5d7", "a1b3c5d8", "a2b3c5d7", "a2b3c5d8",
                                "a1b4c5d7", "a1b4c5d8", "a2b4c5d7", "a2b4c5d8"]),
    (f"n[1-{MAX_RANGE}]", [f"n{i}" for i in range(1, MAX_RANGE + 1)]),
    ("", []), (" , ", []),
])
def test_expand_follows_slurm(expr, hosts):
    assert expand(expr) == hosts


@pytest.mark.parametrize(("expr", "why"), [
    ("n[3-1]", "goes down"), ("n[1-2-3]", "not a number"), ("n[1--3]", "not a number"),
    ("n[-1]", "not a number"), ("n[1-]", "not a number"), ("n[]", "not a number"),
    ("n[1,,2]", "not a number"), ("n[a]", "not a number"), ("n[1x2]", "not a number"),
    ("n[+1]", "not a number"), ("n[ 1]", "not a number"), ("n[1:3]", "not a number"),
    ("n[1", "without ']'"), ("n1]", "without '['"), ("n[[1]]", "inside brackets"),
    (f"n[1-{MAX_RANGE + 1}]", "Slurm's limit"), ("n[1-60000][1-60000]", "more than"),
    # bounded before anything is made: recursion per group, int() of 5,000 digits, 65,536
    # names of 4,000 characters (250 MiB from an 8 KB hostlist), one name of 300
    ("n" + "[1]" * 3000, "bracket groups"), ("n[" + "1" * 5000 + "]", "not a number"),
    ("n[" + "0" * 4000 + "-65535]", "not a number"), ("x" * 300, "longer than"),
    ("n[1-3]" + "y" * 300, "longer than"),
])
def test_bad_hostlists_are_one_line_usage_errors_naming_the_value(expr, why):
    with pytest.raises(UsageError, match=re.escape(why)) as err:
        expand(expr)
    assert f"'{expr}'" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("nodes", "folded"), [
    (["n2", "n1"], "n[2,1]"),                                # order kept
    (["n1", "n1"], "n[1,1]"),                                # duplicates kept
    (["n9", "n10", "n11", "n09"], "n[9-11,09]"),            # 09 and 9 are two hosts
    (["n099", "n100", "n0101"], "n[099-100,0101]"),
    (["b1", "a", "b2", "14636", "c-1x"], "b1,a,b2,14636,c-1x"),
])
def test_fold_keeps_slurms_order(nodes, folded):
    assert fold(nodes) == folded and expand(folded) == nodes


def test_fold_sorted_is_the_set_in_slurms_sort_order():
    assert fold(["n10", "n2", "n2", "a1", "n09", "n"], sort=True) == "a1,n,n[2,09-10]"
    assert fold(["x10y", "x9y", "x1y"], sort=True) == "x1y,x9y,x10y"       # natural, whole names


def test_fold_refuses_names_a_hostlist_cannot_hold():
    with pytest.raises(UsageError, match="not a node name 'n\\[1\\]'"):
        fold(["n[1]"])


def test_fold_then_expand_gives_back_any_list():
    rnd = random.Random(53)
    for _ in range(300):
        nodes = [rnd.choice(["n", "gpu-", "r1n", ""]) + rnd.choice(["", "0", "00"]) + str(rnd.randint(0, 120))
                 + rnd.choice(["", "", "-ib"]) for _ in range(rnd.randint(0, 12))]
        assert expand(fold(nodes)) == nodes
        assert expand(fold(nodes, sort=True)) == sorted(set(nodes), key=expand(fold(nodes, sort=True)).index)


ORACLE = ["n[009-11]", "n[9-011]", "b,a[2,1],c", "n[1-3,2],n1", "n1 n2,,n3", "r[1-2]-n[01-02]",
          "row[0,1]_rack[2-3]_blade[4,5]", "a[1-2]b[3-4]c[5-6]d[7,8]", "n[08-10,7,0007]",
          "n[3-1]", "n[1-2-3]", "n[-1]", "n[]", "n[1,,2]", "n[a]", f"n[1-{MAX_RANGE + 1}]"]


@pytest.mark.skipif(not shutil.which("scontrol"), reason="no scontrol: Slurm's own expansion not here")
def test_slurms_scontrol_agrees(tmp_path):
    """``scontrol show hostnames`` parses offline with any slurm.conf; it prints an error
    instead of names for a list it refuses."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1\nPartitionName=p Nodes=n1\n")
    for expr in ORACLE:
        p = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True, text=True,
                           env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}, timeout=30)
        slurm = None if "Invalid hostlist" in p.stdout + p.stderr else p.stdout.split()
        try:
            ours = expand(expr)
        except UsageError:
            ours = None
        assert ours == slurm, expr
