"""Removing old checkpoints without ever removing the one a restart needs.

What counts toward ``keep`` is a checkpoint that verifies (every shard's size and crc32
against its manifest), not one that merely has a manifest: counting manifests, a corrupt
newest checkpoint made prune delete the last good one. So: the newest ``keep`` verified
checkpoints stay, and so does every corrupt one newer than the oldest of them (left for the
user to inspect, and named in ``skipped``); only what is older than ``keep`` verified ones
goes. With no verified checkpoint at all nothing committed is removed.

Partial directories go when no running attempt writes into them: no ``.attempt-TOKEN`` of
the live owner (a dead attempt's, which could fill the disk over many kills), or older than
that attempt's own newest commit (a save of it that failed). Not "older than the newest
commit": a job that resumed below a corrupt newer checkpoint writes its partials there. Symbolic links are never followed nor removed, and
``removed`` lists only what is really gone.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hpcml.ckpt import layout


@dataclass
class Pruned:
    removed: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)      # "PATH: why it stays"


def _live(partial: layout.Found, live_token: str | None, newest: int, newest_live: int) -> bool:
    """Whether a running attempt may be writing into ``partial``: it holds that attempt's
    mark and is not older than that attempt's own newest commit (the newest commit of any
    attempt says nothing: a job that resumed below a corrupt newer checkpoint writes there),
    or it holds nothing at all yet (a rank between its mkdir and its mark) and is not older
    than the newest commit."""
    if live_token is None:
        return False
    try:
        names = [p.name for p in partial.path.iterdir()]
    except OSError:
        return False
    if not names:
        return partial.step >= newest
    return layout.attempt_mark(live_token) in names and partial.step >= newest_live


def _remove(root: Path, f: layout.Found, out: Pruned) -> None:
    if f.link:
        out.skipped.append(f"{f.path}: a symbolic link; not followed, not removed")
        return
    # out of sight first, then delete: a reader never sees a half-deleted checkpoint
    gone = root / f".deleting-{f.path.name}"
    try:
        f.path.rename(gone)
    except FileNotFoundError:
        return                                       # removed by someone else meanwhile
    except OSError as exc:
        out.skipped.append(f"{f.path}: cannot remove ({exc.strerror})")
        return
    shutil.rmtree(gone, ignore_errors=True)
    if gone.exists():
        out.skipped.append(f"{gone}: could not be removed completely")
    out.removed.append(f.path)


def prune(root: Path, keep: int | None, local: Path | None = None, *,
          verified: Callable[[layout.Found], list[str]] = layout.verify, live_token: str | None = None) -> Pruned:
    """Keep the newest ``keep`` checkpoints that verify (``verified`` gives a checkpoint's
    problems); remove older ones, superseded replacements, and partial ones that no live
    attempt (``live_token``) writes (``_live``). ``keep=None``:
    leave committed ones alone (a new owner clearing dead attempts before its first save)."""
    # the local tier first: a writer makes its shared partial (and mark) before its local
    # step-00000100/, so a local copy seen here has its shared entry in the scan that follows
    local_found = [f for f in layout.scan(local) if not f.link] if local is not None else []
    found = layout.scan(root)
    out = Pruned()
    for leftover in root.glob(".deleting-*"):     # a prune cut short
        if not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
    committed = [f for f in found if f.committed]
    newest = committed[-1].step if committed else -1
    kept, drop = 0, []
    for f in reversed(committed if keep is not None else []):
        if kept >= (keep or 0):
            drop.append(f)
            continue
        problems = verified(f)
        if problems:
            out.skipped.append(f"{f.path}: corrupt, kept and not counted ({problems[0]})")
        else:
            kept += 1
    drop += [f for f in found if f.superseded]
    newest_live = max((f.step for f in committed if f.manifest and f.manifest["token"] == live_token), default=-1)
    drop += [f for f in found if not f.committed and not f.superseded
             and not _live(f, live_token, newest, newest_live)]
    for f in drop:
        _remove(root, f, out)
        if local is not None and f.path in out.removed:
            shutil.rmtree(local / layout.step_name(f.step), ignore_errors=True)
    # a local copy whose shared checkpoint is gone or never came (killed during the drain:
    # the shared partial was then cleared as a dead attempt's) stays on the node otherwise
    shared = {f.step for f in found if f.path not in out.removed}
    for f in local_found:
        if f.step not in shared and f.path.exists():
            shutil.rmtree(f.path, ignore_errors=True)
            if not f.path.exists():
                out.removed.append(f.path)
    return out
