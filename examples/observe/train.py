"""A small CPU training loop instrumented with hpcml.observe (numpy linear regression).

    srun hpcml observe record --dir obs -- python examples/observe/train.py --steps 200

``--slow-rank`` makes one rank compute slower (a straggler), ``--kill-recorder-rank``
makes one rank SIGKILL its recorder mid-run (to show the store survives it).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import struct
import termios
import time

import numpy as np

from hpcml import observe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-factor", type=float, default=3.0)
    ap.add_argument("--kill-recorder-rank", type=int, default=-1)
    ap.add_argument("--kill-at", type=int, default=-1)
    args = ap.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))
    rng = np.random.default_rng(rank)
    true_w = np.arange(32, dtype=np.float64)
    w = np.zeros(32)
    for step in range(args.steps):
        with observe.section("step", step=step):
            with observe.section("dataload", step=step):
                x = rng.normal(size=(args.batch, 32))
                y = x @ true_w + rng.normal(scale=0.1, size=args.batch)
            with observe.section("compute", step=step):
                t0 = time.perf_counter()
                grad = 2 * x.T @ (x @ w - y) / args.batch
                w -= 0.01 * grad
                time.sleep(0.02)                      # stands in for the model's forward/backward
                if rank == args.slow_rank:
                    time.sleep((time.perf_counter() - t0) * (args.slow_factor - 1))
        loss = float(np.mean((x @ w - y) ** 2))
        observe.log(step=step, loss=loss, samples_per_s=args.batch / max(time.perf_counter() - t0, 1e-9))
        if rank == args.kill_recorder_rank and step == args.kill_at:
            observe.flush()
            _drained()
            os.kill(os.getppid(), signal.SIGKILL)       # the recorder dies as if OOM-killed


def _drained(limit_s: float = 60.0) -> None:
    """Wait until the recorder has read what this rank wrote into its pipe, so the kill
    lands after a known step (on a loaded machine the recorder can lag the loop by seconds;
    the kill then cut a random, sometimes tiny, part of the run)."""
    fd = os.environ.get("HPCML_OBSERVE_FD", "")
    if not fd.isdigit():
        return
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        unread = struct.unpack("i", fcntl.ioctl(int(fd), termios.FIONREAD, b"\0\0\0\0"))[0]
        if unread == 0:
            break
        time.sleep(0.02)
    time.sleep(0.2)             # the batch read last is written to the rank file right after


if __name__ == "__main__":
    main()
