"""hpcml's shard reader vs loose small files and the webdataset library, one run, cold cache.

    python benchmarks/bench_data.py                     # 100,000 files of 4-100 KB (about 5.2 GB)
    python benchmarks/bench_data.py --files 20000 --workers 1,2,4 --rounds 1
    python benchmarks/bench_data.py --files 20000 --loaders hpcml,webdataset --out /tmp/d.json

Every loader runs in torch's DataLoader with the same workers and batch size and no
decoding; each worker sums sample bytes, so only counts cross the process boundary:
- loose files: a map-style dataset that opens and reads one file per sample (what
  ImageFolder-style loaders do), in directory order and through a RandomSampler;
- webdataset 1.x on the same shards: ``shardshuffle`` plus its usual ``.shuffle(1000)``
  buffer when shuffled, neither when sequential;
- hpcml: ``ShardLoader(ShardDataset(...))``, shuffled or not.
Before every pass the page cache is emptied (``posix_fadvise(DONTNEED)`` on every file,
and ``drop_caches`` as root); the ceiling is large sequential reads of the shard files on
the same disk, in the same run. Peak memory is the summed RSS of the loader's processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work" / "data"
MB = 1e6


def generate(root: Path, files: int, seed: int = 0) -> Path:
    """``files`` samples of random bytes, 4-100 KB each, 1,000 per directory."""
    done = root / ".complete"
    if done.exists() and done.read_text() == str(files):
        return root
    rng = np.random.default_rng(seed)
    sizes = rng.integers(4_000, 100_001, files)
    pool = rng.integers(0, 256, 1 << 22, dtype=np.uint8).tobytes()
    for i, size in enumerate(sizes):
        d = root / f"d{i // 1000:04d}"
        if i % 1000 == 0:
            d.mkdir(parents=True, exist_ok=True)
        off = int(rng.integers(0, len(pool) - size))
        (d / f"{i:07d}.bin").write_bytes(pool[off:off + int(size)])
    done.write_text(str(files))
    return root


def evict(paths) -> None:
    """Cold cache for the next pass: hpcml data bench's own eviction (plus drop_caches as root)."""
    from hpcml.data.pagecache import drop_caches
    from hpcml.data.pagecache import evict as fadvise_out
    if os.geteuid() == 0:
        drop_caches()
    fadvise_out(str(p) for p in paths)


