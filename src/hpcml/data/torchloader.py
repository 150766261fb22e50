"""torch adapter: ``ShardDataset`` as an ``IterableDataset`` and a DataLoader that keeps
the resume position.

torch is an optional extra: without it this module still imports (so tools that list or
document hpcml's modules work), and ``ShardLoader`` says which install is missing.
torch's DataLoader takes batches from its workers round-robin, and ``ShardDataset.stream``
plans batch ``k`` on worker ``k % W``, so the loader delivers exactly the planned order and
counting delivered batches is enough to know every worker's position.
"""

from __future__ import annotations

import gc
from typing import Any, Iterator

from hpcml.data.reader import ShardDataset
from hpcml.errors import HpcmlError, UsageError

try:
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError:            # the optional extra is not installed: see ShardLoader
    DataLoader = None          # type: ignore[assignment,misc]
    IterableDataset = object   # type: ignore[assignment,misc]


class ShardIterable(IterableDataset):
    def __init__(self, ds: ShardDataset, batch_size: int) -> None:
        self.ds, self.batch_size = ds, batch_size

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is None:
            return self.ds.stream(0, 1, self.batch_size)
        # A loader worker is a fork of the training process: every sample dict would make
        # Python's collector walk the whole inherited heap (torch included; 10 % of a cold
        # pass's CPU here). Freezing what the worker inherited keeps it out of collections.
        gc.freeze()
        return self.ds.stream(info.id, info.num_workers, self.batch_size)


class ShardLoader:
    """A DataLoader over a ``ShardDataset`` with ``state_dict``/``load_state_dict``/``set_epoch``.

        loader = ShardLoader(ShardDataset("/scratch/ds", seed=1), batch_size=64, num_workers=4)
        loader.load_state_dict(ckpt["data"])          # optional: resume mid-epoch
        for epoch in range(loader.epoch, epochs):
            loader.set_epoch(epoch)
            for batch in loader: ...                  # ckpt["data"] = loader.state_dict()

    Every rank yields ``len(loader)`` batches. Extra keyword arguments go to DataLoader;
    ``persistent_workers`` (workers would keep the previous epoch's plan) and
    ``in_order=False`` (batches out of order, so no exact resume) are refused.
    """

    def __init__(self, ds: ShardDataset, batch_size: int, num_workers: int = 0, **kwargs: Any) -> None:
        if DataLoader is None:
            raise HpcmlError("ShardLoader needs torch: pip install 'hpcml[torch]' "
                             "(ShardDataset iterates without it)")
        if kwargs.get("persistent_workers"):
            raise UsageError("True would keep the previous epoch's order", key="persistent_workers")
        if kwargs.get("in_order") is False:
            raise UsageError("False delivers batches out of the planned order: no exact resume", key="in_order")
        self.ds, self.batch_size, self.num_workers = ds, batch_size, num_workers
        self.kwargs = kwargs

    def __len__(self) -> int:
        n = len(self.ds)
        return -(-n // self.batch_size) if n else 0

    @property
    def epoch(self) -> int:
        """The epoch it reads (after ``load_state_dict``: the state's, where a loop resumes)."""
        return self.ds.epoch

    def set_epoch(self, epoch: int) -> None:
        self.ds.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.ds.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Resume where ``state`` was taken; mid-epoch with the same workers and batch size
        (refused here, at once, otherwise)."""
        self.ds.load_state_dict(state)
        problem = self.ds.resume_problem(self.num_workers, self.batch_size)
        if problem is not None:
            raise problem

    def __iter__(self) -> Iterator[Any]:
        ds, batch = self.ds, self.batch_size
        ds.begin(self.num_workers, batch)
        n = len(ds)
        kwargs = dict(self.kwargs)
        if "generator" not in kwargs:
            # DataLoader draws its workers' base seed from the global RNG at every iter():
            # a resume mid-epoch would draw once more than the run it continues and shift
            # the training's own random stream. The order is planned; no draw is needed.
            import torch
            kwargs["generator"] = torch.Generator()
        loader = DataLoader(ShardIterable(ds, batch), batch_size=batch, num_workers=self.num_workers, **kwargs)
        for item in loader:
            ds.position = min(ds.position + batch, n)
            yield item
        ds.position = n
