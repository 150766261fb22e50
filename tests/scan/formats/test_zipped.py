"""Zip tricks that make scanners built on Python's zipfile give up while a loader reads
the member anyway (issue 35): flag bits, a wrong CRC, a local header whose name differs
from the central directory's. The scan reads such a member the way torch's reader does
and judges the pickle inside; a member that is really encrypted stays an error.

Each archive is a real ``torch.save`` file the test then patches, byte by byte, as the
bypasses do; what torch.load itself does with each patch is asserted too, so the claim
"torch reads it" is checked against the torch the suite installs.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tests.scan.payloads import os_system_call


def _torch_file(evil: bytes | None) -> tuple[bytes, zipfile.ZipInfo]:
    """A torch.save archive; its data.pkl replaced by ``evil`` when given (same layout:
    stored, the name torch looks up)."""
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(3)}, buf)
    data = buf.getvalue()
    if evil is not None:
        src = zipfile.ZipFile(io.BytesIO(data))
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
            for info in src.infolist():
                dst.writestr(info, evil if info.filename.endswith("data.pkl") else src.read(info))
        data = out.getvalue()
    info = next(i for i in zipfile.ZipFile(io.BytesIO(data)).infolist() if i.filename.endswith("data.pkl"))
    return data, info


def _central(data: bytes, name: str) -> int:
    at = 0
    while True:
        at = data.index(b"PK\x01\x02", at)
        n = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46:at + 46 + n] == name.encode():
            return at
        at += 4


def _patch(data: bytes, info: zipfile.ZipInfo, *, flags: int = 0, crc: int | None = None,
           local_name: bytes | None = None, payload: bytes | None = None) -> bytes:
    d = bytearray(data)
    local, central = info.header_offset, _central(data, info.filename)
    for at in (local + 6, central + 8):                               # general-purpose flags
        struct.pack_into("<H", d, at, struct.unpack_from("<H", d, at)[0] | flags)
    if crc is not None:
        for at in (local + 14, central + 16):
            struct.pack_into("<I", d, at, crc)
    n, extra = struct.unpack_from("<HH", d, local + 26)
    if local_name is not None:
        assert len(local_name) == n
        d[local + 30:local + 30 + n] = local_name
    if payload is not None:
        start = local + 30 + n + extra
        assert len(payload) == info.compress_size
        d[start:start + len(payload)] = payload
    return bytes(d)


def _scan(path: Path) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "hpcml", "scan", "--json", str(path)],
                         capture_output=True, text=True, timeout=120)
    return out.returncode, json.loads(out.stdout)["files"][0]


def _torch_loads(data: bytes) -> bool:
    try:
        torch.load(io.BytesIO(data), weights_only=True)
        return True
    except Exception:  # noqa: BLE001 - which error torch raises is not the point
        return False


TRICKS = {
    "encrypted flag": dict(flags=0x1),
    "patched-data flag": dict(flags=0x20),
    "strong-encryption flag": dict(flags=0x40),
    "wrong CRC": dict(crc=0x12345678),
    "local name differs": dict(local_name=b"archive/xata.pkl"),
}


@pytest.mark.parametrize("trick", TRICKS)
def test_a_zip_trick_does_not_hide_a_dangerous_pickle(tmp_path, trick):
    marker = tmp_path / "ran"
    data, info = _torch_file(os_system_call(marker))
    path = tmp_path / "model.pt"
    path.write_bytes(_patch(data, info, **TRICKS[trick]))
    with pytest.raises((zipfile.BadZipFile, NotImplementedError, RuntimeError)):   # defeats zipfile
        zipfile.ZipFile(path).read(info.filename)
    rc, res = _scan(path)
    assert rc == 6 and res["verdict"] == "dangerous", res
    assert any(f["name"] == "posix.system" or f["name"] == "os.system" for f in res["findings"]), res
    assert any("zip trick" in n for n in res["notes"]), res["notes"]
    assert not marker.exists()


@pytest.mark.parametrize("trick", TRICKS)
def test_a_benign_torch_file_with_a_trick_is_judged_by_its_pickle(tmp_path, trick):
    data, info = _torch_file(None)
    patched = _patch(data, info, **TRICKS[trick])
    path = tmp_path / "model.pt"
    path.write_bytes(patched)
    rc, res = _scan(path)
    assert rc == 0 and res["verdict"] == "safe", res
    # what torch itself does: it ignores the CRC and the local name, and refuses the flag bits
    assert _torch_loads(patched) is (trick in ("wrong CRC", "local name differs"))


def test_a_really_encrypted_member_stays_an_error(tmp_path):
    data, info = _torch_file(None)
    noise = bytes((i * 167 + 13) % 251 for i in range(info.compress_size))   # not a pickle
    path = tmp_path / "model.pt"
    path.write_bytes(_patch(data, info, flags=0x1, payload=noise))
    rc, res = _scan(path)
    assert rc == 7 and res["verdict"] == "error", res
    assert any("encrypted member" in e for e in res["errors"]), res


def test_a_deflated_member_with_a_trick_is_inflated_and_judged(tmp_path):
    marker = tmp_path / "ran"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", os_system_call(marker))
        z.writestr("archive/version", "3\n")
    data = out.getvalue()
    info = zipfile.ZipFile(io.BytesIO(data)).getinfo("archive/data.pkl")
    path = tmp_path / "deflated.pt"
    path.write_bytes(_patch(data, info, crc=0))
    rc, res = _scan(path)
    assert rc == 6 and res["verdict"] == "dangerous", res


def test_benign_torch_numpy_and_joblib_files_still_pass(tmp_path):
    import joblib
    import numpy as np
    torch.save({"w": torch.ones(2, 2), "step": 3}, tmp_path / "state.pt")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}, [1, 2], "s"], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "arrays.npz", a=np.arange(4), b=np.ones(3))
    joblib.dump({"coef": np.arange(5.0)}, tmp_path / "model.joblib")
    out = subprocess.run([sys.executable, "-m", "hpcml", "scan", "--json", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ))
    files = json.loads(out.stdout)["files"]
    assert out.returncode == 0, out.stdout
    assert sorted(Path(f["path"]).name for f in files if f["verdict"] == "safe") == \
        ["arrays.npz", "model.joblib", "objects.npy", "state.pt"]


def test_a_central_directory_python_and_torch_place_differently_is_an_error(tmp_path):
    """Two central directories in one file: Python's zipfile shifts offsets by the bytes it
    takes for prepended data, torch's reader does not, so each sees other members. The scan
    cannot judge what torch would load: an error, never safe."""
    def zipped(payload: bytes) -> bytes:
        b = io.BytesIO()
        with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", payload)
            z.writestr("archive/version", b"3\n")
        return b.getvalue()

    def split(zb: bytes) -> tuple[bytes, bytes]:
        e = zb.rfind(b"PK\x05\x06")
        _, size_cd, off_cd = struct.unpack_from("<HII", zb, e + 10)
        return zb[:off_cd], zb[off_cd:off_cd + size_cd]

    import pickle
    evil_loc, evil_cd = split(zipped(os_system_call(tmp_path / "ran")))
    good_loc, good_cd = split(zipped(pickle.dumps({"w": [1.0]}, protocol=2)))
    head = evil_loc + evil_cd
    base = len(head)
    shift = base + len(good_loc) - len(evil_loc)          # where Python will think the CD moved
    cd, i = bytearray(good_cd), 0
    while i < len(cd):                                     # good members, placed for Python
        n, x, c = struct.unpack_from("<HHH", cd, i + 28)
        rel = struct.unpack_from("<I", cd, i + 42)[0]
        struct.pack_into("<I", cd, i + 42, base + rel - shift)
        i += 46 + n + x + c
    eocd = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 2, 2, len(good_cd), len(evil_loc), 0)
    path = tmp_path / "two-views.pt"
    path.write_bytes(head + good_loc + bytes(cd) + eocd)
    assert pickle.loads(zipfile.ZipFile(path).read("archive/data.pkl")) == {"w": [1.0]}
    rc, res = _scan(path)
    assert rc == 7 and res["verdict"] == "error", res
    assert any("central directory" in e for e in res["errors"]), res
