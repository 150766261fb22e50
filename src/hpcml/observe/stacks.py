"""Where a process is right now: its Python threads' stacks, read from outside with py-spy.

Why py-spy and not a signal handler in the rank: a rank stuck in a collective, in a C call
that holds the GIL, or in a deadlock never runs a Python signal handler, while py-spy reads
the interpreter's memory through ptrace and needs nothing from the target. The rank is paused
for the few milliseconds of the read (``py-spy dump``), then continues.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from typing import Any

TIMEOUT = 20.0


def py_spy() -> str | None:
    """The py-spy binary installed with hpcml (its venv's scripts), else on PATH."""
    here = os.path.join(sysconfig.get_path("scripts"), "py-spy")
    if os.access(here, os.X_OK):
        return here
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def python_target(pid: int) -> int:
    """``pid`` if it runs Python, else its first Python descendant (a shell script or
    ``hpcml env run`` in front of the program); ``pid`` when none is found."""
    import psutil
    try:
        proc = psutil.Process(pid)
        for p in [proc, *proc.children(recursive=True)]:
            if "python" in os.path.basename(p.name()).lower() or "python" in " ".join(p.cmdline()[:1]).lower():
                return p.pid
    except psutil.Error:
        pass
    return pid


def dump(pid: int, timeout: float = TIMEOUT) -> dict[str, Any]:
    """``{"pid", "threads": [{"name", "active", "owns_gil", "frames": [{"name", "file",
    "line"}, ...innermost first]}]}``, or ``{"pid", "error"}`` saying why not."""
    exe = py_spy()
    if exe is None:
        return {"pid": pid, "error": "py-spy is not installed"}
    target = python_target(pid)
    try:
        out = subprocess.run([exe, "dump", "--pid", str(target), "--json", "--full-filenames"],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"pid": target, "error": f"py-spy did not answer in {timeout:.0f} s"}
    except OSError as exc:
        return {"pid": target, "error": f"py-spy: {exc.strerror or exc}"}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"pid": target, "error": f"py-spy: {last[:300]}"}
    try:
        raw = json.loads(out.stdout)
    except ValueError:
        return {"pid": target, "error": "py-spy: output is not JSON"}
    threads = [{"name": t.get("thread_name"), "main": t.get("os_thread_id") == target,
                "active": t.get("active"), "owns_gil": t.get("owns_gil"),
                "frames": [{"name": f.get("name"), "file": f.get("filename"), "line": f.get("line")}
                           for f in t.get("frames") or []]}
               for t in raw if isinstance(t, dict)]
    return {"pid": target, "threads": threads}


def main_thread(stack: dict[str, Any]) -> list[dict[str, Any]]:
    """The frames of the thread that runs the program: the one whose thread id is the
    process id (py-spy does not list it first)."""
    threads = stack.get("threads") if isinstance(stack, dict) else None
    if not isinstance(threads, list):
        return []
    threads = [t for t in threads if isinstance(t, dict) and isinstance(t.get("frames"), list)]
    main = next((t for t in threads if t.get("main") is True), threads[0] if threads else None)
    return [f for f in main["frames"] if isinstance(f, dict)] if main else []
