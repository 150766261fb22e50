"""``hpcml.files``' bounded reads: what a hostile replacement of a small record can do to
the reader (block it, fill its memory, crash its parser) turns into one ValueError."""

from __future__ import annotations

import os
import threading

import pytest

from hpcml.files import load_json_bounded, read_bounded, remove_dead_temps, write_atomic


def test_a_small_regular_file_is_read(tmp_path):
    write_atomic(tmp_path / "r.json", '{"a": 1}')
    assert load_json_bounded(tmp_path / "r.json", 100) == {"a": 1}


@pytest.mark.parametrize("kind", ["fifo", "directory", "devzero-link", "sparse-huge", "too-deep", "not-json"])
def test_what_is_not_a_small_json_file_is_a_value_error(tmp_path, kind):
    p = tmp_path / "r.json"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    elif kind == "devzero-link":
        os.symlink("/dev/zero", p)
    elif kind == "sparse-huge":
        with open(p, "wb") as f:
            f.truncate(1 << 36)
    elif kind == "too-deep":
        p.write_text("[" * 200_000)
    else:
        p.write_text("{not json")
    done: list[BaseException] = []

    def read() -> None:
        try:
            load_json_bounded(p, 1 << 20, follow_symlinks=kind != "devzero-link")
        except BaseException as exc:             # noqa: BLE001 - the test looks at what it was
            done.append(exc)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(60)
    assert done, f"the read of a {kind} did not return"
    expected = OSError if kind == "devzero-link" else ValueError     # O_NOFOLLOW: ELOOP
    assert isinstance(done[0], expected), repr(done[0])


def test_a_followed_symlink_is_still_bounded(tmp_path):
    os.symlink("/dev/zero", tmp_path / "z")
    with pytest.raises(ValueError):
        read_bounded(tmp_path / "z", 4096)          # /dev/zero is a character device: not read


# ---------------------------------------------------------------- the one loader of user files

# The classic bomb: 9 anchors, each a list of 10 aliases of the one before: 10^8 nodes once
# expanded, and every walk of the result (line numbers, validation, rendering) expands it.
BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))

# Every reader of a user config file, as the CLI calls it: (kind, file name, call).
_READERS = {
    "blueprint": ("b.yaml", "from hpcml.service.blueprint import load; load(p)"),
    "sweep": ("s.yaml", "from hpcml.farm.sweep import parse_sweep; parse_sweep(p)"),
    "protocol": ("p.yaml", "from hpcml.vet.protocol import load; load(p)"),
    "rules": ("r.yaml", "from hpcml.centre.rules import load; load(p)"),
    "policy": ("pol.yaml", "from hpcml.scan.policy import load_policy; load_policy(p)"),
    "site": ("site.yaml", "from hpcml.env.site import load_site; load_site(p)"),
    "edf": ("e.toml", "from hpcml.env.edf import load; load(p, require_image=False)"),
    "lock": ("uv.lock", "from hpcml.scan.requirements import check_requirements; check_requirements(p)"),
}

# Runs one reader on one file in a fresh interpreter (address space capped at 2 GiB, so the
# old unbounded reader fails instead of swapping) and prints its error line and how much
# memory the read itself took: the peak RSS after the read minus the peak before it.
_PROBE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
p = sys.argv[1]
import hpcml.service.blueprint, hpcml.farm.sweep, hpcml.vet.protocol, hpcml.centre.rules
import hpcml.scan.policy, hpcml.env.site, hpcml.env.edf, hpcml.scan.requirements
from hpcml.errors import UsageError
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    exec(sys.argv[2])
    error = None
except UsageError as exc:
    error = str(exc)
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"error": error, "grew_kib": grew}))
"""


def _probe(reader: str, path) -> dict:
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _PROBE, str(path), _READERS[reader][1]],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("reader", [r for r in _READERS if _READERS[r][0].endswith(".yaml")])
def test_a_yaml_bomb_is_refused_in_one_line_and_little_memory(tmp_path, reader):
    p = tmp_path / _READERS[reader][0]
    p.write_text(BOMB)
    got = _probe(reader, p)
    assert got["error"] is not None and "\n" not in got["error"], got
    assert got["error"].startswith(f"{p}:") and "aliases expand to more than" in got["error"], got
    assert got["grew_kib"] < 100 * 1024, got


@pytest.mark.parametrize("reader", list(_READERS))
def test_a_45_mb_file_is_refused_unread(tmp_path, reader):
    p = tmp_path / _READERS[reader][0]
    with open(p, "w") as f:        # valid to the end: only its size is wrong
        f.write("version = 1\n" if p.suffix != ".yaml" else "name: x\n")
        line = "# " + "x" * 1000 + "\n"
        f.write(line * (45_000_000 // len(line)))
    got = _probe(reader, p)
    assert got["error"] is not None and "\n" not in got["error"], got
    assert got["error"].startswith(f"{p}:") and "larger than" in got["error"], got
    assert got["grew_kib"] < 100 * 1024, got


def test_a_modest_use_of_aliases_still_loads():
    from hpcml.files import load_yaml
    text = "env: &env {A: 1, B: 2}\nsvc1: {env: *env}\nsvc2: {env: *env}\n"
    assert load_yaml(text, "c.yaml") == {"env": {"A": 1, "B": 2}, "svc1": {"env": {"A": 1, "B": 2}},
                                         "svc2": {"env": {"A": 1, "B": 2}}}


@pytest.mark.parametrize("text, problem", [
    ("a: &a [1, *a]\n", "recursive alias"),
    ("[" * 100_000, "nested too deeply"),
])
def test_recursive_or_deep_yaml_is_one_line(text, problem):
    from hpcml.errors import UsageError
    from hpcml.files import load_yaml
    with pytest.raises(UsageError, match=problem) as exc:
        load_yaml(text, "c.yaml")
    assert str(exc.value).startswith("c.yaml")


WRITER = """
import sys, threading
from hpcml.files import write_atomic
path, tag = sys.argv[1], sys.argv[2]
errors = []
def loop(k):
    for i in range(150):
        try:
            write_atomic(path, (tag + str(k)) * 50_000)
        except Exception as exc:
            errors.append(repr(exc))
