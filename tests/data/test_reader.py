"""ShardDataset: equal per-rank samples, deterministic shuffle, exact resume, corruption."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hpcml.data import CorruptShardError, ResumeStateError, ShardDataset, quality
from hpcml.data.index import load_index
from hpcml.data.manifest import load_manifest
from tests.data.gen import make_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """6 shards of uneven size: awkward for every world size below."""
    return make_shards(tmp_path_factory.mktemp("reader"), samples=503, target=1_100_000)[1]


def _keys(ds):
    return [s["__key__"] for s in ds]


def _ds(path, **kw):
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    kw.setdefault("block_bytes", 100_000)
    kw.setdefault("window", 4)
    return ShardDataset(path, **kw)


def test_fixture_is_awkward(shards):
    m = load_manifest(shards)
    assert len(m.shards) == 6 and len({s.samples for s in m.shards}) > 1


@pytest.mark.parametrize("world", [2, 3, 4, 7, 16])
def test_every_rank_gets_the_same_number_of_distinct_samples(shards, world):
    got = [_keys(_ds(shards, rank=r, world_size=world, seed=9)) for r in range(world)]
    assert {len(k) for k in got} == {503 // world}
    flat = [k for ks in got for k in ks]
    assert len(set(flat)) == len(flat) == 503 // world * world


def test_without_drop_last_ranks_wrap_around_and_cover_everything(shards):
    got = [_keys(_ds(shards, rank=r, world_size=4, drop_last=False)) for r in range(4)]
    assert {len(k) for k in got} == {126}
    assert len({k for ks in got for k in ks}) == 503


def test_order_is_deterministic_per_seed_and_epoch(shards):
    a, b = _ds(shards, seed=1), _ds(shards, seed=1)
    first = _keys(a)
    assert first == _keys(b)
    other_seed = _keys(_ds(shards, seed=2))
    b.set_epoch(1)
    next_epoch = _keys(b)
    assert sorted(next_epoch) == sorted(other_seed) == sorted(first)
    assert next_epoch != first and other_seed != first
    assert _keys(a) == next_epoch and a.epoch == 1          # a finished epoch starts the next


def test_no_shuffle_is_the_packed_order(shards):
    keys = _keys(_ds(shards, shuffle=False))
    assert keys == sorted(keys) and len(keys) == 503


def test_reads_are_blocks_not_samples(shards):
    ds = _ds(shards, block_bytes=1 << 20)
    n = len(_keys(ds))
    assert ds.reads <= 6 * 2 and ds.reads * 20 < n
    assert ds.read_bytes >= sum(s.bytes for s in load_manifest(shards).shards) - 6 * 1024


def test_shuffle_is_far_from_packed_order_and_mixes_shards(shards):
    m = load_manifest(shards)
    keys = [k for s in m.shards for k in load_index(shards / s.index).keys]
    shard_of = np.repeat(np.arange(len(m.shards)), [s.samples for s in m.shards])
    pos = {k: i for i, k in enumerate(keys)}
    got = np.array([pos[k] for k in _keys(_ds(shards, block_bytes=50_000, window=8, seed=3))])
    q = quality.measure(got, shard_of, batch=32)
    flat = quality.measure(np.arange(len(keys)), shard_of, batch=32)
    assert abs(q["rank_correlation"]) < 0.2 < flat["rank_correlation"]
    assert q["batch_shards"] >= 3 > flat["batch_shards"]


@pytest.mark.parametrize("stop", [1, 137, 502])
def test_resume_mid_epoch_is_exact(shards, stop):
    full = _keys(_ds(shards, seed=4))
    ds = _ds(shards, seed=4)
    it = iter(ds)
    head = [next(it)["__key__"] for _ in range(stop)]
    state = ds.state_dict()
    assert state["position"] == stop
    again = _ds(shards, seed=4)
    again.load_state_dict(state)
    assert head + _keys(again) == full


@pytest.mark.parametrize("change,key", [({"seed": 5}, "layout"), ({"world_size": 2}, "world_size")])
def test_state_of_another_seed_or_world_is_refused(shards, change, key):
    ds = _ds(shards, seed=4)
    next(iter(ds))
    other = _ds(shards, **{"seed": 4, **change})
    with pytest.raises(ResumeStateError, match=key):
        other.load_state_dict(ds.state_dict())


@pytest.mark.parametrize("world", [1, 3])
def test_a_state_at_an_epoch_boundary_resumes_on_another_world_size(shards, world):
    """Nothing of the epoch delivered, or all of it: the position means the same on any
    number of ranks (the epoch's start, or its end), so the new ranks read their own slices."""
    done = [_ds(shards, seed=4, rank=r, world_size=2) for r in (0, 1)]
    for ds in done:
        _keys(ds)                                    # epoch 0 to its end
    fresh = [_ds(shards, seed=4, rank=r, world_size=world) for r in range(world)]
    for ds in fresh:
        ds.set_epoch(1)
    for r in range(world):
        ds = _ds(shards, seed=4, rank=r, world_size=world)
        ds.load_state_dict(done[r % 2].state_dict())
        assert (ds.epoch, ds.position) == (0, len(ds))
        assert _keys(ds) == _keys(fresh[r])          # epoch 1, this rank's slice at the new size
        start = _ds(shards, seed=4, rank=r % 2, world_size=2)
        start.set_epoch(3)
        ds.load_state_dict(start.state_dict())
        assert (ds.epoch, ds.position) == (3, 0)


def test_a_mid_epoch_state_on_another_world_size_is_refused_in_one_line(shards):
    ds = _ds(shards, seed=4, rank=1, world_size=2)
    it = iter(ds)
    for _ in range(10):
        next(it)
    with pytest.raises(ResumeStateError) as caught:
        _ds(shards, seed=4, rank=0, world_size=3).load_state_dict(ds.state_dict())
    msg = str(caught.value)
    assert caught.value.key == "world_size" and msg.splitlines() == [msg]
    assert "state has 2, this reader 3" in msg and "mid-epoch (epoch 0, sample 10 of 251 of rank 1)" in msg


def test_state_of_another_dataset_is_refused(shards, tmp_path):
    _src, other = make_shards(tmp_path, samples=50, target=100_000, seed=7)
    state = _ds(shards).state_dict()
    with pytest.raises(ResumeStateError, match="dataset"):
        _ds(other).load_state_dict(state)
    with pytest.raises(ResumeStateError):
        _ds(other).load_state_dict({"position": 3})


def _copy(shards, tmp_path):
    import shutil
    out = tmp_path / "copy"
    shutil.copytree(shards, out)
    return out, load_manifest(out)


def test_truncated_shard_names_shard_and_offset(shards, tmp_path):
    copy, m = _copy(shards, tmp_path)
    victim = copy / m.shards[2].name
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CorruptShardError) as err:
        _keys(_ds(copy, shuffle=False))
    assert m.shards[2].name in str(err.value) and "offset" in str(err.value) and "truncated" in str(err.value)
    assert size // 2 - 20_000 <= err.value.offset <= size


