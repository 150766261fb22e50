"""Load a pickle-based artefact only if the scan says it is safe, and then only with an
unpickler that refuses every global the policy does not allow.

Two locks, on purpose: the scan reads the whole file first (all streams, nested pickles,
archive members) and refuses before anything is imported; the restricted unpickler then
enforces the same allowlist at load time, so a file changed between scan and load (or a
scanner bug) still cannot import a global outside the allowlist.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import types
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

from hpcml.errors import HpcmlError
from hpcml.scan.model import FileResult, Verdict
from hpcml.scan.picklewalk import map_py2
from hpcml.scan.policy import Policy, default_policy

_EXIT = {Verdict.DANGEROUS: 6, Verdict.UNKNOWN: 5, Verdict.ERROR: 7, Verdict.NOT_SCANNED: 8}


class UnsafeFileError(HpcmlError):
    """The scan did not find the file safe; ``result`` says why."""

    def __init__(self, result: FileResult) -> None:
        self.result = result
        self.exit_code = _EXIT.get(result.verdict, 1)
        bad = [f"{f.name} ({f.why})" for f in result.findings if f.verdict is not Verdict.SAFE]
        why = "; ".join(bad[:3] + result.errors[:2]) or "no reason recorded"
        if result.verdict is Verdict.NOT_SCANNED:
            why += (f". hpcml does not read {result.format} files, so it cannot say they are safe: "
                    "load one with its own library only if you trust where it came from")
        super().__init__(f"{result.path}: refused to load ({result.verdict.value}): {why}")


#: the largest pickle (its opcodes, up to STOP: not the array or storage bytes some formats
#: put after it) ``RestrictedUnpickler`` holds in memory to load exactly what it judged
MAX_PICKLE_BYTES = 1 << 30


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that loads only what the scan's policy finds safe, judged on
    the bytes it then loads: ``load`` first walks the pickle at the file's position with the
    scanner's walker (the same globals, argument checks, dtype states and memo bounds as
    ``hpcml scan``), refuses with ``UnpicklingError`` unless it is safe, and then unpickles
    exactly those bytes (held in memory: a file changed after the walk changes nothing).
    ``find_class`` still only returns globals the policy allows, a second lock.

    Every place hpcml unpickles goes through it: ``safe_load`` and torch's loads under it,
    a checkpoint's pickled leaves, Flight Recorder dumps."""

    def __init__(self, file: IO[bytes], *, policy: Policy | None = None, **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self._policy = policy or default_policy()
        self._file, self._kwargs = file, kwargs

    def load(self) -> Any:
        data, after = self._judged()
        inner = _Loader(io.BytesIO(data), self, **self._kwargs)
        obj = inner.load()
        if after is not None:
            self._file.seek(after)          # where the unpickler would have left the file
        return obj

    def _judged(self) -> tuple[bytes, int | None]:
        """The bytes of the pickle at the file's position, once the walk finds them safe;
        and the offset just after its STOP (None for a stream that cannot seek)."""
        from hpcml.scan.context import FileScan
        from hpcml.scan.pickles import walk_one
        f = self._file
        try:
            start = f.tell()
            end = f.seek(0, io.SEEK_END)
            f.seek(start)
            src: IO[bytes] = f
        except (AttributeError, OSError, ValueError):         # a pipe: read what is there, bounded
            head = f.read(MAX_PICKLE_BYTES + 1)
            if len(head) > MAX_PICKLE_BYTES:
                raise pickle.UnpicklingError(f"refused: a pickle stream larger than {MAX_PICKLE_BYTES >> 20} MiB") from None
            src, start, end = io.BytesIO(head), 0, len(head)
        res = walk_one(cast(BinaryIO, src), start, end, joblib=False)     # as the unpickler below reads it
        if res.error or not res.stopped:
            raise pickle.UnpicklingError(f"refused: {res.error or 'the pickle has no STOP'}")
        if res.end - start > MAX_PICKLE_BYTES:
            raise pickle.UnpicklingError(f"refused: a pickle larger than {MAX_PICKLE_BYTES >> 20} MiB")
        fs = FileScan("<pickle>", self._policy, res.end - start)
        fs.events(res.events)
        bad = [f for f in fs.finish().findings if f.verdict is not Verdict.SAFE]
        if bad:
            raise pickle.UnpicklingError("refused: " + "; ".join(f"{f.name} ({f.why})" for f in bad[:3]))
        src.seek(start)
        data = src.read(res.end - start)
        return data, (res.end if src is f else None)

    def find_class(self, module: str, name: str) -> Any:
        # The C unpickler hides its protocol; mapping Python 2 names always is harmless,
        # because those module names do not exist on Python 3.
        guarded = guarded_global(self._policy, module, name)
        return guarded if guarded is not None else super().find_class(module, name)

    # No persistent_load: the C unpickler then refuses persistent ids, and torch.load can
    # still assign its own on the instance.


def guarded_global(policy: Policy, module: str, name: str) -> Any:
    """The one lock every unpickler of hpcml's applies to a global (``RestrictedUnpickler``,
    joblib's): ``UnpicklingError`` unless the policy allows it; for a global that loads more
    (a torch file in bytes, a pyarrow array) the guarded stand-in; else None (the
    unpickler's own lookup)."""
    mod, nm = map_py2(module, name)
    verdict, why = policy.classify(mod, nm)
    if verdict is not Verdict.SAFE:
        raise pickle.UnpicklingError(f"blocked global {mod}.{nm}: {why}")
    if (mod, nm) == ("torch.storage", "_load_from_bytes"):
        return _restricted_load_from_bytes(policy)
    if (mod, nm) == ("pyarrow.lib", "_restore_array"):
        return _validated_arrow_array
    return None


class _Loader(pickle.Unpickler):
    """The unpickler that reads the judged bytes, with its outer unpickler's ``find_class``
    (a subclass's too, torch's) and ``persistent_load`` (torch assigns one on the instance)."""

    def __init__(self, data: IO[bytes], outer: RestrictedUnpickler, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._outer = outer
        persistent = getattr(outer, "persistent_load", None)
        if persistent is not None:
            self.persistent_load = persistent   # type: ignore[method-assign]

    def find_class(self, module: str, name: str) -> Any:
        return self._outer.find_class(module, name)


def _restricted_load_from_bytes(policy: Policy) -> Any:
    """``torch.storage._load_from_bytes`` (a tensor pickled with plain pickle carries its
    storage as a torch file in bytes) with the same lock on the inner load: torch's own
    runs ``torch.load(weights_only=False)`` with the unrestricted pickle module."""
    def load_from_bytes(b: bytes) -> Any:
        return torch_load(io.BytesIO(b), policy)
    return load_from_bytes


def torch_load(fh: IO[bytes], policy: Policy, map_location: Any = None) -> Any:
    """``torch.load`` of ``fh`` with the restricted pickle module, once torch's own zip
    reader sees the archive as the scan did (``torch_zip_as_scanned``): every pickle torch
    reads goes through the lock, and nothing goes to ``torch.jit.load``, which takes no
    pickle module."""
    import torch
    torch_zip_as_scanned(fh)
    return torch.load(fh, map_location=map_location, weights_only=False,
                      pickle_module=restricted_pickle_module(policy))


def torch_zip_as_scanned(fh: IO[bytes]) -> None:
    """Refuse (``UnpicklingError``) a torch zip that torch's reader (miniz) sees otherwise
    than the scan's (Python's zipfile): other members, or a TorchScript archive
    (``constants.pkl``), which ``torch.load`` hands to ``torch.jit.load`` to run its own code.
    Asked of torch's own reader with torch.load's own tests, so the answer is the loader's,
    whatever the scan saw. A legacy (non-zip) torch file passes: it is pickles only."""
    import zipfile

    from torch import serialization as ts
    start = fh.tell()
    try:
        if not ts._is_zipfile(fh):
            return
        fh.seek(start)
        with ts._open_zipfile_reader(fh) as reader:
            if ts._is_torchscript_zip(reader):
                raise pickle.UnpicklingError("refused: a TorchScript archive (constants.pkl): torch.load hands it "
                                             "to torch.jit.load, which runs its own code outside any allowlist")
            records = set(reader.get_all_records())
        fh.seek(start)
        with zipfile.ZipFile(fh) as zf:
            scanned = {n.split("/", 1)[-1] for n in zf.namelist() if not n.endswith("/")}
    except pickle.UnpicklingError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch's reader raises RuntimeError and kin
        raise pickle.UnpicklingError(f"refused: the archive does not read the same to torch and to the scan "
                                     f"({type(exc).__name__}: {exc})") from None
    finally:
        fh.seek(start)
    if records != scanned:
        diff = sorted(records ^ scanned)[:3]
        raise pickle.UnpicklingError(f"refused: torch's zip reader sees other members than the scan "
                                     f"(e.g. {', '.join(diff)}): a scanner bypass")


def _validated_arrow_array(data: Any) -> Any:
    """pyarrow's ``_restore_array`` trusts the offsets in its buffers (an offset past the
    data reads out of bounds later): the array is validated in full before it is returned."""
    from pyarrow.lib import _restore_array
    array = _restore_array(data)
    try:
        array.validate(full=True)
    except Exception as exc:  # noqa: BLE001 - pyarrow.ArrowInvalid and kin
        raise pickle.UnpicklingError(f"blocked an invalid pyarrow array: {exc}") from None
    return array


def restricted_pickle_module(policy: Policy) -> types.ModuleType:
    """A stand-in for the ``pickle`` module (``torch.load(pickle_module=...)``)."""
    mod = types.ModuleType("hpcml_restricted_pickle")

    class Unpickler(RestrictedUnpickler):
        def __init__(self, file: IO[bytes], **kwargs: Any) -> None:
            super().__init__(file, policy=policy, **kwargs)

    mod.__dict__.update(Unpickler=Unpickler,
                        load=lambda file, **kw: Unpickler(file, **kw).load(),
                        loads=lambda data, **kw: Unpickler(io.BytesIO(data), **kw).load(),
                        UnpicklingError=pickle.UnpicklingError)
    mod.__dict__.update({k: getattr(pickle, k) for k in ("Pickler", "dump", "dumps", "HIGHEST_PROTOCOL",
                                                          "DEFAULT_PROTOCOL", "PickleError")})
    return mod


def _load_npy(fh: IO[bytes], size: int, policy: Policy) -> Any:
    import numpy as np

    from hpcml.scan.formats import npy
    header = npy.read_header(fh, 0, size)
    fh.seek(0)
    if not header.has_object:
        return np.lib.format.read_array(fh, allow_pickle=False)
    fh.seek(header.header_end)
    return RestrictedUnpickler(fh, policy=policy).load()


def _load_npz(path: Path | BinaryIO, policy: Policy) -> dict[str, Any]:
    import zipfile
    out = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            with zf.open(info) as mf:
                out[info.filename.removesuffix(".npy")] = _load_npy(mf, info.file_size, policy)
    return out


class _RestrictedNumpy:
    """numpy as joblib's unpickler sees it (``unpickler.np``): the ``np.load(allow_pickle=True)``
    of the file an old ``NDArrayWrapper`` names goes through the same lock, and only inside
    the pickle's directory."""

    def __init__(self, policy: Policy, dirname: str) -> None:
        import numpy
        self._np, self._policy, self._dir = numpy, policy, os.path.realpath(dirname)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._np, name)

    def load(self, file: str, mmap_mode: Any = None, allow_pickle: bool = False, **kwargs: Any) -> Any:
        target = os.path.realpath(file)
        if os.path.commonpath([self._dir, target]) != self._dir:
            raise pickle.UnpicklingError(f"blocked: the pickle opens {file}, outside its directory")
        from hpcml.scan.formats import npy
        with open(target, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if npy.read_header(fh, 0, size).has_object:
                return _load_npy(fh, size, self._policy)
        return self._np.load(target, mmap_mode=mmap_mode, allow_pickle=False)


def _private_copy(path: Path) -> BinaryIO:
    """The file's bytes as they are now, in a file only this process can open (nameless in
    the temp directory, ``hpcml.scratch``): what is scanned and then loaded, so a file
    rewritten in place or replaced after the scan changes nothing. joblib needs it because
    its unpickler reads array bytes from the file between pickle opcodes (no walk of the
    pickle alone can judge them) and its own ``load`` reopens by path."""
    import shutil
    import tempfile

    from hpcml import scratch
    copy = open(scratch.scratch(tempfile.gettempdir(), ".hpcml-load"), "w+b")
    try:
        with open(path, "rb") as src:
            shutil.copyfileobj(src, copy, 1 << 20)
        copy.seek(0)
    except BaseException:
        copy.close()
        raise
    return cast(BinaryIO, copy)


def _load_joblib(fh: BinaryIO, dirname: str, policy: Policy) -> Any:
    """joblib's own load of the open file ``fh`` (never reopened by path), with the
    policy's lock on every global; an old joblib's companion files come only from ``dirname``.
    joblib < 0.10's compressed format (``ZF``) is never handed to joblib's unrestricted
    compatibility unpickler: given a file object, joblib refuses it."""
    import joblib.numpy_pickle as jnp

    class Restricted(jnp.NumpyUnpickler):
        def __init__(self, filename: str, *args: Any, **kwargs: Any) -> None:
            super().__init__(filename, *args, **kwargs)
            self._dirname = dirname
            self.np = _RestrictedNumpy(policy, dirname)

        def find_class(self, module: str, name: str) -> Any:
            guarded = guarded_global(policy, module, name)      # torch's bytes loaded under the lock too
            return guarded if guarded is not None else super().find_class(module, name)

    if fh.read(2) == b"ZF":
        raise pickle.UnpicklingError("not loaded: joblib < 0.10's compressed format (ZF), which only "
                                     "joblib's unrestricted compatibility reader reads")
    fh.seek(0)
    saved = jnp.NumpyUnpickler
    jnp.NumpyUnpickler = Restricted     # joblib builds its unpickler from this module global
    try:
        return jnp.load(fh)
    finally:
        jnp.NumpyUnpickler = saved


def _load_joblib_file(path: Path, policy: Policy) -> Any:
    """Scan a private copy of the file and load that copy if it is safe."""
    from hpcml.scan.scanner import scan_handle
    with _private_copy(path) as copy:
        result = scan_handle(copy, path, policy)
        if result.verdict is not Verdict.SAFE or not result.scanned:
            raise UnsafeFileError(result)
        copy.seek(0)
        return _load_joblib(copy, os.path.dirname(os.path.abspath(path)) or ".", policy)


def safe_load(path: str | os.PathLike, *, policy: Policy | None = None, framework: str = "numpy",
              map_location: Any = "cpu", rank: int | None = None) -> Any:
    """Scan ``path`` and load it if safe: pickle, PyTorch (zip or legacy), .npy/.npz,
    joblib, safetensors (``framework`` "numpy" or "pt") or an hpcml.ckpt checkpoint (its
    directory: the newest step; a step directory; a ``rank-*.bin`` shard; ``rank``: whose
    shard of a sharded one). Raises ``UnsafeFileError``."""
    from hpcml.scan.formats import claimed
    from hpcml.scan.scanner import scan_file, scan_handle
    policy = policy or default_policy()
    p = Path(path)
    claim = claimed(p)
    if claim is not None and claim[0].load is not None:
        return claim[0].load(p, claim[1], policy, map_location, rank)
    result = scan_file(p, policy)
    if result.verdict is not Verdict.SAFE or not result.scanned:
        if not result.scanned:
            result.errors.append("not a recognised model or pickle file")
            result.verdict = Verdict.ERROR
        raise UnsafeFileError(result)
    if result.format.startswith("joblib") or result.format.endswith("-compressed"):
        return _load_joblib_file(p, policy)
    with _pinned(p) as fh:
        # what is loaded is what was judged: the open file scanned again (a path may name
        # another file by now), loaded from that same handle, never reopened by name
        again = scan_handle(fh, p, policy)
        if again.verdict is not Verdict.SAFE or not again.scanned or again.format != result.format:
            raise UnsafeFileError(again if again.verdict is not Verdict.SAFE else result)
        fh.seek(0)
        return _load_open(fh, again, policy, framework, map_location)


def _pinned(path: Path) -> BinaryIO:
    """The file open for reading, as it is now: the open file itself where only this user
    may write it (a replaced path no longer matters), else a private copy (``_private_copy``:
    another user who may write it could rewrite it in place between scan and load)."""
    import stat
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)     # a FIFO put there is not waited on
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise pickle.UnpicklingError(f"refused: {path} is no longer a regular file")
    os.set_blocking(fd, True)
    if st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return cast(BinaryIO, os.fdopen(fd, "rb"))
    os.close(fd)
    return _private_copy(path)


def _load_open(fh: BinaryIO, result: Any, policy: Policy, framework: str, map_location: Any) -> Any:
    """Load the judged open file ``fh`` by its format."""
    fmt = result.format
    if fmt in ("pytorch-zip", "pytorch-legacy"):
        return torch_load(fh, policy, map_location)
    if fmt == "safetensors":
        data = fh.read()
        if framework == "pt":
            from safetensors.torch import load as pt_load
            return {k: v.to(str(map_location)) for k, v in pt_load(data).items()}
        from safetensors.numpy import load as np_load
        return np_load(data)
    if fmt == "numpy-npz":
        return _load_npz(fh, policy)
    if fmt == "numpy-npy":
        return _load_npy(fh, result.size, policy)
    return RestrictedUnpickler(fh, policy=policy).load()


def _main() -> None:  # pragma: no cover - a convenience for shell use
    print(safe_load(sys.argv[1]))
