"""The live watch's GPU throttling as the GPU saw it, end to end in one process: each rank's
recorder counts it as ``hpcml observe record`` does (``recorder._Throttle`` over its GPU rows
and its tracker's reads, ``samplers.gpuuse``), writes it on its heartbeat, and the watch judges
the slow rank (virtual time, as tests/run/test_watch.py)."""

from __future__ import annotations

from hpcml.observe.beat import BeatWriter, Progress
from hpcml.observe.recorder import _Throttle
from hpcml.run.watch import Watch
from hpcml.samplers.gpuuse import LOST, GpuUse, UsedGpu

RANKS, STEP_S, STEPS, SLOW = 4, 0.5, 400, 2


def gpu_of(rank: int) -> int:
    """The NVML index of the GPU a rank runs on: not its rank (nor its local rank), as on a
    node whose GPUs' PCI order is not the order the ranks were bound in."""
    return (rank + 1) % RANKS


def uuid(index: int) -> str:
    return f"GPU-5a1b{index}c3d-0e4f-4a5b-8c6d-7e8f9a0b1c2{index}"


def _job(tmp_path, *, hot: bool = False, lost: bool = False) -> Watch:
    """Four ranks of one node, none bound to a GPU: rank 0's recorder samples the node's four
    GPUs, each rank's tracker saw its processes on GPU ``gpu_of(rank)``, by its UUID. From step
    100 rank ``SLOW`` computes twice as long; ``hot``: its GPU is held back for heat from then
    on; ``lost``: its GPU falls off the bus then (rank 0's sampler writes ``gpu_lost``, its
    tracker says lost)."""
    d = tmp_path / "job"
    progress = {r: Progress() for r in range(RANKS)}
    writers = {r: BeatWriter(d / "observe", r, "n1") for r in range(RANKS)}
    throttles = {r: _Throttle() for r in range(RANKS)}
    watch = Watch(d, 0, RANKS, period=1.0, straggler_window=60.0)
    t = 1_800_000_000.0
    for step in range(STEPS):
        compute = [STEP_S * (2.0 if r == SLOW and step >= 100 else 1.0) * (1 + 0.02 * ((step * 7 + r * 3) % 5))
                   for r in range(RANKS)]
        longest = max(compute) + 0.001
        t += longest
        for r, p in progress.items():
            p.update([t, t], ["section", "section"], ["step", "collective_wait"], [longest, longest - compute[r]],
                     [step, step])
        if step % 2:
            continue
        ts = int(t * 1e9)
        gone, its = lost and step >= 100, gpu_of(SLOW)
        mask = {g: 0x40 if hot and g == its and step >= 100 else 0x1 for g in range(RANKS)}
        sampled = [(ts, "gpu", LOST, 1.0, None, g) if gone and g == its else
                   (ts, "gpu", "clocks_event_reasons", float(mask[g]), None, g) for g in range(RANKS)]
        for r, w in writers.items():
            g = gpu_of(r)
            use = GpuUse({g: UsedGpu(g, uuid(g))}, {} if gone and g == its else {g: mask[g]},
                         frozenset({its}) if gone and g == its else frozenset())
            throttles[r].add(ts, sampled if r == 0 else [], use)
            w.write(progress[r], now=t, cpu_wait_s=0.0, steal_s=0.0, **throttles[r].beat())
        watch.poll(t)
    return watch


def test_a_rank_whose_gpu_another_rank_records_is_named_as_contention_by_its_own_gpu(tmp_path):
    """Rank 2's GPU, recorded by rank 0's recorder, is held back for heat from rank 2's onset:
    rank 2 is named as contention with the reason (its tracker read its GPU), and rank 0's
    heartbeat carries none of it (was: rank 0 credited with GPU 2's heat, rank 2 a straggler)."""
    watch = _job(tmp_path, hot=True)
    assert watch.stragglers == {} and list(watch.contended) == [SLOW], (watch.stragglers, watch.contended)
    c = watch.contended[SLOW]
    assert c.gpu_throttled is not None and c.gpu_throttled >= 0.3 and c.gpu_throttle == ["hw_thermal_slowdown"]
    assert watch.beats[0].gpu_throttled_s == 0.0 and watch.beats[0].gpu_throttle is None


def test_a_rank_whose_gpu_fell_off_the_bus_is_a_straggler_with_its_throttling_unknown(tmp_path, capsys):
    """Rank 2's GPU falls off the bus at its onset: its heartbeat's throttling is unknown from
    then on, and the watch names it a straggler with its GPU's throttling unknown (None, and
    said so on its line), not "held back 0% of the time" (was: 0.0)."""
    watch = _job(tmp_path, lost=True)
    line = [ln for ln in capsys.readouterr().err.splitlines() if f"straggler: rank {SLOW}" in ln]
    assert line and line[0].endswith("whether its GPU's clocks held it back is unknown"), line
    assert list(watch.stragglers) == [SLOW] and watch.contended == {}, (watch.stragglers, watch.contended)
    assert watch.stragglers[SLOW].gpu_throttled is None, watch.stragglers[SLOW]
    assert watch.beats[SLOW].gpu_throttled_s is None


def test_the_watch_names_a_straggler_s_gpu_as_the_gpu_names_itself(tmp_path, capsys):
    """Rank 2 runs on NVML's GPU 3: the straggler's line, its record, the job report's finding
    and the centre's summary name that GPU by its UUID (the one name the same on every node
    and in Slurm's, CUDA's and NVML's numbering), from the rank's own heartbeat; the other
    ranks' GPUs name no straggler (was: the watch named no GPU; "rank 2" read as GPU 2 by
    whoever looked, another rank's)."""
    from hpcml.jobmodel import Attempt
    from hpcml.run.report import _watch_findings
    from hpcml.run.summary import _events
    watch = _job(tmp_path, lost=True)
    its = uuid(gpu_of(SLOW))
    line = [ln for ln in capsys.readouterr().err.splitlines() if f"straggler: rank {SLOW}" in ln]
    assert line and f"rank {SLOW} on n1 ({its}) " in line[0], line
    assert watch.beats[SLOW].gpu_uuids == [its] and watch.stragglers[SLOW].gpu_uuids == [its]
    assert all(uuid(SLOW) not in ln for ln in line)                   # the GPU numbered like the rank: not its
    seen = watch.fields()
    findings = _watch_findings({"hang": None, "stragglers": [s.to_json() for s in seen.stragglers]}, tmp_path, 0)
    assert [f["message"] for f in findings if f["kind"] == "live_straggler"][0].startswith(f"rank {SLOW} on n1 ({its}) ")
    record = Attempt(command=["train"], mode="local", started=0.0, stragglers=seen.stragglers)
    detail = _events({"job": {"attempt": 0}}, [record])["stragglers"][0]["detail"]
    assert detail.endswith(f"on {its}"), detail


def test_a_rank_slowed_by_its_own_gpu_s_heat_is_contention_named_by_that_gpu(tmp_path, capsys):
    """The contention line names the GPU that was held back by its UUID: the one to check."""
    watch = _job(tmp_path, hot=True)
    line = [ln for ln in capsys.readouterr().err.splitlines() if f"contention: rank {SLOW}" in ln]
    assert line and f"rank {SLOW} on n1 ({uuid(gpu_of(SLOW))}) " in line[0], line
    assert watch.contended[SLOW].gpu_uuids == [uuid(gpu_of(SLOW))]
