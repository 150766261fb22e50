"""Whose GPU each recorded GPU row is: the ranks that used that GPU, as the GPU saw it.

A rank's recorder writes the rows of the GPUs it sampled, and on a node where GPUs are not
bound to ranks one task samples them all (``hpcml.samplers.claim``): the recorder's rank is
not the GPU's user. A recorded GPU (the recording rank, the GPU's NVML index) is credited to

- the ranks whose own recorder saw their processes on it (``gpus_used`` in their metadata,
  ``hpcml.samplers.gpuuse``): the same GPU UUID, or, where either side has none, the same
  node and NVML index;
- the recording rank itself where it could see that GPU only (``gpuuse.one_gpu``: bound to
  one, or one visible on its node), or it ran alone on its node: its launcher said so
  (``gpuuse.ALONE_KEY``), or it is the only rank the job's metadata places there, every
  rank's metadata read (``complete``).

A rank none of whose GPUs is proven has an unknown GPU: its throttling is unknown, never the
recorder's and never 0. The report (``hpcml.observe.report``) applies this; the live watch
gets each rank's own share from its heartbeat, which its recorder counts by the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hpcml.samplers.gpuuse import UsedGpu, owns_sampled


@dataclass(frozen=True)
class Owners:
    """``by_pair``: (recording rank, NVML index) -> the ranks proven to use that GPU;
    ``named``: rank -> the GPUs its processes were seen on (NVML indices, as text), where
    they were."""

    by_pair: dict[tuple[int, int], tuple[int, ...]]
    named: dict[int, list[str]]


def _meta(meta_ranks: Mapping[str, Any], rank: int) -> Mapping[str, Any]:
    m = meta_ranks.get(str(rank))
    return m if isinstance(m, Mapping) else {}


def owners(meta_ranks: Mapping[str, Any], pairs: Iterable[tuple[int, int]], complete: bool = False) -> Owners:
    """Who used each recorded GPU (``pairs``: (recording rank, NVML index), -1 where a row
    names no GPU). One pass over the ranks' ``gpus_used``, by UUID and by (node, index).
    ``complete``: every rank's metadata is in ``meta_ranks``, so a node it names once had
    one rank."""
    by_uuid: dict[str, list[int]] = {}
    by_place: dict[tuple[str, int], list[tuple[int, str | None]]] = {}     # (node, index) -> (rank, its UUID)
    named: dict[int, list[str]] = {}
    per_node: dict[str, int] = {}
    for key in meta_ranks:
        node = _meta(meta_ranks, int(key)).get("node") if str(key).isdigit() else None
        if isinstance(node, str):
            per_node[node] = per_node.get(node, 0) + 1
    for key in meta_ranks:
        if not str(key).isdigit():
            continue
        rank = int(key)
        meta = _meta(meta_ranks, rank)
        used = UsedGpu.from_meta(meta)
        if not used:
            continue
        named[rank] = [str(g.index) for g in used]
        node = meta.get("node")
        for g in used:
            if g.uuid:
                by_uuid.setdefault(g.uuid, []).append(rank)
            if isinstance(node, str):
                by_place.setdefault((node, g.index), []).append((rank, g.uuid))
    out: dict[tuple[int, int], tuple[int, ...]] = {}
    for q, index in pairs:
        meta = _meta(meta_ranks, q)
        alone = complete and isinstance(meta.get("node"), str) and per_node.get(meta["node"]) == 1
        users: list[int] = [q] if owns_sampled(meta) or alone else []
        uuids = meta.get("gpu_uuids")
        uuid = uuids.get(str(index)) if isinstance(uuids, Mapping) and index >= 0 else None
        node = meta.get("node")
        here = by_place.get((node, index), []) if isinstance(node, str) and index >= 0 else []
        if isinstance(uuid, str) and uuid:           # the same GPU by its UUID; by its place where a user named none
            users += by_uuid.get(uuid, []) + [r for r, theirs in here if theirs is None]
        else:
            users += [r for r, _ in here]
        out[(q, index)] = tuple(sorted(set(users)))
    return Owners(by_pair=out, named=named)
