"""``hpcml ckpt export``: one checkpoint shard's tensors as a safetensors file, for loading
where hpcml is not (``safetensors.torch.load_file``, Hugging Face, inference servers).

Written here rather than through the ``safetensors`` package: the format is an 8-byte
header length, a JSON header and the raw tensor bytes, and a shard already holds those
bytes with their dtype and shape, so the export copies them in chunks, needs neither torch
nor the whole state in memory, and adds no dependency (the tests read the result with the
reference library). Names are the leaves' places in the state (``model.layer.weight``);
``key`` exports one part with its prefix cut off, so that ``model.load_state_dict`` takes
it as it is. Values that are not tensors (step counters, pickled objects) are left out and
listed.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml import schemas, scratch
from hpcml.ckpt import layout, offline
from hpcml.ckpt.flatten import leaf_paths
from hpcml.ckpt.shardread import CheckedRead
from hpcml.errors import UsageError
from hpcml.files import fsync_dir

TAG = schemas.tag("ckpt.export", 1)
_CHUNK = 16 << 20
#: torch dtype names (as a shard records them) -> safetensors dtypes
_TORCH = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
          "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "uint16": "U16", "uint32": "U32",
          "uint64": "U64", "bool": "BOOL", "complex64": "C64", "float8_e4m3fn": "F8_E4M3",
          "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0"}
#: bytes per element of each safetensors dtype
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "U16": 2,
             "U32": 4, "U64": 8, "BOOL": 1, "C64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
#: numpy (kind, itemsize) -> safetensors dtypes
_NUMPY = {("f", 8): "F64", ("f", 4): "F32", ("f", 2): "F16", ("i", 8): "I64", ("i", 4): "I32",
          ("i", 2): "I16", ("i", 1): "I8", ("u", 8): "U64", ("u", 4): "U32", ("u", 2): "U16",
          ("u", 1): "U8", ("b", 1): "BOOL", ("c", 8): "C64"}


@dataclass
class Exported:
    path: Path
    step: int
    rank: int
    tensors: int = 0
    bytes: int = 0
    left_out: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"schema": TAG, "path": str(self.path), "step": self.step, "rank": self.rank,
                "tensors": self.tensors, "bytes": self.bytes, "left_out": self.left_out}


def _dtype(entry: dict[str, Any], name: str, source: str) -> str:
    if entry["kind"] == "torch":
        st = _TORCH.get(entry["dtype"])
    else:
        import numpy as np
        dt = np.dtype(entry["dtype"])
        st = None if dt.byteorder == ">" else _NUMPY.get((dt.kind, dt.itemsize))
    if st is None:
        raise UsageError(f"tensor '{name}': dtype {entry['dtype']} has no safetensors equivalent", file=source)
    return st


def export(path: str | os.PathLike, out: str | os.PathLike, step: int | None = None, *,
           rank: int | None = None, key: str | None = None) -> Exported:
    """Write the tensors of ``rank``'s shard of step ``step`` (or the newest) to ``out``."""
    if not Path(out).parent.is_dir() or Path(out).is_dir():
        raise UsageError("expected a file in an existing directory", file=str(out))
    found = offline.find(path, step)
    shard = offline.shard_of(found, rank)
    offline.check(found, shard)
    bin_name, json_name = layout.shard_names(shard)
    assert found.manifest is not None
    rec = layout.record(found.manifest, "rank", shard)
    doc = layout.read_index(found.path / json_name, rec)        # the checksummed bytes, parsed
    fd = layout.open_shard(found.path / bin_name)
    try:
        size = os.fstat(fd).st_size
        # the index this export follows, judged as verify and the load judge it (it may have
        # changed since the check): a leaf it lacks, a shape that is not its bytes: one line, exit 2
        layout.check_index(doc, size, found.path / json_name)
        return _export(doc, fd, size, found, shard, json_name, Path(out), key, rec["crc32"])
    finally:
        os.close(fd)


