"""All-reduce bus bandwidth across the allocation with torch.distributed (NCCL on GPUs,
gloo on CPUs).

Ranks meet through a ``FileStore`` in the vetting run's shared directory, never on a
fixed TCP port (vetnode's 29500 is also PyTorch's default, so it collides with the job).
Bus bandwidth follows nccl-tests' definition so numbers compare with theirs:
all-reduce ``busbw = size / time * 2 (n - 1) / n``.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hpcml.unit_fields import Bytes, Rate, Seconds
from hpcml.units import fmt_rate
from hpcml.vet.checks.base import Check, CheckReport, MissingDependency, judge, skipped


class Warmup(BaseModel):
    model_config = ConfigDict(extra="forbid")
    payload: Bytes = 2**20
    runs: int = Field(default=1, ge=0)


class CollectiveParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    payload: Bytes = 32 * 2**20
    iterations: int = Field(5, ge=1)
    warmup: Warmup = Warmup()
    method: Literal["allreduce", "broadcast", "allgather"] = "allreduce"
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    min_bandwidth: Rate | None = None
    join_timeout: Seconds = 30.0
    #: "intranode" (vetnode's GPU-to-GPU test inside one node) is not implemented yet
    topology: Literal["full", "internode", "intranode"] = "full"
    #: below its threshold on two or more nodes: find the slow nodes (hpcml.vet.culprit)
    culprit_search: bool = True
    culprit_rounds: int | None = Field(None, ge=1)  # default 2 + ceil(log2 nodes)


_BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "broadcast": lambda n: 1.0,
               "allgather": lambda n: (n - 1) / n}


def _test_slowdown(node: str) -> float | None:
    """Test-only, for the culprit search's tests: when HPCML_VET_TEST_SLOW_NODES is set,
    the nodes it lists (comma-separated) make each op HPCML_VET_TEST_SLOW_FACTOR times
    slower (default 10); None when it is not set."""
    listed = os.environ.get("HPCML_VET_TEST_SLOW_NODES")
    if listed is None:
        return None
    if node not in listed.split(","):
        return 1.0
    return float(os.environ.get("HPCML_VET_TEST_SLOW_FACTOR", "10"))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _op(dist, method: str, tensor, world: int):
    if method == "allreduce":
        dist.all_reduce(tensor)
    elif method == "broadcast":
        dist.broadcast(tensor, src=0)
    else:
        out = [tensor.new_empty(tensor.shape) for _ in range(world)]
        dist.all_gather(out, tensor)


class CollectiveCheck(Check[CollectiveParams]):
    scope = "allocation"
    default_timeout = 120.0
    exclusive = True

    def run(self) -> CheckReport:
        world = len(self.ctx.nodes)
        if self.params.topology == "intranode":
            return self._intranode()
        if world < 2:
            return skipped("one node: no collective across nodes to measure")
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            raise MissingDependency("torch is needed for the collective check "
                                    "(run `hpcml vet setup`)") from None
        p = self.params
        cuda = torch.cuda.is_available()
        backend = ("nccl" if cuda else "gloo") if p.backend == "auto" else p.backend
        device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
        store_path = os.path.join(self.ctx.workdir or ".", f"collective-{self.ctx.extra.get('name', 'c')}.store")
        store = dist.FileStore(store_path, world)
        dist.init_process_group(backend, store=store, rank=self.ctx.rank, world_size=world,
                                timeout=datetime.timedelta(seconds=p.join_timeout))
        try:
            sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
            warm = torch.ones(max(1, int(p.warmup.payload) // 4), dtype=torch.float32, device=device)
            for _ in range(p.warmup.runs):
                _op(dist, p.method, warm, world)
            tensor = torch.ones(max(1, int(p.payload) // 4), dtype=torch.float32, device=device)
            dist.barrier()
            sync()
            delay, factor = 0.0, _test_slowdown(self.ctx.node)
            if factor is not None:  # every rank runs this op, so the collectives stay matched
                t = time.perf_counter()
                _op(dist, p.method, tensor, world)
                sync()
                delay = (factor - 1) * (time.perf_counter() - t)
            start = time.perf_counter()
            for _ in range(p.iterations):
                time.sleep(max(0.0, delay))
                _op(dist, p.method, tensor, world)
            sync()
            elapsed = (time.perf_counter() - start) / p.iterations
            probe = torch.full((1024,), float(self.ctx.rank + 1), device=device)
            dist.all_reduce(probe)
            expected = world * (world + 1) / 2
            got = float(probe[0].item())
            if abs(got - expected) > 1e-6 * expected:
                return judge(False, None, threshold="correct sum",
                             message=f"all-reduce gave {got}, expected {expected}")
        finally:
            dist.destroy_process_group()
        size = tensor.numel() * 4
        busbw = size / elapsed * _BUS_FACTOR[p.method](world)
        limit = f">= {fmt_rate(p.min_bandwidth)}" if p.min_bandwidth else "completes"
        ok = p.min_bandwidth is None or busbw >= p.min_bandwidth
        return judge(ok, round(busbw / 1e9, 4), threshold=limit, unit="GB/s",
                     message=f"{p.method} of {size / 2**20:.0f} MiB over {world} nodes "
                             f"({backend}): busbw {fmt_rate(busbw)}",
                     backend=backend, time_per_op=elapsed)

    def _intranode(self) -> CheckReport:
        if not _cuda_available():
            if self.ctx.require_gpus:
                return judge(False, None, threshold="GPUs present", message="no GPU visible to torch")
            return skipped("no GPU: the intranode all-reduce measures GPUs within a node")
        raise NotImplementedError("the intranode (GPU-to-GPU within a node) all-reduce "
                                  "is not implemented yet")
