"""The heartbeat a recorder writes for the live watch (``hpcml.observe.beat``)."""

from __future__ import annotations

import json
import time

import pytest

from hpcml.observe.beat import RECENT, SIZE, BeatWriter, Progress, beat_path, read_beats
from hpcml.observe.schema import to_batch


def test_progress_counts_steps_and_times_them_between_step_numbers():
    p = Progress()
    p.update([10.0, 10.5, 11.0, 13.0], ["metric", "host", "metric", "metric"], ["loss", "cpu", "loss", "loss"],
             [1.0, 5.0, 1.0, 1.0], [0, None, 1, 3])
    assert (p.step, p.steps, p.first, p.progress) == (3, 3, 10.0, 13.0)
    assert list(p.recent) == [(1, 1.0), (3, 1.0)]          # 2 s for steps 2 and 3: 1 s each
    p.update([14.0], ["metric"], ["loss"], [1.0], [2])      # an older step number: no progress
    assert (p.step, p.progress) == (3, 13.0)


def test_a_step_section_gives_the_step_times_and_any_section_is_progress():
    p = Progress()
    p.update([1.0, 2.0, 9.0], ["section", "section", "section"], ["step", "step", "evaluate"], [0.4, 0.6, 7.0],
             [0, 1, None])
    assert list(p.recent) == [(0, 0.4), (1, 0.6)] and p.progress == 9.0 and p.step == 1


def test_progress_reads_the_stores_arrow_batches():
    p = Progress()
    ns = time.time_ns()
    p.update_batch(to_batch([(ns, "metric", "loss", 1.0, 7, None), (ns, "host", "cpu", 3.0, None, None)], 0))
    assert p.step == 7 and p.progress == pytest.approx(ns / 1e9, abs=1e-3)


def test_records_round_trip_and_a_torn_one_keeps_the_last_good(tmp_path):
    p = Progress()
    for i in range(RECENT * 3):
        p.update([float(i)], ["metric"], ["loss"], [1.0], [i])
    w = BeatWriter(tmp_path, 3, "n7")
    w.write(p, pid=42)
    first = read_beats(tmp_path)
    assert first[3].step == RECENT * 3 - 1 and first[3].node == "n7" and first[3].pid == 42
    assert beat_path(tmp_path, 3).stat().st_size == SIZE
    beat_path(tmp_path, 3).write_bytes(b'{"schema": "hpcml.observe.beat/1", "rank": 3, "st')   # caught mid-write
    assert read_beats(tmp_path, first) == first and read_beats(tmp_path) == {}
    w.close()


def test_a_record_never_grows_past_its_size(tmp_path):
    p = Progress()
    p.update([0.0], ["metric"], ["loss"], [1.0], [0])
    for i in range(1, RECENT + 1):
        p.update([i * 1.123456789], ["metric"], ["loss"], [1.0], [10**15 + i])
    w = BeatWriter(tmp_path, 0, "n" * 1000)
    w.write(p)
    doc = read_beats(tmp_path)[0]
    assert beat_path(tmp_path, 0).stat().st_size == SIZE and doc.step == 10**15 + RECENT
    assert 0 < len(doc.recent_steps) == len(doc.recent_s) < RECENT
    w.close()


