"""``hpcml scan`` against the test corpora of other scanners (``../shared/testdata``).

picklescan's corpus and those of modelaudit, modelscan and fickling (``scan-peers/``),
each file judged by its producer: ``manifest.tsv``'s ``expected`` column, and for
picklescan the sentence in ``SOURCE.txt`` naming its benign and its neither files (every
other file there is malicious). The files are scanned, never loaded: several run code
when unpickled. A machine without ``../shared`` skips this module in one line.

"A malicious file that imports" is decided twice: from the raw bytes, by walking every
pickle in the file (its zip members, past an .npy header) with :func:`pickletools.genops`
for a GLOBAL, STACK_GLOBAL or INST opcode, which executes nothing; and from the scan,
by a finding that one of those opcodes made (``Finding.opcode``, nested pickles included).
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
import pickletools
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcml.scan.model import FileResult, Verdict
from hpcml.scan.scanner import scan_file
from tests import needs

DATA = needs.shared_testdata()
PEERS = DATA / "scan-peers"
PICKLESCAN = DATA / "picklescan"
PEER_CORPORA = ("modelaudit", "modelaudit-bypass", "modelscan", "fickling")

# SOURCE.txt: "benign by picklescan's own tests: ...; ... are neither"
PICKLESCAN_BENIGN = ("data/benign0_v*.pkl", "data/new_pytorch_model.bin", "data/pytorch_model.bin",
                     "data2/int_array*.np*", "data2/object_array*.np*")
PICKLESCAN_NEITHER = ("data/benign_password_protected.zip", "data/not_a_pickle.bin",
                      "data/broken_model.pkl", "data/bad_pytorch.pt")

IMPORT_OPCODES = frozenset({"GLOBAL", "STACK_GLOBAL", "INST"})
DANGEROUS_SHARE = 0.95


@dataclass(frozen=True)
class Row:
    corpus: str
    path: Path
    expected: str          # the producer's word: malicious, benign, unsafe-malformed, ...

    @property
    def kind(self) -> str:
        """``malicious (file read)`` is malicious; ``malicious-metadata`` is its own kind."""
        return self.expected.split()[0]

    @property
    def id(self) -> str:
        return self.path.name


def _manifest_rows(corpus: str) -> list[Row]:
    with open(PEERS / corpus / "manifest.tsv", newline="") as fh:
        return [Row(corpus, PEERS / corpus / r["file"], r["expected"].strip())
                for r in csv.DictReader(fh, delimiter="\t")]


def _picklescan_rows() -> list[Row]:
    rows = []
    for p in sorted(PICKLESCAN.rglob("*")):
        if not p.is_file() or p.name == "SOURCE.txt":
            continue
        rel = p.relative_to(PICKLESCAN).as_posix()
        if any(fnmatch.fnmatch(rel, pat) for pat in PICKLESCAN_BENIGN):
            expected = "benign"
        elif rel in PICKLESCAN_NEITHER:
            expected = "neither"
        else:
            expected = "malicious"
        rows.append(Row("picklescan", p, expected))
    return rows


ROWS = [r for c in PEER_CORPORA for r in _manifest_rows(c)] + _picklescan_rows()


def _of(kind: str) -> list[Row]:
    """The rows of one kind; Keras HDF5 files have their own tests (at the end)."""
    return [r for r in ROWS if r.kind == kind and r.path.suffix != ".h5"]


def _params(rows: list[Row]) -> list:
    return [pytest.param(r, id=r.id) for r in rows]


# ---------------------------------------------------------------------------------------
# Does a file import a global? Read from its bytes without running anything.
# ---------------------------------------------------------------------------------------

def _stream_imports(data: bytes, start: int = 0) -> bool:
    """Any GLOBAL/STACK_GLOBAL/INST in the pickles from ``start`` on (each after the
    previous STOP, as legacy torch and joblib files have several); parsing stops at the
    first byte that is not an opcode."""
    fh = io.BytesIO(data)
    fh.seek(start)
    while fh.tell() < len(data):
        before = fh.tell()
        try:
            for op, _arg, _pos in pickletools.genops(fh):
                if op.name in IMPORT_OPCODES:
                    return True
        except Exception:  # noqa: BLE001 - malformed or not a pickle: what came before counts
            return False
        if fh.tell() == before:
            return False
    return False


def _npy_pickle_start(data: bytes) -> int | None:
    if not data.startswith(b"\x93NUMPY") or len(data) < 12:
        return None
    if data[6] == 1:
        return 10 + struct.unpack_from("<H", data, 8)[0]
    return 12 + struct.unpack_from("<I", data, 8)[0]


def _zip_members(data: bytes) -> list[bytes]:
    """Every member after a local file header, read from the headers alone (a central
    directory, flag bits or CRCs that ``zipfile`` refuses do not hide a member from a
    loader that reads local headers); stored or deflated."""
    members = []
    at = data.find(b"PK\x03\x04")
    while at >= 0 and at + 30 <= len(data):
        _flag, method = struct.unpack_from("<HH", data, at + 6)
        size, _usize, name_len, extra_len = struct.unpack_from("<IIHH", data, at + 18)
        start = at + 30 + name_len + extra_len
        body = data[start:start + size] if size else data[start:]
        try:
            members.append(zlib.decompressobj(-15).decompress(body) if method == 8 else body)
        except zlib.error:
            pass
        at = data.find(b"PK\x03\x04", start)
    return members


def _bytes_import(data: bytes, depth: int = 0) -> bool:
    if data.startswith(b"PK\x03\x04") and depth < 4:
        return any(_bytes_import(m, depth + 1) for m in _zip_members(data))
    npy = _npy_pickle_start(data)
    return _stream_imports(data, npy if npy is not None else 0)


def imports_by_bytes(path: Path) -> bool:
    return _bytes_import(path.read_bytes())


def imports_by_scan(result: FileResult) -> bool:
    return any(f.opcode in IMPORT_OPCODES for f in result.findings)


def _show(result: FileResult) -> str:
    found = ", ".join(f"{f.name} ({f.verdict.value}, {f.opcode})" for f in result.findings[:4])
    return f"{result.verdict.value} [{found}] {'; '.join(result.errors[:2])}"


MALICIOUS = _of("malicious")
MALICIOUS_IMPORTING = [r for r in MALICIOUS if imports_by_bytes(r.path)]


# ---------------------------------------------------------------------------------------
# The corpora are what this module thinks they are.
# ---------------------------------------------------------------------------------------

def test_the_producers_verdicts_are_read_as_written():
    source = (PICKLESCAN / "SOURCE.txt").read_text()
    for pattern in PICKLESCAN_BENIGN + PICKLESCAN_NEITHER:
        assert pattern in source, f"SOURCE.txt no longer names {pattern}"
    for row in ROWS:
        assert row.path.is_file(), f"{row.corpus}: manifest names {row.path.name}, which is not there"
    kinds = {r.kind for r in ROWS}
    assert kinds == {"malicious", "benign", "unsafe-malformed", "suspicious", "malicious-metadata",
                     "skipped", "neither"}, kinds
    for pattern in PICKLESCAN_BENIGN:
        assert any(fnmatch.fnmatch(r.path.relative_to(PICKLESCAN).as_posix(), pattern)
                   for r in ROWS if r.corpus == "picklescan"), f"no picklescan file matches {pattern}"
    # most malicious files import something: the import tests below are not run on nothing
    assert len(MALICIOUS_IMPORTING) > 0.8 * len(MALICIOUS), len(MALICIOUS_IMPORTING)


# ---------------------------------------------------------------------------------------
# Malicious, malformed, suspicious
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("row", _params(MALICIOUS_IMPORTING))
def test_malicious_file_that_imports_is_never_safe(row):
    result = scan_file(row.path)
    assert result.verdict is not Verdict.SAFE, _show(result)


def test_malicious_files_that_import_are_called_dangerous():
    """At least 95 % of them ``dangerous`` (and none ``safe``); the list of the others."""
    importing, safe, not_dangerous = 0, [], []
    for row in MALICIOUS:
        result = scan_file(row.path)
        if not (imports_by_bytes(row.path) or imports_by_scan(result)):
            continue
        importing += 1
        if result.verdict is not Verdict.DANGEROUS:
            not_dangerous.append(f"{row.corpus}/{row.id}: {_show(result)}")
        if result.verdict is Verdict.SAFE:
            safe.append(row.id)
    share = 1 - len(not_dangerous) / importing
    listing = "\n".join(not_dangerous)
    print(f"{len(not_dangerous)} of {importing} malicious files that import are not dangerous:\n{listing}")
    assert not safe and share >= DANGEROUS_SHARE, (
        f"{share:.1%} dangerous (at least {DANGEROUS_SHARE:.0%} wanted), safe: {safe}; "
        f"not dangerous:\n{listing}")


@pytest.mark.parametrize("row", _params(_of("unsafe-malformed")))
def test_malformed_pickle_is_never_safe(row):
    result = scan_file(row.path)
    assert result.verdict is not Verdict.SAFE, _show(result)


@pytest.mark.parametrize("row", _params(_of("suspicious")))
def test_dill_pickled_function_is_not_safe(row):
    result = scan_file(row.path)
    assert result.verdict is not Verdict.SAFE, _show(result)


# ---------------------------------------------------------------------------------------
# Benign, encrypted, metadata
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("row", _params(_of("benign")))
def test_benign_file_is_safe(row):
    result = scan_file(row.path)
    assert result.verdict is Verdict.SAFE, _show(result)
    assert result.scanned, "a model file the producer calls benign was not recognised as one"


ENCRYPTED = _of("skipped") + [r for r in _of("neither") if r.path.name == "benign_password_protected.zip"]


@pytest.mark.parametrize("row", _params(ENCRYPTED))
def test_encrypted_archive_is_an_error(row):
    """modelscan skips it (BAD_ZIP, encrypted); here it is an ``error``: never ``safe``."""
    result = scan_file(row.path)
    assert result.verdict is Verdict.ERROR, _show(result)
    assert result.errors and all(e.strip() for e in result.errors)


def _safetensors_metadata(path: Path) -> dict:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n)).get("__metadata__") or {}


@pytest.mark.parametrize("row", _params(_of("malicious-metadata")))
def test_safetensors_metadata_strings_are_noted_but_are_not_code(row):
    """safetensors runs no code: strings in its header are not an import, yet the scan
    says what metadata the file carries (modelaudit flags the strings themselves)."""
    result = scan_file(row.path)
    assert result.verdict is not Verdict.DANGEROUS, _show(result)
    assert not imports_by_scan(result), _show(result)
    metadata = _safetensors_metadata(row.path)
    assert metadata, "the row's file has header metadata"
    notes = " ".join(result.notes)
    missing = [k for k in metadata if k not in notes]
    assert not missing, f"metadata keys {missing} not in the notes: {result.notes}"


# ---------------------------------------------------------------------------------------
# Keras HDF5
# ---------------------------------------------------------------------------------------

KERAS = {r.path.name: r for r in ROWS if r.path.suffix == ".h5"}


def test_keras_lambda_layer_is_dangerous():
    result = scan_file(KERAS["keras__malicious_lambda.h5"].path)
    assert result.verdict is Verdict.DANGEROUS, _show(result)


def test_keras_model_is_not_called_safe():
    """A Keras HDF5 file is not checked (its Lambda layers are code): never ``safe``."""
    result = scan_file(KERAS["keras__safe_model.h5"].path)
    assert result.verdict is not Verdict.SAFE, _show(result)
