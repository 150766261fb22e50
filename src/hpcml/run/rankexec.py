"""``python -m hpcml.run.rankexec CMD...``: become the rank, then exec CMD.

The recorder starts CMD as a plain child; this step in between gives the rank what the
task wrapper needs to own it, without a process of its own (exec keeps the pid the
recorder samples):

* its own process group, so a terminal's Ctrl-C reaches it once, through the launcher,
  and the wrapper can stop the rank together with its children;
* SIGKILL when the wrapper dies (PR_SET_PDEATHSIG), so a rank never outlives it;
* TERM, INT and HUP at their default action: the wrapper ignores them outside the
  recorder's forwarding, and ``cmd &`` in a script starts ``hpcml run`` with INT ignored;
  a rank must stop on INT as on Ctrl-C;
* its parent (the task wrapper's recorder) and the wrapper's children may ptrace it
  (``proctree.allow_tracing_by``), so the watch's py-spy can read a hung rank's stack
  where Yama allows only ancestors;
* a command that cannot start is said in the rank's stderr, with a shell's exit code
  (127 not found, 126 not executable), and recorded like any other exit.
"""

from __future__ import annotations

import os
import signal
import sys

from hpcml.proctree import allow_tracing_by, die_with_parent

NOT_FOUND, NOT_EXECUTABLE = 127, 126


def become_rank() -> None:
    """All of the above but the exec: run in the process that becomes the rank. Also the
    recorder's ``preexec_fn`` (between its fork and the exec of a command found on PATH):
    the same rank without an interpreter of its own started first (~30 ms, and as much CPU,
    per rank start). libc is loaded already (``proctree.libc``, at import)."""
    os.setpgid(0, 0)
    die_with_parent(signal.SIGKILL)
    allow_tracing_by(os.getppid())
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def startable(cmd: list[str]) -> bool:
    """Whether ``cmd`` names a program that can be executed (on PATH, or a path to an
    executable file): the recorder then starts it itself (``become_rank``); one that cannot
    goes through this module, which says why in the rank's stderr with a shell's exit code."""
    import shutil
    return bool(cmd) and shutil.which(cmd[0]) is not None


def main(cmd: list[str]) -> int:
    become_rank()
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"hpcml run: cannot start '{cmd[0]}': {exc.strerror}", file=sys.stderr, flush=True)
        return NOT_FOUND if isinstance(exc, FileNotFoundError) else NOT_EXECUTABLE
    return NOT_EXECUTABLE                     # not reached: execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
