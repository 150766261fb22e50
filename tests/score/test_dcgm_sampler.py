"""The DCGM sampler, the sampler choice, the GPU claims, and ``observe record --gpu-metrics``.

DCGM cannot exist on the machines these tests run on (no GPU, no nv-hostengine). The
sampler is exercised against a fake of DCGM's Python bindings (tests/score/fake_dcgm),
written from DCGM's documented API (same module, class and function names and call
signatures; no NVIDIA code) and replaying synthetic values shaped like DCGM's from a JSON
file, blank sentinels included. ``DCGM_HOME`` points at it exactly as at a real install.
The live path (a real host engine) is not tested here.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcml.errors import UsageError
from hpcml.samplers.fields import BY_ID

FAKE = Path(__file__).parent / "fake_dcgm"
RECORDED = FAKE / "recorded.json"
FAKE_MODULES = ("pydcgm", "DcgmHandle", "DcgmSystem", "DcgmGroup", "DcgmFieldGroup", "dcgm_agent",
                "dcgm_structs", "dcgm_fields", "dcgm_field_helpers", "dcgmvalue")


def _forget_bindings() -> None:
    for name in FAKE_MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """The fake bindings on DCGM_HOME, replaying ``recorded.json`` (or a variant of it)."""
    saved_path = list(sys.path)
    _forget_bindings()
    monkeypatch.setenv("DCGM_HOME", str(FAKE))
    monkeypatch.delenv("DCGM_HOSTENGINE", raising=False)
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path))           # GPU claims stay in the test
    data = json.loads(RECORDED.read_text())

    class Fake:
        def use(self, change=None) -> dict:
            d = copy.deepcopy(data)
            if change:
                change(d)
            path = tmp_path / f"dcgm-{len(list(tmp_path.glob('dcgm-*.json')))}.json"
            path.write_text(json.dumps(d))
            monkeypatch.setenv("HPCML_FAKE_DCGM", str(path))
            return d

        @property
        def calls(self) -> list[dict]:
            import dcgm_agent
            return dcgm_agent.CALLS

    f = Fake()
    f.use()
    yield f
    _forget_bindings()
    sys.path[:] = saved_path


def _expected(data: dict, dcgm_ids: dict[int, int]) -> set[tuple]:
    """Rows the sampler must emit for the GPUs ``{dcgm id: row index}``: every non-blank
    value of ticks 1.. (tick 0 is consumed by the first fetch, history is never ours)."""
    out = set()
    for tick in data["ticks"][1:]:
        for s in tick:
            if s["gpuId"] not in dcgm_ids:
                continue
            for fid, v in s["values"].items():
                if not isinstance(v, str):
                    out.add((s["ts"] * 1000, "gpu", BY_ID[int(fid)].name, float(v), None, dcgm_ids[s["gpuId"]]))
    return out


def _drain(sampler, n: int = 8) -> list[tuple]:
    rows = []
    for _ in range(n):
        rows += sampler.sample(time.time_ns())
    return rows


def test_probe_says_whether_a_host_engine_answers_and_why_not(fake, monkeypatch, tmp_path):
    from hpcml.samplers.dcgm import probe
    p = probe()
    assert p.ok and p.gpus == 4 and p.bindings.endswith("bindings/python3")
    fake.use(lambda d: d.update(reachable=False))
    p = probe()
    assert not p.ok and "no DCGM host engine reachable at localhost" in p.reason and "nv-hostengine" in p.reason
    monkeypatch.setenv("DCGM_HOSTENGINE", "unix:/run/dcgm.sock")
    assert "unix:/run/dcgm.sock" in probe().reason
    _forget_bindings()
    sys.path[:] = [p for p in sys.path if "fake_dcgm" not in p]
    monkeypatch.setenv("DCGM_HOME", str(tmp_path / "nowhere"))
    p = probe()
    assert not p.ok and "bindings are not installed" in p.reason


def test_samples_only_the_bound_gpus_with_dcgm_timestamps_and_no_blank_rows(fake):
    """SLURM_STEP_GPUS=0,1 are NVML indices; in the replay they are DCGM GPU ids 2 and 3."""
    from hpcml.samplers.dcgm import DcgmSampler
    data = fake.use()
    s = DcgmSampler(["0", "1"], 1.0)
    try:
        assert s.index_of == {2: 0, 3: 1} and s.saturation
        added = [c["args"][2] for c in fake.calls if c["call"] == "dcgmGroupAddDevice"]
        assert added == [2, 3]
        watch = next(c for c in fake.calls if c["call"] == "dcgmWatchFields")
        assert watch["args"][3] == 1_000_000 and watch["args"][4] >= 5.0      # µs, seconds
        assert s.models == {"0": "NVIDIA H100 80GB HBM3", "1": "NVIDIA H100 80GB HBM3"}
        assert s.uuids["0"] == data["gpus"][2]["uuid"]
        rows = _drain(s)
    finally:
        s.close()
    assert set(rows) == _expected(data, {2: 0, 3: 1}) and len(rows) == len(set(rows))
    # the blanks of DCGM GPU 2 in tick 3 (NOT_FOUND, BLANK, NOT_PERMISSIONED) are no row, not 0
    t3 = data["ticks"][3][4]["ts"] * 1000
    assert not {r[2] for r in rows if r[0] == t3 and r[5] == 0} & {"nvlink_tx_bytes"}
    assert all(r[3] < 1e14 for r in rows)                    # no sentinel leaked as a value
    old = data["history"][0]["ts"] * 1000
    assert min(r[0] for r in rows) > old                     # another watcher's cache is not ours


def test_a_uuid_binds_by_device_attributes(fake):
    from hpcml.samplers.dcgm import DcgmSampler
    data = fake.use()
    s = DcgmSampler([data["gpus"][1]["uuid"]], 0.5)
    try:
        assert s.index_of == {1: 3}
        rows = _drain(s)
    finally:
        s.close()
    assert rows and {r[5] for r in rows} == {3}
    assert set(rows) == _expected(data, {1: 3})


class _LocalNvml:
    """This process's NVML (a stand-in: no driver here) seeing the node's GPUs by UUID, with
    device minor numbers that are not DCGM's NVML indices (PrincetonUniversity/jobstats#34)."""

    def __init__(self, uuids: list[str], minors: list[int]) -> None:
        self.uuids, self.minors = uuids, minors

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.uuids[h]

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        return self.minors[h]