def test_overwritten_header_is_caught_or_skipped_and_counted(shards, tmp_path):
    copy, m = _copy(shards, tmp_path)
    idx = load_index(copy / m.shards[1].index)
    hdr = int(idx.members[3][0][1]) - 512
    with open(copy / m.shards[1].name, "r+b") as f:
        f.seek(hdr + 130)
        f.write(b"9")                                   # inside the size field
    with pytest.raises(CorruptShardError) as err:
        _keys(_ds(copy, shuffle=False))
    assert err.value.offset == hdr and m.shards[1].name in str(err.value)
    ds = _ds(copy, shuffle=False, on_corrupt="skip")
    with pytest.warns(UserWarning, match="skipping"):
        keys = _keys(ds)
    assert ds.skipped == 1 and len(keys) == 502 and idx.keys[3] not in keys


def test_a_stream_left_early_closes_at_once(shards):
    """Leaving an epoch mid-window cancels the queued reads; the hint that waits for them
    must give up too, or closing the stream hangs (it did with futures.wait)."""
    ds = _ds(shards, block_bytes=20_000, window=2, read_threads=1)
    for _ in range(3):
        it = iter(ds)
        next(it)
        closer = threading.Thread(target=it.close)
        closer.start()
        closer.join(20)
        assert not closer.is_alive()
    assert len(_keys(ds)) == 503 - 3            # and the rest of the epoch reads normally


