"""Whose stack a stack file is: the rank its name says, the rank it says, below the job's
world, and, where the launcher holds the attempt's secret, signed with that rank's key."""

from __future__ import annotations

import json

import pytest

from hpcml.observe import beat
from hpcml.observe.beat import Trust, rank_key, sign_with
from hpcml.observe.snapshot import SCHEMA, STACKS, Responder, read_stacks, stack_path
from hpcml.observe.stacks import Frame, Stack, Thread


def _write(observe, name: str, rank: object, fn: str) -> None:
    (observe / STACKS).mkdir(parents=True, exist_ok=True)
    (observe / STACKS / name).write_text(json.dumps({
        "schema": SCHEMA, "rank": rank, "snapshot": 7, "at": 1.0, "pid": 1,
        "threads": [{"name": "MainThread", "main": True, "frames": [{"name": fn, "file": "/u/train.py", "line": 3}]}]}))


def _where(stack: Stack) -> str | None:
    return stack.main_thread()[0].name


def test_a_file_saying_it_is_another_rank_s_stack_is_left_out(tmp_path):
    _write(tmp_path, "rank-00000.json", 0, "honest")
    _write(tmp_path, "rank-00001.json", 0, "forged-by-rank-1")        # rank 1's file claims rank 0's place
    _write(tmp_path, "rank-xyz.json", 99_999_999_999, "forged")
    _write(tmp_path, "rank-0002.json", 2, "not the recorder's name")
    _write(tmp_path, "rank-00003.json", 3, "three")
    got = read_stacks(tmp_path)
    assert {r: _where(s.stack) for r, s in got.items()} == {0: "honest", 3: "three"}
    assert sorted(read_stacks(tmp_path, world=2)) == [0]


def test_a_symlinked_stack_file_is_not_followed(tmp_path):
    _write(tmp_path, "rank-00000.json", 0, "honest")
    _write(tmp_path / "elsewhere", "rank-00001.json", 1, "elsewhere")
    (tmp_path / STACKS / "rank-00001.json").symlink_to(tmp_path / "elsewhere" / STACKS / "rank-00001.json")
    assert sorted(read_stacks(tmp_path)) == [0]


@pytest.fixture
def stack(monkeypatch):
    s = Stack(pid=5, threads=(Thread(name="MainThread", main=True, active=True, owns_gil=False,
                                     frames=(Frame("train", "/u/train.py", 3),)),))
    monkeypatch.setattr("hpcml.observe.stacks.dump", lambda pid: s)
    yield s
    sign_with(None)


def test_signed_stacks_are_taken_only_with_their_rank_s_signature(tmp_path, stack):
    secret = b"s" * 32
    for r in range(3):
        sign_with(rank_key(secret, r if r != 2 else 0))      # rank 2's recorder holds rank 0's key: forged
        Responder(tmp_path, r, 100 + r)._take(7)
    sign_with(None)
    _write(tmp_path, "rank-00003.json", 3, "unsigned")
    assert beat._key is None
    trust = Trust(4, secret)
    got = read_stacks(tmp_path, trust=trust)
    assert sorted(got) == [0, 1] and got[0].stack == stack and got[0].snapshot == 7
    assert sorted(read_stacks(tmp_path, trust=Trust(4, b"t" * 32))) == []      # another attempt's secret
    assert sorted(read_stacks(tmp_path, trust=Trust(4))) == [0, 1, 2, 3]       # no secret: names and world only
    assert sorted(read_stacks(tmp_path)) == [0, 1, 2, 3]
    doc = json.loads(stack_path(tmp_path, 1).read_bytes())
    assert doc["rank"] == 1 and len(doc["sig"]) == 64
