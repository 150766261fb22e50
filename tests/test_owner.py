"""hpcml.owner's guarantee, with real processes: a live owner is ALIVE; a gone one DEAD
(reaped, killed and not reaped, its pid now another process's, or of another boot); one
elsewhere UNKNOWN unless its Slurm job tells. Of two processes claiming at once exactly one
wins, and a claim whose owner died is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hpcml import proctree
from hpcml.owner import (
    CHECKPOINT,
    LAUNCHER,
    PROC,
    WORKER,
    Liveness,
    Owner,
    Proc,
    claim,
    liveness,
    local_liveness,
)

ALIVE, DEAD, UNKNOWN = Liveness.ALIVE, Liveness.DEAD, Liveness.UNKNOWN

#: says who it is, then waits for its stdin to close
WHO = "import json, sys; from hpcml.owner import Owner; print(json.dumps(Owner.me().to_json()), flush=True); sys.stdin.read()"

#: claims each path it is sent, where no live owner holds it; says whether it won
CLAIMER = """
import json, sys
from pathlib import Path
from hpcml.owner import Liveness, Owner, claim, liveness
me = json.dumps(Owner.me().to_json()).encode()
def free(held):
    try:
        return liveness(Owner.from_json(json.loads(held))) is Liveness.DEAD
    except (TypeError, ValueError):
        return True
print("ready", flush=True)
for line in sys.stdin:
    print("won" if claim(Path(line.strip()), me, free) else "lost", flush=True)
"""


def _env() -> dict[str, str]:
    """Outside Slurm: no job to ask about, and no Slurm client to ask."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, "PATH": os.path.dirname(sys.executable)}


@pytest.fixture
def child():
    p = subprocess.Popen([sys.executable, "-c", WHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=_env())
    assert p.stdout is not None
    who = Owner.from_json(json.loads(p.stdout.readline()))
    yield p, who
    p.kill()
    p.wait()


def test_a_live_owner_is_alive_and_dead_once_reaped(child):
    p, who = child
    assert (who.host, who.pid, who.boot_id, who.pidns) == (socket.gethostname(), p.pid, PROC.boot_id(),
                                                           PROC.pid_namespace())
    assert who.started is not None and liveness(who) is ALIVE
    p.communicate("")
    assert liveness(who) is DEAD


def test_an_owner_killed_and_not_yet_reaped_is_dead(child):
    p, who = child
    p.kill()
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)        # a zombie now: its pid and stat still there
    assert os.path.exists(f"/proc/{p.pid}") and liveness(who) is DEAD


def test_its_pid_in_another_process_is_dead(child):
    """The pid runs, but it started at another time than the owner recorded: a later process."""
    _, who = child
    assert who.started is not None
    assert liveness(replace(who, started=who.started - 60)) is DEAD
    assert liveness(replace(who, started=None)) is ALIVE      # no start time recorded: the pid is all it says


def test_another_boot_is_dead_another_host_or_pid_namespace_unknown(child):
    _, who = child
    assert liveness(replace(who, boot_id="another-boot")) is DEAD
    assert liveness(replace(who, host="not-" + who.host)) is UNKNOWN
    assert liveness(replace(who, pidns=(who.pidns or 0) + 1)) is UNKNOWN


def test_the_start_time_is_the_one_proctree_records():
    """Records written through proctree.start_time (psutil) compare with this module's."""
    started = PROC.start_time(os.getpid())
    assert started is not None and abs(started - (proctree.start_time(os.getpid()) or 0)) < 1e-3


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A Slurm client on PATH that says the job is in state $STATE ('' : Slurm forgot it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ -n "$STATE" ] || { echo "Invalid job id specified" >&2; exit 1; }\n'
                                      'echo "JobId=$5 JobState=$STATE Reason=None"\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return monkeypatch


@pytest.mark.parametrize("state, verdict", [("RUNNING", ALIVE), ("PENDING", ALIVE), ("COMPLETED", DEAD),
                                            ("CANCELLED", DEAD), ("", DEAD)])
def test_an_owner_elsewhere_is_judged_by_its_slurm_job(scontrol, state, verdict):
    scontrol.setenv("STATE", state)
    assert liveness(Owner("not-" + socket.gethostname(), 4242, 1.0, job="77")) is verdict


def test_slurm_does_not_overrule_a_pid_checked_here(scontrol, child):
    p, who = child
    scontrol.setenv("STATE", "RUNNING")
    p.communicate("")
    assert liveness(replace(who, job="77")) is DEAD


def test_without_slurm_an_owner_elsewhere_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert liveness(Owner("not-" + socket.gethostname(), 4242, 1.0, job="77")) is UNKNOWN


# -- the process table it reads -----------------------------------------------------------------