def test_a_stream_the_collector_closes_while_a_thread_starts_does_not_wait_for_ever(shards):
    """The collector may close an unfinished stream inside a new thread's start, where
    ``threading`` holds its own lock (``_shutdown_locks_lock``, in ``_maintain_shutdown_locks``)
    and the starting thread waits for the new one: a close that joined the stream's threads
    needed that lock and both waited for ever (the suite hung so, in a reader test). Here the
    close runs holding that lock, as the collector's did (a CPython internal, held on
    purpose: the state cannot be made through a public API); it must return, and the
    stream's threads end soon after."""
    ds = _ds(shards, block_bytes=20_000, window=2)
    it = iter(ds)
    next(it)

    def close_as_the_collector_did() -> None:
        with threading._shutdown_locks_lock:       # type: ignore[attr-defined]
            it.close()
    closer = threading.Thread(target=close_as_the_collector_did, daemon=True)
    closer.start()
    closer.join(30)
    assert not closer.is_alive(), "closing the stream waited on threading's own lock"
    assert len(_keys(ds)) == 503 - 1             # and the rest of the epoch reads normally


def test_decode_runs_per_sample(shards):
    ds = _ds(shards, decode=lambda s: (s["__key__"], int(s["cls"])))
    assert all(isinstance(label, int) for _k, label in ds)


@pytest.mark.parametrize("kw, key", [({"on_corrupt": "ignore"}, "on_corrupt"), ({"rank": 3, "world_size": 2}, "rank")])
def test_a_bad_setting_is_a_usage_error_naming_it(shards, kw, key):
    """Like every other component's settings (it was a bare ValueError)."""
    from hpcml.errors import UsageError
    with pytest.raises(UsageError) as caught:
        _ds(shards, **kw)
    assert caught.value.key == key and caught.value.exit_code == 2



@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")   # an error its finally raised
def test_a_stream_closed_on_one_of_its_own_threads_does_not_wait_for_itself(shards, monkeypatch):
    """An unfinished stream is closed by the garbage collector in whichever thread it runs;
    once that was the stream's own hint thread, loading an index under the lock its readers
    wait for, and closing joined them (and itself): the suite's process hung at exit. Here
    the stream's hint thread closes the suspended stream while holding that lock, as the
    collector did."""
    from hpcml.data import reader

    suspended, closed = threading.Event(), threading.Event()
    seen: dict = {}
    real = reader._Shards.advise

    def advise(self, pieces, wait=()):
        if "first" not in seen:
            seen["first"] = threading.get_ident()
            suspended.wait(60)
            try:
                with self.load_lock:
                    seen["it"].close()        # the generator's finally, on its own hint thread
            except BaseException as exc:  # noqa: BLE001 - what closing raised is the finding
                seen["error"] = exc
            closed.set()
            return None
        return real(self, pieces, wait)

    monkeypatch.setattr(reader._Shards, "advise", advise)
    seen["it"] = iter(_ds(shards))
    next(seen["it"])
    suspended.set()
    assert closed.wait(60), "closing a stream on its own hint thread hung"
    assert "error" not in seen, seen.get("error")


# -- states saved with the 4 MiB blocks of before issue 72 ----------------------------------

#: sha256 (first 16 hex digits) of the keys, one a line, of epoch 0 of ``old_layout_set`` read
#: by ``ShardDataset(path, seed=4, rank=0, world_size=1)`` at 24cbac4 (4 MiB blocks by default)
OLD_DEFAULT_ORDER = "2a89fcf6a594750b"
OLD_LAYOUT = {"seed": 4, "shuffle": True, "block_bytes": 4 << 20, "window": 32, "drop_last": True}


