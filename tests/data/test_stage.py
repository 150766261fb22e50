"""``hpcml data stage`` on this machine: copy, verify, skip, refuse, fall back (no Slurm)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.data import stage as st
from hpcml.data.manifest import load_manifest
from hpcml.data.pack import pack
from hpcml.data.stage_worker import RESULT, combine
from hpcml.errors import UsageError

ROOT = Path(__file__).parents[2]
NO_SLURM = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """A few hundred small random files packed into about ten shards."""
    base = tmp_path_factory.mktemp("ds")
    rng = random.Random(6)
    for i in range(300):
        d = base / "raw" / f"c{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"s{i:04d}.bin").write_bytes(rng.randbytes(rng.randint(50, 3000)))
        (d / f"s{i:04d}.cls").write_text(str(i % 4))
    pack(base / "raw", base / "shards", target_bytes=64 * 1024, jobs=2)
    assert len(load_manifest(base / "shards").shards) >= 5
    return base / "shards"


@pytest.fixture
def src(packed, tmp_path) -> Path:
    """A private copy of the shard set, for tests that damage it."""
    return Path(shutil.copytree(packed, tmp_path / "shards"))


def _names(src: Path) -> list[str]:
    m = load_manifest(src)
    return [s.name for s in m.shards] + [s.index for s in m.shards] + ["manifest.json"]


def _stamp(path: str | Path) -> dict:
    return json.loads((Path(path) / st.STAMP).read_text())


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**NO_SLURM, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "hpcml", "data", "stage", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=60)


def test_stage_copies_every_file_byte_identical_and_stamps_it(packed, tmp_path):
    m = load_manifest(packed)
    r = st.stage(packed, str(tmp_path / "local"), env={})
    assert r.staged and r.path == str(tmp_path / "local" / m.dataset) and r.reason == ""
    for name in _names(packed):
        assert (Path(r.path) / name).read_bytes() == (packed / name).read_bytes(), name
    assert r.files_copied == len(_names(packed)) and r.files_skipped == 0
    assert r.bytes_copied == r.bytes_total == sum((packed / n).stat().st_size for n in _names(packed))
    stamp = _stamp(r.path)
    assert stamp["dataset"] == m.dataset
    assert {s.name: s.sha256 for s in m.shards} == {s.name: stamp["files"][s.name]["sha256"] for s in m.shards}
    assert [run["copied"] for run in stamp["runs"]] == [2 * len(m.shards)]
    assert not list(Path(r.path).glob(".*.part"))


def test_rerun_skips_everything_without_rehashing_and_verify_rehashes(packed, tmp_path, monkeypatch):
    first = st.stage(packed, str(tmp_path), env={})

    def no_hashing(*a, **k):
        raise AssertionError("a stamped file was re-hashed")
    with monkeypatch.context() as mp:
        mp.setattr(st, "_sha_of", no_hashing)
        again = st.stage(packed, str(tmp_path), env={})
    assert again.staged and again.path == first.path
    assert again.files_copied == 0 and again.bytes_copied == 0
    assert again.files_skipped == len(_names(packed))
    checked = st.stage(packed, str(tmp_path), env={}, verify=True)
    assert checked.files_copied == 0 and checked.files_verified == len(_names(packed)) - 1
    assert [run["copied"] for run in _stamp(first.path)["runs"]][-3:] == [first.files_copied - 1, 0, 0]


def test_corrupt_source_shard_is_refused_named_and_not_left_behind(src, tmp_path):
    bad = src / "shard-000002.tar"
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="shard-000002.tar") as err:
        st.stage(src, str(tmp_path / "local"), env={})
    assert "checksum mismatch" in str(err.value) and err.value.exit_code == 2
    staged = tmp_path / "local" / load_manifest(src).dataset
    assert not (staged / "shard-000002.tar").exists() and not list(staged.glob(".*.part"))
    assert not (staged / "manifest.json").exists()          # not a complete copy
    assert (staged / "shard-000001.tar").read_bytes() == (src / "shard-000001.tar").read_bytes()

    p = _cli(str(src), "--to", str(tmp_path / "cli"), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "shard-000002.tar" in lines[0] and lines[0].startswith("hpcml data stage: error:")
    assert p.stdout == ""


def test_wrong_size_staged_file_is_recopied(packed, tmp_path):
    r = st.stage(packed, str(tmp_path), env={})
    victim = Path(r.path) / "shard-000001.tar"
    victim.write_bytes(b"truncated")
    again = st.stage(packed, str(tmp_path), env={})
    assert again.files_copied == 1 and again.bytes_copied == (packed / "shard-000001.tar").stat().st_size
    assert victim.read_bytes() == (packed / "shard-000001.tar").read_bytes()


def test_same_size_damage_behind_the_stamp_is_caught_by_verify(packed, tmp_path):
    r = st.stage(packed, str(tmp_path), env={})
    victim = Path(r.path) / "shard-000003.tar"
    before = victim.stat()
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x01
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))    # the stamp still matches
    assert st.stage(packed, str(tmp_path), env={}).files_copied == 0
    fixed = st.stage(packed, str(tmp_path), env={}, verify=True)
    assert fixed.files_copied == 1
    assert victim.read_bytes() == (packed / "shard-000003.tar").read_bytes()


def test_missing_source_shard_is_bad_input_naming_it(src, tmp_path):
    (src / "shard-000004.tar").unlink()
    with pytest.raises(UsageError, match="shard-000004.tar"):
        st.stage(src, str(tmp_path / "local"), env={})


def test_shard_name_leaving_the_directory_is_refused(src, tmp_path):
    doc = json.loads((src / "manifest.json").read_text())
    doc["shards"][0]["name"] = "../escape.tar"
    (src / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="shards.0.name"):
        st.stage(src, str(tmp_path / "local"), env={})
    assert not (tmp_path / "local").exists()


@pytest.mark.parametrize("dataset", ["../escaped", "/tmp/abs-target", "sub/dir", ".hidden"])
def test_a_dataset_id_that_is_not_a_plain_name_is_refused(src, tmp_path, dataset):
    """The manifest's dataset id names the directory it is staged in: a path there (was:
    the whole set staged outside --to, over what was there) is bad input naming the key."""
    doc = json.loads((src / "manifest.json").read_text())
    doc["dataset"] = dataset
    (src / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="dataset"):
        st.stage(src, str(tmp_path / "local" / "root"), env={})
    assert not (tmp_path / "local").exists() and not (tmp_path / "escaped").exists()


def test_negative_or_absurd_sample_counts_are_refused(src, tmp_path):
    for key, value in (("samples", -1), ("samples", 10**13)):
        doc = json.loads((src / "manifest.json").read_text())
        doc["shards"][0][key] = value
        (src / "manifest.json").write_text(json.dumps(doc))
        with pytest.raises(UsageError, match=f"shards.0.{key}"):
            load_manifest(src)


def test_a_link_planted_at_the_dataset_s_directory_or_its_lock_is_not_followed(packed, tmp_path):
    """The target's dataset directory, or its lock file, is a symlink someone planted (the
    default target's name is known in advance): nothing is written where it points, and
    the set is streamed from where it is."""
    m = load_manifest(packed)
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / m.dataset).symlink_to(outside, target_is_directory=True)
    r = st.stage(packed, str(root), env={})
    assert not r.staged and "not a directory of this user's" in r.reason, r.reason
    assert list(outside.iterdir()) == []
    (root / m.dataset).unlink()
    (root / m.dataset).mkdir()
    (root / m.dataset / st.LOCK).symlink_to(outside / "created-by-stage")
    r = st.stage(packed, str(root), env={})
    assert not r.staged and not (outside / "created-by-stage").exists(), r


def test_does_not_fit_prints_src_and_copies_nothing(packed, tmp_path):
    r = st.stage(packed, str(tmp_path / "local"), env={}, keep_free=10**18)
    assert not r.staged and r.path == str(packed) and "does not fit" in r.reason
    assert not list(Path(r.target).glob("shard-*"))

    p = _cli(str(packed), "--to", str(tmp_path / "cli"), "--keep-free", "1 PB", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == str(packed)
    assert "does not fit: needs" in p.stderr and f"streams from {packed}" in p.stderr
    assert not list((tmp_path / "cli").rglob("shard-*"))


def test_uncreatable_target_falls_back_to_streaming(packed, tmp_path):
    (tmp_path / "afile").write_text("")
    p = _cli(str(packed), "--to", str(tmp_path / "afile" / "sub"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == str(packed) and "cannot create" in p.stderr


def test_cli_prints_the_staged_directory_last_and_the_summary_on_stderr(packed, tmp_path):
    p = _cli(str(packed / "manifest.json"), "--to", "local/%n", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    staged = tmp_path / "local" / st.this_node({}) / load_manifest(packed).dataset
    assert p.stdout.strip() == str(staged)
    assert (staged / "manifest.json").read_bytes() == (packed / "manifest.json").read_bytes()
    assert f"{len(_names(packed))} files copied" in p.stderr
    rerun = _cli(str(packed), "--to", "local/%n", "--json", cwd=tmp_path)
    rep = json.loads(rerun.stdout)
    (node,) = rep["nodes"].values()
    assert rep["path"] == str(staged) and node["files_copied"] == 0


def test_target_expansion():
    env = {"SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "42", "SLURM_TMPDIR": "/local/job42", "X": "/x"}
    assert st.resolve_dir("/tmp/d/%n/%j/100%%", env) == Path("/tmp/d/n7/42/100%")
    assert st.resolve_dir("$SLURM_TMPDIR/data", env) == Path("/local/job42/data")
    assert st.resolve_dir("${X}/%n", env) == Path("/x/n7")
    assert st.resolve_dir(None, env) == Path("/local/job42")
    assert st.resolve_dir(None, {"SLURM_JOB_ID": "42"}) == Path("/tmp/hpcml-data-42")
    assert st.resolve_dir(None, {}) == Path("/tmp/hpcml-data")
    with pytest.raises(st.TargetUnavailable, match="SLURM_TMPDIR is not set"):
        st.resolve_dir("$SLURM_TMPDIR", {"SLURM_JOB_ID": "42"})


def test_unset_variable_in_target_falls_back_to_the_default_target(packed, tmp_path):
    """Issue 19: `--to '$SLURM_TMPDIR'` where it is unset staged nothing; now the default
    target ($SLURM_TMPDIR, else $TMPDIR/hpcml-data-JOB) is used, and a note says so."""
    r = st.stage(packed, "$SLURM_TMPDIR/x", env={"SLURM_JOB_ID": "9", "TMPDIR": str(tmp_path)})
    assert r.staged and r.path.startswith(str(tmp_path / "hpcml-data-9"))
    assert "SLURM_TMPDIR is not set" in r.note and "default" in r.note


def test_tasks_of_one_node_copy_once(packed, tmp_path):
    """Three workers at once on one directory: one copies, the others wait and skip."""
    env = {**NO_SLURM, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "hpcml.data.stage_worker", str(packed),
                               f"--to={tmp_path}"], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    results = [json.loads(line[len(RESULT):]) for out in outs for line in out.splitlines()
               if line.startswith(RESULT)]
    assert len(results) == 3 and all(r["ok"] and r["staged"] for r in results)
    assert sorted(r["files_copied"] for r in results) == [0, 0, len(_names(packed))]
    runs = _stamp(results[0]["path"])["runs"]
    assert sorted(run["copied"] for run in runs) == [0, 0, len(_names(packed)) - 1]


def test_combine_prints_src_when_any_node_streams_and_notes_per_node_paths():
    def res(node, staged, path):
        return st.StageResult(node=node, src="/s", path=path, target=path, dataset="d", staged=staged)
    both = combine("/s", {"n1": res("n1", True, "/t/n1/d"), "n2": res("n2", True, "/t/n2/d")})
    assert both.staged and both.path == "/t/n1/d" and "different path" in both.notes[0]
    same = combine("/s", {"n1": res("n1", True, "/t/d"), "n2": res("n2", True, "/t/d")})
    assert same.path == "/t/d" and not same.notes
    one = combine("/s", {"n1": res("n1", True, "/t/d"), "n2": res("n2", False, "/s")})
    assert not one.staged and one.path == "/s" and "n2 could not stage" in one.notes[0]


def test_missing_manifest_is_one_line_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    p = _cli(str(tmp_path / "empty"), "--to", str(tmp_path / "local"), cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "manifest.json" in lines[0] and "no manifest" in lines[0]
    assert not (tmp_path / "local").exists()


def test_default_copy_goes_to_ram_as_the_doctor_advises_and_cleanup_removes_only_the_job_s(packed, tmp_path):
    """Without --to the doctor's placement decides (RAM: HPCML_DATA_RAM_DIR standing in for
    /dev/shm); ``cleanup`` removes the job's default copies, never a --to of the user's."""
    (tmp_path / "ram").mkdir()
    env = {"SLURM_JOB_ID": "5", "HPCML_DATA_RAM_DIR": str(tmp_path / "ram"), "TMPDIR": str(tmp_path)}
    r = st.stage(packed, env=env)
    assert r.staged and r.placement == "ram" and Path(r.path).parent == tmp_path / "ram" / "hpcml-data-5"
    assert "Stage the shards to RAM" in r.note
    mine = st.stage(packed, str(tmp_path / "cache"), env=env)
    assert mine.staged and mine.placement == "given"
    assert st.cleanup(env) == [str(tmp_path / "ram" / "hpcml-data-5")]
    assert not (tmp_path / "ram" / "hpcml-data-5").exists() and Path(mine.path, "manifest.json").is_file()
    assert st.cleanup(env) == []


def test_a_stage_killed_at_random_leaves_no_partial_copy(packed, tmp_path):
    """Issue 61: 40 stages killed with SIGKILL at random moments, each into a directory of
    its own, then staged there again: no ``.part`` copy anywhere, and every shard under its
    own name is whole."""
    from tests.killloop import kill_loop

    def work(i):
        st.stage(packed, str(tmp_path / f"to-{os.getpid()}-{i}"), env={})
    k = kill_loop(work)
    assert k.killed == 40 and k.done > 0, k
    sizes = {n: (packed / n).stat().st_size for n in _names(packed)}
    for part in tmp_path.rglob(".*.part"):            # only ever a whole copy, killed between its
        name = part.name[1:].rsplit(".", 3)[0]        # link and its rename: .NAME.HOST.PID.part
        assert part.stat().st_size == sizes[name], part
    for to in tmp_path.iterdir():                     # the next stage there removes it
        st.stage(packed, str(to), env={})
    for p in tmp_path.rglob("*"):
        assert not p.name.endswith(".part"), p
        if p.name in sizes:
            assert p.stat().st_size == sizes[p.name], p


# --- memmapped token arrays (issue 70): staged as they are, no manifest ---------------------------

def _sha(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_nanogpt_token_arrays_are_staged_as_they_are_and_read_from_the_copy(tmp_path):
    """nanoGPT's data directory (np.memmap'd uint16 train.bin/val.bin, meta.pkl), staged by
    the CLI: the last line is the copy, each file byte-identical under its own name, its
    sha256 in the stamp; the script's own np.memmap reads the same tokens; a rerun copies
    nothing; a changed source is a new copy, the old one left as it was."""
    import numpy as np

    from tests.data.test_doctor import _nanogpt
    _nanogpt(tmp_path / "data")
    (tmp_path / "data" / ".cache").write_text("hidden: not staged")
    p = _cli(str(tmp_path / "data"), "--local", "--to", str(tmp_path / "local"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    copy = Path(p.stdout.strip().splitlines()[-1])
    assert copy.parent == tmp_path / "local" and copy.name.startswith("arrays-")
    assert sorted(x.name for x in copy.iterdir() if not x.name.startswith(".")) == ["meta.pkl", "train.bin", "val.bin"]
    stamp = _stamp(copy)
    for name in ("meta.pkl", "train.bin", "val.bin"):
        assert (copy / name).read_bytes() == (tmp_path / "data" / name).read_bytes(), name
        assert stamp["files"][name]["sha256"] == _sha(tmp_path / "data" / name)
    tokens = np.memmap(copy / "train.bin", dtype=np.uint16, mode="r")
    assert np.array_equal(tokens[1000:1256], np.memmap(tmp_path / "data" / "train.bin", dtype=np.uint16, mode="r")[1000:1256])
    assert not (copy / "manifest.json").exists() and not (copy / ".cache").exists()
    again = st.stage(tmp_path / "data", str(tmp_path / "local"), env={})
    assert again.staged and again.path == str(copy) and again.files_copied == 0 and again.files_skipped == 3
    with open(tmp_path / "data" / "val.bin", "ab") as f:                 # prepare.py run again
        f.write(b"\x01\x00" * 10)
    changed = st.stage(tmp_path / "data", str(tmp_path / "local"), env={})
    assert changed.path != str(copy) and changed.files_copied == 3
    assert (Path(changed.path) / "val.bin").read_bytes() == (tmp_path / "data" / "val.bin").read_bytes()
    assert (copy / "val.bin").stat().st_size == 200_000                  # the earlier copy is as it was


def test_megatron_and_hf_layouts_keep_their_names_and_damage_is_caught_by_verify(tmp_path):
    from tests.data.test_doctor import _hf_arrow, _megatron
    _megatron(tmp_path / "mega")
    r = st.stage(tmp_path / "mega", str(tmp_path / "local"), env={})
    assert r.staged and {p.name for p in Path(r.path).iterdir() if not p.name.startswith(".")} == {
        "corpus_text_document.bin", "corpus_text_document.idx"}
    _hf_arrow(tmp_path / "hf" / "train")                                  # save_to_disk of a DatasetDict: train/
    (tmp_path / "hf" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    hf = st.stage(tmp_path / "hf", str(tmp_path / "local"), env={})
    arrow = Path(hf.path) / "train" / "data-00000-of-00001.arrow"
    assert hf.staged and arrow.read_bytes() == (tmp_path / "hf" / "train" / "data-00000-of-00001.arrow").read_bytes()
    st_ = arrow.stat()
    data = bytearray(arrow.read_bytes())
    data[100] ^= 0xFF                                                     # same size, same mtime: the stamp trusts it
    arrow.write_bytes(bytes(data))
    os.utime(arrow, ns=(st_.st_atime_ns, st_.st_mtime_ns))
    assert st.stage(tmp_path / "hf", str(tmp_path / "local"), env={}).files_copied == 0
    checked = st.stage(tmp_path / "hf", str(tmp_path / "local"), env={}, verify=True)
    assert checked.files_copied == 1
    assert arrow.read_bytes() == (tmp_path / "hf" / "train" / "data-00000-of-00001.arrow").read_bytes()


def test_a_token_array_link_is_not_followed_and_a_file_changing_while_copied_is_refused(tmp_path, monkeypatch):
    """A link in the data directory (to a file outside it) is not staged and is named; a
    source file whose size or mtime differs after its copy (the writer still at work:
    simulated by the stat after the copy, which a test cannot time) is refused, its copy
    not kept."""
    from tests.data.test_doctor import _nanogpt
    _nanogpt(tmp_path / "data")
    (tmp_path / "secret").write_text("outside")
    (tmp_path / "data" / "extra.bin").symlink_to(tmp_path / "secret")
    r = st.stage(tmp_path / "data", str(tmp_path / "local"), env={})
    assert r.staged and not (Path(r.path) / "extra.bin").exists() and "extra.bin" in r.note
    monkeypatch.setattr(st, "_stat_of", lambda path: (0, 0))
    with pytest.raises(UsageError, match="changed while it was copied"):
        st.stage(tmp_path / "data", str(tmp_path / "other"), env={})
    assert not [p for p in (tmp_path / "other").rglob("*") if p.is_file() and p.suffix in (".bin", ".pkl")]


def test_an_index_named_by_a_path_is_refused_wherever_it_is_read(src):
    """A shard's index is a file beside the manifest: ``../../etc/passwd`` there is bad input
    naming the key, for the loader as for the stage (was: opened and parsed by the loader)."""
    doc = json.loads((src / "manifest.json").read_text())
    doc["shards"][0]["index"] = "../../../../etc/passwd"
    (src / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="shards.0.index"):
        load_manifest(src)
