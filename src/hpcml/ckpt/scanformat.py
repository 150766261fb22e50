"""hpcml checkpoint shards (``rank-00000.bin`` written by ``hpcml.ckpt``): scan the pickled
leaves, and only those.

A shard is raw bytes at offsets that its index beside it (``rank-00000.json``, tagged
``hpcml.ckpt.shard/1``) lists: tensors and arrays are copied from those bytes, never
unpickled; a leaf that is none of these (a user object) is one pickle, read back through the
restricted unpickler. So the shard is recognised by its index, not by its content (the first
bytes are a tensor's), and the scan walks each pickled leaf with the usual policy, naming the
leaf by its place in the state (``leaf extra.sampler``). A ``.bin`` without such an index is
scanned as before (this format claims only what has one). The index must describe the file exactly (its size, leaves inside it, no
object arrays): one that does not is an error, never a pass.

The file is also scanned whole from offset 0 as a loader that ignores the index reads it
(``torch.load``'s zip or legacy stream of pickles, ``pickle.load`` of any protocol, ``np.load``,
joblib): a shard is safe to load with hpcml, and an index beside a torch zip, a protocol 0
pickle or a benign leaf followed by more pickles must not make the file pass.

Registered with scan through the ``hpcml.scan_formats`` entry point (pyproject), with the
loader ``hpcml.scan.safe_load`` uses for a checkpoint directory, step or shard, so scan
does not import ckpt.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from hpcml.ckpt import layout, leafcheck
from hpcml.scan.formats import ScanFormat

if TYPE_CHECKING:
    from hpcml.scan.context import FileScan
    from hpcml.scan.model import FileResult
    from hpcml.scan.policy import Policy

NAME = "hpcml-ckpt"
_SHARD = re.compile(r"^(?:rank|own)-(\d{5,})\.bin$")     # own-: a replicated state's per-rank values


def index_of(path: Path) -> tuple[Path, Any] | None:
    """``(index path, index document)`` when ``path`` is an hpcml shard: named
    ``rank-NNNNN.bin`` (or ``own-NNNNN.bin``) with its ``.json`` beside it that carries the
    shard tag."""
    if not _SHARD.match(path.name):
        return None
    from hpcml.files import load_json_bounded
    index = path.with_suffix(".json")
    try:
        doc = load_json_bounded(index, layout.JSON_MAX, follow_symlinks=False)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("hpcml.ckpt.shard/"):
        return None
    return index, doc


def scan(fs: FileScan, fh: BinaryIO, size: int, index: Path, doc: dict[str, Any]) -> None:
    """Walk every pickled leaf of the shard ``fh`` (``size`` bytes) that ``doc`` indexes."""
    from hpcml.ckpt.flatten import leaf_paths
    from hpcml.scan.scanner import scan_as_loaders_read_it
    fs.set_format(NAME)
    problem = layout.index_problem(doc, size)
    if problem:
        fs.error(f"{index.name} does not describe this shard: {problem}")
        return
    entries = doc["entries"]
    names = leaf_paths(doc.get("skeleton"))
    pickled = [i for i, e in enumerate(entries) if e["kind"] == "pickle"]
    for i in pickled:               # by the one rule verify and the load apply
        leafcheck.judge(fs, fh, entries[i]["offset"], entries[i]["nbytes"], f"leaf {names.get(i, f'#{i}')}")
    scan_as_loaders_read_it(fs, fh, size)
    fs.note(f"{len(entries) - len(pickled)} tensors and arrays (raw bytes, never unpickled), "
            f"{len(pickled)} pickled leaves scanned; load it with hpcml.ckpt (or hpcml.scan.safe_load)")


def claims(path: Path) -> Any:
    """A checkpoint directory or step directory (the path itself), or a shard with its
    index (``(index path, index document)``); None for anything else."""
    if path.is_dir():
        return path if (path / layout.MANIFEST).is_file() or layout.is_checkpoint_dir(path) else None
    return index_of(path) if path.is_file() else None


def _scan_claimed(fs: FileScan, fh: BinaryIO, size: int, claim: Any) -> None:
    scan(fs, fh, size, *claim)


def load(path: Path, claim: Any, policy: Policy, map_location: Any, rank: int | None) -> Any:
    """Load a checkpoint (its directory: the newest step; a step directory; a shard): each
    file opened once (no link followed, a regular file), its index read once (its bytes the
    manifest's), the shard scanned through that descriptor with that index, and loaded from
    the same descriptor and index, never opened again by name: a file swapped after the
    scan is not what loads. The load proves the bytes it reads against the manifest's crc32
    and judges the pickled leaves it holds in memory by the scan's rule (``leafcheck``)."""
    from hpcml.ckpt import offline
    from hpcml.scan.loader import UnsafeFileError
    from hpcml.scan.model import Verdict
    if path.is_dir():
        found = offline.find(path)
    else:
        found, rank = offline.find(path.parent), int(path.stem.split("-", 1)[1])
    shard = offline.shard_of(found, rank)
    own = offline.own_of(found, rank)
    offline.check(found, shard, own)
    assert found.manifest is not None
    opened: dict[tuple[str, int], offline.Opened] = {}
    try:
        for kind, r in [("rank", shard)] + ([("own", own)] if own is not None else []):
            bin_name, json_name = layout.shard_names(r, kind)
            doc = layout.read_index(found.path / json_name, layout.record(found.manifest, kind, r))
            fd = layout.open_shard(found.path / bin_name)
            opened[(kind, r)] = (doc, fd)
            result = _scan_open(fd, found.path / bin_name, found.path / json_name, doc, policy)
            if result.verdict is not Verdict.SAFE:
                raise UnsafeFileError(result)
        return offline.read(found, shard, own, map_location, policy, opened=opened)
    finally:
        for _doc, fd in opened.values():
            os.close(fd)


def _scan_open(fd: int, path: Path, index: Path, doc: dict[str, Any], policy: Policy) -> FileResult:
    """The scan of the open shard ``fd`` with the index ``doc`` (as ``hpcml scan`` makes it
    by path: a failure of the scan is an error verdict, never a pass)."""
    from hpcml.scan.context import FileScan
    from hpcml.scan.scanner import scan_content
    size = os.fstat(fd).st_size
    fs = FileScan(str(path), policy, size, scan_content)
    try:
        with open(os.dup(fd), "rb") as fh:
            scan(fs, fh, size, index, doc)
    except OSError as exc:
        fs.error(f"read failed: {exc.strerror or exc}")
    except Exception as exc:  # noqa: BLE001 - fail closed: a scanner bug is an error verdict
        fs.error(f"internal error while scanning ({type(exc).__name__}: {exc}); please report it")
    return fs.finish()


FORMAT = ScanFormat(looks_like=lambda head, size, name: False, scan=lambda *args: None,
                    claims=claims, scan_claimed=_scan_claimed, load=load)
