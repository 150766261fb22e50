"""The README's main job: a small PyTorch DDP training on CPU, on a packed dataset.

    hpcml run --ntasks 2 --vet examples/vet/cpu.yaml -- python examples/run/train_ddp.py

Rank 0 generates a regression dataset (32 features -> 1 target) as loose files the first
time, packs it with ``hpcml data pack`` into WebDataset shards, and every rank reads its
share with ``ShardLoader`` (exact resume, equal batches per rank). The model trains with
DistributedDataParallel over gloo; ``hpcml run`` provides MASTER_ADDR, MASTER_PORT, RANK
and WORLD_SIZE, so ``init_process_group()`` needs no arguments. Steps and the loss go to
``hpcml observe`` (the report's throughput and straggler sections).

``--fail-rank R --fail-step S`` makes rank R exit with code 3 at step S (the tests' crash).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hpcml import observe
from hpcml.data import ShardDataset
from hpcml.data.torchloader import ShardLoader

FEATURES = 32


def make_dataset(root: Path, samples: int) -> Path:
    """Loose files (``NNNNNN.x.npy`` + ``NNNNNN.y.txt``) packed into shards, once."""
    shards = root / "shards"
    if (shards / "manifest.json").is_file():
        return shards
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w = rng.normal(size=FEATURES)
    for i in range(samples):
        x = rng.normal(size=FEATURES).astype(np.float32)
        buf = io.BytesIO()
        np.save(buf, x)
        (raw / f"{i:06d}.x.npy").write_bytes(buf.getvalue())
        (raw / f"{i:06d}.y.txt").write_text(f"{float(x @ w) + 0.01 * rng.normal():.6f}")
    from hpcml.data.pack import pack
    pack(raw, shards, target_bytes=256 * 1024)
    return shards


def collate(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(np.stack([np.load(io.BytesIO(b)) for b in batch["x.npy"]]))
    y = torch.tensor([float(b) for b in batch["y.txt"]], dtype=torch.float32)
    return x, y


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("HPCML_EXAMPLE_DATA", "hpcml-example-data"))
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--fail-rank", type=int, default=-1)
    ap.add_argument("--fail-step", type=int, default=-1)
    args = ap.parse_args()
    dist.init_process_group("gloo")                       # env:// from hpcml run
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    if rank == 0:
        shards = make_dataset(Path(args.data), args.samples)
    dist.barrier()                                        # the shards exist for everyone now
    shards = Path(args.data) / "shards"
    loader = ShardLoader(ShardDataset(shards, seed=1234), batch_size=args.batch)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(),
                                                        torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step, loss = 0, torch.tensor(0.0)
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            t0 = time.perf_counter()
            with observe.section("step", step=step):
                with observe.section("dataload", step=step):
                    x, y = collate(batch)
                loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            if rank == args.fail_rank and step == args.fail_step:
                print(f"rank {rank}: injected failure at step {step}", file=sys.stderr, flush=True)
                observe.flush()
                os._exit(3)
            observe.log(step=step, loss=float(loss.detach()), samples_per_s=len(y) / (time.perf_counter() - t0))
            step += 1
    if rank == 0:
        print(f"trained {step} steps on {world} ranks, final loss {float(loss.detach()):.4f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
