"""The culprit search against a simulated fabric: a group's collective runs at the speed
of its slowest member, each round's groups must be disjoint, and a node that cannot join
makes its group's measurement fail."""

from __future__ import annotations

import random

import pytest

from hpcml.vet.culprit import first_groups, max_rounds, search

FAST, SLOW, THRESHOLD = 10.0, 1.0, 5.0


class Fabric:
    def __init__(self, nodes, slow=(), dead=(), singletons=True):
        self.nodes, self.slow, self.dead = list(nodes), set(slow), set(dead)
        self.singletons = singletons
        self.calls = 0

    def __call__(self, groups):
        self.calls += 1
        seen = [n for g in groups for n in g]
        assert len(seen) == len(set(seen)), f"groups of one round overlap: {groups}"
        assert set(seen) <= set(self.nodes)
        out = {}
        for i, g in enumerate(groups):
            assert len(g) >= (1 if self.singletons else 2), g
            if self.dead & set(g):
                out[i] = None
            else:
                out[i] = min(SLOW if n in self.slow else FAST for n in g)
        return out


def names(n):
    return [f"nid{i:04d}" for i in range(n)]


def check(n, k, rng, **kw):
    nodes = names(n)
    slow = rng.sample(nodes, k)
    fabric = Fabric(nodes, slow, singletons=kw.get("singletons", True))
    res = search(nodes, fabric, threshold=THRESHOLD, **kw)
    assert res.rounds == fabric.calls <= max_rounds(n)
    return nodes, slow, res


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 64, 100, 127, 256])
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_finds_exactly_the_slow_nodes_within_the_bound(n, k):
    rng = random.Random(n * 10 + k)
    for _ in range(20 if n <= 17 else 5):
        if k >= n:
            return
        nodes, slow, res = check(n, k, rng)
        if k == 0:
            assert res.culprits == [] and res.rounds == 1 and not res.fabric_wide
            assert "not explained by single nodes" in res.conclusion
            continue
        assert res.culprits == [x for x in nodes if x in slow], (slow, res.to_dict())
        assert res.unresolved == [] and res.cleared == [x for x in nodes if x not in slow]
        assert all(res.slow_tests[c] >= 1 for c in res.culprits)
        assert res.tests == sum(len(r.groups) for r in res.log)


@pytest.mark.parametrize("n", [4, 5, 8, 9, 33, 256])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_pairs_only_when_one_node_cannot_be_tested_alone(n, k):
    """Without single-node groups a suspect is only ever tested beside a known-good node."""
    rng = random.Random(n + k)
    for _ in range(10):
        nodes, slow, res = check(n, k, rng, singletons=False)
        if res.fabric_wide:  # every first-round group held a slow node: nothing to compare with
            assert k >= len(first_groups(nodes, 2, False)) and res.culprits == []
            continue
        assert res.culprits == [x for x in nodes if x in slow], (slow, res.to_dict())


def test_rounds_grow_with_log_n_not_with_the_number_of_tests():
    rng = random.Random(1)
    _, _, res = check(256, 3, rng)
    assert res.rounds <= 2 and res.tests > 128  # 128 pairs at once, then 6 suspects at once


def test_two_nodes_are_tested_one_by_one():
    res = search(["n1", "n2"], Fabric(["n1", "n2"], {"n2"}), threshold=THRESHOLD)
    assert res.culprits == ["n2"] and res.cleared == ["n1"] and res.rounds == 1
    assert res.log[0].groups == [["n1"], ["n2"]] and res.log[0].bandwidths == [FAST, SLOW]
    assert res.conclusion.startswith("culprit n2 (1 rounds, 2 tests")


@pytest.mark.parametrize("n", [2, 3, 8, 64])
def test_every_node_slow_is_fabric_wide_and_blames_nobody(n):
    nodes = names(n)
    res = search(nodes, Fabric(nodes, nodes), threshold=THRESHOLD)
    assert res.fabric_wide and res.culprits == [] and res.cleared == []
    assert res.unresolved == nodes and "fabric-wide" in res.conclusion
    assert res.rounds <= 2


def test_node_that_fails_to_join_is_a_culprit():
    nodes = names(10)
    res = search(nodes, Fabric(nodes, slow={nodes[7]}, dead={nodes[2]}), threshold=THRESHOLD)
    assert res.culprits == [nodes[2], nodes[7]]
    assert all(bw is None for r in res.log for g, bw in zip(r.groups, r.bandwidths)
               if nodes[2] in g)


def test_relative_threshold_without_an_absolute_one():
    nodes = names(12)
    res = search(nodes, Fabric(nodes, slow={nodes[5], nodes[6]}), min_relative=0.5)
    assert res.culprits == [nodes[5], nodes[6]]


def test_relative_threshold_sees_no_culprit_when_every_node_is_equally_slow():
    nodes = names(8)
    res = search(nodes, Fabric(nodes, slow=nodes), min_relative=0.5)
    assert res.culprits == [] and not res.fabric_wide and res.rounds == 1


def test_round_cap_leaves_the_rest_unresolved():
    nodes = names(16)
    res = search(nodes, Fabric(nodes, slow={nodes[0], nodes[9]}), threshold=THRESHOLD, rounds=1)
    assert res.rounds == 1 and res.culprits == []
    assert res.unresolved == [nodes[0], nodes[1], nodes[8], nodes[9]]
    assert "cap of 1 rounds" in res.conclusion


def test_deadline_stops_before_the_next_round():
    nodes = names(16)
    t = [0.0]

    def slow_measure(groups):
        t[0] += 10.0
        return Fabric(nodes, slow={nodes[3]})(groups)

    res = search(nodes, slow_measure, threshold=THRESHOLD, deadline_at=5.0, clock=lambda: t[0])
    assert res.rounds == 1 and res.unresolved == [nodes[2], nodes[3]]
    assert "deadline" in res.conclusion and res.seconds == 10.0


def test_larger_first_groups_are_bisected():
    nodes = names(64)
    fabric = Fabric(nodes, slow={nodes[13]}, singletons=False)
    res = search(nodes, fabric, threshold=THRESHOLD, group_size=8, singletons=False)
    assert res.culprits == [nodes[13]]
    assert [len(r.groups) for r in res.log] == [8, 2, 2, 2]  # 8 -> 4+4 -> 2+2 -> 1+1


def test_first_groups():
    assert first_groups(["a", "b", "c", "d", "e"]) == [["a", "b"], ["c", "d", "e"]]
    assert first_groups(["a", "b", "c"]) == [["a"], ["b"], ["c"]]
    assert first_groups(["a", "b", "c"], singletons=False) == []


def test_one_node_runs_nothing():
    res = search(["a"], Fabric(["a"]), threshold=THRESHOLD)
    assert res.rounds == 0 and res.culprits == [] and "fewer than two" in res.conclusion
