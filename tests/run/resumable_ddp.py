"""A deterministic DDP job (gloo, CPU) that checkpoints with hpcml.ckpt and resumes with
``load_latest``, for the recovery tests: the final model must be bitwise a fault-free run's.

Data and initial weights come from seeds (the step and rank choose the batch), the optimiser
state is in the checkpoint (replicated: rank 0 writes it, any world size loads it), and the
gloo sum of 2 ranks is exact in any order, so a run resumed from step 20 or 30 ends with the
same weights as one that never stopped.

FAULT (at step FAULT_STEP, in the attempts FAULT_ATTEMPTS, default "0"; "all" for every one):
``crash`` exits 3 on the rank on node FAULT_NODE (SLURMD_NODENAME; without Slurm, rank
FAULT_RANK); ``hang`` sleeps there forever before the all_reduce. STEP_S: seconds a step
takes (STEP_S_AFTER in the later attempts). Every step a rank completed is appended
to DONE (O_APPEND, one line "attempt rank step time"); rank 0 writes the final weights to OUT.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

from hpcml import observe
from hpcml.ckpt import Checkpointer

STEPS = int(os.environ.get("STEPS", "50"))
EVERY = int(os.environ.get("EVERY", "10"))
ATTEMPT = int(os.environ.get("HPCML_RUN_ATTEMPT", "0"))
STEP_S = float(os.environ.get("STEP_S" if ATTEMPT == 0 else "STEP_S_AFTER", os.environ.get("STEP_S", "0.02")))
FAULT = os.environ.get("FAULT", "")
FAULT_STEP = int(os.environ.get("FAULT_STEP", "30"))
ATTEMPTS = os.environ.get("FAULT_ATTEMPTS", "0")


def faulty(rank: int) -> bool:
    if ATTEMPTS != "all" and str(ATTEMPT) not in ATTEMPTS.split(","):
        return False
    if "FAULT_NODE" in os.environ:
        return os.environ.get("SLURMD_NODENAME") == os.environ["FAULT_NODE"]
    return rank == int(os.environ.get("FAULT_RANK", "1"))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ck = Checkpointer(os.environ["CKPT"], every=EVERY, keep=2, replicated=True)   # DDP: the same on every rank
    state, last = ck.load_latest()
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = last + 1
    for step in range(start, STEPS):
        if step == FAULT_STEP:
            if FAULT == "crash" and faulty(rank):
                print(f"injected crash at step {step}", file=sys.stderr, flush=True)
                os._exit(3)
            if FAULT == "hang" and faulty(rank):
                time.sleep(1e6)  # culprit:hang
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        with observe.section("step", step=step):
            time.sleep(STEP_S)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            opt.step()
        observe.log(step=step, loss=0.0)
        fd = os.open(os.environ["DONE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{ATTEMPT} {rank} {step} {time.time():.3f}\n".encode())
        os.close(fd)
        ck.maybe_save(lambda: {"model": model.state_dict(), "opt": opt.state_dict()}, step)
    ck.wait()
    ck.close()
    if rank == 0:
        torch.save(model.state_dict(), os.environ["OUT"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch's native teardown after gloo can abort a finished rank ("terminate called without
    # an active exception", exit 134; seen once in ~2,100 CI tests under load): the work is
    # done and saved, so run Python's exit handlers (observe's flush) and leave without it
    import atexit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
