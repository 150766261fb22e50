"""Compressed joblib files as joblib recognises them (``joblib.compressor``'s prefixes, and
joblib < 0.10's "ZF" format): what ``joblib.load`` decompresses and unpickles, the scan
reads too, whatever the file's name; never "not a model file". Files are made by joblib
itself (``joblib.dump``, ``numpy_pickle_compat.write_zfile``), changed as little as the
case needs.
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest

from hpcml.scan.loader import UnsafeFileError, safe_load
from hpcml.scan.model import Verdict
from hpcml.scan.policy import default_policy
from hpcml.scan.scanner import exit_code, scan_file

joblib = pytest.importorskip("joblib")


class _Evil:
    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _lzma_with_dictionary(value) -> bytes:
    """``joblib.dump(compress="lzma")`` with the dictionary size in its header 96 KiB, not
    8 MiB (what lzma's own encoder writes for ``dict_size=2**16 + 2**12``): the file's third
    byte is no longer 0, and lzma, so joblib, reads it (the stream is far smaller)."""
    buf = io.BytesIO()
    joblib.dump(value, buf, compress="lzma")
    data = bytearray(buf.getvalue())
    assert data[:5] == b"\x5d\x00\x00\x80\x00"
    data[1:5] = (0x18000).to_bytes(4, "little")
    return bytes(data)


def _joblib_runs(path, marker) -> bool:
    code = ("import warnings, joblib\nwarnings.simplefilter('ignore')\n"
            f"try:\n    joblib.load({str(path)!r})\nexcept Exception:\n    pass")
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    ran = marker.exists()
    if ran:
        marker.unlink()
    return ran


def test_lzma_joblib_reads_by_its_two_byte_prefix_is_scanned(tmp_path):
    """joblib takes ``5d 00`` for lzma; the scan wanted ``5d 00 00`` and called such a file
    not a pickle (a .joblib) or not a model file at all (was: skipped, exit 0)."""
    value = {"w": np.arange(5.0), "o": np.array(["a", None], dtype=object)}
    good = tmp_path / "m.joblib"
    good.write_bytes(_lzma_with_dictionary(value))
    assert joblib.load(good)["w"].sum() == 10
    got = scan_file(good)
    assert got.verdict is Verdict.SAFE and got.format == "joblib (lzma-compressed)", got
    assert list(safe_load(good)["o"]) == ["a", None]
    marker = tmp_path / "ran"
    for name in ("model.joblib", "model.weights"):
        bad = tmp_path / name
        bad.write_bytes(_lzma_with_dictionary(_Evil(marker)))
        assert _joblib_runs(bad, marker)
        got = scan_file(bad)
        assert got.scanned and got.verdict is Verdict.DANGEROUS, got


def _zfile(obj, path) -> None:
    from joblib.numpy_pickle_compat import write_zfile
    with open(path, "wb") as fh:
        write_zfile(fh, pickle.dumps(obj, protocol=2))


@pytest.mark.parametrize("name", ["old.model.z", "old.joblib", "old.pkl"])
def test_joblibs_old_zf_format_is_never_called_safe_or_skipped(tmp_path, name):
    """joblib < 0.10's "ZF" file: ``joblib.load`` unpickles it with its compatibility
    unpickler, which restricts nothing. hpcml reads neither it nor its format: an error,
    never "skipped, not a model file" (was, exit 0, for a name not a pickle's)."""
    marker = tmp_path / "ran"
    path = tmp_path / name
    _zfile(_Evil(marker), path)
    assert _joblib_runs(path, marker)
    got = scan_file(path)
    assert got.scanned and got.verdict is Verdict.ERROR and "ZF" in " ".join(got.errors), got
    assert exit_code([got], default_policy()) == 7
    _zfile({"w": [1, 2]}, path)                 # harmless inside: still not read, not loaded
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert joblib.load(path) == {"w": [1, 2]}
    assert scan_file(path).verdict is Verdict.ERROR
    with pytest.raises(UnsafeFileError):
        safe_load(path)


def test_text_starting_with_zf_is_not_joblibs(tmp_path):
    """joblib's ``read_zfile`` parses 19 characters of hex after "ZF": text that does not
    fails there, before anything is unpickled, and is not taken for the format."""
    path = tmp_path / "notes.txt"
    path.write_text("ZFS pool layout\nmirror of two disks\n")
    assert not scan_file(path).scanned
