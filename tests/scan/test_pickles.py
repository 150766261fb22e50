"""A stream of pickles (``hpcml.scan.pickles``): pickles carried as text are named in a note
and do not change the verdict of a file that never decodes them."""

from __future__ import annotations

import base64
import os
import pickle

import pytest

from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo hi",))


@pytest.mark.parametrize("encode", [lambda b: base64.b64encode(b).decode(), lambda b: b.hex(),
                                    lambda b: b.hex(" ")], ids=["base64", "hex", "spaced hex"])
@pytest.mark.parametrize("protocol", [2, 4])
def test_a_pickle_carried_as_text_is_noted_not_loaded(encode, protocol, tmp_path):
    inner = pickle.dumps(_Evil(), protocol=protocol)
    path = tmp_path / "carrier.pkl"
    path.write_bytes(pickle.dumps({"config": {"lr": 0.1}, "blob": encode(inner)}, protocol=4))
    result = scan_file(path)
    assert result.verdict is Verdict.SAFE, result.findings      # nothing in it decodes the text
    assert any("encoded as" in n and "posix.system" in n for n in result.notes), result.notes


def test_ordinary_text_that_starts_like_base64_gets_no_note(tmp_path):
    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps(["gAJ is how base64 of a pickle starts", "8002 0a 0b 0c 0d 0e 0f"]))
    result = scan_file(path)
    assert result.verdict is Verdict.SAFE and not result.notes, result.notes
