"""safe_load loads the bytes it judged: a joblib file changed between the scan and the load
(rewritten in place, or replaced by a rename, as another writer of a shared directory can)
is never loaded as changed.

The change is made at the one moment that matters by wrapping the scanner's entry points
(a stand-in for a writer racing the load: a real race could not be timed in a test). The
hostile variant is one a name-only lock lets through: ``fractions.Fraction`` is allowlisted,
and only the argument check refuses ``Fraction('1e50')`` (in the wild ``'1e30000000'``,
which hangs the load).
"""

from __future__ import annotations

import io
import os
from fractions import Fraction
from pathlib import Path

import joblib
import numpy as np
import pytest

from hpcml.scan import scanner
from hpcml.scan.loader import UnsafeFileError, safe_load
from hpcml.scan.model import Verdict


class _Text:
    """Pickles as ``Fraction(text)`` (how Python < 3.12 pickled every Fraction)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __reduce__(self):
        return (Fraction, (self.text,))


def _dump(text: str) -> bytes:
    buf = io.BytesIO()
    joblib.dump({"x": _Text(text), "a": np.arange(4)}, buf)
    return buf.getvalue()


def _files(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    good, bad = _dump("1/3"), _dump("1e50")
    path = tmp_path / "model.joblib"
    path.write_bytes(good)
    return path, good, bad


def _change(path: Path, data: bytes, how: str) -> None:
    if how == "in place":
        with open(path, "r+b") as fh:
            fh.write(data)
            fh.truncate()
    else:
        tmp = path.with_name("swap.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def test_the_hostile_variant_is_refused_when_loaded_directly(tmp_path):
    path, _, bad = _files(tmp_path)
    path.write_bytes(bad)
    assert scanner.scan_file(path).verdict is not Verdict.SAFE
    with pytest.raises(UnsafeFileError, match="Fraction"):
        safe_load(path)


@pytest.mark.parametrize("how", ["in place", "renamed"])
def test_a_file_changed_after_the_copy_was_judged_loads_as_judged(how, tmp_path, monkeypatch):
    path, _, bad = _files(tmp_path)
    _changed_after(monkeypatch, "scan_handle", path, bad, how)
    loaded = safe_load(path)
    assert loaded["x"] == Fraction(1, 3) and list(loaded["a"]) == [0, 1, 2, 3]
    assert path.read_bytes() == bad                      # the writer did change it


def _changed_after(monkeypatch, scan: str, path: Path, data: bytes, how: str) -> None:
    """``scanner.<scan>`` (``scan_file`` or ``scan_handle``) changes ``path`` to ``data``
    right after it has judged it: the writer's race, at its worst moment."""
    real = getattr(scanner, scan)

    def scan_then_change(*args, **kwargs):
        result = real(*args, **kwargs)
        _change(path, data, how)
        return result
    monkeypatch.setattr(scanner, scan, scan_then_change)


@pytest.mark.parametrize("how", ["in place", "renamed"])
def test_a_file_changed_after_the_first_scan_is_judged_again(how, tmp_path, monkeypatch):
    path, _, bad = _files(tmp_path)
    _changed_after(monkeypatch, "scan_file", path, bad, how)
    with pytest.raises(UnsafeFileError, match="Fraction"):
        safe_load(path)


