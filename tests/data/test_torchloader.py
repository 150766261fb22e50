"""The torch DataLoader adapter: equal batch counts per rank, exact resume with workers."""

from __future__ import annotations

import pytest

from hpcml.data import ResumeStateError, ShardDataset
from hpcml.errors import UsageError
from tests import needs
from tests.data.gen import make_shards

needs.module("torch")
pytestmark = pytest.mark.torch
from hpcml.data.torchloader import ShardLoader  # noqa: E402


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("torch"), samples=301, target=700_000)[1]


def _loader(shards, rank=0, world=1, workers=2, batch=8, seed=2):
    ds = ShardDataset(shards, seed=seed, rank=rank, world_size=world, block_bytes=60_000, window=3)
    return ShardLoader(ds, batch_size=batch, num_workers=workers)


def _batches(loader, stop=None):
    out = []
    for i, b in enumerate(loader):
        out.append(list(b["__key__"]))
        if stop is not None and i + 1 == stop:
            break
    return out


def test_every_rank_yields_the_same_number_of_batches(shards):
    per_rank = [_batches(_loader(shards, rank=r, world=3, workers=2, batch=7)) for r in range(3)]
    assert {len(b) for b in per_rank} == {len(_loader(shards, world=3, batch=7))} == {15}
    keys = [k for batches in per_rank for b in batches for k in b]
    assert len(keys) == len(set(keys)) == 300


def test_batches_arrive_in_the_planned_order(shards):
    """With workers the loader delivers the same samples as without, batch for batch."""
    ds = ShardDataset(shards, seed=2, rank=0, world_size=1, block_bytes=60_000, window=3)
    planned = []
    for w in range(2):
        planned.append([s["__key__"] for s in ds.stream(w, 2, 8)])
    expected, k = [], 0
    while any(planned):
        part = planned[k % 2]
        expected.append(part[:8])
        planned[k % 2] = part[8:]
        k += 1
    assert _batches(_loader(shards, workers=2, batch=8)) == expected


@pytest.mark.parametrize("stop", [1, 5, 37])
def test_resume_with_workers_is_exact(shards, stop):
    full = _batches(_loader(shards))
    first = _loader(shards)
    head = _batches(first, stop=stop)
    state = first.state_dict()
    assert state["position"] == min(stop * 8, 301)
    resumed = _loader(shards)
    resumed.load_state_dict(state)
    assert head + _batches(resumed) == full


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("change,key", [({"batch": 5}, "batch_size"), ({"workers": "other"}, "workers")])
def test_resume_mid_epoch_with_other_workers_or_batch_size_is_refused(shards, workers, change, key):
    """Without workers as with them: a batch size of 5 after a state taken at batch 8
    would skip by whole batches of 5 (24 delivered, 20 skipped: 4 samples twice). Refused
    at load_state_dict, and by the dataset when the loader's check is passed by."""
    first = _loader(shards, workers=workers, batch=8)
    _batches(first, stop=3)
    state = first.state_dict()
    other_workers = (2 if workers == 0 else 0) if change.get("workers") else workers
    other = _loader(shards, workers=other_workers, batch=change.get("batch", 8))
    with pytest.raises(ResumeStateError) as caught:
        other.load_state_dict(state)
    assert caught.value.key == key and "state was taken with" in str(caught.value)
    assert str(caught.value).splitlines() == [str(caught.value)]
    other.ds.load_state_dict(state)
    with pytest.raises(ResumeStateError) as again:
        _batches(other)
    assert str(again.value) == str(caught.value)


def test_another_batch_size_at_an_epochs_end_is_not_refused(shards):
    """A finished epoch holds no position to continue: the next one is planned afresh."""
    first = _loader(shards, workers=0, batch=8)
    _batches(first)
    other = _loader(shards, workers=2, batch=5)
    other.load_state_dict(first.state_dict())
    fresh = _loader(shards, workers=2, batch=5)
    fresh.set_epoch(1)
    assert _batches(other) == _batches(fresh)


