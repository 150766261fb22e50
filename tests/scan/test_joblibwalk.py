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


def _dumped(value, protocol: int = 2) -> bytes:
    joblib = pytest.importorskip("joblib")
    buf = io.BytesIO()
    joblib.dump(value, buf, protocol=protocol)
    return buf.getvalue()


def _runs(path, loader: str, marker) -> bool:
    """Whether ``loader`` (``joblib.load`` or ``pickle.load``) of ``path`` runs the command, in a child."""
    code = (f"import joblib, pickle\ntry:\n    {loader}(open({str(path)!r}, 'rb'))\nexcept Exception:\n    pass")
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    ran = marker.exists()
    if ran:
        marker.unlink()
    return ran


def _object_array_pickle(real: bytes) -> int:
    """Where joblib.dump put the object array's own pickle (protocol 5): after the wrapper's BUILD."""
    return real.index(b"b\x80\x05") + 1


def _with_object_array_pickle(real: bytes, inner: bytes) -> bytes:
    """joblib.dump's file with its object array's own pickle replaced by ``inner``."""
    at = _object_array_pickle(real)
    rest = io.BytesIO(real[at:])
    pickle.load(rest)
    return real[:at] + inner + real[at + rest.tell():]


def test_a_wrapper_inside_an_object_array_pickle_is_an_object_and_its_bytes_opcodes(tmp_path):
    """joblib reads an object array's pickle with a fresh plain unpickler (joblib 1.2-1.5:
    ``pickle.load(file_handle)``; 1.6: ``Unpickler(file_handle)``): a ``NumpyArrayWrapper``
    BUILT in there is an object, and the bytes after it opcodes. Here they are ``os.system``
    behind a 0-d uint8 wrapper: the walk took them as its array and called the file safe
    (was); joblib.load and pickle.load run them."""
    np = pytest.importorskip("numpy")
    real = _dumped(np.array([1, 2], dtype=object))
    marker = tmp_path / "ran"
    payload = b"0" + system(str(marker)) + b"N"         # pops the wrapper, runs, leaves None
    inner = (b"\x80\x02" + glob("joblib.numpy_pickle", "NumpyArrayWrapper") + b")\x81" + state(len(payload))
             + payload + b".")
    path = tmp_path / "m.joblib"
    path.write_bytes(_with_object_array_pickle(real, inner))
    assert _runs(path, "joblib.load", marker) and _runs(path, "pickle.load", marker)
    got = scan_file(path)
    assert got.verdict is Verdict.DANGEROUS and any(f.name == "os.system" for f in got.findings), got


def test_an_object_array_pickle_plain_load_reads_with_the_outer_memo_is_judged(tmp_path):
    """``pickle.load`` reads an object array's pickle on with the outer pickle's memo, joblib
    with a fresh one: from joblib.dump's own output (two strings in the outer pickle), a
    pickle whose GETs fetch ``builtins.str`` for joblib and ``os.system`` for pickle.load.
    The plain reading was cut there and the file called safe (was)."""
    np = pytest.importorskip("numpy")
    real = _dumped({"m": "os", "f": "system", "o": np.array([1, 2], dtype=object)}, protocol=4)
    at = _object_array_pickle(real)
    plain = pickle.Unpickler(io.BytesIO(real[:at] + b"N."))     # the outer memo at that point
    plain.load()
    keys = {v: k for k, v in plain.memo.copy().items() if isinstance(v, str)}
    k_mod, k_name = keys["os"], keys["system"]
    inner = b"\x80\x05"
    for key in range(max(k_mod, k_name) + 1):        # a fresh memo: builtins.str at the same keys
        inner += u({k_mod: "builtins", k_name: "str"}.get(key, f"pad{key}")) + b"\x94" + b"0"
    marker = tmp_path / "ran"
    cmd = f"touch {marker}".encode()
    inner += (b"h" + bytes([k_mod]) + b"h" + bytes([k_name]) + b"\x93"
              + b"X" + struct.pack("<I", len(cmd)) + cmd + b"\x85R.")
    path = tmp_path / "m.joblib"
    path.write_bytes(_with_object_array_pickle(real, inner))
    assert _runs(path, "pickle.load", marker) and not _runs(path, "joblib.load", marker)
    got = scan_file(path)
    assert got.verdict is Verdict.DANGEROUS and any(f.name == "os.system" for f in got.findings), got


def test_real_object_arrays_first_stay_safe_and_load(tmp_path):
    """The plain reading of joblib.dump's own object array (first, so pickle.load reaches it)
    imports garbage spelled by the outer memo (``NumpyArrayWrapper.dtype``): named in a note,
    not counted; the file is safe and safe_load loads it, plain and compressed."""
    np = pytest.importorskip("numpy")
    joblib = pytest.importorskip("joblib")
    from hpcml.scan.loader import safe_load
    value = {"o": np.array(["a", None, 3], dtype=object), "w": np.arange(4.0)}
    for compress in (0, 3, ("lzma", 3)):
        path = tmp_path / f"m{compress!r}.joblib"
        joblib.dump(value, path, compress=compress)
        got = scan_file(path)
        assert got.verdict is Verdict.SAFE, (compress, got)
        back = safe_load(path)
        assert list(back["o"]) == ["a", None, 3] and back["w"].sum() == 6


def test_a_wrapper_built_twice_is_refused(tmp_path):
    """A second BUILD of one wrapper (its memo GET) merges into its ``__dict__``: joblib sizes
    the array from both states (the first one's alignment), the walk from the second alone,
    and the two read apart by the padding: joblib ran what the walk took as array bytes.
    joblib.dump never builds a wrapper twice: refused (was: safe)."""
    np = pytest.importorskip("numpy")
    real = _dumped(np.zeros(0, dtype=np.uint8))
    wrapper = real.index(b"\x81q") + 2              # its BINPUT, after NEWOBJ
    key = real[wrapper]
    built = real.index(b"K\x10ub", wrapper) + 4
    first = real[wrapper + 1:built]                  # its state dict, as joblib wrote it, and BUILD
    align = first.index(b"X\x1b\x00\x00\x00numpy_array_alignment_bytes")
    second = first[:align] + first[first.index(b"K\x10", align) + 2:]       # without the alignment item
    second = second.replace(b"K\x00\x85", b"K\x02\x85", 1)                  # and 2 bytes of array
    marker = tmp_path / "ran"
    body = (real[:-1] + b"0h" + bytes([key]) + second
            + b"\x0aA.\xff" + b"\x00" * 9 + system(str(marker)) + b".")
    path = tmp_path / "m.joblib"
    path.write_bytes(body)
    assert _runs(path, "joblib.load", marker)
    got = scan_file(path)
    assert got.verdict is Verdict.ERROR and "BUILT twice" in " ".join(got.errors), got
