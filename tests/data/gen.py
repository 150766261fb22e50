"""Generated datasets for the data tests: random bytes, fixed seed, a few hundred small files."""

from __future__ import annotations

import random
from pathlib import Path

from hpcml.data.pack import pack


def make_files(root: Path, samples: int = 300, seed: int = 0, lo: int = 1, hi: int = 20_000,
               dirs: int = 3) -> Path:
    """``samples`` samples of an image-like ``.jpg`` (random size) and a ``.cls`` label."""
    rng = random.Random(seed)
    for i in range(samples):
        d = root / f"class{i % dirs}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"s{i:06d}.jpg").write_bytes(rng.randbytes(rng.randint(lo, hi)))
        (d / f"s{i:06d}.cls").write_text(str(i % dirs))
    return root


def make_shards(tmp: Path, samples: int = 300, target: int = 400_000, **kw) -> tuple[Path, Path]:
    src = make_files(tmp / "src", samples, **kw)
    dst = tmp / "shards"
    pack(src, dst, target_bytes=target, jobs=4)
    return src, dst
