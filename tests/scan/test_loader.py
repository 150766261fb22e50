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