def test_slurms_device_numbers_reach_dcgm_as_uuids(fake, monkeypatch):
    """SLURM_STEP_GPUS=0 is /dev/nvidia0: this process's NVML says which UUID that is, and
    DCGM samples that GPU, not the one it indexes 0."""
    from hpcml.samplers import nvml
    from hpcml.samplers.dcgm import DcgmSampler, DcgmUnavailable
    data = fake.use()
    uuids = [g["uuid"] for g in data["gpus"]]
    monkeypatch.setattr(nvml, "nvml_library", lambda env=None: _LocalNvml(uuids, [3, 0, 1, 2][:len(uuids)]))
    monkeypatch.setenv("SLURM_STEP_GPUS", "0")
    s = DcgmSampler(["0"], 1.0)
    try:
        assert list(s.index_of) == [1] and s.uuids == {str(s.index_of[1]): uuids[1]}
    finally:
        s.close()
    monkeypatch.setattr(nvml, "nvml_library", lambda env=None: _LocalNvml(uuids, [5, 6, 7, 8][:len(uuids)]))
    monkeypatch.setenv("SLURM_STEP_GPUS", "1")       # /dev/nvidia1 is none of these: no GPU, not DCGM's 1
    with pytest.raises(DcgmUnavailable, match="none of this task's GPUs"):
        DcgmSampler(["1"], 1.0)
    monkeypatch.setenv("SLURM_STEP_GPUS", "0")
    monkeypatch.setattr(nvml, "nvml_library", lambda env=None: (_ for _ in ()).throw(nvml.NoDriver("none")))
    s = DcgmSampler(["0"], 1.0)                      # no NVML here: the numbers stay, said
    try:
        assert s.index_of == {2: 0} and "taken as NVML indices" in s.label()["note"]
    finally:
        s.close()


