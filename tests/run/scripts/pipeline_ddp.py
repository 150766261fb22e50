"""A pipeline-parallel job over gloo that never imports hpcml: 4 ranks as 2 replicas of a
2-stage pipeline (stage = rank % 2, replica = rank // 2), as Megatron-style PP x DP lays
them out. Each step: stage 0 runs its layer forward and sends the activations to stage 1
(``dist.send``), which receives them, runs forward and backward and sends the gradient back;
stage 0 receives it and runs its backward; then each stage all-reduces its gradients with
the same stage of the other replica (a group of its own) and steps its optimizer.

STEPS steps, STEP_S seconds of compute per stage and pass; SLOW_RANK computes SLOW times as
long."""

import os
import time

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("STEPS", "100"))
STEP_S = float(os.environ.get("STEP_S", "0.02"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW = float(os.environ.get("SLOW", "3"))
WIDTH = 16


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world % 2 == 0, "2 stages a replica"
    stage = rank % 2
    peers = {s: dist.new_group([r for r in range(world) if r % 2 == s]) for s in (0, 1)}   # every rank makes both
    layer = torch.nn.Linear(WIDTH, WIDTH)
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    compute = STEP_S * (SLOW if rank == SLOW_RANK else 1.0)
    x = torch.randn(8, WIDTH)
    for _ in range(STEPS):
        if stage == 0:
            time.sleep(compute)                                   # forward
            act = layer(x)
            dist.send(act.detach(), rank + 1)
            grad = torch.empty_like(act)
            dist.recv(grad, rank + 1)
            time.sleep(compute)                                   # backward
            act.backward(grad)
        else:
            act = torch.empty(8, WIDTH)
            dist.recv(act, rank - 1)
            act.requires_grad_(True)
            time.sleep(2 * compute)                               # forward and backward
            layer(act).square().mean().backward()
            dist.send(act.grad, rank - 1)
        for p in layer.parameters():
            dist.all_reduce(p.grad, group=peers[stage])
            p.grad /= world // 2
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
    print(f"rank {rank} (stage {stage}): {STEPS} steps", flush=True)


if __name__ == "__main__":
    main()
