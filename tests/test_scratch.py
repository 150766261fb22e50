"""Scratch that cannot outlive its process (issue 61): what ``hpcml.scratch`` makes, and
``files.write_atomic`` and ``owner.claim`` built on it, under kill -9 at random moments,
counted by path. The named fallback (NFS has no O_TMPFILE) is forced in the killed child by
making ``scratch.anonymous`` answer None, as it does on such a filesystem."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from hpcml import scratch
from hpcml.files import write_atomic
from hpcml.owner import claim
from tests.killloop import kill_loop, left

PAYLOAD = os.urandom(1 << 20) * 2                     # 2 MiB: a kill lands mid-write often


def _no_nameless(i: int) -> None:
    """A killed child (``i >= 0``; -1 is the warm-up in the test's process) as on a
    filesystem without O_TMPFILE."""
    if i >= 0:
        scratch.anonymous = lambda *a, **k: None      # type: ignore[assignment]


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_scratch_file_has_no_name_and_reads_back(tmp_path):
    fd = scratch.scratch(tmp_path, ".x")
    try:
        os.write(fd, b"hello")
        assert os.pread(fd, 5, 0) == b"hello"
        assert open(scratch.fd_path(fd), "rb").read() == b"hello"     # readers handed a path
        assert left(tmp_path) == []
    finally:
        os.close(fd)
    assert left(tmp_path) == []


def test_publish_names_it_once_and_a_second_publisher_loses(tmp_path):
    fd = scratch.anonymous(tmp_path, 0o640, to_publish=True)
    assert fd is not None
    os.write(fd, b"rec")
    scratch.publish(fd, tmp_path / "a")
    try:
        scratch.publish(fd, tmp_path / "a")
        raise AssertionError("published twice over one name")
    except FileExistsError:
        pass
    os.close(fd)
    assert (tmp_path / "a").read_bytes() == b"rec" and (tmp_path / "a").stat().st_mode & 0o777 == 0o640


def test_the_named_fallback_is_swept_by_the_next_user_on_this_host(tmp_path):
    here, dead = scratch.host_tag(), _dead_pid()
    mine_dead = tmp_path / f".x-{here}-{dead}-0a0b0c0d"
    mine_live = tmp_path / f".x-{here}-{os.getpid()}-0a0b0c0d"
    other_young = tmp_path / f".x-otherhost-{dead}-0a0b0c0d"
    other_old = tmp_path / f".x-otherhost-{dead}-1a0b0c0d"
    unrelated = tmp_path / ".x-notes"
    for p in (mine_dead, mine_live, other_young, other_old, unrelated):
        p.write_bytes(b"8 MB once")
    os.utime(other_old, (time.time() - 2 * scratch.STALE_S,) * 2)
    fd = scratch.scratch(tmp_path, ".x")
    os.close(fd)
    assert left(tmp_path) == sorted(p.name for p in (mine_live, other_young, unrelated))


def test_scratch_under_kill_9_leaves_nothing_nameless_or_named(tmp_path):
    def work(i):
        fd = scratch.scratch(tmp_path, ".x")
        os.write(fd, PAYLOAD)
        os.close(fd)
    k = kill_loop(work)
    assert k.killed == 40 and k.done > 0, k
    assert left(tmp_path) == []

    def named(i):
        _no_nameless(i)
        work(i)
    k = kill_loop(named, seed=7)
    assert k.killed == 40 and k.done > 0, k
    os.close(scratch.scratch(tmp_path, ".x"))         # the next user sweeps what a kill left between create and unlink
    assert left(tmp_path) == []


def test_write_atomic_under_kill_9_leaves_only_whole_files(tmp_path):
    """Replacing one file and creating new ones exclusively, killed at random: every name
    left is a target, whole; the next write into the directory removes any temporary file
    a kill left between a link and its rename (or, without O_TMPFILE, mid-write)."""
    def work(i):
        write_atomic(tmp_path / "state.bin", PAYLOAD)
        write_atomic(tmp_path / f"new-{os.getpid()}-{i}", PAYLOAD, exclusive=True)

    def named(i):
        _no_nameless(i)
        work(i)
    for fn, seed in ((work, 1), (named, 2)):
        k = kill_loop(fn, seed=seed)
        assert k.killed == 40 and k.done > 0, k
        subprocess.run([sys.executable, "-c", "import sys; from hpcml.files import write_atomic; "
                        "write_atomic(sys.argv[1], b'')", str(tmp_path / "marker")], check=True)   # the next writer here
        names = left(tmp_path)
        assert all(n == "state.bin" or n == "marker" or n.startswith("new-") for n in names), names
        for n in names:
            if n != "marker":
                assert (tmp_path / n).read_bytes() == PAYLOAD, n
            (tmp_path / n).unlink()


def test_owner_claim_under_kill_9_leaves_only_the_record(tmp_path):
    """Taking a record over, killed at random: the record renamed away for the moment of
    the take-over (``owner.stale-HOST.PID``) is what a kill leaves; the next claimant on
    this host removes it."""
    path = tmp_path / "owner"

    def work(i):
        claim(path, PAYLOAD, lambda held: True)
    k = kill_loop(work)
    assert k.killed == 40 and k.done > 0, k
    claim(path, PAYLOAD, lambda held: True)           # the next claimant removes a killed one's stale record
    assert left(tmp_path) == ["owner"] and path.read_bytes() == PAYLOAD