@pytest.mark.parametrize("bad", [
    '"step": "x"', '"recent_steps": [1, "a"], "recent_s": [0.1, 0.2]', '"recent_steps": [2, 1], "recent_s": [0.1, 0.2]',
    '"recent_steps": [1], "recent_s": []', '"progress": "soon"', '"exit": 1.5', '"rank": -1', '"node": 7',
    '"rank": true', '"recent_s": {"a": 1}', '"recent_steps": [1, 9223372036854775807], "recent_s": [0.1, 0.2]',
    '"restarts": 9223372036854775807', '"gap_s": "long"', '"recent_steps": [true], "recent_s": [0.1]',
    '"recent_steps": [1, 1], "recent_s": [0.1, 0.2]', '"recent_s": [false]', '"recent_wait": [-0.5]',
    # printed in the watch's lines: NVML's names only, never a terminal's escape or a line of text
    '"gpu_uuids": "GPU-1"', '"gpu_uuids": [7]', '"gpu_uuids": ["GPU-1\\u001b[2J"]', '"gpu_uuids": ["GPU-1 is fine"]',
    '"gpu_uuids": ["GPU-1\\n"]', '"gpu_uuids": [""]', '"gpu_uuids": ["GPU-' + "a" * 93 + '"]',
    '"gpu_uuids": [' + ", ".join(f'"GPU-{i}"' for i in range(17)) + ']',
])
def test_a_record_of_the_wrong_shape_keeps_the_last_good_one(tmp_path, bad):
    """The job directory is the user's too: whatever a program writes there, the launcher
    reads records of the right shape only."""
    p = Progress()
    p.update([1.0, 2.0], ["metric", "metric"], ["loss", "loss"], [1.0, 1.0], [0, 1])
    w = BeatWriter(tmp_path, 2, "n1")
    w.write(p)
    good = read_beats(tmp_path)
    doc = beat_path(tmp_path, 2).read_text().rstrip()
    beat_path(tmp_path, 2).write_text(doc[:-1] + ", " + bad + "}")
    assert read_beats(tmp_path, good) == good
    w.close()


def test_a_step_numbering_that_restarts_each_epoch_is_still_progress(tmp_path):
    """``observe.log(step=batch)`` counted per epoch: the drop back to 0 is progress, and the
    recent times start again so that the record stays valid (ascending)."""
    p = Progress()
    t = 0.0
    for _epoch in range(3):
        for batch in range(5):
            t += 1.0
            p.update([t], ["section", "metric"][1:], ["loss"], [1.0], [batch])
    assert p.steps == 15 and p.restarts == 2 and p.progress == t and p.step == 4
    assert [s for s, _ in p.recent] == [1, 2, 3, 4]
    w = BeatWriter(tmp_path, 0, "n1")
    w.write(p)
    assert read_beats(tmp_path)[0].restarts == 2
    w.close()


def test_the_gap_between_progresses_is_kept_for_a_job_that_logs_every_k_steps():
    p = Progress()
    for i in range(5):
        p.update([100.0 * i], ["metric"], ["loss"], [1.0], [100 * i])     # every 100 steps, 1 s each
    doc = p.to_json()
    assert doc["gap_s"] == 100.0 and doc["recent_s"] == [1.0] * 4


@pytest.fixture
def signed():
    """BeatWriters made inside sign with the key given; the process's key is unset after."""
    from hpcml.observe import beat
    yield beat.sign_with
    beat.sign_with(None)


def _writer(tmp_path, rank: int, secret: bytes | None, signed) -> BeatWriter:
    from hpcml.observe.beat import rank_key
    signed(rank_key(secret, rank) if secret else None)
    return BeatWriter(tmp_path, rank, "n1")


def test_the_launcher_takes_only_records_its_ranks_recorders_signed(tmp_path, signed):
    """A record for a rank the attempt did not start, one not signed, one signed with another
    rank's key or changed after signing: each refused (the last good one kept) and named."""
    from hpcml.observe.beat import Trust
    secret = b"s" * 32
    p = Progress()
    p.update([1.0], ["metric"], ["loss"], [1.0], [7])
    for r in (0, 1):
        _writer(tmp_path, r, secret, signed).write(p, now=100.0)
    trust = Trust(2, secret)
    good = read_beats(tmp_path, {}, trust)
    assert sorted(good) == [0, 1] and b',"sig":"' in beat_path(tmp_path, 1).read_bytes() and trust.refused == {}
    forged = {"schema": "hpcml.observe.beat/1", "rank": 5, "step": 10**12, "progress": 200.0, "beat": 200.0, "exit": 3}
    beat_path(tmp_path, 5).write_text(json.dumps(forged))
    beat_path(tmp_path, 7).write_text(json.dumps({**forged, "rank": 1}))                    # not signed
    _writer(tmp_path, 0, secret, signed).write(p, now=200.0)                               # rank 0's key ...
    beat_path(tmp_path, 8).write_bytes(beat_path(tmp_path, 0).read_bytes().replace(b'"rank":0', b'"rank":1'))
    text = beat_path(tmp_path, 1).read_bytes()
    beat_path(tmp_path, 9).write_bytes(text.replace(b'"step":7', b'"step":8'))           # changed after signing
    seen = read_beats(tmp_path, good, trust)
    assert seen[1] == good[1] and 5 not in seen and seen[0].beat == 200.0      # none of them passed for rank 1
    assert set(trust.refused) == {(5, "not a rank of this attempt"), (1, "not signed by the rank's recorder")}
    assert trust.refused[5, "not a rank of this attempt"] == "rank-00005.json"       # each named once, by a file


