"""Thin wrappers over Slurm's own clients, each with a timeout.

Slurm clients retry for minutes when the controller is down, so every call here has a
deadline and turns a missing binary, a timeout or a non-zero exit into a one-line
``SlurmError``.
"""

from __future__ import annotations

import csv
import io
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

from hpcml.cluster.hostlist import fold
from hpcml.errors import SlurmError
from hpcml.proctree import stop_group

DEFAULT_TIMEOUT = 30.0


def available(command: str = "srun") -> bool:
    return shutil.which(command) is not None


def run(argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT,
        env: Mapping[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run one Slurm client command and capture its output."""
    if not available(argv[0]):
        raise SlurmError(f"{argv[0]}: Slurm is not installed or not on PATH")
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=None if env is None else dict(env))
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]}: no answer within {timeout:g} s "
                         "(is slurmctld reachable?)") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(f"{' '.join(argv[:2])}: exit {proc.returncode}: "
                         f"{msg[-1] if msg else 'no message'}")
    return proc


def srun_argv(command: Sequence[str], *, nodes: Sequence[str] | None = None,
              ntasks_per_node: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The srun command line for one step; kept separate so callers can stream it."""
    argv = ["srun"]
    if nodes:
        argv += [f"--nodes={len(nodes)}", f"--nodelist={fold(nodes)}"]
        if ntasks_per_node:
            argv += [f"--ntasks={len(nodes) * ntasks_per_node}"]
    if ntasks_per_node:
        argv += [f"--ntasks-per-node={ntasks_per_node}"]
    return argv + list(extra) + list(command)


def srun(command: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT, **kw) -> subprocess.CompletedProcess:
    return run(srun_argv(command, **kw), timeout=timeout, check=False)


def scontrol_show(kind: str, name: str | None = None, *,
                  timeout: float = 10.0) -> list[dict[str, str]]:
    """``scontrol show -o KIND [NAME]`` as one dict of Key=Value pairs per record."""
    argv = ["scontrol", "show", "-o", kind] + ([name] if name else [])
    records = []
    for line in run(argv, timeout=timeout).stdout.splitlines():
        record: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                record[key] = value
            elif record:  # a value with spaces (Reason=...) continues the last key
                last = next(reversed(record))
                record[last] += " " + token
        if record:
            records.append(record)
    return records


def time_left(job_id: str | None) -> float | None:
    """Seconds the Slurm job has left (its TimeLimit less its RunTime), None if unknown."""
    if not job_id:
        return None
    try:
        rec = next(iter(scontrol_show("job", job_id)), None)
    except (OSError, SlurmError):
        return None
    if rec is None:
        return None
    limit, ran = parse_slurm_time(rec.get("TimeLimit", "")), parse_slurm_time(rec.get("RunTime", "0"))
    return None if limit is None else max(0.0, limit - (ran or 0.0))


def parse_slurm_time(text: str) -> float | None:
    """Slurm's time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``,
    sbatch(1)) in seconds; None for 0 and UNLIMITED (no limit), INVALID or anything else."""
    text = text.strip()
    days, with_days = 0, "-" in text
    if with_days:
        d, _, text = text.partition("-")
        if not (d.isascii() and d.isdigit()):
            return None
        days = int(d)
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    nums = [int(p) for p in parts]
    if with_days:                           # days-hours[:minutes[:seconds]]
        h, m, s = (nums + [0, 0])[:3]
    elif len(nums) == 3:
        h, m, s = nums
    else:                                   # minutes[:seconds]
        h, m, s = 0, nums[0], nums[1] if len(nums) == 2 else 0
    total = float(days * 86400 + h * 3600 + m * 60 + s)
    return total or None                    # --time=0: no limit (sbatch(1))


def show_config(*, timeout: float = 10.0) -> dict[str, str]:
    """``scontrol show config`` as a dict (``ClusterName``, ``AuthInfo``, ...)."""
    out: dict[str, str] = {}
    for line in run(["scontrol", "show", "config"], timeout=timeout).stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def scontrol_update_node(nodes: Sequence[str], *, timeout: float = 10.0, **fields: str) -> None:
    argv = ["scontrol", "update", f"nodename={fold(nodes)}"]
    argv += [f"{k}={v}" for k, v in fields.items()]
    run(argv, timeout=timeout)


def sacct(job_id: str, fields: Sequence[str] = ("JobID", "JobName", "State", "ExitCode",
                                                 "Elapsed", "NodeList"), *,
          jobcomp: bool = False, timeout: float = 20.0, extra: Sequence[str] = ()) -> list[dict[str, str]]:
    """Accounting rows of one job: from slurmdbd, or with ``jobcomp`` from the job
    completion file (``sacct -c``) on clusters without a database."""
    argv = ["sacct", "-j", str(job_id), "-P", "-n", "-o", ",".join(fields), *extra] + (["-c"] if jobcomp else [])
    proc = run(argv, timeout=timeout)
    reader = csv.reader(io.StringIO(proc.stdout), delimiter="|")
    return [dict(zip(fields, row)) for row in reader if row]


def stop_step(proc: subprocess.Popen, term_wait: float = 1.0) -> None:
    """Stop an srun started in its own process group: srun forwards SIGTERM to its tasks;
    SIGKILL if it does not leave within ``term_wait`` seconds."""
    stop_group(proc.pid, term_wait, lambda: proc.poll() is not None, poll=0.05)
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        pass


def step_id(job_id: str, name: str, *, timeout: float = 10.0) -> str | None:
    """``JOB.STEP`` of the running step of ``job_id`` named ``name`` (``srun --job-name``);
    None until it shows in squeue."""
    proc = run(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i %j"], timeout=timeout, check=False)
    for line in proc.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip() == name:
            return parts[0]
    return None


def signal_step(step: str, sig: int, *, timeout: float = 10.0) -> None:
    """Send ``sig`` to every task of a step without ending it (srun itself ends its step
    with SIGKILL when it gets TERM, or INT twice)."""
    run(["scancel", f"--signal={signal.Signals(sig).name.removeprefix('SIG')}", step], timeout=timeout)


def node_states(nodes: str | None = None, *, timeout: float = 10.0) -> dict[str, str]:
    """Node name -> its state as ``scontrol show -o node`` prints it (``IDLE``,
    ``ALLOCATED+DRAIN``, ``DOWN+NOT_RESPONDING``...), for a hostlist or every node."""
    return {r["NodeName"]: r.get("State", "") for r in scontrol_show("node", nodes, timeout=timeout)}


#: node state flags that mean the node is gone from its jobs' point of view
LOST = ("DOWN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN")
#: node state flags of a drain: asked for (DRAIN), jobs still running (DRAINING), done (DRAINED)
DRAINED = frozenset({"DRAIN", "DRAINED", "DRAINING"})
#: node state flags under which a node, drained or not, takes no job now: down, failing, in
#: maintenance, rebooting, powered down or on its way there, or not yet part of the cluster
UNAVAILABLE = frozenset({"DOWN", "FAIL", "FAILING", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED",
                         "POWERED_DOWN", "POWERING_DOWN", "FUTURE"})


def node_lost(state: str) -> bool:
    """The controller no longer reaches the node, or took it down (``*``: not responding)."""
    flags = state.replace("*", "+NOT_RESPONDING").upper().split("+")
    return any(f in LOST or f.startswith("FAIL") for f in flags)


#: job states in which a job holds or will get its allocation, so its processes may run or
#: come back (Slurm's job_state_string names; ``scontrol`` prints the base state first).
#: Those less obvious, with why: STOPPED and SUSPENDED keep the allocation (processes are
#: only signalled to pause); SPECIAL_EXIT is a requeue in held state after an exit code the
#: site marked special, so the job comes back; RESV_DEL_HOLD is held because its
#: reservation was deleted and can be released; REQUEUE_FED/REQUEUE_HOLD/REQUEUED are on
#: their way back; SIGNALING, STAGE_OUT, COMPLETING and RESIZING still have processes or
#: an allocation. Everything else (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL,
#: PREEMPTED, BOOT_FAIL, DEADLINE, OUT_OF_MEMORY, REVOKED) is over.
ALIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED",
                   "RESIZING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT",
                   "RESV_DEL_HOLD", "SPECIAL_EXIT"})


def job_state(job_id: str, *, timeout: float = 10.0) -> str | None:
    """A job's base state from ``scontrol show job`` (e.g. ``RUNNING``); ``""`` once Slurm
    no longer knows the job (it ended longer ago than MinJobAge); None where Slurm cannot be
    asked (not installed, controller down): the caller cannot tell and must say so."""
    try:
        recs = scontrol_show("job", str(job_id), timeout=timeout)
    except SlurmError as exc:
        return "" if "invalid job id" in str(exc).lower() else None
    return recs[0].get("JobState", "").split()[0] if recs and recs[0].get("JobState") else ""



def cancel(job_id: str, wait: float = 60.0) -> None:
    """scancel the job and wait until it no longer holds its allocation (or Slurm cannot say)."""
    run(["scancel", job_id], timeout=15)
    deadline = time.monotonic() + wait
    while job_state(job_id) in ALIVE and time.monotonic() < deadline:
        time.sleep(0.3)

def free_port_on(node: str, python: str, *, timeout: float = 60.0) -> int:
    """A TCP port free now on ``node`` of the current allocation (one ``srun --overlap``
    step running ``python -c FREE_PORT``): the rendezvous port for rank 0 there. A step
    that fails or answers nothing is a ``SlurmError``: a port free on the caller's node
    says nothing of ``node``'s."""
    from hpcml.ports import FREE_PORT
    proc = run(["srun", "-N1", "-n1", "-w", node, "--overlap", python, "-c", FREE_PORT], timeout=timeout)
    text = proc.stdout.strip()
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise SlurmError(f"srun on {node}: no free port in its answer ({text[:80]!r})")
    return int(text)