def test_the_private_copy_leaves_nothing_in_the_temp_directory(tmp_path, monkeypatch):
    path, _, _ = _files(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert safe_load(path)["x"] == Fraction(1, 3)
    assert list(tmp.iterdir()) == []


def test_an_old_compressed_joblib_format_is_never_handed_to_joblibs_unrestricted_reader(tmp_path):
    """joblib < 0.10 wrote ``ZF`` + a hex length + zlib: joblib.load given a path runs its
    compatibility unpickler, which has no lock. Not scanned as a pickle, so never loaded."""
    import pickle
    import warnings

    from joblib.numpy_pickle_compat import write_zfile  # the old format's own writer
    path = tmp_path / "old.pkl"
    with open(path, "wb") as fh:
        write_zfile(fh, pickle.dumps({"x": 1}, protocol=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert joblib.load(path) == {"x": 1}             # joblib still reads it, unrestricted
    with pytest.raises(UnsafeFileError):
        safe_load(path)
    from hpcml.scan.loader import _load_joblib
    from hpcml.scan.policy import default_policy
    with open(path, "rb") as fh, pytest.raises(pickle.UnpicklingError, match="compressed format"):
        _load_joblib(fh, str(tmp_path), default_policy())   # the load itself refuses it too


def _plain_files(tmp_path: Path, fmt: str) -> tuple[Path, bytes, bytes]:
    """A pickle, a torch zip and an object .npy, each as its producer writes it: the good
    variant holds Fraction('1/3'), the bad one Fraction('1e50') (refused)."""
    import pickle

    def made(text: str) -> bytes:
        value = {"x": _Text(text)}
        buf = io.BytesIO()
        if fmt == "pkl":
            pickle.dump(value, buf)
        elif fmt == "pt":
            torch = pytest.importorskip("torch")
            torch.save(value, buf)
        else:
            arr = np.empty(1, dtype=object)
            arr[0] = value
            np.save(buf, arr, allow_pickle=True)
        return buf.getvalue()
    path = tmp_path / f"model.{fmt}"
    good, bad = made("1/3"), made("1e50")
    path.write_bytes(good)
    return path, good, bad


def _x(loaded):
    return (loaded[0] if isinstance(loaded, np.ndarray) else loaded)["x"]


@pytest.mark.parametrize("fmt", ["pkl", "pt", "npy"])
@pytest.mark.parametrize("how", ["in place", "renamed"])
def test_a_pickle_torch_or_npy_file_changed_after_its_scan_is_judged_again(fmt, how, tmp_path, monkeypatch):
    """Changed between the scan and the load (was: torch.load and the rest reopened the
    path and loaded the new file unjudged): refused."""
    path, _, bad = _plain_files(tmp_path, fmt)
    _changed_after(monkeypatch, "scan_file", path, bad, how)
    with pytest.raises(UnsafeFileError, match="Fraction"):
        safe_load(path)


@pytest.mark.parametrize("fmt", ["pkl", "pt", "npy"])
@pytest.mark.parametrize("how", ["in place", "renamed"])
def test_what_is_loaded_is_what_was_judged_last(fmt, how, tmp_path, monkeypatch):
    """Changed after the judged handle's scan: a path replaced no longer matters (the open
    file is loaded); a file another user may write (here ``nobody``'s) is judged and loaded
    as a private copy, so rewriting it in place changes nothing either."""
    import pwd
    path, _, bad = _plain_files(tmp_path, fmt)
    if how == "in place":
        os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    _changed_after(monkeypatch, "scan_handle", path, bad, how)
    assert _x(safe_load(path)) == Fraction(1, 3)
    assert path.read_bytes() == bad                      # the writer did change it


# --- the doors beside torch.load's pickle module: TorchScript, joblib's lookup, ZIP64 ---------

def _torchscript_archive(marker: Path) -> bytes:
    """A hostile TorchScript archive as an attacker writes it: its data.pkl names only an
    allowlisted global (``argparse.Namespace``), and its ``code/argparse.py`` gives that
    class a TorchScript ``__setstate__`` that writes ``marker``: torch.load hands any archive
    with constants.pkl to torch.jit.load, which takes no pickle module."""
    import zipfile
    code = ("class Namespace:\n  x : int\n  def __getstate__(self) -> int:\n    return self.x\n"
            "  def __setstate__(self, state: int) -> None:\n"
            f"    t = torch.from_file({str(marker)!r}, True, 2, dtype=0)\n"
            "    t.copy_(torch.tensor([111, 107], dtype=0))\n    self.x = state\n    return None\n")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02cargparse\nNamespace\n)\x81K\x01b.")
        z.writestr("archive/constants.pkl", b"\x80\x02).")
        z.writestr("archive/code/argparse.py", code)
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


class _Bytes:
    """Pickles as ``torch.storage._load_from_bytes(data)`` (how plain pickle carries a tensor)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self):
        import torch.storage
        return (torch.storage._load_from_bytes, (self.data,))


def test_a_torchscript_archive_never_runs_its_code_through_the_scan_or_the_loader(tmp_path):
    """A .pt whose data.pkl is allowlisted but which is a TorchScript archive: ``hpcml scan``
    does not call it safe and names it, ``safe_load`` refuses it, and so does the loader's own
    lock where the scan is not asked (the bytes inside a pickle's ``_load_from_bytes``), so
    its code never runs (was: "safe", and the load wrote the file)."""
    import pickle
    import subprocess
    import sys

    from hpcml.scan.loader import _restricted_load_from_bytes
    from hpcml.scan.policy import default_policy
    marker = tmp_path / "ran"
    archive = _torchscript_archive(marker)
    (tmp_path / "ts.pt").write_bytes(archive)
    (tmp_path / "lfb.pkl").write_bytes(pickle.dumps(_Bytes(archive), protocol=2))
    for name in ("ts.pt", "lfb.pkl"):
        p = subprocess.run([sys.executable, "-m", "hpcml", "scan", str(tmp_path / name)], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode != 0 and "TorchScript" in p.stdout, (name, p.returncode, p.stdout)
        with pytest.raises(UnsafeFileError, match="TorchScript"):
            safe_load(tmp_path / name)
    with pytest.raises(pickle.UnpicklingError, match="TorchScript"):
        _restricted_load_from_bytes(default_policy())(archive)
    assert not marker.exists()


def test_joblibs_lookup_loads_torch_bytes_under_the_same_lock(tmp_path):
    """joblib's unpickler found ``torch.storage._load_from_bytes`` allowlisted and returned
    torch's own, an unrestricted ``torch.load`` of the bytes (was: a command in them ran).
    Loaded directly, past the scan, the bytes still go through the lock."""
    import pickle
    import zipfile

    from hpcml.scan.loader import _load_joblib
    from hpcml.scan.policy import default_policy
    marker = tmp_path / "ran"
    cmd = f"touch {marker}".encode()
    evil = b"\x80\x02cposix\nsystem\nX" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R."
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", evil)
        z.writestr("archive/version", "3\n")
    path = tmp_path / "x.joblib"
    joblib.dump([np.arange(3), _Bytes(buf.getvalue())], path)
    with open(path, "rb") as fh, pytest.raises(pickle.UnpicklingError, match="posix.system"):
        _load_joblib(fh, str(tmp_path), default_policy())
    assert not marker.exists()


def _zip64_two_directories(first: list[tuple[str, bytes]], second: list[tuple[str, bytes]]) -> bytes:
    """One archive, two central directories: Python's zipfile reads the ZIP64 end record
    right before the locator (``first``'s), miniz (torch) the one the locator points at."""
    import struct
    import zlib

    def local(name: str, data: bytes) -> bytes:
        n = name.encode()
        return struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, zlib.crc32(data), len(data),
                           len(data), len(n), 0) + n + data

    def central(name: str, data: bytes, off: int) -> bytes:
        n = name.encode()
        return struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 45, 20, 0, 0, 0, 0, zlib.crc32(data), len(data),
                           len(data), len(n), 0, 0, 0, 0, 0, off) + n

    def end64(count: int, size: int, off: int) -> bytes:
        return struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, size, off)

    body, offsets = b"", []
    for name, data in first + second:
        offsets.append(len(body))
        body += local(name, data)
    dirs = []
    for members, offs in ((second, offsets[len(first):]), (first, offsets[:len(first)])):
        cd = b"".join(central(n, d, o) for (n, d), o in zip(members, offs))
        start = len(body)
        body += cd
        dirs.append(len(body))
        body += end64(len(members), len(cd), start)
    body += struct.pack("<4sIQI", b"PK\x06\x07", 0, dirs[0], 1)         # -> second's end record
    return body + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFFFFFF,
                              0xFFFFFFFF, 0)