def _proc(root: Path, procs: dict[int, tuple[str, int]], boot: str = "boot-1", btime: int = 1_700_000_000) -> Proc:
    """A procfs of its own: boot id, this process's pid namespace, boot time, and each pid's
    (state, start ticks), under a name with ') ' in it."""
    (root / "sys/kernel/random").mkdir(parents=True)
    (root / "sys/kernel/random/boot_id").write_text(boot + "\n")
    (root / "self/ns").mkdir(parents=True)
    (root / "self/ns/pid").write_text("")
    (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {btime}\nprocesses 9\n")
    for pid, (state, ticks) in procs.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_text(f"{pid} (a) b) {state} " + " ".join(["1"] * 18) + f" {ticks} 0 0\n")
    return Proc(str(root))


def test_identity_is_read_from_the_proc_root_it_is_given(tmp_path):
    hz = os.sysconf("SC_CLK_TCK")
    proc = _proc(tmp_path, {4242: ("S", 50 * hz), 4243: ("Z", 50 * hz)})
    me = Owner.me(proc, env={"SLURM_JOB_ID": "77"})
    assert (me.boot_id, me.pidns, me.job) == ("boot-1", os.stat(tmp_path / "self/ns/pid").st_ino, "77")
    owner = Owner(socket.gethostname(), 4242, 1_700_000_050.0, "boot-1", me.pidns)
    assert proc.start_time(4242) == 1_700_000_050.0
    assert local_liveness(owner, proc=proc) is ALIVE
    assert local_liveness(replace(owner, started=1_700_000_040.0), proc=proc) is DEAD      # pid reused
    assert local_liveness(replace(owner, pid=4243), proc=proc) is DEAD                     # a zombie
    assert local_liveness(replace(owner, pid=4244), proc=proc) is DEAD                     # gone
    assert local_liveness(replace(owner, boot_id="boot-0"), proc=proc) is DEAD             # before a reboot


# -- the records each kind of owner writes ------------------------------------------------------

def test_records_written_before_this_module_read_as_they_were_meant():
    assert Owner.from_json({"pid": 12, "host": "n1", "created": 5.0}, LAUNCHER) == Owner("n1", 12, 5.0)
    ckpt = {"token": "t", "host": "n1", "pid": 12, "started": 5.0, "slurm_job_id": "77", "claimed_at": 9.0}
    assert Owner.from_json(ckpt, CHECKPOINT) == Owner("n1", 12, 5.0, job="77")
    worker = {"worker": "w", "host": "n1", "boot_id": "b", "pidns": 3, "pid": 12, "pid_start": 5.0, "job": "77",
              "started": 99.0}                                  # when the worker began work, not its process
    assert Owner.from_json(worker, WORKER) == Owner("n1", 12, 5.0, "b", 3, "77")
    assert Owner.from_json({**worker, "boot_id": "", "pid_start": None}) == Owner("n1", 12, None, None, 3, "77")


@pytest.mark.parametrize("doc", [None, "x", [1], {"pid": True, "host": 5, "created": "5"}, {"pid": -1, "host": "h"}])
def test_a_record_hpcml_did_not_write_names_no_process_to_check(doc):
    owner = Owner.from_json(doc, LAUNCHER)
    assert owner.pid <= 0 and owner.started is None and local_liveness(owner) is UNKNOWN


@pytest.mark.parametrize("fields", [WORKER, CHECKPOINT, LAUNCHER])
def test_each_record_reads_back_as_written(fields):
    me = Owner.me(env={"SLURM_JOB_ID": "77"})
    assert Owner.from_json(json.loads(json.dumps(me.to_json(fields))), fields) == (me if fields.job else
                                                                                     replace(me, job=None))
    assert set(me.to_json(LAUNCHER)) == {"pid", "host", "created", "boot_id", "pid_ns"}     # run.json's launcher


# -- claims ---------------------------------------------------------------------------------------

def _dead_record() -> bytes:
    p = subprocess.run([sys.executable, "-c", WHO], input="", capture_output=True, text=True, env=_env(), check=True)
    return p.stdout.strip().encode()


def test_two_processes_claiming_at_once_one_wins(tmp_path):
    """Both wait on a pipe, then get the same path at once; half the rounds race through the
    take-over of a dead owner's record."""
    claimants = [subprocess.Popen([sys.executable, "-c", CLAIMER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=_env()) for _ in range(2)]
    try:
        assert [p.stdout.readline() for p in claimants if p.stdout] == ["ready\n", "ready\n"]
        dead = _dead_record()
        for n in range(20):
            path = tmp_path / f"claim-{n}"
            if n % 2:
                path.write_bytes(dead)
            for p in claimants:
                assert p.stdin is not None
                p.stdin.write(f"{path}\n")
                p.stdin.flush()
            said = [p.stdout.readline().strip() for p in claimants if p.stdout]
            assert sorted(said) == ["lost", "won"], (n, said)
            assert json.loads(path.read_bytes())["pid"] == claimants[said.index("won")].pid
        assert sorted(os.listdir(tmp_path)) == sorted(f"claim-{n}" for n in range(20))    # no temporary left
    finally:
        for p in claimants:
            p.communicate("")


def test_a_dead_owners_claim_is_taken_over_a_live_ones_is_not(tmp_path, child):
    path = tmp_path / "claim"
    path.write_bytes(_dead_record())
    judged: list[bytes | None] = []

    def free(held: bytes | None) -> bool:
        judged.append(held)
        return liveness(Owner.from_json(json.loads(held or b"{}"))) is DEAD

    mine = json.dumps(Owner.me().to_json()).encode()
    assert claim(path, mine, free) and path.read_bytes() == mine and len(judged) == 1
    _, who = child
    path.write_bytes(json.dumps(who.to_json()).encode())
    assert not claim(path, mine, free) and Owner.from_json(json.loads(path.read_bytes())) == who
    assert sorted(os.listdir(tmp_path)) == ["claim"]


def test_a_directory_in_a_claims_place_is_left_alone(tmp_path):
    (tmp_path / "claim" / "x").mkdir(parents=True)
    with pytest.raises(IsADirectoryError):
        claim(tmp_path / "claim", b"{}", lambda held: True)
    assert (tmp_path / "claim" / "x").is_dir() and sorted(os.listdir(tmp_path)) == ["claim"]