def test_gpus_dcgm_does_not_know_are_noted_and_ids_stand_in_for_missing_nvml_indices(fake):
    from hpcml.samplers.dcgm import DcgmSampler
    s = DcgmSampler(["0", "7"], 1.0)
    try:
        assert s.index_of == {2: 0} and "['7']" in s.label()["note"]
    finally:
        s.close()
    fake.use(lambda d: [g.pop("nvmlIndex") for g in d["gpus"]])
    s = DcgmSampler(["1"], 1.0)
    try:
        assert s.index_of == {1: 1} and "taken as Slurm's indices" in s.label()["note"]
    finally:
        s.close()


@pytest.mark.parametrize("status, words", [("DCGM_ST_PROFILING_MULTI_PASS", "one pass"),
                                            ("DCGM_ST_IN_USE", "another profiler"),
                                            ("DCGM_ST_PROFILING_NOT_SUPPORTED", "does not support")])
def test_profiling_fields_that_cannot_be_watched_fall_back_to_device_fields(fake, status, words):
    from hpcml.samplers.dcgm import DEVICE_IDS, DcgmSampler
    data = fake.use(lambda d: d.update(watch_error=status))
    s = DcgmSampler(["0"], 1.0)
    try:
        assert not s.saturation and words in s.note and "no saturation" in s.note
        label = s.label()
        assert label["kind"] == "dcgm" and label["saturation"] is False and label["fields"] == list(DEVICE_IDS)
        rows = _drain(s)
    finally:
        s.close()
    device = {BY_ID[i].name for i in DEVICE_IDS}
    assert rows and {r[2] for r in rows} <= device
    assert set(rows) == {r for r in _expected(data, {2: 0}) if r[2] in device}
    calls = [c["call"] for c in fake.calls]
    assert calls.count("dcgmFieldGroupCreate") == 2 and calls.count("dcgmFieldGroupDestroy") == 2


def test_an_unexpected_watch_error_is_not_swallowed(fake):
    from hpcml.samplers.dcgm import DcgmSampler, load_bindings
    fake.use(lambda d: d.update(watch_error="DCGM_ST_NO_PERMISSION"))
    with pytest.raises(load_bindings().dcgm_structs.DCGMError):
        DcgmSampler(["0"], 1.0)
    calls = [c["call"] for c in fake.calls]
    assert calls[-3:] == ["dcgmFieldGroupDestroy", "dcgmGroupDestroy", "dcgmDisconnect"]


def test_close_unwatches_destroys_and_disconnects_even_when_the_engine_is_gone(fake):
    from hpcml.samplers.dcgm import DcgmSampler
    s = DcgmSampler(["0", "1"], 1.0)
    s.close()
    s.close()                                                # idempotent
    calls = [c["call"] for c in fake.calls]
    assert calls[-4:] == ["dcgmUnwatchFields", "dcgmFieldGroupDestroy", "dcgmGroupDestroy", "dcgmDisconnect"]
    import dcgm_agent
    assert dcgm_agent._ENGINES == {} and not s.cleanup_errors
    s = DcgmSampler(["0"], 1.0)
    dcgm_agent._ENGINES.clear()                              # the host engine went away
    s.close()
    assert len(s.cleanup_errors) == 4


