"""A user's training task for the fault tests: resumes with hpcml.ckpt, saves every step and,
once ``wait()`` said a step is durable, appends it to ``--log`` itself (O_APPEND): what the
task was told is safe, counted by the task, not by hpcml's own records.

    python tests/ckpt/task.py DIR [--steps N] [--at STEP] [--size-mb X] [--rate R] [--keep K]
        [--log FILE] [--hold] [--take-over] [--die-after-old-rename] [--object-store s3://BUCKET/PREFIX]

--at STEP saves that one step (again, if it is committed) and exits; --hold prints "ready"
after opening the directory and waits for a line on stdin before saving;
--die-after-old-rename kills the process with SIGKILL right after a re-save moved the
committed step aside (the moment between the two renames).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import numpy as np

from hpcml.ckpt import Checkpointer, checkpointer
from hpcml.errors import HpcmlError


def _die_after_old_rename() -> None:
    real = os.rename

    def rename(src, dst) -> None:
        real(src, dst)
        if os.path.basename(dst).startswith(".old-step-"):
            os.kill(os.getpid(), signal.SIGKILL)
    checkpointer.os.rename = rename           # type: ignore[assignment]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=10**6)
    ap.add_argument("--at", type=int)
    ap.add_argument("--size-mb", type=float, default=1)
    ap.add_argument("--rate", default="0")
    ap.add_argument("--keep", type=int, default=2)
    ap.add_argument("--log")
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--take-over", action="store_true")
    ap.add_argument("--die-after-old-rename", action="store_true")
    ap.add_argument("--object-store")
    args = ap.parse_args()
    if args.die_after_old_rename:
        _die_after_old_rename()
    try:
        ck = Checkpointer(args.dir, keep=args.keep, max_write_rate=args.rate, take_over=args.take_over,
                          object_store=args.object_store)
    except HpcmlError as exc:
        print(f"refused: {exc}", flush=True)
        return 2
    w = np.zeros(int(args.size_mb * (1 << 20) / 8))
    state, start = ck.load_latest()
    start = start or 0
    print(f"resumed at {start}", flush=True)
    if args.hold:
        print("ready", flush=True)
        sys.stdin.readline()
    steps = [args.at] if args.at is not None else range(start + 1, args.steps + 1)
    for s in steps:
        w[:] = s
        try:
            ck.save({"w": w, "step": s}, s)
            ck.wait()
        except HpcmlError as exc:
            print(f"refused: {exc}", flush=True)
            return 3
        if args.log:
            fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(fd, f"{s}\n".encode())
            os.close(fd)
    ck.close()
    print(f"done at {steps[-1]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
