"""A DDP job (gloo, CPU) where one rank goes wrong at step 30, for the watch's tests.

FAULT: ``collective`` sleeps forever before its all_reduce; ``loader`` sleeps forever in the
dataset's ``__getitem__``; ``gil`` spins in a C call that holds the GIL (libc's ``sleep``
through ``ctypes.PyDLL``, which does not release it); ``exit`` exits 1; ``slow`` makes the
rank 2x slower from step 30; ``pause`` pauses every rank for PAUSE seconds at step 30
inside a section (an evaluation). Each line a culprit must be named on ends in a
``# culprit:KIND`` comment the tests look up.
"""

import ctypes
import os
import sys
import time

import torch
import torch.distributed as dist

from hpcml import observe

FAULT = os.environ.get("FAULT", "")
BAD = int(os.environ.get("BAD_RANK", "1"))
STEPS = int(os.environ.get("STEPS", "60"))
STEP_S = float(os.environ.get("STEP_S", "0.02"))


class Data(torch.utils.data.Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        if FAULT == "loader" and self.rank == BAD and i == 30:
            time.sleep(1e6)  # culprit:loader
        return torch.ones(4)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = iter(torch.utils.data.DataLoader(Data(rank), batch_size=1, num_workers=0))
    x = torch.ones(1000)
    for step in range(STEPS):
        next(loader)
        if rank == BAD and step == 30:
            if FAULT == "collective":
                time.sleep(1e6)  # culprit:collective
            if FAULT == "gil":
                ctypes.PyDLL(None).sleep(1000000)  # culprit:gil
            if FAULT == "exit":
                print("injected crash at step 30", file=sys.stderr, flush=True)
                sys.exit(1)
        if FAULT == "pause" and step == 30:
            with observe.section("evaluate", step=step):
                time.sleep(float(os.environ.get("PAUSE", "3")))
        with observe.section("step", step=step):       # the rank's own work: what stragglers differ in
            time.sleep(STEP_S * (2 if FAULT == "slow" and rank == BAD and step >= 30 else 1))
        dist.all_reduce(x)
        observe.log(step=step, loss=1.0)
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
