"""``pack --format squashfs``: one read-only image of the dataset, made by mksquashfs.

Calls Debian's squashfs-tools rather than writing images by hand: mksquashfs is the
format's reference writer. The image keeps the directory layout (a POSIX view that
needs no reader), but shuffled reads through it were 4.6x slower than directory order
here (../shared/notes/data-ckpt.md), so the packer says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from hpcml.data.pack import refuse_unreadable
from hpcml.data.sources import list_files
from hpcml.errors import UsageError

SHUFFLE_NOTE = ("shuffled reads of small files through squashfs were 4.6x slower than directory "
                "order on a local disk; prefer the tar shards for shuffled training")


@dataclass
class ImageResult:
    image: Path
    bytes: int
    source_bytes: int
    files: int
    seconds: float
    skipped: list[tuple[str, str]]


def make_image(src: str | Path, image: str | Path, *, jobs: int | None = None,
               compression: str = "lz4", skip_unreadable: bool = False) -> ImageResult:
    """mksquashfs stores an unreadable file as an empty one, so they are found first."""
    src, image = Path(src), Path(image)
    if not src.is_dir():
        raise UsageError("not a directory" if src.exists() else "does not exist", file=str(src))
    exe = shutil.which("mksquashfs")
    if exe is None:
        raise UsageError("mksquashfs not found: install squashfs-tools (apt install squashfs-tools)",
                         key="format")
    if image.is_dir():
        image = image / f"{src.resolve().name}.sqsh"
    if image.resolve().is_relative_to(src.resolve()):
        raise UsageError("image is inside the source: it would pack itself", file=str(image))
    image.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    listing = list_files(src, jobs=jobs or 8)
    if listing.unreadable and not skip_unreadable:
        refuse_unreadable(image.with_name(image.name + ".unreadable.txt"), listing.unreadable, resume=False)
    part = image.with_name(f".{image.name}.part")
    exclude = image.with_name(f".{image.name}.exclude")
    exclude.write_text("".join(os.path.relpath(p, src) + "\n" for p, _why in listing.unreadable))
    argv = [exe, str(src), str(part), "-noappend", "-no-progress", "-comp", compression,
            "-processors", str(jobs or os.cpu_count() or 1), "-ef", str(exclude)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True)
    finally:
        exclude.unlink(missing_ok=True)
    if proc.returncode != 0:
        part.unlink(missing_ok=True)
        last = (proc.stderr.strip() or proc.stdout.strip() or "failed").splitlines()[-1]
        raise UsageError(f"mksquashfs: {last}", file=str(src))
    os.replace(part, image)
    return ImageResult(image, image.stat().st_size, sum(f.size for f in listing.files), len(listing.files),
                       time.monotonic() - t0, listing.unreadable)
