"""The kernel's OOM killer, as a process's memory cgroup counts it.

A rank killed by SIGKILL may have been killed by anyone; the kernel says when it was its
OOM killer: the cgroup's ``oom_kill`` count (cgroup v2: ``memory.events``; v1:
``memory.oom_control``, Linux >= 4.13) rises. The recorder reads the count of its rank's
cgroup when the rank starts and when it ends (Slurm's task or step cgroup under srun). The
count is the cgroup's: in a step cgroup shared by several ranks, a SIGKILL that came while
the count rose is told as "the OOM killer killed a process of this cgroup", not more.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _files(pid: int) -> list[Path]:
    """The files that count OOM kills of ``pid``'s memory cgroup, v2 first."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":                                  # v2's single hierarchy
            out += [CGROUP_ROOT / rel / "memory.events", CGROUP_ROOT / "unified" / rel / "memory.events"]
        elif "memory" in controllers.split(","):
            out.append(CGROUP_ROOT / "memory" / rel / "memory.oom_control")
    return out


def oom_kills(pid: int) -> int | None:
    """The ``oom_kill`` count of ``pid``'s memory cgroup; None when none can be read."""
    for f in _files(pid):
        try:
            text = f.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None
