"""Loaded by every Python process of an ``hpcml run`` rank (PYTHONPATH): dump PyTorch's
Flight Recorder when the watch asks, without a change to the training script.

Why here: a rank stuck in a collective has its main thread blocked in C++ (a Python signal
handler would never run), but torch's collectives release the GIL while they wait, so a
thread of the rank can still call ``torch._C._distributed_c10d._dump_fr_trace()`` (gloo and
NCCL alike, torch >= 2.5; ``_dump_nccl_trace``, NCCL only, before; the recorder itself is
armed by ``TORCH_FR_BUFFER_SIZE``, ``TORCH_NCCL_TRACE_BUFFER_SIZE`` before 2.5, which
``hpcml run`` sets). The thread looks for the watch's snapshot request once a second (one
``stat``) and writes ``<observe>/flight-recorder/rank-NNNNN``. It never imports torch: a
process that did not initialise ``torch.distributed`` has nothing to dump. A rank whose GIL
is held (a C call that does not release it) cannot dump; py-spy's stack still locates it.
Every ``HPCML_RUN_FR_EVERY`` seconds (30; 0: never) the same thread also dumps the recorder
into ``<observe>/flight-recorder-live/rank-NNNNN``, replacing its last: who arrived last at
each collective (``hpcml.observe.arrivals``), the straggler measure NCCL leaves no other.

Every optimizer step a step (``hpcml.observe.optimsteps``): a ``sys.meta_path`` finder that
finds nothing itself waits for ``torch.optim``'s first import, and once it has run registers
torch's global optimizer step hooks, so a process that never imports torch pays one string
comparison per import and no torch. Only in the rank's main process: the first process of
the rank to import ``torch.optim`` with the recorder's pipe as it was given (checked at
start: a subprocess or spawned DataLoader worker whose parent closed the pipe may have its
number reused) claims the rank's steps (``HPCML_RUN_STEPS_PID``, inherited by its children,
which then count nothing); a forked child stops counting (``os.register_at_fork``).
``HPCML_RUN_OPTIMIZER_STEPS=0`` turns it off. In a farm task (``hpcml farm``'s worker puts
this directory on the task's PYTHONPATH) with no recorder's pipe, each process that imports
``torch.optim`` counts its steps the same way until one of its ancestors stepped first (the
claim, ``HPCML_FARM_STEPS_PID``, is taken at a process's first ``step()``: a launcher's
workers count their own; an ``hpcml run`` in the task gives its ranks theirs), written through
``hpcml.observe.api`` into the attempt's observe directory for ``hpcml farm results``; an
interpreter without hpcml runs as without us, silently. With ``--step-pattern``, rank 0's main process
also reads the first step it prints (``hpcml.observe.printedsteps``). The same process's
time waiting in collectives is measured from then on (``hpcml.observe.collectives``;
``HPCML_RUN_COLLECTIVE_WAIT=0``: not).

The site's own ``sitecustomize``, if any, is loaded first, as ddtrace-run's bootstrap does.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import json
import os
import stat
import sys
import threading
import time

TYPE_CHECKING = False                # typing is not imported at every process's start (~5 ms)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

ENV = "HPCML_RUN_SNAPSHOT_DIR"      # the attempt's observe store
# The request file and the dump directory are hpcml.observe.snapshot's REQUEST (under the
# store's beat/) and FLIGHT_RECORDER, written out here: this file runs in every Python
# process of a rank and imports nothing of hpcml.
POLL = 1.0
PIPE = "HPCML_OBSERVE_FD"           # the recorder's pipe (hpcml.observe.recorder)
STEPS = "HPCML_RUN_OPTIMIZER_STEPS"  # "0": optimizer steps are not counted
CLAIM = "HPCML_RUN_STEPS_PID"       # the process whose optimizer steps are the rank's
WAITS = "HPCML_RUN_COLLECTIVE_WAIT"  # "0": the time in collectives is not measured
FR_EVERY = "HPCML_RUN_FR_EVERY"      # seconds between two Flight Recorder dumps into LIVE (0: none)
LIVE = "flight-recorder-live"       # hpcml.observe.arrivals reads each rank's latest dump there
STEP_PATTERN = "HPCML_RUN_STEP_PATTERN"  # hpcml.observe.printedsteps' ENV: rank 0's printed step (--step-pattern)
# hpcml.run.launchers' ENV_LAUNCHER, ENV_WRAPPED and IDENTITY, written out (tests/run/test_launchers.py)
LAUNCHER = "HPCML_RUN_LAUNCHER"
WRAPPED = "HPCML_RUN_WRAPPED"
IN_RANK = "HPCML_RUN_IN_RANK"         # set in a wrapped worker: its own children are never ranks
FARM_CLAIM = "HPCML_FARM_STEPS_PID"  # a farm task's process whose optimizer steps are the attempt's
FARM_TASK, FARM_JOB, OBSERVE_DIR = "HPCML_FARM_TASK_ID", "HPCML_FARM_JOB_ID", "HPCML_OBSERVE_DIR"  # taskenv's, written out
IDENTITY = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


def _chain() -> None:
    here = os.path.realpath(__file__)
    others = [p for p in sys.path if os.path.realpath(os.path.join(p or ".", "sitecustomize.py")) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None or os.path.realpath(spec.origin or "") == here:
        return                                        # none, or this file again under another name
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the site's own file failing is its business, as without us
        print(f"hpcml run: the site's sitecustomize failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    sys.modules["sitecustomize"] = module          # `import sitecustomize` finds the site's, as without us


def _dump(observe: str, ident: int, into: str = "flight-recorder") -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    import torch
    c10d = torch._C._distributed_c10d
    # NCCL's entries are in the NCCL backend's own recorder, the other backends' (gloo) in
    # torch >= 2.5's generic one: on an H100 with torch 2.11 the generic dump held 0 of a
    # DDP job's 2,000 NCCL entries (tests/fixtures/gpu/run/train_fr.json). Both, merged.
    blobs = [f(True, False, False) for f in (getattr(c10d, name, None) for name in ("_dump_nccl_trace", "_dump_fr_trace"))
             if f is not None]
    if not blobs:
        return
    data = merge_dumps(blobs)
    rank = dist.get_rank()
    out = os.path.join(observe, into)
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, f".rank-{rank:05d}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(out, f"rank-{rank:05d}"))


def merge_dumps(blobs: list[bytes]) -> bytes:
    """Flight Recorder dumps of one process (torch's own pickles, made just now in this
    process: nothing from outside) as one: every entry by enqueue time, the groups and
    their status of each, the first dump's where both name one (the NCCL recorder's, whose
    group names are real; gloo's recorder writes a placeholder)."""
    import pickle
    docs = [d for d in (pickle.loads(b) for b in blobs) if isinstance(d, dict)]
    with_entries = [d for d in docs if d.get("entries")]
    if len(with_entries) < 2:
        return pickle.dumps(with_entries[0]) if with_entries else blobs[0]
    out = dict(with_entries[0])
    out["entries"] = sorted((e for d in with_entries for e in d["entries"]),
                            key=lambda e: e.get("time_created_ns", 0) if isinstance(e, dict) else 0)
    for key in ("pg_config", "pg_status"):
        merged: dict = {}
        for d in with_entries:
            if isinstance(d.get(key), dict):
                for k, v in d[key].items():
                    merged.setdefault(k, v)
        out[key] = merged
    return pickle.dumps(out)