def test_a_zip_whose_zip64_locator_points_at_another_directory_is_refused(tmp_path):
    """Python's zipfile sees a harmless data.pkl, torch's reader a command (shown by torch's
    own reader): the scan refuses the archive (was: "safe", and torch.load ran the command)."""
    import subprocess
    import sys

    import torch
    cmd = b"true"
    evil = b"\x80\x02cposix\nsystem\nX" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R."
    data = _zip64_two_directories([("archive/data.pkl", b"\x80\x02}q\x00."), ("archive/version", b"3\n")],
                                  [("archive/data.pkl", evil), ("archive/version", b"3\n")])
    path = tmp_path / "two.pt"
    path.write_bytes(data)
    assert torch._C.PyTorchFileReader(str(path)).get_record("data.pkl") == evil       # what torch.load reads
    p = subprocess.run([sys.executable, "-m", "hpcml", "scan", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and "ZIP64 locator" in p.stdout, (p.returncode, p.stdout)
    with pytest.raises(UnsafeFileError, match="ZIP64 locator"):
        safe_load(path)


def _shell_pickle(marker: Path) -> bytes:
    """``posix.system("touch MARKER")`` as a protocol-2 pickle."""
    cmd = f"touch {marker}".encode()
    return b"\x80\x02cposix\nsystem\nX" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R."


def _scan(path: Path) -> str:
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "hpcml", "scan", "--json", str(path)], capture_output=True,
                       text=True, timeout=120)
    import json
    (result,) = json.loads(p.stdout)["files"]
    return result["verdict"]


