"""A training loop as Karpathy's nanoGPT ``train.py`` writes it (no hpcml in it): DDP over gloo
on CPU, ``iter_num`` from 0, every EVAL iterations rank 0 (``master_process``) evaluates,
prints ``step N: train loss ...`` and saves ``ckpt.pt`` (model, optimizer, ``iter_num``) in
OUT with ``torch.save``; it resumes from that file when it exists (``init_from='resume'``),
at the saved ``iter_num``, which it then does again. Every LOG iterations rank 0 prints
``iter N: loss X, time Yms`` after the step, nanoGPT's line (tests/run/test_printed_steps.py).

Each iteration is appended to LEDGER after its optimizer step (attempt, rank, iter_num,
epoch seconds: O_APPEND, the script's own ledger); each rank writes its pid to
PIDS/rank-R so that a test can stop, kill or pin it from outside. BUSY_S: CPU seconds of
compute per iteration (a busy loop: it takes longer where the CPU is shared). On the first attempt rank
HOLD_RANK sleeps HOLD_S seconds after iteration HOLD_AT (a rank that stops answering).
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

OUT = os.environ["OUT"]
ITERS = int(os.environ.get("ITERS", "20"))
EVAL = int(os.environ.get("EVAL", "5"))
LOG = int(os.environ.get("LOG", "1"))
STEP_S = float(os.environ.get("STEP_S", "0.1"))
BUSY_S = float(os.environ.get("BUSY_S", "0"))     # CPU seconds of compute per iteration (a busy loop)
HOLD_RANK = int(os.environ.get("HOLD_RANK", "-1"))
HOLD_AT = int(os.environ.get("HOLD_AT", "-1"))
HOLD_S = float(os.environ.get("HOLD_S", "0"))
ATTEMPT = os.environ.get("HPCML_RUN_ATTEMPT", "0")


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    master_process = rank == 0
    if os.environ.get("PIDS"):
        with open(os.path.join(os.environ["PIDS"], f"rank-{rank}"), "w") as f:
            f.write(str(os.getpid()))
    torch.manual_seed(1337)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt_path = os.path.join(OUT, "ckpt.pt")
    iter_num = 0
    if os.path.exists(ckpt_path):                      # init_from == 'resume'
        checkpoint = torch.load(ckpt_path, map_location="cpu")
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        iter_num = checkpoint["iter_num"]
    model = DistributedDataParallel(model)
    x = torch.randn(32, 8)
    t0 = time.time()
    while iter_num < ITERS:
        if iter_num % EVAL == 0 and master_process:
            loss = model.module(x).pow(2).mean().item()
            print(f"step {iter_num}: train loss {loss:.4f}, val loss {loss:.4f}")
            if iter_num > 0:
                print(f"saving checkpoint to {OUT}")
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                            "iter_num": iter_num}, ckpt_path)
        time.sleep(STEP_S)                             # the forward and backward of a real model
        until = time.thread_time() + BUSY_S
        while time.thread_time() < until:              # ... or its CPU work: slower on a busy CPU
            pass
        loss = model(x).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{ATTEMPT} {rank} {iter_num} {time.time():.6f}\n".encode())
        os.close(fd)
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % LOG == 0 and master_process:
            print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms, mfu -100.00%")
        if ATTEMPT == "0" and rank == HOLD_RANK and iter_num == HOLD_AT:
            time.sleep(HOLD_S)
        iter_num += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
