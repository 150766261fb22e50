"""Is a worker alive? Its file ``workers/WID`` says who it is; its mtime is its heartbeat.

Checks, most certain first (see claim.py for why this makes claiming safe):
same host (hostname, boot id and pid namespace) -> the pid with the same process start time,
another boot -> dead (``hpcml.owner.local_liveness``);
another Slurm allocation -> that job still running (``scontrol show job``);
otherwise the lease: the heartbeat's mtime must change within ``lease`` seconds of the
observer's own monotonic clock, so clocks of different hosts are never compared.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hpcml.farm.model import WORKER_SCHEMA, WORKERS
from hpcml.files import load_json_bounded
from hpcml.owner import Liveness as Life
from hpcml.owner import Owner, job_liveness, local_liveness


def identity(wid: str, node: str, job: str | None, gpus: tuple[str, ...]) -> dict[str, Any]:
    """What a worker writes about itself (``started``: when it began work)."""
    return {"schema": WORKER_SCHEMA, "worker": wid, "node": node, **Owner.me().to_json(), "job": job,
            "gpus": list(gpus), "started": time.time()}


class Liveness:
    """Judges owners of claims; caches what it learns for one ``window`` of seconds."""

    def __init__(self, farm: Path, lease: float, job: str | None, window: float = 5.0):
        self.farm, self.lease, self.job, self.window = farm, lease, job, window
        self.me = Owner.me()
        self.boot, self.pidns = self.me.boot_id, self.me.pidns
        self._workers: dict[str, dict[str, Any]] = {}
        self._beats: dict[str, tuple[int, float]] = {}      # wid -> (mtime_ns, first seen at)
        self._jobs: dict[str, tuple[bool, float]] = {}

    def __call__(self, claim: dict[str, Any]) -> bool:
        return self.is_dead(str(claim.get("worker", "")))

    def is_dead(self, wid: str) -> bool:
        path = self.farm / WORKERS / wid
        try:
            mtime = os.stat(path).st_mtime_ns
        except FileNotFoundError:
            return True                                      # removed after its last end
        info = self._worker(wid, path)
        if info is None:
            return False                                     # being written: judge next time
        local = self._local(info)
        if local is not None:
            return local
        job = info.get("job")
        if job and job != self.job and not self._job_alive(str(job)):
            return True
        now = time.monotonic()
        seen = self._beats.get(wid)
        if seen is None or seen[0] != mtime:
            self._beats[wid] = (mtime, now)
            return False
        return now - seen[1] >= self.lease

    def _local(self, info: dict[str, Any]) -> bool | None:
        """Dead or not, for a worker on this host (its pid and start time); None elsewhere."""
        verdict = local_liveness(Owner.from_json(info), me=self.me)
        return None if verdict is Life.UNKNOWN else verdict is Life.DEAD

    def seems_dead(self, wid: str) -> bool:
        """A snapshot for display (``farm status``): no file, its Slurm job over (as
        ``hpcml run`` judges its launcher: a scancel'ed allocation's tasks are not running,
        whichever host asks), a dead pid on this host, or a heartbeat older than a lease by
        this host's clock. Slurm is asked only about a heartbeat younger than a lease: the
        worker files of every allocation that ever ran the farm stay, and one ``scontrol``
        each would make every status wait on the controller."""
        path = self.farm / WORKERS / wid
        try:
            mtime = os.stat(path).st_mtime
        except FileNotFoundError:
            return True
        stale = time.time() - mtime >= self.lease
        info = self._worker(wid, path)
        if info is not None and info.get("job") and info["job"] != self.job and not stale \
                and not self._job_alive(str(info["job"])):
            return True
        local = None if info is None else self._local(info)
        return local if local is not None else stale

    def _worker(self, wid: str, path: Path) -> dict[str, Any] | None:
        if wid not in self._workers:
            try:
                self._workers[wid] = load_json_bounded(path, 1 << 20)
            except (OSError, ValueError):
                return None
        return self._workers[wid]

    def _job_alive(self, job: str) -> bool:
        """The job holds its allocation (``hpcml.owner.job_liveness``); True where Slurm
        cannot be asked: the lease decides then."""
        cached = self._jobs.get(job)
        if cached and time.monotonic() - cached[1] < self.window:
            return cached[0]
        alive = job_liveness(job) is not Life.DEAD
        self._jobs[job] = (alive, time.monotonic())
        return alive