def _v7_member(name: bytes, data: bytes) -> bytes:
    """A tar member with a V7 header (no ustar magic), which Python's tarfile reads."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108], h[108:116], h[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    h[124:136], h[136:148] = b"%011o\0" % len(data), b"00000000000\0"
    h[148:156], h[156:157] = b" " * 8, b"0"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h) + data + b"\0" * (-len(data) % 512)


def test_a_file_torch_reads_as_a_tar_is_scanned_as_that_tar(tmp_path):
    """torch.load opens any file that is not a zip as a tar first (Python's tarfile, which
    takes a V7 header with no magic): a file whose first header's name is a harmless
    pickle and whose ``storages`` member is a command is not safe (was: "safe, pickle, no
    imports", and torch.load ran it), shown by torch.load running it."""
    import subprocess
    import sys
    path = tmp_path / "v7.pt"
    ran = tmp_path / "ran"
    path.write_bytes(_v7_member(b"\x80\x02K\x01.", b"x") + _v7_member(b"storages", _shell_pickle(ran)) + b"\0" * 1024)
    assert _scan(path) == "dangerous"
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(path)!r}, weights_only=False)"],
                   capture_output=True, timeout=120)
    assert ran.exists()          # what the scan judged is what torch would run


def test_a_pickle_after_a_legacy_checkpoints_storage_bytes_is_judged(tmp_path):
    """torch's legacy tar: ``storages`` holds pickles between raw bytes, read as torch's
    legacy_load reads them, so the storage_views pickle after a storage's bytes is judged
    (was: "trailing bytes, not a pickle", safe); a checkpoint laid out as torch reads it is
    read through to its end with no error."""
    import pickle
    import struct
    import tarfile

    import torch

    def checkpoint(path: Path, views: bytes) -> None:
        storages = (pickle.dumps(1, protocol=2) + pickle.dumps((0, "cpu", torch.FloatStorage), protocol=2)
                    + struct.pack("<q", 2) + b"\0" * 8 + views)
        tensors = (pickle.dumps(1, protocol=2) + pickle.dumps((1, 0, torch.FloatTensor), protocol=2)
                   + struct.pack("<i", 1) + b"\0" * 4 + struct.pack("<qqq", 2, 1, 0))
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
            for name, data in (("sys_info", pickle.dumps({}, protocol=2)), ("storages", storages),
                               ("tensors", tensors), ("pickle", b"\x80\x02}q\x00.")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))

    checkpoint(tmp_path / "evil.tar", _shell_pickle(tmp_path / "ran"))
    assert _scan(tmp_path / "evil.tar") == "dangerous"
    checkpoint(tmp_path / "plain.tar", pickle.dumps([], protocol=2))
    from hpcml.scan.policy import load_policy
    (tmp_path / "p.yaml").write_text("safe:\n  - torch.FloatTensor\n")
    result = scanner.scan_file(tmp_path / "plain.tar", load_policy(tmp_path / "p.yaml"))
    assert result.verdict is Verdict.SAFE and not result.errors, result


def test_a_zip64_entry_with_two_offsets_is_refused(tmp_path):
    """A central directory entry with two ZIP64 extra fields: Python's zipfile takes the
    offset of the last (a harmless data.pkl at byte 0), torch's reader the first (a command
    at 4 GiB, a sparse file). Shown by torch's own reader; the scan refuses it (was: safe)."""
    import struct
    import zlib

    import torch
    far = 0xFFFFFFFF
    evil = _shell_pickle(tmp_path / "ran")
    k = len(evil) - 8
    benign = b"\x80\x02X" + k.to_bytes(4, "little") + b"a" * k + b"."

    def local(name: str, data: bytes) -> bytes:
        n = name.encode()
        return struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 45, 0, 0, 0, 0, zlib.crc32(data), len(data), len(data),
                           len(n), 0) + n + data

    def central(name: str, data: bytes, off: int, extra: bytes = b"") -> bytes:
        n = name.encode()
        return struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 45, 45, 0, 0, 0, 0, zlib.crc32(data), len(data),
                           len(data), len(n), len(extra), 0, 0, 0, 0, off) + n + extra

    head = local("archive/data.pkl", benign)
    version_at = len(head)
    head += local("archive/version", b"3\n")
    moved = local("archive/data.pkl", evil)
    cd_at = far + len(moved)
    extra = struct.pack("<HHQ", 1, 8, far) + struct.pack("<HHQ", 1, 8, 0)
    cd = central("archive/data.pkl", benign, far, extra) + central("archive/version", b"3\n", version_at)
    end64 = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, 2, 2, len(cd), cd_at)
    tail = (struct.pack("<4sIQI", b"PK\x06\x07", 0, cd_at + len(cd), 1)
            + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 2, 2, len(cd), 0xFFFFFFFF, 0))
    path = tmp_path / "two.pt"
    with open(path, "wb") as f:
        f.write(head)
        f.seek(far)
        f.write(moved + cd + end64 + tail)
    assert torch._C.PyTorchFileReader(str(path)).get_record("data.pkl") == evil
    assert _scan(path) == "error"