def _every() -> float:
    """``HPCML_RUN_FR_EVERY``: seconds between two dumps into ``LIVE`` (0: none)."""
    try:
        return max(0.0, float(os.environ.get(FR_EVERY, "30")))
    except ValueError:
        return 30.0


def _watch(observe: str) -> None:
    request = os.path.join(observe, "beat", "snapshot.json")
    seen = None
    every = _every()
    due = time.monotonic() + every
    while True:
        time.sleep(POLL)
        if every and time.monotonic() >= due:        # who arrives last at each collective (hpcml.observe.arrivals)
            due = time.monotonic() + every
            try:
                _dump(observe, 0, LIVE)
            except Exception:  # noqa: BLE001, S110 - never into the training loop
                pass
        try:
            mtime = os.stat(request).st_mtime
            if mtime == seen:
                continue
            seen = mtime
            with open(request, "rb") as f:
                ident = int(json.loads(f.read(4096))["id"])
            _dump(observe, ident)
        except Exception:  # noqa: BLE001, S112 - never into the training loop: the stack still names the rank
            continue


def _pipe() -> tuple[int, int, int] | None:
    """The recorder's pipe as this process has it: (fd, device, inode), or None."""
    fd = os.environ.get(PIPE, "")
    if not fd.isdigit():
        return None
    try:
        st = os.fstat(int(fd))
    except OSError:
        return None
    return (int(fd), st.st_dev, st.st_ino) if stat.S_ISFIFO(st.st_mode) else None