def test_blank_sentinels_are_recognised_even_without_the_helpers_flag(fake):
    """The sampler checks DCGM's sentinels itself; a 64-bit counter past the 32-bit
    sentinel range (energy in mJ after hours) is a value, not a blank."""
    from types import SimpleNamespace as V

    from hpcml.samplers.dcgm import DcgmSampler
    s = DcgmSampler(["0"], 1.0)
    dv = s.b.dcgmvalue
    try:
        for blank in (dv.DCGM_FP64_BLANK, dv.DCGM_FP64_NOT_FOUND, dv.DCGM_FP64_NOT_SUPPORTED,
                      dv.DCGM_FP64_NOT_PERMISSIONED, dv.DCGM_INT64_BLANK, dv.DCGM_INT64_NOT_FOUND,
                      dv.DCGM_INT64_NOT_SUPPORTED, dv.DCGM_INT64_NOT_PERMISSIONED, float("nan"), None, "N/A"):
            assert s._number(V(isBlank=False, value=blank)) is None, blank
        assert s._number(V(isBlank=True, value=3.0)) is None
        assert s._number(V(isBlank=False, value=dv.DCGM_INT32_BLANK + 5)) == float(dv.DCGM_INT32_BLANK + 5)
        assert s._number(V(isBlank=False, value=0)) == 0.0
    finally:
        s.close()


# -- choose_gpu_sampler -----------------------------------------------------------------

def _replay(tmp_path: Path) -> Path:
    f = tmp_path / "nvml.jsonl"
    f.write_text(json.dumps({"gpus": [{"index": 0, "util_gpu_percent": 80, "power_w": 200.0}]}) + "\n")
    return f


def test_choose_modes(fake, monkeypatch, tmp_path):
    from hpcml.samplers.choose import NVML_NOTE, choose_gpu_sampler
    from hpcml.samplers.dcgm import DcgmSampler

    s, label = choose_gpu_sampler("none", ["0"], 1.0)
    assert s is None and label["kind"] == "none"
    s, label = choose_gpu_sampler("auto", ["0"], 1.0)
    assert isinstance(s, DcgmSampler) and label["kind"] == "dcgm" and label["saturation"] is True
    s.close()
    s, label = choose_gpu_sampler("dcgm", ["0"], 1.0)
    assert isinstance(s, DcgmSampler)
    s.close()

    fake.use(lambda d: d.update(reachable=False))
    with pytest.raises(UsageError, match="DCGM is required.*no DCGM host engine reachable"):
        choose_gpu_sampler("dcgm", ["0"], 1.0)
    monkeypatch.setenv("HPCML_OBSERVE_NVML_REPLAY", str(_replay(tmp_path)))
    s, label = choose_gpu_sampler("auto", ["0"], 1.0)
    assert type(s).__name__ == "NvmlSampler"
    assert label["kind"] == "nvml" and label["saturation"] is False and label["note"].startswith(NVML_NOTE)
    assert "DCGM not used: no DCGM host engine reachable" in label["note"]
    s, label = choose_gpu_sampler("nvml", ["0"], 1.0)
    assert type(s).__name__ == "NvmlSampler" and label["note"] == NVML_NOTE
    with pytest.raises(UsageError, match="not one of"):
        choose_gpu_sampler("rocm", ["0"], 1.0)


def test_auto_without_dcgm_or_nvml_records_no_gpu(fake, monkeypatch):
    """No host engine, and NVML fails here (no driver): no sampler, and the label says why."""
    from hpcml.samplers.choose import choose_gpu_sampler
    fake.use(lambda d: d.update(reachable=False))
    monkeypatch.delenv("HPCML_OBSERVE_NVML_REPLAY", raising=False)
    from tests.nodriver import skip_if_nvidia_driver
    skip_if_nvidia_driver()
    s, label = choose_gpu_sampler("auto", ["0"], 1.0)
    assert s is None and label["kind"] == "none" and "NVML unavailable" in label["note"]