def test_a_state_taken_at_an_epochs_end_resumes_with_the_loops_epoch(shards):
    """The loop resumes at the state's epoch (``loader.epoch``) and calls ``set_epoch`` with
    it: that epoch is finished, so it yields nothing more, and the next ``set_epoch`` starts
    the next one: the uninterrupted run's epochs, not one epoch ahead of the loop's count."""
    whole = _loader(shards)
    want = []
    for epoch in range(3):
        whole.set_epoch(epoch)
        want.append(_batches(whole))
    first = _loader(shards)
    _batches(first)                                  # epoch 0, to its end
    again = _loader(shards)
    again.load_state_dict(first.state_dict())
    got = []
    for epoch in range(again.epoch, 3):
        again.set_epoch(epoch)
        got.append(_batches(again))
    assert got == [[], want[1], want[2]]
    plain = _loader(shards)                          # no set_epoch after the resume: the next epoch
    plain.load_state_dict(first.state_dict())
    assert _batches(plain) == want[1]


def test_next_epoch_reshuffles(shards):
    loader = _loader(shards)
    one = _batches(loader)
    loader.set_epoch(1)
    two = _batches(loader)
    assert one != two and sorted(sum(one, [])) == sorted(sum(two, []))


@pytest.mark.parametrize("kw,match", [({"persistent_workers": True}, "persistent"), ({"in_order": False}, "order")])
def test_options_that_break_the_order_are_refused(shards, kw, match):
    ds = ShardDataset(shards, rank=0, world_size=1)
    with pytest.raises(UsageError, match=match) as caught:
        ShardLoader(ds, batch_size=4, num_workers=2, **kw)
    assert caught.value.key == next(iter(kw))


def test_a_mid_epoch_state_of_the_old_4_mib_layout_resumes_with_workers_in_the_old_order(tmp_path):
    """A checkpoint of a loader of before issue 72 (4 MiB blocks by default, 2 workers,
    batch 8, 5 batches delivered), state dict as it wrote it: a loader with today's defaults
    delivers the rest of that epoch in the old order, batch for batch."""
    from hpcml.data.manifest import load_manifest
    path = make_shards(tmp_path, samples=400, target=3_000_000, hi=30_000)[1]
    old_layout = {"seed": 4, "shuffle": True, "block_bytes": 4 << 20, "window": 32, "drop_last": True}
    old = ShardLoader(ShardDataset(path, seed=4, rank=0, world_size=1, block_bytes=4 << 20, window=32),
                      batch_size=8, num_workers=2)
    full = _batches(old)
    state = {"schema": "hpcml.data.state/1", "dataset": load_manifest(path).dataset, "epoch": 0, "position": 40,
             "samples": 400, "rank": 0, "world_size": 1, "workers": 2, "batch_size": 8, "layout": old_layout}
    resumed = ShardLoader(ShardDataset(path, seed=4, rank=0, world_size=1), batch_size=8, num_workers=2)
    resumed.load_state_dict(state)
    assert _batches(resumed) == full[5:]
    assert _batches(ShardLoader(ShardDataset(path, seed=4, rank=0, world_size=1), batch_size=8,
                                num_workers=2)) != full        # today's default is another order


@pytest.mark.parametrize(("key", "value"), [("position", -8), ("position", 302), ("epoch", True), ("batch_size", "8"),
                                            ("workers", 10**6)])
def test_a_forged_resume_state_is_refused_by_the_loader_naming_the_key(shards, key, value):
    """The loader's door to the same checks: a state out of range or not an integer is one
    line naming its key, and the loader delivers from the start as before (was: a
    position of -8 resumed, counting from -8)."""
    first = _loader(shards)
    _batches(first, stop=2)
    state = {**first.state_dict(), key: value}
    resumed = _loader(shards)
    with pytest.raises(ResumeStateError) as caught:
        resumed.load_state_dict(state)
    assert caught.value.key == key and str(caught.value).splitlines() == [str(caught.value)]
    assert (resumed.epoch, resumed.ds.position) == (0, 0)
    assert _batches(resumed) == _batches(_loader(shards))
