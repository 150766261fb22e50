"""Host sampler (psutil): the wrapped process tree always; the node only once per node.

Node-wide figures (CPU, memory, disk and network I/O) are the same for every rank of a
node, so only local rank 0 records them; each rank records its own process tree.
Rates are differences between successive samples, so the first sample has none.

Each rank's reads, cold or warm: ``proc_read_chars`` (bytes its processes read through
read calls, the page cache's hits included) and ``proc_read_bytes`` (bytes the kernel
fetched from storage for them: Linux's ``/proc/PID/io``), each the total since the rank
started, over every process of its tree that has run (a DataLoader worker that ended keeps
its count). Their ratio says whether a data-bound step read from the disk (a first, cold
run) or the page cache (``hpcml.observe.report``'s data finding). The same for its writes
(``proc_write_chars``: bytes its write calls passed, a checkpoint to any filesystem;
``proc_write_bytes``: what reached the block layer) and its calls (``proc_read_calls``,
``proc_write_calls``): the report finds the bursts a throughput drop coincides with.
The node's parallel-filesystem client counters (Lustre, NFS) come from
``hpcml.samplers.fsclients``, on local rank 0 with the other node-wide figures.

``proc_cpu_wait_s``: the seconds the rank's threads waited for a CPU (their run delay),
since it started: a slow rank that waited is contended, not a straggler (the report's and the
watch's ``CONTENDED``).

The loader's cores (issue 70): ``proc_workers``, the rank's child processes that run its own
interpreter (DataLoader workers, and any other Python child it forks or spawns);
``proc_workers_cpu_percent``, their CPU use; ``proc_cores``, the cores the rank may run on:
its CPU affinity, capped by its cgroup's ``cpu.max`` quota. Under ``srun`` without
``--cpus-per-task`` a task gets one core, and eight workers then share it with the rank.
"""

from __future__ import annotations

import time

import psutil

from hpcml.proctree import cgroup_v2, cpu_wait
from hpcml.samplers.fsclients import FsClients

#: a rank's cumulative I/O rows, in the order of ``HostSampler._io``'s tuples
IO_ROWS = ("proc_read_chars", "proc_read_bytes", "proc_write_chars", "proc_write_bytes", "proc_read_calls",
           "proc_write_calls")
TREE_REFRESH_S = 2.0    # walking /proc for the process tree is most of a sample's cost
CORES_REFRESH_S = 10.0  # the rank's affinity and cgroup quota, read again this often