@pytest.fixture(scope="module")
def old_layout_set(tmp_path_factory):
    """3 shards of up to 3 MB: one 4 MiB block each, several 1 MiB ones."""
    return make_shards(tmp_path_factory.mktemp("oldlayout"), samples=400, target=3_000_000, hi=30_000)[1]


def _digest(keys):
    import hashlib
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def _old_state(path, position, **over):
    """A state exactly as ``state_dict`` wrote it before issue 72 (its defaults in "layout")."""
    return {"schema": "hpcml.data.state/1", "dataset": load_manifest(path).dataset, "epoch": 0,
            "position": position, "samples": 400, "rank": 0, "world_size": 1, "workers": 1, "batch_size": 1,
            "layout": dict(OLD_LAYOUT), **over}


def test_a_state_of_the_old_default_layout_resumes_in_the_old_order(old_layout_set):
    old = [s["__key__"] for s in ShardDataset(old_layout_set, seed=4, rank=0, world_size=1,
                                              block_bytes=4 << 20, window=32)]
    assert _digest(old) == OLD_DEFAULT_ORDER          # the order hpcml read before issue 72
    new = [s["__key__"] for s in ShardDataset(old_layout_set, seed=4, rank=0, world_size=1)]
    assert new != old and sorted(new) == sorted(old)  # the new default is another order
    ds = ShardDataset(old_layout_set, seed=4, rank=0, world_size=1)
    ds.load_state_dict(_old_state(old_layout_set, 137))
    assert [s["__key__"] for s in ds] == old[137:]
    assert ds.state_dict()["layout"] == OLD_LAYOUT    # and its next checkpoint keeps that layout
    again = ShardDataset(old_layout_set, seed=4, rank=0, world_size=1)
    again.load_state_dict(ds.state_dict())                # the end of epoch 0: epoch 1 is next
    old_next = ShardDataset(old_layout_set, seed=4, rank=0, world_size=1, block_bytes=4 << 20)
    old_next.set_epoch(1)
    assert [s["__key__"] for s in again] == [s["__key__"] for s in old_next] and again.epoch == 1
    legacy = {k: v for k, v in _old_state(old_layout_set, 137).items() if k != "schema"}
    before_tags = ShardDataset(old_layout_set, seed=4, rank=0, world_size=1)
    before_tags.load_state_dict({"format": "hpcml-shard-state/1", **legacy})
    assert [s["__key__"] for s in before_tags] == old[137:]


def test_an_old_layout_state_is_refused_in_one_line_where_the_block_size_is_given(old_layout_set):
    ds = ShardDataset(old_layout_set, seed=4, rank=0, world_size=1, block_bytes=1 << 20)
    with pytest.raises(ResumeStateError) as caught:
        ds.load_state_dict(_old_state(old_layout_set, 137))
    msg = str(caught.value)
    assert msg.splitlines() == [msg] and caught.value.key == "layout"
    assert msg == ("key 'layout': state has block_bytes=4194304, this reader block_bytes=1048576 (given "
                   "explicitly: block_bytes): the order would differ")
    assert ds.layout.block_bytes == 1 << 20 and ds.position == 0          # nothing taken from it
    other_seed = ShardDataset(old_layout_set, seed=5, rank=0, world_size=1)
    with pytest.raises(ResumeStateError, match=r"state has seed=4, this reader seed=5: the order would differ$"):
        other_seed.load_state_dict(_old_state(old_layout_set, 137))
    assert other_seed.layout.block_bytes == 1 << 20                        # refused: nothing adopted


@pytest.mark.parametrize(("layout", "words"), [
    ({"block_bytes": 1 << 40}, "block_bytes 1099511627776 is not between 1 and 1073741824"),
    ({"window": 1 << 20}, "window 1048576 is not between 1 and 4096 blocks"),
    ({"block_bytes": 1 << 30, "window": 32}, "window 32 blocks of 1073741824 bytes is more than 16 GiB")])
