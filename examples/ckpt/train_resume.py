"""A training loop that checkpoints with hpcml.ckpt and resumes where it stopped.

    python examples/ckpt/train_resume.py CKPT_DIR --steps 200 [--size-mb 2] [--rate "50 MB/s"] [--every 1]
        [--local DIR] [--requeue] [--torch] [--step-sleep 0.01]

Every step writes the step number into the whole state (a numpy array, or torch tensors
and an optimizer with --torch, then DDP when WORLD_SIZE > 1), so a loaded checkpoint shows
at once whether it is complete and which step it holds. On SIGUSR1/SIGTERM (Slurm's
``--signal=USR1@300``, preemption) it saves a final checkpoint, requeues the job with
--requeue, and exits 0. Prints "resumed at STEP" and "stopped at STEP" / "done at STEP".
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from hpcml.ckpt import Checkpointer
from hpcml.errors import HpcmlError


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--size-mb", type=float, default=2)
    ap.add_argument("--rate", default="50 MB/s")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--local")
    ap.add_argument("--requeue", action="store_true")
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--step-sleep", type=float, default=0.0)
    args = ap.parse_args()
    n = int(args.size_mb * (1 << 20) / 8)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.torch:
        import torch
        import torch.distributed as dist
        if world > 1:
            dist.init_process_group("gloo")
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        w = torch.zeros(n, dtype=torch.float64)
    else:
        w = np.zeros(n)
    ck = Checkpointer(args.dir, every=args.every, keep=3, local_dir=args.local, max_write_rate=args.rate,
                      requeue=args.requeue)
    state, step = ck.load_latest()
    start = 0
    if state is not None:
        assert int(state["step"]) == step and float(state["w"][0]) == step and float(state["w"][-1]) == step
        w[:] = state["w"]
        start = step
        if args.torch:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
    print(f"resumed at {start}", flush=True)
    rank = ck.rank
    for s in range(start + 1, args.steps + 1):
        w[:] = s
        if args.step_sleep:
            time.sleep(args.step_sleep)
        st = {"step": s, "w": w, "rank": rank}
        if args.torch:
            st.update(model=model.state_dict(), optim=opt.state_dict())
        ck.maybe_save(st, s)
        if ck.stopping:
            print(f"stopped at {s} ({ck.stop_signal})", flush=True)
            return
    ck.wait()
    print(f"done at {args.steps}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except HpcmlError as exc:          # e.g. the directory in use by another job: one line, exit 2
        print(f"train_resume: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
