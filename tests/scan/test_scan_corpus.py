"""``hpcml scan`` and ``safe_load`` against the ground-truth corpus of ``payloads``.

``test_payloads_are_live`` proves each malicious file really runs its payload when
loaded; here the same files are scanned and loaded through hpcml, in this process,
and the marker file proves nothing was executed.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from hpcml.scan.loader import RestrictedUnpickler, UnsafeFileError, safe_load
from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file
from tests import needs
from tests.scan import payloads


def _params(cases):
    return [pytest.param(c, id=c.name, marks=[pytest.mark.torch] if "torch" in c.needs else [])
            for c in cases]


def _build(case: payloads.Case, tmp_path: Path) -> tuple[Path, Path]:
    for module in case.needs:
        needs.module(module)
    marker = tmp_path / "marker file"
    out = tmp_path / "corpus"
    out.mkdir()
    return case.build(out, marker), marker


@pytest.mark.parametrize("case", _params(payloads.MALICIOUS))
def test_malicious_file_is_flagged_and_never_run(case, tmp_path):
    path, marker = _build(case, tmp_path)
    result = scan_file(path)
    assert result.verdict in (Verdict.DANGEROUS, Verdict.UNKNOWN), (result.findings, result.errors)
    assert any(f.verdict is not Verdict.SAFE for f in result.findings), result
    with pytest.raises(UnsafeFileError) as info:
        safe_load(path)
    assert info.value.exit_code in (5, 6)
    assert not marker.exists()


@pytest.mark.parametrize("case", _params(payloads.BENIGN))
def test_benign_file_is_safe_and_loads_like_the_real_loader(case, tmp_path):
    path, marker = _build(case, tmp_path)
    result = scan_file(path)
    assert result.verdict is Verdict.SAFE, (result.findings, result.errors)
    assert result.scanned and result.format != "unrecognised"
    ours = safe_load(path, framework="pt" if "safetensors_torch" in case.name else "numpy")
    _assert_same(ours, case.load(path))
    assert not marker.exists()


@pytest.mark.parametrize("case", _params(payloads.MALFORMED))
def test_malformed_file_is_never_safe(case, tmp_path):
    path, _ = _build(case, tmp_path)
    result = scan_file(path)
    assert result.verdict is not Verdict.SAFE, result
    if result.verdict is Verdict.ERROR:
        assert result.errors and all(e.strip() for e in result.errors)


def _assert_same(a, b) -> None:
    """Deep equality that understands numpy arrays and torch tensors."""
    if hasattr(a, "shape") and hasattr(b, "shape"):
        import numpy as np
        def to_np(x):
            return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)
        assert np.array_equal(to_np(a), to_np(b))
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_restricted_unpickler_blocks_without_a_scan(tmp_path):
    """The second lock: even called directly, the unpickler refuses a dangerous global."""
    case = next(c for c in payloads.MALICIOUS if c.name == "memo_desync_stack_global")
    path, marker = _build(case, tmp_path)
    with open(path, "rb") as fh, pytest.raises(pickle.UnpicklingError, match="os.system"):
        RestrictedUnpickler(fh).load()
    assert not marker.exists()