class _Then:
    """A loader that runs ``then`` after the module it loads (where the loader's own
    ``exec_module`` cannot be replaced); everything else is the loader's."""

    def __init__(self, loader: Any, then: Callable[[], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._then()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):                     # ours not set yet (a copy): not the loader's
            raise AttributeError(name)
        return getattr(self._loader, name)


class _OnImport:
    """A ``sys.meta_path`` finder that finds nothing itself: when ``name`` is first imported
    it leaves ``sys.meta_path``, lets the other finders find it, and has ``then`` called
    once the module has run."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader, then = spec.loader, self.then
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            try:
                del loader.exec_module               # the loader's own again, for any later module
            except AttributeError:
                pass
            run(module)
            then()
        try:
            loader.exec_module = exec_module         # a file's loader is made for this module alone
        except (AttributeError, TypeError):
            spec.loader = _Then(loader, then)
        return spec


def _count_steps(pipe: tuple[int, int, int] | None) -> None:
    """``torch.optim`` has just run: this process's optimizer steps become the rank's steps,
    if no other process of the rank claimed them and it still has the recorder's pipe."""
    try:
        if pipe is None or os.environ.get(CLAIM, str(os.getpid())) != str(os.getpid()) or _pipe() != pipe:
            return
        os.environ[CLAIM] = str(os.getpid())
        from hpcml.observe import optimsteps
        counted = optimsteps.install()
    except Exception as exc:  # noqa: BLE001 - an interpreter without hpcml: the program runs as without us
        print(f"hpcml run: optimizer steps are not counted: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    if os.environ.get(STEP_PATTERN) and os.environ.get("RANK", "0") == "0":
        try:
            from hpcml.cluster.requeue import note_printed
            from hpcml.observe import printedsteps
            printedsteps.install(printedsteps.compile_pattern(os.environ[STEP_PATTERN]), lambda: counted.n,
                                 note_printed)
        except Exception as exc:  # noqa: BLE001
            print(f"hpcml run: the printed step is not read: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        from hpcml.observe import saves
        saves.install()
        if saves.DCP not in sys.modules:
            sys.meta_path.insert(0, _OnImport(saves.DCP, saves.wrap_dcp))
    except Exception as exc:  # noqa: BLE001
        print(f"hpcml run: checkpoint saves are not timed: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        from hpcml.observe import resumes
        for name, hook in ((resumes.HF, resumes.hook_transformers),
                           *((m, functools.partial(resumes.hook_lightning, m)) for m in resumes.LIGHTNING)):
            if name in sys.modules:
                hook()
            else:
                sys.meta_path.insert(0, _OnImport(name, hook))
    except Exception as exc:  # noqa: BLE001
        print(f"hpcml run: a framework's resume step is not read: {type(exc).__name__}: {exc}", file=sys.stderr)
    if os.environ.get(WAITS) == "0":
        return
    try:
        from hpcml.observe import collectives
        collectives.install()
    except Exception as exc:  # noqa: BLE001
        print(f"hpcml run: time in collectives is not measured: {type(exc).__name__}: {exc}", file=sys.stderr)


def _count_farm_steps() -> None:
    """``torch.optim`` has just run in a farm task's process: its optimizer steps are the
    attempt's, unless a process it descends from stepped first. The claim is taken at the
    first ``step()``, not at the import: a launcher that imports torch and steps nothing
    (torchrun's agent, ``accelerate launch``) leaves its workers their own steps, each its
    rank's (``RANK``)."""
    if os.environ.get(FARM_CLAIM, str(os.getpid())) != str(os.getpid()):
        return
    try:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        from hpcml.observe import optimsteps
    except Exception:  # noqa: BLE001 - an interpreter without hpcml, or one that fails: the task runs as without us
        return
    claimed: list[bool] = []

    def claim(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not claimed:                              # never removed: torch loops over its hooks as it calls them
            claimed.append(True)
            os.environ[FARM_CLAIM] = str(os.getpid())     # processes started from now on count none
    try:
        register_optimizer_step_pre_hook(claim)
        optimsteps.install()
    except Exception as exc:  # noqa: BLE001 - the task runs as without us
        print(f"hpcml farm: optimizer steps are not counted: {type(exc).__name__}: {exc}", file=sys.stderr)


def _become_worker() -> None:
    """A launcher's worker (the task runs torchrun or ``accelerate launch``, and this
    process's rank variables are not those of the process hpcml wraps): exec
    ``hpcml.run.worker`` in its place, with this command line, so that it is watched as a
    rank (same pid: the launcher's handle stays right). Only the launcher's own children:
    a process below a wrapped worker (its evaluation subprocess, a nested launcher, a
    forkserver) is part of that rank (``IN_RANK``). Not for a process that ``multiprocessing``
    starts (its descriptors are passed by number), nor where ``hpcml.run.worker`` is not
    importable (a container without hpcml, an older one): those run as they are."""
    argv = getattr(sys, "orig_argv", None)            # Python 3.10+
    if (not os.environ.get(LAUNCHER) or WRAPPED not in os.environ or os.environ.get(IN_RANK) or not argv
            or not sys.executable or "--multiprocessing-fork" in argv
            or any(a.startswith("from multiprocessing.") for a in argv[1:])):   # spawn, forkserver, its tracker
        return
    if not (os.environ.get("RANK", "").isdigit() and os.environ.get("WORLD_SIZE", "").isdigit()):
        return
    me = "|".join(os.environ.get(k, "") for k in IDENTITY)
    if me == os.environ[WRAPPED] or importlib.util.find_spec("hpcml.run.worker") is None:
        return
    os.environ[WRAPPED] = me                          # the wrapper and the worker it starts: this rank
    os.environ[IN_RANK] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "hpcml.run.worker", "--", sys.executable, *argv[1:]])


if __name__ == "sitecustomize":
    _chain()
    if os.environ.get(LAUNCHER):
        try:
            _become_worker()
        except Exception as exc:  # noqa: BLE001 - never in the way of the program: it runs unwatched
            print(f"hpcml run: this worker is not watched as a rank: {type(exc).__name__}: {exc}", file=sys.stderr)
    if os.environ.get(ENV):
        threading.Thread(target=_watch, args=(os.environ[ENV],), name="hpcml-flight-recorder", daemon=True).start()
        pipe = _pipe()
        if (pipe is not None and os.environ.get(STEPS) != "0"
                and os.environ.get(CLAIM, str(os.getpid())) == str(os.getpid())):
            sys.meta_path.insert(0, _OnImport("torch.optim", lambda: _count_steps(pipe)))
    elif (os.environ.get(FARM_TASK) and os.environ.get(OBSERVE_DIR) and not os.environ.get(PIPE)
          and os.environ.get(STEPS) != "0" and os.environ.get(FARM_CLAIM, str(os.getpid())) == str(os.getpid())
          and os.environ.get(FARM_JOB, os.environ.get("SLURM_JOB_ID", "")) == os.environ.get("SLURM_JOB_ID", "")):
        # (a job a task submitted inherits the farm's variables, not its job: not the task's)
        sys.meta_path.insert(0, _OnImport("torch.optim", _count_farm_steps))
