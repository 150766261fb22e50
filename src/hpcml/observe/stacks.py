"""Where a process is right now: its Python threads' stacks, read from outside with py-spy.

Why py-spy and not a signal handler in the rank: a rank stuck in a collective, in a C call
that holds the GIL, or in a deadlock never runs a Python signal handler, while py-spy reads
the interpreter's memory through ptrace and needs nothing from the target. The rank is paused
for the few milliseconds of the read (``py-spy dump``), then continues.

What py-spy said is parsed once, here, into a ``Stack`` (``Stack.of_py_spy``), and so is a
stack file read back (``Stack.of``): a rank's stack is its own memory, and its file lies in
the job directory, where the rank's program may write. A value of the wrong type is None,
an entry that is not an object is dropped, and what is kept is bounded (``MAX_THREADS``
threads, the main one always among them; ``MAX_FRAMES`` frames a thread, innermost first;
``MAX_TEXT`` characters a name or a file). A real dump fits these bounds, and its
``to_json`` is what ``dump`` always wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TIMEOUT = 20.0
MAX_OUTPUT = 64 << 20          # characters of py-spy's output parsed: more is not a stack
MAX_THREADS = 1024             # threads of one process kept (the main thread always)
MAX_FRAMES = 4096              # frames of one thread kept, innermost first (recursion: the innermost tell)
MAX_TEXT = 4096                # characters of a function's name or a file's kept


def _text(v: object) -> str | None:
    return v[:MAX_TEXT] if isinstance(v, str) else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _flag(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


def _objects(v: object) -> list[Mapping[str, object]]:
    """The JSON objects of a JSON array; nothing from anything else."""
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: the function, its file and the line it is on."""

    name: str | None
    file: str | None
    line: int | None

    @classmethod
    def of(cls, doc: Mapping[str, object], file_key: str = "file") -> Frame:
        """From a stack file's frame, or (``file_key="filename"``) py-spy's."""
        return cls(name=_text(doc.get("name")), file=_text(doc.get(file_key)), line=_int(doc.get("line")))

    def to_json(self) -> dict[str, str | int | None]:
        return {"name": self.name, "file": self.file, "line": self.line}


@dataclass(frozen=True, slots=True)
class Thread:
    """One Python thread of the process; ``main``: the one that runs the program (its thread
    id is the process id)."""

    name: str | None
    main: bool
    active: bool | None
    owns_gil: bool | None
    frames: tuple[Frame, ...]                  # innermost first

    @classmethod
    def of(cls, doc: Mapping[str, object]) -> Thread:
        """From a stack file's thread."""
        return cls(name=_text(doc.get("name")), main=doc.get("main") is True, active=_flag(doc.get("active")),
                   owns_gil=_flag(doc.get("owns_gil")),
                   frames=tuple(Frame.of(f) for f in _objects(doc.get("frames"))[:MAX_FRAMES]))

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "main": self.main, "active": self.active, "owns_gil": self.owns_gil,
                "frames": [f.to_json() for f in self.frames]}


def _bounded(threads: Iterable[Thread]) -> tuple[Thread, ...]:
    """At most ``MAX_THREADS``, in their order, the main one kept whatever its place."""
    out = list(threads)
    if len(out) <= MAX_THREADS:
        return tuple(out)
    main = next((i for i, t in enumerate(out) if t.main), None)
    keep = set(range(MAX_THREADS - 1 if main is not None and main >= MAX_THREADS else MAX_THREADS))
    if main is not None:
        keep.add(main)
    return tuple(t for i, t in enumerate(out) if i in keep)


@dataclass(frozen=True, slots=True)
class Stack:
    """A process's Python threads (``pid``: the one read), or the ``error`` saying why not."""

    pid: int | None
    threads: tuple[Thread, ...] = ()
    error: str | None = None

    @classmethod
    def of_py_spy(cls, raw: object, pid: int) -> Stack:
        """From ``py-spy dump --json`` of ``pid`` (parsed JSON): a list of threads, each with
        ``thread_name``, ``os_thread_id``, ``active``, ``owns_gil`` and ``frames`` (``name``,
        ``filename``, ``line``, ...); what else py-spy gives is not kept."""
        if not isinstance(raw, list):
            return cls(pid=pid, error="py-spy: output is not a list of threads")
        return cls(pid=pid, threads=_bounded(
            Thread(name=_text(t.get("thread_name")), main=_int(t.get("os_thread_id")) == pid,
                   active=_flag(t.get("active")), owns_gil=_flag(t.get("owns_gil")),
                   frames=tuple(Frame.of(f, "filename") for f in _objects(t.get("frames"))[:MAX_FRAMES]))
            for t in _objects(raw)))

    @classmethod
    def of(cls, doc: object) -> Stack:
        """From what ``to_json`` wrote (a stack file's, read back): anything else gives a
        stack without threads."""
        if not isinstance(doc, dict):
            return cls(pid=None, error="not a stack")
        pid, error = _int(doc.get("pid")), doc.get("error")
        if error is not None:
            return cls(pid=pid, error=_text(error) or "not a stack")
        return cls(pid=pid, threads=_bounded(Thread.of(t) for t in _objects(doc.get("threads"))))

    def to_json(self) -> dict[str, object]:
        """``{"pid", "threads": [{"name", "main", "active", "owns_gil", "frames": [{"name",
        "file", "line"}, ...innermost first]}]}``, or ``{"pid", "error"}``."""
        if self.error is not None:
            return {"pid": self.pid, "error": self.error}
        return {"pid": self.pid, "threads": [t.to_json() for t in self.threads]}

    def main_thread(self) -> tuple[Frame, ...]:
        """The frames of the thread that runs the program: the one whose thread id is the
        process id (py-spy does not list it first), else the first."""
        main = next((t for t in self.threads if t.main), self.threads[0] if self.threads else None)
        return main.frames if main else ()


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


def dump(pid: int, timeout: float = TIMEOUT) -> Stack:
    """The stack of ``pid`` (or of its first Python descendant), or a ``Stack`` whose
    ``error`` says why not."""
    exe = py_spy()
    if exe is None:
        return Stack(pid=pid, error="py-spy is not installed")
    target = python_target(pid)
    try:
        out = subprocess.run([exe, "dump", "--pid", str(target), "--json", "--full-filenames"],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Stack(pid=target, error=f"py-spy did not answer in {timeout:.0f} s")
    except OSError as exc:
        return Stack(pid=target, error=f"py-spy: {exc.strerror or exc}")
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return Stack(pid=target, error=f"py-spy: {last[:300]}")
    if len(out.stdout) > MAX_OUTPUT:
        return Stack(pid=target, error=f"py-spy: output over {MAX_OUTPUT >> 20} MiB")
    try:
        raw = json.loads(out.stdout)
    except (ValueError, RecursionError):
        return Stack(pid=target, error="py-spy: output is not JSON")
    return Stack.of_py_spy(raw, target)