class HostSampler:
    def __init__(self, pid: int, node_wide: bool) -> None:
        self.proc = psutil.Process(pid)
        self.node_wide = node_wide
        self.waited: float | None = None     # the last sample's proc_cpu_wait_s (the recorder's heartbeat has it)
        #: the last sample's worker processes, the rank's cores and the workers' CPU use (percent
        #: of one core): the heartbeat has them, for the watch's live word on the loader's cores
        self.loader: tuple[int, float | None, float | None] | None = None
        self._read_once: set[int] = set()    # pids whose CPU use was read before: their next read is a measure
        self._last: tuple[int, dict[str, float]] | None = None
        self._procs: dict[int, psutil.Process] = {}
        #: pid -> its last (read_chars, read_bytes, write_chars, write_bytes, read calls, write calls)
        self._io: dict[int, tuple[int, int, int, int, int, int]] = {}
        self._fs = FsClients() if node_wide else None
        self._refreshed = 0.0
        self._workers_at = -1.0
        self._worker_pids: set[int] = set()
        self._cores_at = -CORES_REFRESH_S
        self._cores: float | None = None
        psutil.cpu_percent(None)

    def _tree(self) -> list[psutil.Process]:
        now = time.monotonic()
        if now - self._refreshed >= TREE_REFRESH_S or not self._procs:
            self._refreshed = now
            try:
                current = [self.proc] + self.proc.children(recursive=True)
            except psutil.Error:
                current = []
            # keep Process objects so cpu_percent() measures since the previous sample
            self._procs = {p.pid: self._procs.get(p.pid, p) for p in current}
        return list(self._procs.values())

    def _workers(self) -> set[int]:
        """The rank's children that run its interpreter, found when the tree is listed (every
        ``TREE_REFRESH_S``), not at every sample: the sample stays as cheap as it was."""
        if self._workers_at != self._refreshed:
            self._workers_at = self._refreshed
            found: set[int] = set()
            try:
                exe = self.proc.exe()
                for p in self.proc.children(recursive=False):
                    try:
                        if p.exe() == exe:
                            found.add(p.pid)
                    except psutil.Error:
                        continue
            except psutil.Error:
                pass
            self._worker_pids = found
        return self._worker_pids

    def sample(self, ts: int) -> list[tuple]:
        rows: list[tuple] = []
        cpu = rss = 0.0
        io_read = True
        tree = self._tree()
        workers, workers_cpu = self._workers(), 0.0
        unread = False                # a worker read for the first time: psutil's first reading is 0, not a measure
        for p in tree:
            try:
                used = p.cpu_percent(None)
                cpu += used
                rss += p.memory_info().rss
                if p.pid in workers:
                    workers_cpu += used
                    unread |= p.pid not in self._read_once
                self._read_once.add(p.pid)
            except psutil.Error:
                continue
            try:
                io = p.io_counters()
                self._io[p.pid] = (int(getattr(io, "read_chars", 0)), int(io.read_bytes),
                                   int(getattr(io, "write_chars", 0)), int(io.write_bytes),
                                   int(io.read_count), int(io.write_count))
            except psutil.NoSuchProcess:
                continue                            # ended since the tree was listed: its last count stays
            except (psutil.Error, AttributeError, NotImplementedError):
                io_read = False                     # not ours to read, or no /proc/PID/io here
        self._read_once &= {p.pid for p in tree}
        rows += [(ts, "host", "proc_cpu_percent", cpu, None, None),
                 (ts, "host", "proc_rss_bytes", rss, None, None),
                 (ts, "host", "proc_workers", float(len(workers)), None, None)]
        if not unread:                # the workers' use since the last sample; unknown at a worker's first
            rows.append((ts, "host", "proc_workers_cpu_percent", workers_cpu, None, None))
        now = time.monotonic()
        if now - self._cores_at >= CORES_REFRESH_S:
            self._cores_at, self._cores = now, rank_cores(self.proc.pid)
        self.loader = (len(workers), self._cores, None if unread else workers_cpu)
        if self._cores is not None:
            rows.append((ts, "host", "proc_cores", self._cores, None, None))
        self.waited = waited = cpu_wait(self.proc.pid)
        if waited is not None:                      # the rank's threads' run delay, cumulative: contention
            rows.append((ts, "host", "proc_cpu_wait_s", waited, None, None))
        if io_read and self._io:
            totals = [float(sum(col)) for col in zip(*self._io.values())]
            rows += [(ts, "host", name, value, None, None) for name, value in zip(IO_ROWS, totals)]
        if not self.node_wide:
            return rows
        mem = psutil.virtual_memory()
        rows += [(ts, "host", "cpu_percent", psutil.cpu_percent(None), None, None),
                 (ts, "host", "mem_used_bytes", float(mem.total - mem.available), None, None),
                 (ts, "host", "mem_available_bytes", float(mem.available), None, None)]
        counters: dict[str, float] = {}
        disk = psutil.disk_io_counters()
        if disk:
            counters.update(disk_read=disk.read_bytes, disk_write=disk.write_bytes)
        net = psutil.net_io_counters()
        if net:
            counters.update(net_recv=net.bytes_recv, net_sent=net.bytes_sent)
        if self._last:
            t0, before = self._last
            dt = (ts - t0) / 1e9
            if dt > 0:
                rows += [(ts, "host", f"{k}_bytes_per_s", (v - before[k]) / dt, None, None)
                         for k, v in counters.items() if k in before]
        self._last = (ts, counters)
        if self._fs is not None:
            rows += [(ts, "host", name, value, None, None) for name, value in self._fs.sample().items()]
        return rows


def rank_cores(pid: int) -> float | None:
    """The cores process ``pid`` may use: its CPU affinity, capped by its cgroup v2
    ``cpu.max`` quota (quota / period; ``max``: none). None when neither can be read."""
    import os
    try:
        cores: float = float(len(os.sched_getaffinity(pid)))
    except OSError:
        return None
    path = cgroup_v2(pid)
    while path:                                   # the cgroup and its ancestors: the tightest quota holds
        try:
            with open(f"/sys/fs/cgroup{path.rstrip('/')}/cpu.max", encoding="ascii") as f:
                quota, period = (f.read().split() + ["100000"])[:2]
            if quota != "max" and float(period) > 0:
                cores = min(cores, float(quota) / float(period))
        except (OSError, ValueError):
            pass
        path = path.rstrip("/").rpartition("/")[0]
    return cores
