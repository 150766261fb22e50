"""A checkpoint read outside the job that wrote it: one process, no Slurm, no
torch.distributed, no ``HPCML_CKPT_TOKEN``.

``Checkpointer.load_latest`` is the job's resume path: each rank loads its own shard of a
checkpoint of the job's own world size, and the ranks agree on which one. An evaluation, an
export or a look at rank 3's optimizer state comes afterwards, in one process, so it names
the step and the shard. The checks are the resume path's: the manifest key by key, every
shard's size, the chosen shard's crc32, pickled leaves through the scan's restricted loader.
Shards are not merged: how a sharded state splits (FSDP, ZeRO, the user's own) is the
training code's, and a shard records none of it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hpcml.ckpt import layout
from hpcml.ckpt.flatten import unflatten
from hpcml.ckpt.layout import CheckpointError
from hpcml.errors import HpcmlError, UsageError


def find(path: str | os.PathLike, step: int | None = None) -> layout.Found:
    """The committed checkpoint at ``path``: a step directory (``DIR/step-00000020``, also
    one copied elsewhere), or a checkpoint directory and ``step`` (default: the newest)."""
    p = Path(path)
    if not p.is_dir():
        raise UsageError("no such checkpoint directory", file=str(p))
    if (p / layout.MANIFEST).is_file() and not layout.is_checkpoint_dir(p):
        doc = layout.read_json(p / layout.MANIFEST, layout.TAG)
        found = layout.Found(doc["step"] if type(doc.get("step")) is int else -1, p, True)
        layout.read_manifest(found)
        if step is not None and found.step != step:
            raise UsageError(f"holds step {found.step}, not {step}", file=str(p / layout.MANIFEST), key="step")
        return found
    committed = [f for f in layout.scan(p) if f.committed]
    if not committed:
        raise UsageError("no committed checkpoint (step-*/) here", file=str(p))
    if step is None:
        return committed[-1]
    for f in committed:
        if f.step == step:
            return f
    raise UsageError(f"no committed checkpoint of step {step}; steps here: "
                     f"{', '.join(str(f.step) for f in committed[-8:])}", file=str(p))


def shard_of(found: layout.Found, rank: int | None) -> int:
    """Which shard holds ``rank``'s state: rank 0's for a replicated checkpoint (every rank
    loaded it), the rank's own for a sharded one, which must then be named."""
    if found.problems or not found.manifest:
        raise CheckpointError(f"{found.path}: {'; '.join(found.problems) or 'no manifest'}")
    man, source = found.manifest, str(found.path / layout.MANIFEST)
    world = man["world_size"]
    if rank is not None and not 0 <= rank < world:
        raise UsageError(f"no rank {rank}: {source} has ranks 0 to {world - 1}", key="rank")
    if man["replicated"]:
        return 0
    if rank is None:
        if world == 1:
            return 0
        raise UsageError(f"{source}: a sharded checkpoint of world size {world}; name the shard to load, "
                         f"rank 0 to {world - 1} (the shards are not merged: how the state was split is the "
                         "training code's)", key="rank")
    return rank


def check(found: layout.Found, rank: int) -> None:
    """The resume path's checks: every shard's size, then ``rank``'s shard's crc32."""
    assert found.manifest is not None
    problems = layout.verify(found, [r for r in map(int, found.manifest["ranks"]) if r != rank], checksums=False)
    problems = problems or layout.verify(found, [rank])
    if problems:
        raise CheckpointError(problems[0])


def read_state(directory: Path, rank: int, map_location: Any = "cpu", policy: Any = None) -> Any:
    """Rebuild one shard's state from its index and bytes (checked by the caller)."""
    bin_name, json_name = layout.shard_names(rank)
    shard = layout.read_json(directory / json_name, layout.SHARD_TAG)
    with open(directory / bin_name, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        if shard.get("size") != size:          # before allocating what the index says: 1 TB is not read
            raise CheckpointError(f"{directory / json_name}: key 'size': {shard.get('size')!r}, "
                                  f"the shard has {size} bytes")
        buf = bytearray(size)
        got = fh.readinto(buf)
    if got != size:
        raise CheckpointError(f"{directory / bin_name}: {got} bytes, expected {size}")
    try:
        return unflatten(shard["skeleton"], shard["entries"], memoryview(buf), source=str(directory / bin_name),
                         map_location=map_location, policy=policy)
    except HpcmlError:
        raise
    except Exception as exc:  # noqa: BLE001 - a structure that does not match its bytes, a refused global
        raise CheckpointError(f"{directory / json_name}: cannot rebuild the state ({type(exc).__name__}: {exc})") \
            from None


def load(path: str | os.PathLike, step: int | None = None, *, rank: int | None = None,
         map_location: Any = "cpu", policy: Any = None) -> tuple[Any, int]:
    """``(state, step)`` of a committed checkpoint, read in this one process: the state
    rank ``rank`` saved (any rank, or none, for a replicated one). ``policy``: the scan
    policy for pickled leaves (default: the built-in one)."""
    found = find(path, step)
    shard = shard_of(found, rank)
    check(found, shard)
    return read_state(found.path, shard, map_location, policy), found.step