def test_a_state_whose_blocks_would_fill_the_memory_is_refused_before_anything_is_read(old_layout_set, layout, words):
    """A resumed state is a file: the block size and window it would have the reader adopt
    are bounded (a reading process holds two windows), with a tag or without (a state from
    before tags is not checked against the schema); refused in one line, nothing taken."""
    tagged = _old_state(old_layout_set, 137, layout={**OLD_LAYOUT, **layout})
    legacy = {"format": "hpcml-shard-state/1", **{k: v for k, v in tagged.items() if k != "schema"}}
    for state in (tagged, legacy):
        ds = ShardDataset(old_layout_set, seed=4, rank=0, world_size=1)
        with pytest.raises(ResumeStateError) as caught:
            ds.load_state_dict(state)
        msg = str(caught.value)
        assert msg.splitlines() == [msg] and ("key 'layout'" in msg or "schema" in msg), msg
        assert words in msg or state is tagged, msg            # the schema names the bound its own way
        assert ds.layout.block_bytes == 1 << 20 and ds.position == 0


def test_a_block_size_or_window_out_of_bounds_is_refused_naming_it(old_layout_set):
    from hpcml.errors import UsageError
    with pytest.raises(UsageError, match=r"block_bytes.*not between 1 and 1073741824"):
        ShardDataset(old_layout_set, block_bytes=2 << 30, rank=0, world_size=1)
    with pytest.raises(UsageError, match=r"window.*more than 16 GiB a window"):
        ShardDataset(old_layout_set, block_bytes=64 << 20, window=512, rank=0, world_size=1)
    ShardDataset(old_layout_set, block_bytes=64 << 20, window=128, rank=0, world_size=1)     # 8 GiB: taken



def _reads_in_flight(ds, workers: int, monkeypatch) -> tuple[int, int]:
    """The most reads one loader worker's stream had in flight at once, in its first window
    and after it (each read held 20 ms, so reads that overlap are seen to)."""
    import time

    from hpcml.data import reader
    real, lock = reader._Shards.read, threading.Lock()
    now, most, done = [0], [0, 0], [0]
    ds.begin(workers, 8)
    first_reads = len(ds.plan(workers, 8).streams[0][0].pieces)

    def read(self, piece):
        with lock:
            now[0] += 1
            phase = int(done[0] >= first_reads)
            most[phase] = max(most[phase], now[0])
        time.sleep(0.02)
        try:
            return real(self, piece)
        finally:
            with lock:
                now[0] -= 1
                done[0] += 1
    monkeypatch.setattr(reader._Shards, "read", read)
    for _ in ds.stream(0, workers, 8):
        pass
    monkeypatch.undo()
    return most[0], most[1]


def test_a_rank_s_loader_workers_share_its_reads_in_flight(shards, monkeypatch):
    """Files: 8 reads in flight per rank once a worker yields, shared by its workers (2 each
    at 4 workers, where 8 each read 13 % slower on the benchmark disk); its first window, all
    wait, reads at 8. Given ``read_threads`` is kept; 0 is refused in one line."""
    from hpcml.data.reader import READ_THREADS
    from hpcml.errors import UsageError
    assert [_ds(shards).threads(w) for w in (1, 2, 4, 8)] == [READ_THREADS, READ_THREADS // 2, 2, 2]
    first, after = _reads_in_flight(_ds(shards, window=16, block_bytes=20_000), 4, monkeypatch)
    assert first > 2 and after == 2, (first, after)
    first, after = _reads_in_flight(_ds(shards, window=16, block_bytes=20_000, read_threads=5), 4, monkeypatch)
    assert first <= 5 and after > 2, (first, after)         # the bound can fail
    with pytest.raises(UsageError) as caught:
        _ds(shards, read_threads=0)
    assert caught.value.key == "read_threads"
