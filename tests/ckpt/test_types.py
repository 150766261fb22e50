"""A checkpoint leaf loads back with its type: the standard library's dict subclasses
round-trip, any other is refused at save in one line, never turned into a plain dict."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer, load
from hpcml.errors import UsageError


def _round_trip(tmp_path: Path, state: dict) -> dict:
    with Checkpointer(tmp_path / "ck", max_write_rate=None) as ck:
        ck.save(state, 1)
    return load(tmp_path / "ck")[0]


def test_counter_ordereddict_and_defaultdict_load_back_with_their_type(tmp_path):
    seen = collections.Counter({"class0": 3, "class1": 1, 7: 2})       # a key that is not a string
    seen["class2"] += 0
    by_len = collections.defaultdict(list, {"a": [1], "b": [np.arange(3)]})
    nested = collections.OrderedDict([("z", collections.Counter("abca")), ("a", collections.defaultdict(int))])
    state = {"seen": seen, "by_len": by_len, "nested": nested, "plain": {"x": 1},
             "none": collections.defaultdict(None, {"k": 1}), "counter_of": collections.defaultdict(collections.Counter)}
    got = _round_trip(tmp_path, state)
    assert type(got["seen"]) is collections.Counter and got["seen"] == seen and list(got["seen"]) == list(seen)
    assert got["seen"].most_common(1) == [("class0", 3)]
    assert type(got["by_len"]) is collections.defaultdict and got["by_len"].default_factory is list
    assert got["by_len"]["a"] == [1] and (got["by_len"]["b"][0] == np.arange(3)).all()
    got["by_len"]["new"].append(1)                   # the factory works after the load
    assert type(got["nested"]) is collections.OrderedDict and list(got["nested"]) == ["z", "a"]
    assert type(got["nested"]["z"]) is collections.Counter and got["nested"]["z"]["a"] == 2
    assert got["nested"]["a"].default_factory is int and type(got["plain"]) is dict
    assert got["none"].default_factory is None and got["none"]["k"] == 1
    assert got["counter_of"].default_factory is collections.Counter


class Config(dict):
    pass


@pytest.mark.parametrize("value,says", [
    (Config(lr=0.1), "tests.ckpt.test_types.Config (a dict subclass) would load back as a plain dict"),
    (collections.defaultdict(lambda: 0), "a defaultdict whose default_factory is"),
], ids=["dict-subclass", "defaultdict-lambda"])
def test_a_dict_that_would_change_type_is_refused_at_save_in_one_line(tmp_path, value, says):
    with Checkpointer(tmp_path / "ck", max_write_rate=None) as ck:
        with pytest.raises(UsageError) as caught:
            ck.save({"model": {"w": np.ones(3)}, "extra": {"cfg": value}}, 1)
    msg = str(caught.value)
    assert msg.splitlines() == [msg] and msg.startswith("key 'extra.cfg': ") and says in msg
    assert not list((tmp_path / "ck").glob("*step-*"))                 # nothing written


def test_a_typed_leaf_is_a_node_an_older_reader_refuses_instead_of_misreading(tmp_path):
    """The type is a node of its own (``{"__m": ..., "__v": ...}``), not a key beside
    ``"__d"`` that an older hpcml would skip and load a plain dict: one that does not know
    the node names it as unknown."""
    _round_trip(tmp_path, {"c": collections.Counter("ab")})
    doc = json.loads(next((tmp_path / "ck").glob("step-*/rank-00000.json")).read_text())
    node = doc["skeleton"]["__d"]["c"]
    assert set(node) == {"__m", "__v"} and node["__m"] == "Counter"
    assert not {"__t", "__d", "__kv", "__tu", "__f"} & set(node)      # the older reader's node keys