def test_for_task_records_each_gpu_once_per_step(fake, monkeypatch):
    from hpcml.samplers.choose import for_task
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    first = for_task("dcgm", ["0", "1"], 1.0)
    second = for_task("dcgm", ["0", "1"], 1.0)
    try:
        assert first.sampler is not None and first.meta["gpu_sampler"]["gpus"] == ["0", "1"]
        assert first.meta["gpu_models"] == {"0": "NVIDIA H100 80GB HBM3", "1": "NVIDIA H100 80GB HBM3"}
        assert second.sampler is None and "recorded by another task" in second.meta["gpu_sampler"]["note"]
    finally:
        second.close()
        first.close()
    again = for_task("dcgm", ["1"], 1.0)                     # released at close
    try:
        assert again.sampler is not None
    finally:
        again.close()
    none = for_task("auto", [], 1.0)
    assert none.sampler is None
    assert none.meta["gpu_sampler"]["note"].startswith("no GPU bound to this task and none visible (NVML")


# -- GPU claims -------------------------------------------------------------------------

CLAIMER = """
import json, os, sys, time
from pathlib import Path
from hpcml.samplers.claim import claim_gpus
go = Path(sys.argv[1])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
c = claim_gpus(sys.argv[3].split(","))
print(json.dumps(c.claimed), flush=True)
while not Path(sys.argv[2]).exists():
    time.sleep(0.01)
c.release()
"""


def test_two_processes_claiming_overlapping_gpus_never_share_one(tmp_path):
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3", "SLURM_TMPDIR": str(tmp_path)}
    script = tmp_path / "claim.py"
    script.write_text(CLAIMER)
    go, done = tmp_path / "go", tmp_path / "done"
    sets = [[str(i) for i in range(0, 12)], [str(i) for i in range(4, 16)]]
    procs = [subprocess.Popen([sys.executable, str(script), str(go), str(done), ",".join(s)], env=env,
                              stdout=subprocess.PIPE, text=True) for s in sets]
    assert [p.stdout.readline() for p in procs] == ["ready\n"] * 2    # both wait for the go
    go.touch()                                               # both start claiming at once
    got = [json.loads(p.stdout.readline()) for p in procs]
    done.touch()
    assert all(p.wait(timeout=60) == 0 for p in procs)
    a, b = set(got[0]), set(got[1])
    assert not a & b and a | b == {str(i) for i in range(16)}
    assert {str(i) for i in range(4)} <= a and {str(i) for i in range(12, 16)} <= b
    assert not list(tmp_path.glob("hpcml-gpu-claim-4242-*"))  # released


def test_claims_are_per_step_released_and_stale_ones_taken_over(tmp_path):
    from hpcml.samplers.claim import claim_gpus
    env = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_TMPDIR": str(tmp_path)}
    first = claim_gpus(["0", "GPU-abc/1"], env)
    assert first.claimed == ["0", "GPU-abc/1"] and first.directory == tmp_path
    assert claim_gpus(["0"], env).others == ["0"]            # held by a live task
    assert claim_gpus(["0"], {**env, "SLURM_STEP_ID": "1"}).claimed == ["0"]   # another step
    first.release()
    second = claim_gpus(["0"], env)
    assert second.claimed == ["0"]
    second.release()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    (tmp_path / "hpcml-gpu-claim-9-0-3").write_text(f"{dead} 1")
    taken = claim_gpus(["3"], env)
    assert taken.claimed == ["3"] and (tmp_path / "hpcml-gpu-claim-9-0-3").read_text() == taken.token
    taken.release()


# -- hpcml observe record --gpu-metrics dcgm, then the store importer -------------------

def _record(tmp_path: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcml", "observe", "record", *args, "--", sys.executable,
                           "-c", "import time; time.sleep(2)"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)