def _export(doc: dict[str, Any], fd: int, size: int, found: layout.Found, shard: int, json_name: str,
            out: Path, key: str | None, crc: int) -> Exported:
    entries, names = doc["entries"], leaf_paths(doc["skeleton"])
    if key:
        names = {i: n.removeprefix(key + ".") for i, n in names.items() if n.startswith(key + ".")}
        if not names:
            tops = sorted({n.split(".")[0] for i, n in leaf_paths(doc["skeleton"]).items()
                           if entries[i]["kind"] in ("torch", "numpy")})
            raise UsageError(f"no tensors under '{key}' in {found.path / json_name}; the parts of the state "
                             f"with tensors: {', '.join(tops) or 'none'}", key="key")
    done = Exported(out, found.step, shard)
    header: dict[str, Any] = {}
    order = []
    for i, name in sorted(names.items(), key=lambda kv: kv[1]):
        e = entries[i]
        if e["kind"] not in ("torch", "numpy"):
            done.left_out.append(name)
            continue
        if name in header or name == "__metadata__":       # the header's own key: the file would not load
            raise UsageError(f"two tensors would both be named '{name}'" if name in header else
                             "a tensor named '__metadata__' (safetensors' name for the header's metadata); "
                             "export a part of the state with --key", file=str(found.path / json_name), key="key")
        dtype = _dtype(e, name, str(found.path / json_name))
        _check_bytes(e, name, dtype, size, found.path / json_name)
        header[name] = {"dtype": dtype, "shape": e["shape"], "data_offsets": [done.bytes, done.bytes + e["nbytes"]]}
        order.append((e, done.bytes))
        done.bytes += e["nbytes"]
    if not order:
        raise UsageError("no tensors to export", file=str(found.path / json_name), key="key")
    done.tensors = len(order)
    header["__metadata__"] = {"format": "pt", "hpcml.step": str(found.step), "hpcml.rank": str(shard)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)            # the reference writer pads the header to 8 bytes
    _write(done.path, raw, order, done.bytes, CheckedRead(fd, size, str(found.path / layout.shard_names(shard)[0])), crc)
    return done


def _check_bytes(e: dict[str, Any], name: str, dtype: str, size: int, source: Path) -> None:
    """A tensor's bytes lie inside the shard and are exactly its shape's: what the index says
    is what a reader of the export gets (a mismatch is a corrupt shard, never a file that
    the reference library refuses or misreads)."""
    shape, off, n = e.get("shape"), e.get("offset"), e.get("nbytes")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
            and type(off) is int and type(n) is int and off >= 0 and 0 <= n <= size - off
            and math.prod(shape) * _ITEMSIZE[dtype] == n):
        raise layout.CheckpointError(f"{source}: tensor '{name}': {n!r} bytes at offset {off!r} of the "
                                     f"{size}-byte shard for shape {shape!r} of {dtype} (corrupt)")


def _write(out: Path, header: bytes, order: list[tuple[dict[str, Any], int]], total: int, src: CheckedRead,
           crc: int) -> None:
    """Header and tensors into a nameless file (``scratch``: an export killed half-way
    leaves no half model on the disk), fsync, linked in under a temporary name and renamed
    over ``out``: a half export is never seen. Where the filesystem has no nameless files
    (NFS), written under the temporary name, which the next export removes."""
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)             # a crashed export's, or a link planted there: never written through
    except OSError as exc:                      # a directory of that name, no permission: the user's to fix
        raise UsageError(f"in the way of the export's temporary file, and cannot be removed ({exc.strerror or exc}); "
                         "remove it or export elsewhere", file=str(tmp)) from None
    fd = scratch.anonymous(out.parent, layout.FILE_MODE, to_publish=True)
    try:
        if fd is not None:
            os.fchmod(fd, layout.FILE_MODE)
            _fill(fd, header, order, total, src, crc)
            scratch.replace_with(fd, out, tmp, mode=layout.FILE_MODE, durable=True)
        else:
            try:
                fd = layout.create(tmp, flags=os.O_EXCL)
                _fill(fd, header, order, total, src, crc)
                os.replace(tmp, out)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
    finally:
        if fd is not None:
            os.close(fd)
    fsync_dir(out.parent)


def _fill(fd: int, header: bytes, order: list[tuple[dict[str, Any], int]], total: int, src: CheckedRead,
          crc: int) -> None:
    """Header and tensors (each with its place among the data) into ``fd``, fsynced. The
    shard is read once, in file order, each tensor's bytes written to their place in the
    export; its checksum is taken over the bytes copied and compared before the file is
    published (``flatten.ChecksumMismatch``): an export holds the bytes the manifest names."""
    base = 8 + len(header)
    _pwrite(fd, memoryview(len(header).to_bytes(8, "little") + header), 0)
    buf = memoryview(bytearray(min(_CHUNK, max((e["nbytes"] for e, _ in order), default=0)) or 1))
    for e, at in sorted(order, key=lambda pair: pair[0]["offset"]):
        done = 0
        while done < e["nbytes"]:
            view = buf[:min(len(buf), e["nbytes"] - done)]
            src.into(e["offset"] + done, view)
            _pwrite(fd, view, base + at + done)
            done += len(view)
    src.finish(crc)
    os.ftruncate(fd, base + total)
    os.fsync(fd)


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n
