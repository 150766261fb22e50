"""joblib's reading of a pickle against a plain unpickler's, and the scan's verdict on both.

``joblib.load`` takes the bytes after a ``NumpyArrayWrapper``'s BUILD as the array's;
``pickle.load``, ``torch.load`` and numpy's object arrays read them as opcodes. Each file
here is crafted by hand the way ``joblib.dump`` writes a wrapper (protocol 2-4 opcodes, the
wrapper's state as joblib writes it), with something hidden where one reading does not
look. The plain loads are run for real on the first one (in a child, a marker file): the
bytes do what the verdict says.
"""

from __future__ import annotations

import io
import pickle
import struct
import subprocess
import sys
import zipfile

import pytest

from hpcml.scan.loader import RestrictedUnpickler
from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file


def u(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def glob(module: str, name: str) -> bytes:
    return u(module) + u(name) + b"\x93"


def dtype(descr: str = "u1", flags: int = 0) -> bytes:
    """``numpy.dtype(descr, False, True)`` and its state, as numpy pickles it."""
    return (glob("numpy", "dtype") + u(descr) + b"\x89\x88\x87R(K\x03" + u("|")
            + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK" + bytes([flags]) + b"tb")


def state(n: int, extra: bytes = b"") -> bytes:
    return (b"}(" + u("subclass") + glob("numpy", "ndarray") + u("shape") + b"K" + bytes([n]) + b"\x85"
            + u("order") + u("C") + u("dtype") + dtype() + u("allow_mmap") + b"\x89"
            + u("numpy_array_alignment_bytes") + b"N" + extra + b"ub")


def system(marker: str) -> bytes:
    """``os.system("touch MARKER")``, its result popped."""
    cmd = f"touch {marker}".encode()
    return b"cos\nsystem\nX" + struct.pack("<I", len(cmd)) + cmd + b"\x85R0"


def hidden_in_the_array(payload: bytes) -> bytes:
    """A wrapper (NEWOBJ, as joblib writes it) whose ``len(payload)`` array bytes are
    ``payload``: joblib reads them as a uint8 array, a plain unpickler as opcodes."""
    return (b"\x80\x02" + glob("joblib.numpy_pickle", "NumpyArrayWrapper") + b")\x81" + state(len(payload))
            + payload + b".")


def torch_zip(data_pkl: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    return out.getvalue()


def test_array_bytes_a_plain_load_runs_as_opcodes_are_judged_as_it_runs_them(tmp_path):
    """The array's bytes are ``os.system``: joblib would read 20-odd bytes of uint8, and
    pickle.load runs the command (shown here). The scan calls the file dangerous (was:
    safe), inside a torch zip too, and hpcml's own unpickler refuses it (was: loaded)."""
    marker = tmp_path / "ran"
    pkl = tmp_path / "model.pkl"
    pkl.write_bytes(hidden_in_the_array(system(str(marker))))
    run = subprocess.run([sys.executable, "-c", f"import pickle; pickle.load(open({str(pkl)!r}, 'rb'))"],
                         capture_output=True, text=True, timeout=60)
    assert marker.exists(), run.stderr              # the file is what it claims to test
    marker.unlink()
    assert scan_file(pkl).verdict is Verdict.DANGEROUS
    pt = tmp_path / "model.pt"
    pt.write_bytes(torch_zip(pkl.read_bytes()))
    assert scan_file(pt).verdict is Verdict.DANGEROUS
    with open(pkl, "rb") as fh, pytest.raises(pickle.UnpicklingError, match="os.system"):
        RestrictedUnpickler(fh).load()
    assert not marker.exists()


@pytest.mark.parametrize("builder", ["newobj", "reconstructor"])
def test_a_wrapper_copyreg_builds_is_read_as_joblib_reads_it(tmp_path, builder):
    """``copyreg.__newobj__`` / ``_reconstructor`` build the wrapper (joblib tests
    isinstance, so it reads its array bytes): the bytes after the array are the pickle's
    next opcodes, here ``os.system``. Was: walked as opcodes from the array's first byte,
    where a BINBYTES swallowed the command, and called safe."""
    n = 16
    factory = (glob("copyreg", "__newobj__") + glob("joblib.numpy_pickle", "NumpyArrayWrapper") + b"\x85R"
               if builder == "newobj" else
               glob("copyreg", "_reconstructor") + glob("joblib.numpy_pickle", "NumpyArrayWrapper")
               + glob("builtins", "object") + b"N\x87R")
    payload = system(str(tmp_path / "ran"))
    swallow = b"B" + struct.pack("<I", n - 5 + len(payload))           # the old walk's reading
    body = b"\x80\x04" + factory + state(n) + swallow + b"X" * (n - len(swallow)) + payload + b"0."
    (tmp_path / "m.pkl").write_bytes(body)
    assert scan_file(tmp_path / "m.pkl").verdict is Verdict.DANGEROUS


def test_a_wrapper_state_joblib_and_the_walk_may_read_apart_is_refused(tmp_path):
    """Two ways joblib's reading and the walk's could part, refused as not joblib's own:
    the wrapper called with arguments (its ``__init__`` sets an alignment its state need not
    name), and a state of more items than the walk keeps (a later ``dtype`` it would drop)."""
    called = (b"\x80\x04" + glob("joblib.numpy_pickle", "NumpyArrayWrapper") + b"(" + glob("numpy", "ndarray")
              + b"K\x10\x85" + u("C") + dtype() + b"tR" + state(16)[:-2] + b"ub" + b"\x00" * 16 + b".")
    (tmp_path / "called.pkl").write_bytes(called)
    got = scan_file(tmp_path / "called.pkl")
    assert got.verdict is not Verdict.SAFE and "built by a call with arguments" in " ".join(got.errors), got
    big = b"".join(u(f"pad{i}") + b"N" for i in range(64))
    wide = (b"\x80\x04" + glob("joblib.numpy_pickle", "NumpyArrayWrapper") + b")\x81" + state(8, big)
            + b"\x00" * 8 + b".")
    (tmp_path / "wide.pkl").write_bytes(wide)
    got = scan_file(tmp_path / "wide.pkl")
    assert got.verdict is not Verdict.SAFE and "is not read whole" in " ".join(got.errors), got


def test_what_joblib_dump_writes_is_still_safe_and_loads(tmp_path):
    """The real producer: arrays of numbers (aligned, as joblib 1.x writes them), an object
    array, and both at once: safe, and loaded equal."""
    joblib = pytest.importorskip("joblib")
    np = pytest.importorskip("numpy")
    from hpcml.scan.loader import safe_load
    value = {"w": np.arange(1000, dtype=np.float64), "names": np.array(["a", 1, None], dtype=object),
             "b": np.ones((3, 4), dtype=np.int16)}
    joblib.dump(value, tmp_path / "m.joblib")
    assert scan_file(tmp_path / "m.joblib").verdict is Verdict.SAFE
    back = safe_load(tmp_path / "m.joblib")
    assert (back["w"] == value["w"]).all() and list(back["names"]) == ["a", 1, None] and back["b"].sum() == 12