def test_record_with_dcgm_then_load_gives_the_recorded_values(fake, tmp_path):
    """End to end under the fake: the recorder samples DCGM GPUs 2 and 3 (NVML 0 and 1),
    the store importer gives DCGM's own timestamps and values back, blanks as NaN."""
    import numpy as np

    from hpcml.score.importers import store
    log = tmp_path / "calls.jsonl"
    env = {"HPCML_FAKE_DCGM_LOG": str(log), "SLURM_STEP_GPUS": "0,1", "SLURMD_NODENAME": "nid001",
           "SLURM_JOB_ID": "555", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    out = _record(tmp_path, "--gpu-metrics", "dcgm", "--interval", "0.2", "--dir", str(tmp_path / "D"), env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(Path(os.environ["HPCML_FAKE_DCGM"]).read_text())
    rec = store.load(tmp_path / "D")
    assert sorted(rec.gpus) == [("nid001", "0"), ("nid001", "1")]
    assert not rec.temporal_only and rec.meta["samplers"]["0"]["kind"] == "dcgm"
    for index, dcgm_id in (("0", 2), ("1", 3)):
        g = rec.gpus[("nid001", index)]
        assert g.model == "NVIDIA H100 80GB HBM3"
        mine = [[s for s in tick if s["gpuId"] == dcgm_id] for tick in data["ticks"][1:]]
        assert len(g.t) == len(mine) == 4
        assert np.allclose(g.t, [tick[0]["ts"] / 1e6 for tick in mine], rtol=0, atol=1e-6)
        for fid in ("1002", "1005", "1011", "203", "155", "156"):
            want = [next(s["values"][fid] for s in tick if fid in s["values"]) for tick in mine]
            want = [np.nan if isinstance(v, str) else v for v in want]
            assert np.allclose(g.values[BY_ID[int(fid)].name], want, equal_nan=True, rtol=1e-6), fid
    assert np.isnan(rec.gpus[("nid001", "0")].values["total_energy_consumption"][2])   # blank stays missing
    calls = [json.loads(line)["call"] for line in log.read_text().splitlines()]
    assert calls[-4:] == ["dcgmUnwatchFields", "dcgmFieldGroupDestroy", "dcgmGroupDestroy", "dcgmDisconnect"]
    assert not list(tmp_path.glob("hpcml-gpu-claim-*"))


def test_two_ranks_seeing_the_node_wide_gpu_list_record_each_gpu_once(fake, tmp_path):
    from hpcml.score.importers import store
    base = {"SLURM_STEP_GPUS": "0,1", "SLURMD_NODENAME": "nid001", "SLURM_JOB_ID": "556",
            "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}
    procs = [subprocess.Popen([sys.executable, "-m", "hpcml", "observe", "record", "--gpu-metrics", "dcgm",
                               "--interval", "0.2", "--dir", str(tmp_path / "D"), "--", sys.executable, "-c",
                               "import time; time.sleep(2)"],
                              env={**os.environ, **base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)})
             for r in (0, 1)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    rec = store.load(tmp_path / "D")
    assert sorted(rec.gpus) == [("nid001", "0"), ("nid001", "1")]
    assert not any("recorded by ranks" in n for n in rec.notes)
    labels = [json.loads((tmp_path / "D" / f"rank-0000{r}.json").read_text())["gpu_sampler"] for r in (0, 1)]
    assert sorted(lab["kind"] for lab in labels) == ["dcgm", "none"]
    assert any("recorded by another task" in lab["note"] for lab in labels)


def test_record_requiring_dcgm_without_a_host_engine_is_one_line_exit_2(fake, tmp_path):
    fake.use(lambda d: d.update(reachable=False))
    out = _record(tmp_path, "--gpu-metrics", "dcgm", "--dir", str(tmp_path / "D"),
                  env={"SLURM_STEP_GPUS": "0"})
    assert out.returncode == 2, out.stderr
    assert "DCGM is required" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_virtual_nodes_of_one_host_do_not_share_claims(tmp_path):
    from hpcml.samplers.claim import claim_gpus
    env = {"SLURM_TMPDIR": str(tmp_path), "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}
    a = claim_gpus(["0"], {**env, "SLURMD_NODENAME": "n1"})
    b = claim_gpus(["0"], {**env, "SLURMD_NODENAME": "n2"})
    try:
        assert a.claimed == ["0"] and b.claimed == ["0"]
    finally:
        a.release()
        b.release()
