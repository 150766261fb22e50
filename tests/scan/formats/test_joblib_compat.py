"""joblib < 0.10 kept each array in a file beside the pickle: its ``NDArrayWrapper`` makes
``joblib.load`` run ``np.load(dirname/filename, allow_pickle=True)``. The file it names is
part of the verdict: scanned when it lies in the pickle's directory, dangerous anywhere else.

Files are made as old joblib made them: the wrapper pickled (protocol 0 or 2) where each
array would be, and ``np.save`` of the array beside it; ``joblib.load`` still reads them.
"""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

from hpcml.scan.loader import UnsafeFileError, _load_joblib, safe_load
from hpcml.scan.model import Verdict
from hpcml.scan.policy import default_policy
from hpcml.scan.scanner import scan_file, scan_paths
from tests import needs


def _wrapper():
    needs.module("joblib")
    from joblib.numpy_pickle_compat import NDArrayWrapper
    return NDArrayWrapper


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _write(d: Path, name: str, filename: str, array=None, protocol: int = 2) -> Path:
    if array is not None:
        np.save(d / filename, array, allow_pickle=True)
    (d / name).write_bytes(pickle.dumps({"w": _wrapper()(filename, np.ndarray)}, protocol=protocol))
    return d / name


def _joblib_load(path: Path):
    import joblib
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return joblib.load(path)


@pytest.mark.parametrize("protocol", [0, 2])
def test_an_old_joblib_file_with_its_array_beside_it_is_safe_and_loads(protocol, tmp_path):
    path = _write(tmp_path, "m.pkl", "m.pkl_01.npy", np.arange(5), protocol)
    result = scan_file(path)
    assert result.verdict is Verdict.SAFE, (result.findings, result.errors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ours = safe_load(path)
    assert np.array_equal(ours["w"], _joblib_load(path)["w"])


def test_the_file_it_opens_is_scanned_as_part_of_its_verdict(tmp_path):
    marker = tmp_path / "ran"
    path = _write(tmp_path, "m.pkl", "m.pkl_01.npy", np.array([_Evil(marker)], dtype=object))
    result = scan_file(path)
    assert result.verdict is Verdict.DANGEROUS
    assert any(f.name == "posix.system" and "opened by the load" in f.location.member for f in result.findings)
    with pytest.raises(UnsafeFileError):
        safe_load(path)
    by_name = {Path(r.path).name: r.verdict for r in scan_paths([tmp_path], jobs=1)}
    assert by_name["m.pkl"] is Verdict.DANGEROUS             # also when the directory is scanned
    assert not marker.exists()


@pytest.mark.parametrize("filename", ["../outside.npy", "/etc/passwd", "sub/../../outside.npy", "link.npy"])
def test_a_file_outside_the_pickles_directory_is_dangerous(filename, tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    np.save(tmp_path / "outside.npy", np.arange(3))
    (d / "link.npy").symlink_to(tmp_path / "outside.npy")
    result = scan_file(_write(d, "m.pkl", filename))
    assert result.verdict is Verdict.DANGEROUS, result.findings
    assert any("NDArrayWrapper opens" in f.name for f in result.findings)


def test_a_missing_file_is_an_error(tmp_path):
    result = scan_file(_write(tmp_path, "m.pkl", "gone.npy"))
    assert result.verdict is Verdict.ERROR and any("gone.npy" in e for e in result.errors), result


def test_a_file_swapped_after_the_scan_is_still_refused_at_load(tmp_path):
    """The second lock: joblib's own np.load(allow_pickle=True) goes through the restricted
    unpickler, so an array file replaced between scan and load cannot run code."""
    marker = tmp_path / "ran"
    path = _write(tmp_path, "m.pkl", "m.pkl_01.npy", np.arange(3))
    assert scan_file(path).verdict is Verdict.SAFE
    np.save(tmp_path / "m.pkl_01.npy", np.array([_Evil(marker)], dtype=object), allow_pickle=True)
    with warnings.catch_warnings(), pytest.raises(pickle.UnpicklingError, match="posix.system"):
        warnings.simplefilter("ignore", DeprecationWarning)
        with open(path, "rb") as fh:
            _load_joblib(fh, str(tmp_path), default_policy())
    assert not marker.exists()


@pytest.mark.parametrize("state", [
    # dict([('filename', '/etc/passwd')]): a state built by a call
    b"c__builtin__\ndict\n]X\x08\x00\x00\x00filenameX\x0b\x00\x00\x00/etc/passwd\x86a\x85R",
    # a literal state with more items than the walk keeps (the file name among the last)
    b"}(" + b"".join(b"X\x03\x00\x00\x00k%02dN" % i for i in range(70))
    + b"X\x08\x00\x00\x00filenameX\x0b\x00\x00\x00/etc/passwdu",
])
def test_a_file_name_the_walk_cannot_read_is_dangerous(state, tmp_path):
    """The state joblib applies names the file: never fall back to the constructor's."""
    np.save(tmp_path / "ok.npy", np.arange(3))
    data = (b"\x80\x02cjoblib.numpy_pickle_compat\nNDArrayWrapper\nX\x06\x00\x00\x00ok.npycnumpy\nndarray\n\x86R"
            + state + b"b.")
    path = tmp_path / "m.pkl"
    path.write_bytes(data)
    result = scan_file(path)
    assert result.verdict is Verdict.DANGEROUS, result.findings
