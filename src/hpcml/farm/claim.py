"""Claiming tasks exactly once on a shared filesystem, without locks or a server.

How it works. Attempt A of task ID belongs to whoever creates ``claims/ID.A`` with
``open(O_CREAT|O_EXCL)``; how it ended is ``ends/ID.A``, made by writing a private file
(nameless, O_TMPFILE, where the filesystem has it: a worker killed mid-write leaves
nothing; a private temp name elsewhere) and ``link()``-ing it to that name. Both calls either create the name or fail with
EEXIST, atomically, on a local filesystem and on NFSv3+/Lustre/GPFS/BeeGFS alike: the
server (or the metadata server) decides, not a client-side lock, which is why this works
where SQLite's fcntl locking does not. (Over NFS a retransmitted link() may report
EEXIST although it succeeded; ``finish`` then checks the temp file's link count, the
classic recipe from open(2).) Nothing is ever renamed over or rewritten, so every claim and end, once seen,
is final, and readers cache them.

Why a task runs to completion at most once, and is never lost:

* Attempt A+1 may only be claimed by a worker that has read ``ends/ID.A`` and found it
  not "ok". Ends are immutable, so that precondition never becomes false; attempt 1 needs
  none. Two workers racing for the same attempt: O_EXCL lets exactly one win.
* An "ok" end of attempt A is written only by A's owner, and only if ``ends/ID.A`` does
  not exist yet (link fails otherwise). So at most one attempt of a task ends "ok", and
  once one has, no later attempt can be claimed.
* A worker that dies (kill -9, node crash, allocation killed) leaves a claim without an
  end. Any other worker that finds the owner dead writes ``ends/ID.A`` = "lost" the same
  way (only one succeeds), and the task becomes claimable as attempt A+1. Should the owner
  still be alive after all (a false suspicion: a stalled filesystem), its own end fails
  with EEXIST and its result is discarded: the end record is the fence, and the farm
  records the task once. It also looks for that fence at each heartbeat and kills its
  copy, so two copies overlap by at most one heartbeat (lease/6) in that case.
* The owner is judged dead, most certain first: on the same host (hostname and boot id),
  by its pid and process start time; under Slurm, by its job no longer running (scontrol,
  when the owner's job is another allocation); otherwise by its lease: the mtime of
  ``workers/WID``, which the owner touches every lease/6 s, standing still for a whole
  lease as timed by the *observer's* monotonic clock (no clocks are compared across hosts).
  A worker that exits removes its file after its last end, so a missing file is dead too.
* Ends are linked into place whole, so an end file that is not a record (empty,
  truncated: damaged outside hpcml) is read as an end "damaged": not ok, so the task is
  claimable again. A claim that is not a record (its creator died between create and
  write, or damage) without an end is declared lost a lease after it was first seen, as
  its owner is unknown. A full disk fails a write: the end's temp file, or the claim just
  created (its attempt never started), is removed again, and the worker stops.

Why a task judged lost is not still running (the process tree, ``guard.py``):

* A task is a tree: ``/bin/sh -c`` and its children, which PR_SET_PDEATHSIG does not
  reach. Each runs in a process group of its own inside its worker's session, and the
  worker is the child of a guard that is a child subreaper in a session of its own, with
  PR_SET_PDEATHSIG = SIGTERM, which it catches. Every process the task starts stays the
  guard's descendant whatever it does (``setsid``, double forks: an orphan re-parents to
  the nearest living subreaper ancestor, never past it). So: worker killed -> the guard
  reaps it and SIGKILLs every descendant; agent (``hpcml farm run``) killed, or a
  ``kill -9`` of its process group, which the guard is not in -> the guard gets SIGTERM
  and does the same. A task that ends is followed by a SIGKILL of its group and of every
  child the worker (a subreaper too) adopted from it: what it daemonised dies with the
  attempt.
* What that leaves: the guard itself SIGKILLed on its own (then the agent, a subreaper,
  adopts the tree and kills it, unless it is dead too). So before a lost attempt is
  declared, the declaring worker kills, on its own host, the worker's session recorded in
  the claim (boot id, pid namespace, session id and its leader's start time: a session id
  is not reused while anything is in it, and one that now names a newer process is gone)
  and every process whose environment carries the attempt's HPCML_FARM_DIR,
  HPCML_FARM_TASK_ID and HPCML_FARM_ATTEMPT, and declares it only once none is left.
  Not covered: guard and agent both killed, and then a leftover on another host than
  the declaring worker's, or one that left the session and cleared its environment.
* Under Slurm, the agents run as one ``srun`` step: with proctrack/cgroup (the usual and
  recommended plugin) slurmstepd kills every process of the step's cgroup when the step
  or the allocation ends, daemons included, so a task of a dead allocation is gone before
  its job is seen as no longer running; with proctrack/pgid it reaches only the step's
  process groups, and the guard above is what holds.

What this does not promise: a task killed after its side effect but before it exited
(a tiny window) is run again, as with any at-least-once scheduler; its end record then
says "lost" for the first attempt and "ok" for the second.

Cost per task: one O_EXCL create with one write (claim), a temp write + link + unlink
(end), a killpg and a read of /proc/self/task/PID/children at its end: no fsync (a killed
process loses nothing it has written; a node's crash is covered by the lease and the task
is rerun) and no directory listing on the hot path. The guard is one fork per worker, not
per task.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml import scratch
from hpcml.farm.model import CLAIMS, DAMAGED, END_SCHEMA, ENDS, FAILED, LOST, NODES, OK, OUTCOMES, TIMEOUT, Settings, Task
from hpcml.farm.store import Farm, reload_tasks, tasks_signature
from hpcml.files import load_json_bounded


def _split(name: str) -> tuple[int, int] | None:
    tid, dot, att = name.partition(".")
    if not dot or not tid.isdigit() or not att.isdigit():
        return None
    return int(tid), int(att)


def _write(fd: int, doc: dict[str, Any], path: str) -> None:
    """One write of the record; a short or failed one (a full disk) raises OSError naming ``path``."""
    data = json.dumps(doc).encode()
    try:
        if os.write(fd, data) == len(data):
            return
        err = errno.ENOSPC
    except OSError as exc:
        err = exc.errno or errno.EIO
    raise OSError(err, os.strerror(err), path)


def try_claim(farm: Path, tid: int, attempt: int, doc: dict[str, Any]) -> bool:
    """Create claims/TID.ATTEMPT exclusively; False if another worker has it. A claim whose
    write fails (a full disk) is removed again: its attempt never started."""
    path = f"{farm}/{CLAIMS}/{tid}.{attempt}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        _write(fd, doc, path)
    except OSError:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return True


def finish(farm: Path, tid: int, attempt: int, record: dict[str, Any]) -> bool:
    """Put ends/TID.ATTEMPT in place with ``record`` (complete, or not at all: a nameless
    file linked to that name, or on NFS a temp file, removed however it ends but by
    SIGKILL); False if an end for this attempt exists
    already (e.g. it was declared lost)."""
    path = f"{farm}/{ENDS}/{tid}.{attempt}"
    doc = {"schema": END_SCHEMA, "id": tid, "attempt": attempt, **record}
    fd = scratch.anonymous(f"{farm}/{ENDS}", 0o644, to_publish=True)
    tmp = f"{farm}/{ENDS}/.{tid}.{attempt}.{os.getpid()}"
    if fd is not None:                             # nameless: a worker killed here leaves nothing
        try:
            _write(fd, doc, path)
            scratch.place_new(fd, path, tmp, mode=0o644, exact=False)
            return True
        except FileExistsError:
            return False
        finally:
            os.close(fd)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)                         # a killed worker's of this pid, or a planted link
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY, 0o644)
        try:
            _write(fd, doc, path)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return os.stat(tmp).st_nlink == 2      # NFS: a retransmitted link that did succeed
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


#: a claim or end record is a few hundred bytes: anything larger is not one
RECORD_MAX = 1 << 20


def read_record(path: str) -> dict[str, Any] | None:
    """A claim or end record; None if it is not there or not a complete record. hpcml
    writes them as small regular files, so anything else in their place is not read: a
    symlink is not followed (to /dev/zero it would fill the memory), a FIFO is not waited
    on (O_NONBLOCK), a directory or a file over RECORD_MAX is not a record."""
    try:
        doc = load_json_bounded(path, RECORD_MAX, follow_symlinks=False)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _number(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _integer(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))


def _text(v: Any) -> bool:
    return v is None or isinstance(v, str)


#: the fields of a record that hpcml computes with, and their types (None allowed)
_Check = Callable[[Any], bool]
_END_FIELDS: dict[str, _Check] = {"start": _number, "end": _number, "exit_code": _integer, "signal": _integer,
                                  "retries": _integer, "node": _text, "gpu": _text, "worker": _text, "job": _text,
                                  "reason": _text}
_CLAIM_FIELDS: dict[str, _Check] = {"start": _number, "worker": _text, "node": _text, "gpu": _text, "job": _text}
_TREE_FIELDS: dict[str, _Check] = {"session": _integer, "since": _number, "boot": _text, "pidns": _integer}


def _typed(rec: dict[str, Any], fields: Mapping[str, Callable[[Any], bool]]) -> bool:
    return all(check(rec.get(key)) for key, check in fields.items())


def load_claim(path: str) -> dict[str, Any] | None:
    """A claim record whose fields have the types hpcml writes; None if there is none or
    it is not one (a record of the right shape with a field of the wrong type included)."""
    rec = read_record(path)
    if rec is None or not _typed(rec, _CLAIM_FIELDS):
        return None
    tree = rec.get("tree")
    if tree is not None and not (isinstance(tree, dict) and _typed(tree, _TREE_FIELDS)):
        return None
    return rec


def load_end(path: str) -> dict[str, Any] | None:
    """An end record; one with outcome "damaged" if the file is there but empty, truncated
    or not an end (ends are linked into place whole: only something outside hpcml, or a
    disk that lost data, makes one so); None if there is no end."""
    rec = read_record(path)
    if rec is not None and rec.get("outcome") in OUTCOMES and _typed(rec, _END_FIELDS):
        return rec
    if not os.path.lexists(path):
        return None
    return {"outcome": DAMAGED, "reason": f"{path} is damaged (not a complete end record)"}


def claim_damaged(path: str, settle: float = 5.0) -> bool:
    """A claim file that is there but not a record, and not one being written this instant
    (an empty one younger than ``settle`` s by this host's clock: for display)."""
    if load_claim(path) is not None:
        return False
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return True                            # a directory, link, FIFO...: never a claim
    return st.st_size > 0 or time.time() - st.st_mtime > settle


@dataclass
class TaskState:
    """What is known of one task: its attempts' claims and ends."""

    claimed: int = 0                                       # highest attempt seen claimed
    ends: dict[int, dict[str, Any]] = field(default_factory=dict)
    mine: int = 0                                          # attempt this worker holds, 0: none

    def latest_end(self) -> dict[str, Any] | None:
        return self.ends.get(self.claimed)

    @property
    def ok(self) -> bool:
        end = self.ends.get(self.claimed)
        return end is not None and end.get("outcome") == OK

    @property
    def running(self) -> bool:
        return self.claimed > 0 and self.claimed not in self.ends

    def failures(self) -> int:
        return sum(1 for e in self.ends.values() if e.get("outcome") in (FAILED, TIMEOUT))

    def gave_up(self, settings: Settings, recorded: bool = False) -> bool:
        """Failed for good: retries spent by attempts that failed or timed out. A lost or
        damaged attempt (its worker, the farm or the allocation killed: nothing the task did)
        never counts, however often. ``recorded``: count the retries the last end was written
        under (``farm run --retries`` overrides the farm's setting), as a reader that did not
        run it must."""
        retries = settings.retries
        end = self.latest_end() or {}
        if recorded and isinstance(end.get("retries"), int):
            retries = end["retries"]
        return not self.ok and not self.running and self.failures() > retries

    def retry_at(self, settings: Settings) -> float:
        """Wall time after which the next attempt may start (backoff after a failure)."""
        end = self.latest_end()
        if end is None or end.get("outcome") in (LOST, DAMAGED):
            return 0.0
        n = self.failures()
        return float(end.get("end") or 0) + settings.backoff * (2 ** max(0, n - 1))


class View:
    """One worker's (or reader's) cached picture of a farm; ``refresh`` lists the claims
    and ends directories and reads only the records it has not seen (they never change)."""

    def __init__(self, farm: Farm, recorded: bool = False):
        self.farm = farm
        self.recorded = recorded            # judge retries as the ends record them (readers)
        self.path = farm.path
        self.states: dict[int, TaskState] = {}
        self.owners: dict[tuple[int, int], dict[str, Any]] = {}
        self.bad_nodes: set[str] = set()
        self._empty_since: dict[tuple[int, int], float] = {}
        self._sig = tasks_signature(farm.path)
        self._index()

    def _index(self) -> None:
        self.tasks: dict[int, Task] = {t.id: t for t in self.farm.tasks}
        self.order = [t.id for t in self.farm.tasks]
        self.groups: dict[str, list[int]] = {}
        for t in self.farm.tasks:
            if t.group:
                self.groups.setdefault(t.group, []).append(t.id)
            self.states.setdefault(t.id, TaskState())

    def state(self, tid: int) -> TaskState:
        return self.states.setdefault(tid, TaskState())

    def refresh(self) -> bool:
        """Catch up with the directory; True if the task list grew."""
        grew = False
        sig = tasks_signature(self.path)
        if sig != self._sig:
            self._sig = sig
            n = len(self.farm.tasks)
            reload_tasks(self.farm)
            self._index()
            grew = len(self.farm.tasks) > n
        with os.scandir(self.path / CLAIMS) as it:
            for entry in it:
                parsed = _split(entry.name)
                if parsed:
                    st = self.state(parsed[0])
                    st.claimed = max(st.claimed, parsed[1])
        with os.scandir(self.path / ENDS) as it:
            for entry in it:
                parsed = _split(entry.name)
                if parsed is None:
                    continue
                st = self.state(parsed[0])
                if parsed[1] in st.ends:
                    continue
                rec = load_end(entry.path)
                if rec is not None:
                    st.ends[parsed[1]] = rec
                    st.claimed = max(st.claimed, parsed[1])
        self.bad_nodes = {n.removesuffix(".bad") for n in os.listdir(self.path / NODES) if n.endswith(".bad")}
        return grew


    def owner(self, tid: int, attempt: int) -> dict[str, Any]:
        """The claim record of an attempt (cached: claims are never rewritten)."""
        key = (tid, attempt)
        if key not in self.owners:
            rec = load_claim(f"{self.path}/{CLAIMS}/{tid}.{attempt}")
            if rec is None:
                return {}           # being written this instant: ask again next time
            self.owners[key] = rec
        return self.owners[key]

    def deps(self, tid: int, settings: Settings, _seen: frozenset[int] = frozenset()) -> str:
        """"ok" (all dependencies done), "wait", or "blocked" (one failed for good)."""
        task = self.tasks.get(tid)
        if task is None or not task.after:
            return "ok"
        verdict = "ok"
        for dep in task.after:
            ids = self.groups.get(dep, []) if isinstance(dep, str) else [dep]
            for d in ids:
                if d == tid or d in _seen:
                    continue
                st = self.state(d)
                if st.ok:
                    continue
                if st.gave_up(settings, self.recorded) or self.deps(d, settings, _seen | {tid}) == "blocked":
                    return "blocked"
                verdict = "wait"
        return verdict

    def final(self, tid: int, settings: Settings) -> bool:
        st = self.state(tid)
        return st.ok or st.gave_up(settings, self.recorded) or (not st.running and self.deps(tid, settings) == "blocked")

    def all_final(self, settings: Settings) -> bool:
        return all(self.final(t, settings) for t in self.order)

    def reap(self, is_dead: Callable[[dict[str, Any]], bool], lease: float,
             bury: Callable[[int, int, dict[str, Any]], bool]) -> int:
        """Declare "lost" every running attempt whose owner ``is_dead`` (or whose claim is
        not a record a lease after this reader first saw it), once ``bury`` has proven
        nothing of it still runs on this host (worker.py)."""
        n = 0
        now = time.monotonic()
        for tid in self.order:
            st = self.states.get(tid)
            if st is None or not st.running or st.mine == st.claimed:
                continue
            owner = self.owner(tid, st.claimed)
            if not owner:
                first = self._empty_since.setdefault((tid, st.claimed), now)
                dead = now - first >= lease
            else:
                dead = is_dead(owner)
            if not dead:
                continue
            # ended since this view last read the ends (a worker that finished and exited
            # looks dead): no sweep of /proc for it, which costs a read of every process's
            # environment (seconds per attempt with thousands of processes on a host)
            ended = load_end(f"{self.path}/{ENDS}/{tid}.{st.claimed}")
            if ended is not None:
                st.ends.setdefault(st.claimed, ended)
                continue
            if bury(tid, st.claimed, owner):
                rec = {"outcome": LOST, "end": time.time(), "node": owner.get("node"),
                       "worker": owner.get("worker"), "reason": "its worker died"}
                finish(self.path, tid, st.claimed, rec)
                st.ends.setdefault(st.claimed, load_end(f"{self.path}/{ENDS}/{tid}.{st.claimed}") or rec)
                n += 1
        return n