def test_an_older_record_put_back_keeps_the_newer_one(tmp_path, signed):
    from hpcml.observe.beat import Trust
    secret = b"k" * 32
    p = Progress()
    w = _writer(tmp_path, 0, secret, signed)
    w.write(p, now=100.0)
    old = beat_path(tmp_path, 0).read_bytes()
    w.write(p, now=101.0)
    trust = Trust(1, secret)
    new = read_beats(tmp_path, {}, trust)
    beat_path(tmp_path, 0).write_bytes(old)                       # a copy taken earlier, put back
    assert read_beats(tmp_path, new, trust) == new and new[0].beat == 101.0 and trust.refused == {}


def test_a_signed_record_never_grows_past_its_size(tmp_path, signed):
    from hpcml.observe.beat import Trust
    p = Progress()
    p.update([0.0], ["metric"], ["loss"], [1.0], [0])
    for i in range(1, RECENT + 1):
        p.update([i * 1.123456789], ["metric"], ["loss"], [1.0], [10**15 + i])
    _writer(tmp_path, 0, b"x" * 32, signed).write(p)
    assert beat_path(tmp_path, 0).stat().st_size == SIZE
    assert read_beats(tmp_path, {}, Trust(1, b"x" * 32))[0].step == 10**15 + RECENT


def test_each_steps_wait_in_collectives_rides_beside_its_time_and_is_checked(tmp_path):
    """A ``collective_wait`` section is no progress and no step time: its value goes to
    ``recent_wait``, aligned with ``recent_steps`` (0 where a step has none); a record whose
    waits are not one non-negative number per recent step is refused."""
    p = Progress()
    p.update([1.0, 1.0, 2.0, 3.0, 3.0], ["section"] * 5, ["step", "collective_wait", "step", "step", "collective_wait"],
             [0.4, 0.1, 0.5, 0.6, 0.3], [1, 1, 2, 3, 3])
    assert (p.step, p.steps, list(p.recent)) == (3, 3, [(1, 0.4), (2, 0.5), (3, 0.6)])
    w = BeatWriter(tmp_path, 0, "n1")
    w.write(p)
    good = read_beats(tmp_path)
    assert good[0].recent_wait == [0.1, 0.0, 0.3]
    doc = beat_path(tmp_path, 0).read_text().rstrip()
    for bad in ('[0.1, 0.0]', '[0.1, -1, 0.3]', '"x"', '[0.1, null, 0.3]'):
        beat_path(tmp_path, 0).write_text(doc.replace("[0.1,0.0,0.3]", bad))
        assert read_beats(tmp_path, good) == good, bad
    w.close()


