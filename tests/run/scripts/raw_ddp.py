"""A plain DDP training loop (gloo, CPU) that never imports hpcml: what ``hpcml run`` must
see without a script change (tests/run/test_inject_progress.py).

STEPS optimizer steps of ACCUM micro-batches each; beside the model's optimizer a second one
steps every iteration (a GAN's two: not twice the steps); STEP_S seconds of compute each.
Steps that are not the rank's: a DataLoader worker (forked) and a subprocess that inherits
every descriptor each step an optimizer of their own.
WORK loop turns of pure CPU work an iteration besides (a rank whose CPU is shared takes
longer). SLOW_RANK computes SLOW times as long (SLOW_IN=input: its DataLoader worker takes
the extra time to produce the batches, its main process waits for them). STUCK_RANK blocks
forever after STUCK_AFTER steps (the line ends in ``# culprit``). OWN=1: the script logs its
own steps through hpcml.observe, numbered from 1000.
"""

import os
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("STEPS", "6"))
ACCUM = int(os.environ.get("ACCUM", "2"))
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_AFTER = int(os.environ.get("STUCK_AFTER", "3"))
OWN = os.environ.get("OWN") == "1"
STEP_S = float(os.environ.get("STEP_S", "0"))       # the compute of an iteration
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))  # computes SLOW times as long: a slow node
SLOW = float(os.environ.get("SLOW", "2"))
SLOW_IN = os.environ.get("SLOW_IN", "compute")     # or "input": the slow rank's data loading is slow
WORK = int(os.environ.get("WORK", "0"))            # a fixed amount of CPU work an iteration (loop turns), slowed by a busy CPU
ELSEWHERE = "import torch\np = torch.zeros(1, requires_grad=True)\no = torch.optim.SGD([p], lr=0.1)\nfor _ in range(5):\n    o.step()\n"


class Data(torch.utils.data.Dataset):
    """Each item steps an optimizer of the worker's own: a forked child's steps."""

    def __len__(self) -> int:
        return 1 << 20

    def __init__(self, late_s: float = 0.0) -> None:
        self.late_s = late_s                          # each item's extra time to read (a slow input)

    def __getitem__(self, i: int):
        if self.late_s:
            time.sleep(self.late_s)
        p = torch.zeros(1, requires_grad=True)
        torch.optim.SGD([p], lr=0.1).step()
        return torch.full((4,), float(i % 7))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        subprocess.run([sys.executable, "-c", ELSEWHERE], check=True, close_fds=False)   # it has the recorder's pipe
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    other = torch.nn.Linear(4, 1)                     # a GAN's second network, not synchronised
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt_other = torch.optim.Adam(other.parameters(), lr=0.01)
    slow_input = rank == SLOW_RANK and SLOW_IN == "input"
    late = STEP_S * (SLOW - 1) / (ACCUM * 2) if slow_input else 0.0          # 2 items a micro-batch
    loader = iter(torch.utils.data.DataLoader(Data(late), batch_size=2, num_workers=1))
    if OWN:
        from hpcml import observe
    for step in range(STEPS):
        if rank == STUCK_RANK and step == STUCK_AFTER:
            threading.Event().wait()  # culprit
        time.sleep(STEP_S * (SLOW if rank == SLOW_RANK and not slow_input else 1))
        busy = 0
        for i in range(WORK):                         # the CPU's work: as long as the CPU is shared
            busy += i
        for _ in range(ACCUM):
            x = next(loader)
            model(x).sum().backward()
        if OWN:
            with observe.section("step", step=1000 + step):
                opt.step()
        else:
            opt.step()
        opt.zero_grad()
        other(x).sum().backward()
        opt_other.step()
        opt_other.zero_grad()
    dist.destroy_process_group()
    print(f"rank {rank}: {STEPS} optimizer steps", flush=True)


if __name__ == "__main__":
    main()
