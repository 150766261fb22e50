"""A checkpoint read outside the job that wrote it: one process, no Slurm, no
torch.distributed, no ``HPCML_CKPT_TOKEN``.

``Checkpointer.load_latest`` is the job's resume path: each rank loads its own shard of a
checkpoint of the job's own world size, and the ranks agree on which one. An evaluation, an
export or a look at rank 3's optimizer state comes afterwards, in one process, so it names
the step and the shard. The checks are the resume path's: the manifest key by key, every
shard's size, the chosen shard's crc32, pickled leaves through the scan's restricted loader.
Shards are not merged: how a sharded state splits (FSDP, ZeRO, the user's own) is the
training code's, and a shard records none of it. A replicated checkpoint's per-rank values
(``own-NNNNN``) are the named rank's, rank 0's when none is named.

``resolve_own`` is what the resume path does at another world size than the one that saved:
a data-loader state taken at an epoch boundary carries over (the loader reshards it), a
``PerRank(..., on_resize="none")`` loads as None, anything else is refused in one line,
at load, instead of a state that breaks the training code on every restart.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcml.ckpt import layout
from hpcml.ckpt.flatten import ChecksumMismatch, is_data_state, own_slots, unflatten
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


def own_of(found: layout.Found, rank: int | None) -> int | None:
    """Whose per-rank values come with a replicated checkpoint (``rank``'s, rank 0's when
    none is named); None when it has none."""
    assert found.manifest is not None
    return None if "per_rank" not in found.manifest else rank or 0


def check(found: layout.Found, rank: int, own: int | None = None) -> None:
    """The resume path's checks before a load: every file's size (and, of a replicated
    state's, whether ``rank``'s shard and ``own``'s per-rank values join). Their indexes
    and crc32s are judged on the read that loads them (``read_state``), not on a read of
    their own before it; the other ranks' files are not read."""
    assert found.manifest is not None
    mine = [("rank", rank)] + ([("own", own)] if own is not None else [])
    problems = layout.verify(found, but=mine, checksums=False, index=False) or \
        layout.verify(found, files=mine, checksums=False, index=False)
    if problems:            # an index that does not describe its shard: bad input (exit 2), naming its key
        raise problems[0].error if isinstance(problems[0], layout.Fault) else CheckpointError(problems[0])


def read_own(directory: Path, rank: int, map_location: Any = "cpu", policy: Any = None,
             rec: dict[str, Any] | None = None, opened: Opened | None = None) -> list[Any]:
    """The per-rank values that ``rank`` saved beside a replicated state, in order (``rec``:
    the manifest's record of its files, checked on the read: ``read_state``)."""
    values = read_state(directory, rank, map_location, policy, kind="own", rec=rec, opened=opened)
    if not isinstance(values, list):
        raise CheckpointError(f"{directory / layout.shard_names(rank, 'own')[1]}: not a list of per-rank values")
    return values


def resolve_own(values: list[Any], slots: list[dict[str, Any]], saved: int, world: int, source: str) -> list[Any]:
    """The per-rank values as a rank of a ``world``-rank job gets them from a checkpoint that
    ``saved`` ranks wrote (each its own; see the module's docstring at another world size)."""
    if saved == world:
        return values
    out = list(values)
    for slot in slots:
        i, where = slot["__own"], slot.get("at") or "state"
        if not 0 <= i < len(values):
            continue                                   # unflatten names it
        head = f"saved by {saved} ranks, this job has {world}: "
        if is_data_state(values[i]):
            from hpcml.data.reader import resize_problem
            problem = resize_problem(values[i])
            if problem:
                raise ResizeRefused(head + problem + f"; resume on {saved} ranks, or from a checkpoint "
                                    "taken at an epoch's end", file=source, key=where)
        elif slot.get("resize") == "none":
            out[i] = None
        else:
            raise ResizeRefused(head + "a per-rank value (PerRank) has no owner among other ranks; resume on "
                                f"{saved} ranks, or save it as PerRank(..., on_resize='none') to load None",
                                file=source, key=where)
    return out


class ResizeRefused(UsageError):
    """A replicated checkpoint's per-rank values that do not carry over to this world size."""


#: a shard's index as read and its file open (``read_state``'s ``opened``): what a scan judged
Opened = tuple[dict[str, Any], int]


def read_state(directory: Path, rank: int, map_location: Any = "cpu", policy: Any = None, *,
               kind: str = "rank", own: Callable[[list[dict[str, Any]]], list[Any]] | None = None,
               rec: dict[str, Any] | None = None, opened: Opened | None = None) -> Any:
    """Rebuild one shard's state from its index and bytes (checked by the caller, and again
    here: the files may have changed since). The index this load follows is judged by the
    check ``verify`` and ``hpcml scan`` make (``layout.check_index``) before anything is
    allocated, and each leaf is read into memory of its checked size alone. With ``rec``
    (the manifest's record of the files) the index and the shard are the checksummed bytes,
    proven on the one read that loads them (``flatten.CheckedRead``), or
    ``flatten.ChecksumMismatch``. ``own`` gives the per-rank values of the state's
    ``{"__own": i}`` places (``own_slots``). ``opened``: the index already read and the
    shard already open (the caller's, left open), so that what loads is what a scan of
    them judged (``scanformat.load``), never the files opened again by name."""
    bin_name, json_name = layout.shard_names(rank, kind)
    if opened is None:
        shard = layout.read_index(directory / json_name, rec)
        fd = layout.open_shard(directory / bin_name)
    else:
        shard, fd = opened
    try:
        size = os.fstat(fd).st_size
        if rec is not None and size != rec["size"]:
            raise ChecksumMismatch(str(directory / bin_name))
        layout.check_index(shard, size, directory / json_name)
        values = own(own_slots(shard["skeleton"])) if own is not None else None
        return unflatten(shard["skeleton"], shard["entries"], fd, source=str(directory / bin_name),
                         map_location=map_location, policy=policy, own=values,
                         crc=rec["crc32"] if rec is not None else None)
    except HpcmlError:
        raise
    except Exception as exc:  # noqa: BLE001 - a structure that does not match its bytes, a refused global
        raise CheckpointError(f"{directory / json_name}: cannot rebuild the state ({type(exc).__name__}: {exc})") \
            from None
    finally:
        if opened is None:
            os.close(fd)


def load(path: str | os.PathLike, step: int | None = None, *, rank: int | None = None,
         map_location: Any = "cpu", policy: Any = None) -> tuple[Any, int]:
    """``(state, step)`` of a committed checkpoint, read in this one process: the state
    rank ``rank`` saved (any rank, or none, for a replicated one). ``policy``: the scan
    policy for pickled leaves (default: the built-in one)."""
    found = find(path, step)
    shard = shard_of(found, rank)
    own = own_of(found, rank)
    check(found, shard, own)
    return read(found, shard, own, map_location, policy), found.step


def read(found: layout.Found, shard: int, own: int | None, map_location: Any = "cpu", policy: Any = None,
         opened: dict[tuple[str, int], Opened] | None = None) -> Any:
    """The state of ``shard`` with ``own``'s per-rank values in place (their sizes and
    indexes checked by the caller, their checksums on the read that loads them).
    ``opened``: by ``(kind, rank)``, files already read and open (``read_state``)."""
    man = found.manifest
    assert man is not None
    opened = opened or {}

    def values(_slots: list[dict[str, Any]]) -> list[Any]:
        if own is None:
            return []
        return read_own(found.path, own, map_location, policy, rec=layout.record(man, "own", own),
                        opened=opened.get(("own", own)))
    return read_state(found.path, shard, map_location, policy, own=values if own is not None else None,
                      rec=layout.record(man, "rank", shard), opened=opened.get(("rank", shard)))
