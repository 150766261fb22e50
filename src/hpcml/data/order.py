"""Which samples a rank and each of its loader workers read in an epoch, and in what order.

Pure arithmetic over the manifest's per-shard sample counts, so every rank computes the
same plan without talking to the others and a resume recomputes it exactly.

1. Each shard is cut into *blocks* of consecutive samples of about ``block_bytes``: the
   unit of one large read.
2. The epoch permutes all blocks of the dataset (seed, epoch): the global part of the
   shuffle, so a rank's samples come from everywhere in the dataset.
3. The rank takes an equal slice of that sequence: ``N // world`` samples (or
   ``ceil(N / world)``, wrapping around, with ``drop_last=False``), so no rank runs out
   of batches before the others (the DDP hang of uneven shards).
4. The slice is dealt to the loader's workers so that batch ``k`` comes from worker
   ``k % W``: torch's DataLoader collects batches from its workers round-robin, so the
   batches arrive in exactly the planned order, and every rank has ``ceil(n / B)`` batches.
5. Each worker's part is read in *windows* of ``window`` blocks; the samples of a window
   are permuted (the local part of the shuffle): neighbouring samples come from
   ``window`` random places in the dataset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Piece = tuple[int, int, int]        # (shard, first sample, end sample)


@dataclass(frozen=True)
class Layout:
    """Everything the order depends on besides the dataset; part of the resume state."""

    seed: int = 0
    shuffle: bool = True
    block_bytes: int = 1 << 20     # one read; Lustre's RPC size is 1-16 MiB (4 MiB before issue 72)
    window: int = 32               # blocks mixed together: 32 MiB by default
    drop_last: bool = True


def blocks(counts: list[int], sizes: list[int], block_bytes: int) -> list[Piece]:
    out: list[Piece] = []
    for s, (n, size) in enumerate(zip(counts, sizes)):
        if n <= 0:
            continue
        per = max(1, int(round(block_bytes * n / max(size, 1))))
        out.extend((s, lo, min(lo + per, n)) for lo in range(0, n, per))
    return out


def block_count(counts: list[int], sizes: list[int], block_bytes: int) -> int:
    """How many blocks ``blocks`` cuts, without making them (O(shards)): the size of an
    epoch's plan, known before it is built (``ShardDataset`` bounds it by the shards' bytes)."""
    total = 0
    for n, size in zip(counts, sizes):
        if n > 0:
            total += -(-n // max(1, int(round(block_bytes * n / max(size, 1)))))
    return total


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([abs(int(k)) for k in key])


def epoch_pieces(counts, sizes, layout: Layout, epoch: int) -> list[Piece]:
    bl = blocks(counts, sizes, layout.block_bytes)
    if layout.shuffle and bl:
        perm = _rng(layout.seed, epoch, 0x5EED).permutation(len(bl))
        bl = [bl[i] for i in perm]
    return bl


def cut(pieces: list[Piece], start: int, stop: int) -> list[Piece]:
    """Samples ``[start, stop)`` of the concatenated pieces, wrapping around past the end."""
    total = sum(hi - lo for _s, lo, hi in pieces)
    out: list[Piece] = []
    while start < stop and total:
        base = (start // total) * total
        a, b = start - base, min(stop - base, total)
        pos = 0
        for s, lo, hi in pieces:
            n = hi - lo
            if pos + n > a and pos < b:
                out.append((s, lo + max(0, a - pos), lo + min(n, b - pos)))
            pos += n
            if pos >= b:
                break
        start = base + b
    return out


def per_rank(total: int, world: int, drop_last: bool) -> int:
    return total // world if drop_last else -(-total // world)


def stream_lengths(n: int, batch: int, workers: int) -> list[int]:
    """Samples of each worker when batch k of the rank's n samples goes to worker k % W."""
    batches = -(-n // batch) if n else 0
    lengths = [0] * workers
    for w in range(workers):
        full = len(range(w, batches, workers))
        lengths[w] = full * batch
    if batches and n % batch:
        lengths[(batches - 1) % workers] -= batch - n % batch
    return lengths


def consumed_per_stream(position: int, n: int, batch: int, workers: int) -> list[int]:
    """How far each worker's stream got when the rank has delivered ``position`` samples."""
    if position >= n:
        return stream_lengths(n, batch, workers)
    k = position // batch
    return [len(range(w, k, workers)) * batch for w in range(workers)]


@dataclass(frozen=True)
class Window:
    """``window`` blocks read together, their samples permuted (``order``).

    The permutation is drawn when the window is read, not when the plan is made: a plan
    holds its blocks, never a number per sample. Drawn up front, a rank's plan held 8 bytes
    for every sample of the epoch in every loader worker (each plans all streams), and a
    manifest or index whose counts are wrong (a file: anyone's) could ask for terabytes
    before a byte was read; drawn here, only after the window's indexes are loaded and each
    count checked against its index, it is the few samples of ``window`` blocks. Same
    generator and key as before: the same order."""

    pieces: list[Piece]
    key: tuple[int, ...]   # the window's random stream: (seed, epoch, rank, worker, first block)
    shuffle: bool = True

    def __len__(self) -> int:
        return sum(hi - lo for _s, lo, hi in self.pieces)

    @property
    def order(self) -> np.ndarray:
        """The permutation of the window's samples (identity without shuffle), drawn anew
        at each access: read it once."""
        n = len(self)
        return _rng(*self.key).permutation(n) if self.shuffle else np.arange(n)


def worker_windows(pieces: list[Piece], layout: Layout, key: tuple[int, ...]) -> list[Window]:
    step = max(1, layout.window)
    return [Window(pieces[i:i + step], (*key, i), layout.shuffle) for i in range(0, len(pieces), step)]


@dataclass(frozen=True)
class RankPlan:
    samples: int                       # n: samples of this rank in the epoch
    streams: list[list[Window]]        # per worker

    def batches(self, batch: int) -> int:
        return -(-self.samples // batch) if self.samples else 0


def rank_plan(counts, sizes, layout: Layout, epoch: int, rank: int, world: int,
              workers: int = 1, batch: int = 1) -> RankPlan:
    pieces = epoch_pieces(counts, sizes, layout, epoch)
    n = per_rank(sum(counts), world, layout.drop_last)
    mine = cut(pieces, rank * n, (rank + 1) * n)
    streams, pos = [], 0
    for w, length in enumerate(stream_lengths(n, batch, workers)):
        part = cut(mine, pos, pos + length) if length else []
        pos += length
        streams.append(worker_windows(part, layout, (layout.seed, epoch, rank, w)))
    return RankPlan(n, streams)
