"""What a checkpoint directory holds, for ``hpcml ckpt ls`` and ``verify``: plain data, no
printing (the CLI renders it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml import schemas
from hpcml.ckpt import layout
from hpcml.errors import UsageError

LIST_TAG = schemas.tag("ckpt.list", 1)


@dataclass
class Entry:
    step: int
    state: str                    # "committed", "partial", "corrupt", "superseded" (a re-save's old copy)
    size: int | None              # None: not measured (a partial or superseded copy is not summed)
    world_size: int | None
    tiers: list[str]
    path: str
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "state": self.state, "size": self.size, "world_size": self.world_size,
                "tiers": self.tiers, "path": self.path, "problems": self.problems}


@dataclass
class Inventory:
    root: str
    entries: list[Entry]

    def to_json(self) -> dict[str, Any]:
        return {"schema": LIST_TAG, "root": self.root, "checkpoints": [e.to_json() for e in self.entries]}


def open_root(root: Path) -> list[layout.Found]:
    """The checkpoints under ``root``; a missing directory or one that holds something else
    is bad input (exit 2)."""
    if not root.is_dir():
        raise UsageError("not a directory" if root.exists() else "no such directory", file=str(root))
    if not layout.is_checkpoint_dir(root):
        raise UsageError("not a checkpoint directory (no step-*/ or .partial-step-*/ inside)", file=str(root))
    return layout.scan(root)


def inventory(root: Path, *, local: Path | None = None, verify: bool = False, step: int | None = None) -> Inventory:
    """Every checkpoint (or only ``step``), with sizes and where it lies; ``verify`` reads
    every file and checks its crc32 against the manifest."""
    found = [f for f in open_root(root) if step is None or f.step == step]
    if step is not None and not found:
        raise UsageError(f"no checkpoint of step {step}", file=str(root))
    entries = []
    for f in found:
        tiers = ["shared"]
        if local is not None and (local / layout.step_name(f.step)).is_dir():
            tiers.append("local")
        if not f.committed:
            entries.append(Entry(f.step, "superseded" if f.superseded else "partial", None, None, tiers, str(f.path)))
            continue
        problems = layout.verify(f, checksums=verify)
        man = f.manifest or {}
        entries.append(Entry(f.step, "corrupt" if problems else "committed", f.size, man.get("world_size"),
                             tiers, str(f.path), problems))
    return Inventory(str(root), entries)
