"""A user's DDP training script for the per-rank checkpoint tests: docs/ckpt.md's recipe
"DDP with a data loader" as it stands there (replicated model and optimizer, each rank's
ShardLoader position and RNG state its own), over gloo on CPU.

    RANK=r WORLD_SIZE=n MASTER_ADDR=... MASTER_PORT=... python tests/ckpt/ddp_task.py CKPT DATA LOG
        [--epochs E] [--every K | --every 0 (each epoch's last step)] [--crash-at STEP] [--workers W]

Each rank appends what it trained on at each step to ``LOG/rank-R.jsonl`` (step, epoch,
sample keys) itself, so the test counts what the user's code saw, not what hpcml says.
``--crash-at S`` kills every rank with its loader workers (SIGKILL to its process group:
start each rank in a session of its own) right after training step S, before its save.
Rank 0 writes the final weights to ``LOG/weights.json``. Prints "resumed at S"
and "done at S"; a refused load prints "refused: MESSAGE" and exits 2.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from hpcml.ckpt import Checkpointer, PerRank
from hpcml.data import ShardDataset
from hpcml.data.torchloader import ShardLoader
from hpcml.errors import HpcmlError


def features(batch) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([[len(j) % 7, len(j) % 11, len(j) % 13, 1.0] for j in batch["jpg"]])
    y = torch.tensor([[float(c)] for c in batch["cls"]])
    return x, y


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("data")
    ap.add_argument("log")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--crash-at", type=int)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.manual_seed(100 + dist.get_rank())             # each rank's own RNG from here on
    loader = ShardLoader(ShardDataset(args.data, seed=1234, block_bytes=60_000, window=3),
                         batch_size=8, num_workers=args.workers)
    epochs = args.epochs

    def train_step(batch) -> None:
        x, y = features(batch)
        x = x + 0 * torch.rand(1)                         # draws from this rank's RNG every step
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        log.write(json.dumps({"step": step, "epoch": epoch, "keys": list(batch["__key__"]),
                              "rng": torch.rand(1).item()}) + "\n")
        log.flush()
        if step == args.crash_at:
            os.killpg(0, signal.SIGKILL)

    # -- the recipe: docs/ckpt.md, "DDP: the model once, ..." (test_the_task_runs_the_documented_recipe)
    try:
        ck = Checkpointer(args.ckpt, every=args.every or len(loader), replicated=True, max_write_rate=None)
        state, step = ck.load_latest()                   # (None, None) on the first run
        step = step or 0
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            loader.load_state_dict(state["data"])        # this rank's own position
            if state["rng"] is not None:                 # None at another world size
                torch.set_rng_state(state["rng"])
    except HpcmlError as exc:
        print(f"refused: {exc}", flush=True)
        model = opt = None                               # see _teardown
        _teardown()
        return 2
    print(f"resumed at {step}", flush=True)
    log = open(os.path.join(args.log, f"rank-{dist.get_rank()}.jsonl"), "a")  # noqa: SIM115
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            step += 1
            train_step(batch)
            ck.maybe_save(lambda: {"model": model.state_dict(), "optim": opt.state_dict(),
                                   "data": loader.state_dict(),            # each rank's own, by itself
                                   "rng": PerRank(torch.get_rng_state(), on_resize="none")}, step)
            if ck.stopping:
                break
        if ck.stopping:
            break
    ck.wait()
    # ------------------------------------------------------------------------------------------
    if dist.get_rank() == 0:
        with open(os.path.join(args.log, "weights.json"), "w") as fh:
            json.dump([p.detach().double().flatten().tolist() for p in model.parameters()], fh)
    ck.close()
    print(f"done at {step}", flush=True)
    model = opt = None                                   # see _teardown
    _teardown()
    return 0


def _teardown() -> None:
    """torch 2.13's gloo aborts the process at exit ("terminate called without an active
    exception", exit -6) in about one run of three when a DDP module is still alive at
    destroy_process_group: the caller drops it first and it is collected here."""
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    # Even after _teardown, gloo's threads can still abort in C++ static destructors at
    # interpreter exit (seen once in a CI run: the refusal printed, then exit -6). What this
    # task proves ends with its last flushed line, so it leaves without running them.
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