def test_a_written_record_is_what_its_generated_schema_says(tmp_path, signed):
    """The record on disk, signed, with every field the recorder writes, validates against
    observe.beat.schema.json (generated from ``Beat``) and reads back as that ``Beat``."""
    import jsonschema

    from hpcml import schemas
    from hpcml.observe.beat import Beat, Trust
    p = Progress()
    p.update([1.0, 1.0, 2.0], ["section"] * 3, ["step", "collective_wait", "step"], [0.4, 0.1, 0.5], [1, 1, 2])
    gpus = ["GPU-3e1f9a2b-7c4d-4e5f-8a6b-9c0d1e2f3a4b", "MIG-8b9c0d1e-2f3a-4b5c-9d6e-7f8a9b0c1d2e"]
    _writer(tmp_path, 0, b"k" * 32, signed).write(p, now=5.0, pid=42, snapshot=1, exit=0, gpu_uuids=gpus)
    doc = json.loads(beat_path(tmp_path, 0).read_bytes())
    jsonschema.validate(doc, schemas.load("observe.beat"), cls=jsonschema.Draft202012Validator)
    beat = read_beats(tmp_path, {}, Trust(1, b"k" * 32))[0]
    assert isinstance(beat, Beat) and (beat.step, beat.pid, beat.exit, beat.recent_wait) == (2, 42, 0, [0.1, 0.0])
    assert beat.gpu_uuids == gpus
    for extra in ({"extra": 1}, {"gpu_uuids": ["GPU-1 is fine"]}, {"gpu_uuids": [f"GPU-{i}" for i in range(17)]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**doc, **extra}, schemas.load("observe.beat"), cls=jsonschema.Draft202012Validator)


def test_a_real_h200_heartbeat_reads_with_the_seconds_nvml_held_the_clocks_back(tmp_path):
    """The record a rank's recorder wrote on a lent H200 (gpu_check.py's ``run`` part, 20 s of
    a small DDP model, tests/fixtures/gpu-h200/run-throttle): NVML's clocks event reasons said
    software power cap for 19.2 s of the 19.7 s it stepped; nvidia-smi's own counter on that
    machine afterwards said 19.9 s. The watch reads both fields from the real record."""
    from pathlib import Path

    from hpcml.samplers.clockreasons import reason_names
    fixture = Path(__file__).parents[1] / "fixtures" / "gpu-h200" / "run-throttle"
    dest = beat_path(tmp_path, 0)
    dest.parent.mkdir(parents=True)
    dest.write_bytes((fixture / "beat-rank-00000.json").read_bytes())
    beat = read_beats(tmp_path)[0]
    assert beat.steps == 2056 and beat.gpu_throttled_s == pytest.approx(19.21)
    assert reason_names(beat.gpu_throttle) == ["sw_power_cap"]
    stepped = beat.progress - beat.first
    assert 0.9 < beat.gpu_throttled_s / stepped <= 1.0
    smi = (fixture / "nvidia-smi-performance.txt").read_text()
    assert "SW Power Capping                               : 19870607 us" in smi


def test_a_heartbeat_too_full_for_its_gpus_keeps_its_steps_and_leaves_the_gpus_out(tmp_path, signed):
    """A process driving 16 GPUs, a million steps in, with 128 recent steps and their waits:
    the record holds the steps (what the straggler model reads) and leaves the GPU names out,
    rather than halving the steps; with 2 GPUs both fit."""
    from hpcml.observe.beat import MAX_GPUS, Trust
    p = Progress()
    for i in range(RECENT + 1):
        t = 1_800_000_000.0 + i * 1.123456789
        p.update([t, t], ["section", "section"], ["step", "collective_wait"], [1.123456789, 0.0123456789],
                 [10**6 + i, 10**6 + i])
    gpus = [f"GPU-{k:x}a1b2c3d-0e4f-4a5b-8c6d-7e8f9a0b1c2d" for k in range(MAX_GPUS)]
    w = _writer(tmp_path, 0, b"g" * 32, signed)
    w.write(p, pid=4242, cpu_wait_s=12.5, steal_s=0.25, gpu_throttled_s=3.5, gpu_uuids=gpus)
    beat = read_beats(tmp_path, {}, Trust(1, b"g" * 32))[0]
    assert beat_path(tmp_path, 0).stat().st_size == SIZE
    assert len(beat.recent_steps) == RECENT and beat.gpu_uuids is None, (len(beat.recent_steps), beat.gpu_uuids)
    w.write(p, pid=4242, cpu_wait_s=12.5, steal_s=0.25, gpu_throttled_s=3.5, gpu_uuids=gpus[:2])
    beat = read_beats(tmp_path, {}, Trust(1, b"g" * 32))[0]
    assert len(beat.recent_steps) == RECENT and beat.gpu_uuids == gpus[:2]