class PeakRSS:
    """Summed RSS of this process and its children, polled every 50 ms."""

    def __enter__(self):
        self.peak, self._stop = 0, threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def _poll(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.05):
            try:
                rss = sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])
            except psutil.Error:
                continue
            self.peak = max(self.peak, rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def count_batch(batch):
    """Collate: (samples, payload bytes, keys) — no sample data crosses to the main process."""
    n = sum(len(v) for s in batch for k, v in s.items() if not k.startswith("__"))
    return len(batch), n, [s["__key__"] for s in batch]


class LooseFiles:
    """Map-style dataset of loose files: one open/read/close per sample."""

    def __init__(self, paths: list[str], root: Path) -> None:
        self.paths, self.root = paths, root

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        with open(self.root / self.paths[i], "rb") as f:
            return {"__key__": self.paths[i].rsplit(".", 1)[0], "bin": f.read()}


def run_pass(name: str, make_loader, evict_paths) -> dict:
    evict(evict_paths)
    samples = nbytes = 0
    keys: list[str] = []
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        for n, b, k in make_loader():
            samples, nbytes = samples + n, nbytes + b
            keys.extend(k)
        secs = time.perf_counter() - t0
    r = {"pass": name, "samples": samples, "bytes": nbytes, "seconds": round(secs, 3),
         "samples_per_s": round(samples / secs), "mb_per_s": round(nbytes / secs / MB, 1),
         "peak_rss_mb": round(rss.peak / 2**20)}
    print(f"  {name:<28} {r['samples_per_s']:>8} samples/s {r['mb_per_s']:>8} MB/s "
          f"{secs:6.1f} s  peak {r['peak_rss_mb']} MB", flush=True)
    return r, keys


def ceiling(shards: list[Path]) -> dict:
    """Large sequential reads of the shard files: ``hpcml data bench``'s own ceiling."""
    from hpcml.data.loadbench import CEILING_THREADS, READ_SIZE, read_sequential
    evict(shards)
    total, _reads, secs = read_sequential([str(p) for p in shards], 1 << 62)
    r = {"pass": "ceiling", "bytes": total, "seconds": round(secs, 3), "mb_per_s": round(total / secs / MB, 1),
         "method": f"{READ_SIZE >> 20} MiB preads, {CEILING_THREADS} in flight, each queued whole (WILLNEED)"}
    print(f"  {'ceiling: 16 MiB reads':<28} {'':>8}           {r['mb_per_s']:>8} MB/s {secs:6.1f} s", flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--workers", default="1,2", help="Loader worker counts, comma-separated.")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="Every pass this often, in rotating order; medians.")
    ap.add_argument("--loaders", default="hpcml,webdataset,loose",
                    help="Which loaders to run, comma-separated (while iterating: hpcml,webdataset).")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "data.json")
    args = ap.parse_args()

    import torch
    import webdataset as wds
    from torch.utils.data import DataLoader, RandomSampler

    from hpcml.data import ShardDataset, quality
    from hpcml.data.index import load_index
    from hpcml.data.manifest import load_manifest
    from hpcml.data.pack import pack
    from hpcml.data.torchloader import ShardLoader

    torch.set_num_threads(1)
    src = generate(WORK / f"files-{args.files}", args.files)
    dst = WORK / f"shards-{args.files}"
    print(f"dataset: {args.files} files of 4-100 KB in {src}", flush=True)
    t0 = time.perf_counter()
    packed = pack(src, dst, jobs=8)
    pack_s = time.perf_counter() - t0
    m = load_manifest(dst)
    shards = [dst / s.name for s in m.shards]
    files = sorted(str(p.relative_to(src)) for p in src.rglob("*.bin"))
    loose = [src / f for f in files]
    print(f"packed into {len(shards)} shards of ~256 MB in {pack_s:.1f} s "
          f"({packed.written} written, {packed.reused} kept from an earlier run)", flush=True)
    B = args.batch
    counts = [int(w) for w in args.workers.split(",")]

    def hpcml_loader(shuffle: bool, W: int):
        return lambda: ShardLoader(ShardDataset(dst, shuffle=shuffle, seed=1, rank=0, world_size=1),
                                   batch_size=B, num_workers=W, collate_fn=count_batch)

    def wds_loader(shuffle: bool, W: int):
        def make():
            urls = [str(p) for p in shards]
            ds = wds.WebDataset(urls, shardshuffle=100 if shuffle else False, seed=1,
                                nodesplitter=None, empty_check=False)
            if shuffle:
                ds = ds.shuffle(1000)
            return DataLoader(ds, batch_size=B, num_workers=W, collate_fn=count_batch)
        return make

    def loose_loader(shuffle: bool, W: int):
        ds = LooseFiles(files, src)
        return lambda: DataLoader(ds, sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(1))
                                  if shuffle else None, batch_size=B, num_workers=W, collate_fn=count_batch)

    chosen = set(args.loaders.split(","))
    passes = [("ceiling", None, shards)]
    for W in counts:
        passes += [p for p in [
            (f"hpcml shards, sequential, {W}w", hpcml_loader(False, W), shards),
            (f"hpcml shards, shuffled, {W}w", hpcml_loader(True, W), shards),
            (f"webdataset, sequential, {W}w", wds_loader(False, W), shards),
            (f"webdataset, shuffled, {W}w", wds_loader(True, W), shards),
            (f"loose files, directory order, {W}w", loose_loader(False, W), loose),
            (f"loose files, shuffled, {W}w", loose_loader(True, W), loose),
        ] if p[0].split()[0].rstrip(",") in chosen]
    runs: dict[str, list[dict]] = {name: [] for name, _m, _p in passes}
    keys = {}
    for rnd in range(args.rounds):
        print(f"round {rnd + 1} of {args.rounds} (batch {B}, cold cache):", flush=True)
        shift = rnd * len(passes) // args.rounds
        for name, make, paths in passes[shift:] + passes[:shift]:
            if make is None:
                runs[name].append(ceiling(shards))
                continue
            r, k = run_pass(name, make, paths)
            assert r["samples"] == args.files, f"{name}: {r['samples']} samples"
            runs[name].append(r)
            keys.setdefault(name, k)
    results = {}
    for name, rs in runs.items():
        mid = sorted(rs, key=lambda r: r["mb_per_s"])[len(rs) // 2]
        results[name] = {**mid, "mb_per_s_all": [r["mb_per_s"] for r in rs],
                         "peak_rss_mb_max": max(r.get("peak_rss_mb", 0) for r in rs)}
    print("medians:")
    for name, r in results.items():
        print(f"  {name:<36} {r['mb_per_s']:>8} MB/s  (all: {', '.join(map(str, r['mb_per_s_all']))})")

    packed_keys = [k for s in m.shards for k in load_index(dst / s.index).keys]
    pos = {k: i for i, k in enumerate(packed_keys)}
    shard_of = np.repeat(np.arange(len(m.shards)), [s.samples for s in m.shards])
    W0 = counts[-1]
    q = {name: quality.measure(np.array([pos[k] for k in keys[f"{name}, {W0}w"]]), shard_of, B)
         for name in ("hpcml shards, shuffled", "webdataset, shuffled", "loose files, shuffled")
         if f"{name}, {W0}w" in keys}
    q["uniform permutation"] = quality.uniform(shard_of, len(packed_keys), B)
    print(f"shuffle quality ({W0} workers, batch {B}, {len(m.shards)} shards):")
    for name, v in q.items():
        print(f"  {name:<28} same shard as previous {v['adjacent_same_shard']:.3f}  "
              f"shards per batch {v['batch_shards']:5.1f}  rank correlation {v['rank_correlation']:+.3f}")

    mbs = {k: v["mb_per_s"] for k, v in results.items()}
    ratios = {}
    print("ratios (MB/s):")
    for W in counts:
        def r(a: str, b: str, W: int = W) -> float:
            a, b = (x if x == "ceiling" else f"{x}, {W}w" for x in (a, b))
            return mbs[a] / mbs[b] if a in mbs and b in mbs else float("nan")
        ratios[f"{W} workers"] = mine = {k: v for k, v in {
            "hpcml shuffled / hpcml sequential": r("hpcml shards, shuffled", "hpcml shards, sequential"),
            "hpcml shuffled / ceiling": r("hpcml shards, shuffled", "ceiling"),
            "hpcml shuffled / loose files shuffled": r("hpcml shards, shuffled", "loose files, shuffled"),
            "hpcml shuffled / webdataset shuffled": r("hpcml shards, shuffled", "webdataset, shuffled"),
            "hpcml sequential / webdataset sequential": r("hpcml shards, sequential", "webdataset, sequential"),
            "loose files shuffled / ceiling": r("loose files, shuffled", "ceiling"),
        }.items() if v == v}          # nan: a loader left out by --loaders
        for k, v in mine.items():
            print(f"  {W} workers: {k:<44} {v:5.2f}")
    # Round by round (each round's two passes ran in the same rotation, minutes apart at most):
    # "ahead in every round" is read off here, not from the medians.
    per_round: dict[str, dict[str, list[float]]] = {}
    for W in counts:
        for label, a, b in (("hpcml shuffled / webdataset shuffled", "hpcml shards, shuffled", "webdataset, shuffled"),
                            ("hpcml sequential / webdataset sequential", "hpcml shards, sequential",
                             "webdataset, sequential")):
            ra, rb = runs.get(f"{a}, {W}w"), runs.get(f"{b}, {W}w")
            if ra and rb:
                per_round.setdefault(label, {})[f"{W} workers"] = [
                    round(x["mb_per_s"] / y["mb_per_s"], 3) for x, y in zip(ra, rb)]
    if per_round:
        print("per round:")
        for label, by_w in per_round.items():
            for w, vs in by_w.items():
                ahead = sum(v > 1 for v in vs)
                print(f"  {w}: {label:<44} {'  '.join(f'{v:5.2f}' for v in vs)}   "
                      f"(ahead in {ahead} of {len(vs)})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "files": args.files, "bytes": m.bytes, "shards": len(m.shards),
        "workers": counts, "batch": B, "rounds": args.rounds, "pack_seconds": round(pack_s, 1), "passes": results,
        "quality": q, "ratios": {w: {k: round(v, 3) for k, v in rs.items()} for w, rs in ratios.items()},
        "ratios_per_round": per_round,
        "webdataset": wds.__version__ if hasattr(wds, "__version__") else "?", "python": sys.version.split()[0],
    }, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