threads = [threading.Thread(target=loop, args=(k,)) for k in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print("\\n".join(errors[:3]))
sys.exit(1 if errors else 0)
"""


def test_two_processes_of_four_threads_writing_one_file_never_tear_it(tmp_path):
    """Each writer has its own temporary name (pid, thread, random): with one name per
    process, two threads of it wrote into one temporary file and renamed it away from each
    other. A reader in a third process sees one writer's whole file at every moment."""
    import subprocess
    import sys
    path = tmp_path / "state.json"
    write_atomic(path, "a0" * 50_000)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), tag], stdout=subprocess.PIPE, text=True)
               for tag in ("a", "b")]
    while any(w.poll() is None for w in writers):
        text = path.read_text()
        assert len(text) == 100_000 and len(set(text[i:i + 2] for i in range(0, 100_000, 2))) == 1, text[:20]
    outs = [w.communicate()[0] for w in writers]
    assert [w.returncode for w in writers] == [0, 0], outs
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]          # no temporary file left


def test_mode_and_durable(tmp_path):
    import stat
    write_atomic(tmp_path / "secret", b"\x00\x01", mode=0o600, durable=True)
    assert (tmp_path / "secret").read_bytes() == b"\x00\x01"
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600


@pytest.mark.parametrize("command, name", [
    (["farm", "status"], "farm.json"),
    (["report"], "run.json"),
])
@pytest.mark.parametrize("fault, words", [
    ("garbage", "not JSON"),
    ("list", "expected a JSON object"),
    ("other", "not an hpcml."),
    ("newer", "written by a newer hpcml"),
    ("fifo", "unreadable"),
])
def test_every_record_reader_says_one_thing_per_fault(tmp_path, command, name, fault, words):
    """farm.json and run.json (like checkpoint records and manifests) go through files.read_json:
    the same fault reads the same way through each command, one line naming the file, exit 2."""
    import json
    import os
    import subprocess
    import sys

    from hpcml.schemas import parse
    d = tmp_path / "d"
    d.mkdir()
    f = d / name
    tags = {"farm.json": "hpcml.farm/1", "run.json": "hpcml.run/1", "manifest.json": "hpcml.ckpt/1"}
    major = parse(tags[name])[0]
    if name == "manifest.json":
        (d / "step-00000001").mkdir()
        f = d / "step-00000001" / name
    if fault == "fifo":
        os.mkfifo(f)
    else:
        f.write_text({"garbage": "{not json", "list": "[1, 2]", "other": json.dumps({"schema": "hpcml.other/1"}),
                      "newer": json.dumps({"schema": f"{major}/99"})}[fault])
    p = subprocess.run([sys.executable, "-m", "hpcml", *command, str(d)], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and words in p.stderr and name in p.stderr, p.stderr


def test_a_killed_writers_temporary_file_is_removed_and_a_live_ones_kept(tmp_path):
    """kill -9 between write_atomic's link and rename (or, without O_TMPFILE, mid-write)
    leaves ``.NAME.@HOST.PID.TID.HEX.tmp``: this host's dead writer's (its pid gone) or an
    old one goes; a live writer's young one, another host's young one, an older hpcml's
    young one (no host in its name) and anything not named so stay."""
    import subprocess
    dead = subprocess.Popen(["true"])
    dead.wait()
    from hpcml.scratch import host_tag
    here = host_tag()
    dead_tmp = tmp_path / f".attempt-0.sent.@{here}.{dead.pid}.1.ab12cd34.tmp"
    live_tmp = tmp_path / f".attempt-1.sent.@{here}.{os.getpid()}.1.ab12cd34.tmp"
    old_tmp = tmp_path / f".attempt-2.sent.@{here}.{os.getpid()}.1.ab12cd34.tmp"
    other_host = tmp_path / f".attempt-3.sent.@elsewhere.{dead.pid}.1.ab12cd34.tmp"     # its pid means nothing here
    older_hpcml = tmp_path / f".attempt-4.sent.{dead.pid}.1.ab12cd34.tmp"              # no host: by age only
    older_hpcml_old = tmp_path / f".attempt-5.sent.{dead.pid}.1.ab12cd34.tmp"
    other = tmp_path / ".notes.tmp"
    for p in (dead_tmp, live_tmp, old_tmp, other_host, older_hpcml, older_hpcml_old, other):
        p.write_text("x")
    os.utime(old_tmp, (1, 1))
    os.utime(older_hpcml_old, (1, 1))
    assert remove_dead_temps(tmp_path) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (live_tmp, other_host, older_hpcml, other))
