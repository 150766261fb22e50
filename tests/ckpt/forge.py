"""A checkpoint's index forged the way whoever can write its files would: changed, and the
manifest given the index's new size and checksum, so that only the index's meaning is wrong."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from hpcml.ckpt import layout


def reseal(step_dir: Path, index: Path, rank: str = "0") -> None:
    """The manifest's record of ``index`` (rank ``rank``'s) made to match its bytes again."""
    man = json.loads((step_dir / "manifest.json").read_text())
    man["ranks"][rank].update(json_size=index.stat().st_size, json_crc32=layout.file_crc(index))
    (step_dir / "manifest.json").write_text(json.dumps(man))


def reseal_shard(step_dir: Path, rank: str = "0") -> None:
    """The manifest's record of rank ``rank``'s shard and index both made to match their bytes."""
    man = json.loads((step_dir / "manifest.json").read_text())
    for name, size, crc in ((f"rank-{int(rank):05d}.bin", "size", "crc32"), (f"rank-{int(rank):05d}.json", "json_size", "json_crc32")):
        man["ranks"][rank].update({size: (step_dir / name).stat().st_size, crc: layout.file_crc(step_dir / name)})
    (step_dir / "manifest.json").write_text(json.dumps(man))


def forge(step_dir: Path, change: Callable[[dict], object]) -> Path:
    """Change rank 0's index with ``change`` and reseal it; the index."""
    index = step_dir / "rank-00000.json"
    doc = json.loads(index.read_text())
    change(doc)
    index.write_text(json.dumps(doc))
    reseal(step_dir, index)
    return index
