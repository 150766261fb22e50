"""A collector token file that is not what it should be (binary, a FIFO, too large): the
reader neither blocks nor raises, and a vetting run or prolog says so in one warning line and
keeps its verdict (the collector never changes it)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from hpcml.centre import client
from hpcml.centre.collector import server


def _within(seconds: float, fn, *args):
    """``fn(*args)`` in a thread: its result or exception, or a failure when it is still
    running after ``seconds`` (a read that blocks on a FIFO would hang the test otherwise)."""
    out: list = []

    def call():
        try:
            out.append(("ok", fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(("raised", exc))
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"{fn.__name__} still blocked after {seconds} s"
    return out[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    os.mkfifo(path)
    return path


def test_reading_a_fifo_as_token_file_neither_blocks_nor_raises(fifo):
    kind, value = _within(3, server.read_tokens, fifo)
    assert kind == "raised" and isinstance(value, ValueError) and "FIFO" in str(value)
    kind, (token, why) = _within(3, client.read_token, fifo)
    assert kind == "ok" and token is None and why == f"token file {fifo}: a FIFO, not a regular file"


def test_a_token_file_that_is_not_utf8_is_a_reason_not_an_exception(tmp_path):
    bad = tmp_path / "token"
    bad.write_bytes(b"\xff\xfe\x00garbage\n")
    assert client.read_token(bad) == (None, f"token file {bad}: not UTF-8 text (bad byte at offset 0)")
    line = client.send_with_token_file({"nodes": {}}, "http://127.0.0.1:9", bad, timeout=1)
    assert line == (f"hpcml vet: warning: report not sent to http://127.0.0.1:9: token file {bad}: "
                    "not UTF-8 text (bad byte at offset 0)")


def test_a_huge_token_file_is_refused_unread(tmp_path):
    big = tmp_path / "token"
    with open(big, "wb") as f:
        f.truncate(64 << 20)          # sparse: its size claimed for free, all of it NULs (valid UTF-8)
    token, why = client.read_token(big)
    assert token is None and why is not None and "larger than" in why


def test_a_good_token_file_still_gives_its_first_token(tmp_path):
    good = tmp_path / "token"
    good.write_text("# the collector's\n\n  s3cret  \nother\n")
    assert client.read_token(good) == ("s3cret", None)
    assert client.read_token(tmp_path / "none") == (None, f"token file {tmp_path / 'none'}: file not found")


def test_centre_serve_names_what_its_token_file_is(fifo, tmp_path):
    """``centre serve``'s door says the same as the senders': a FIFO is a FIFO (it once said
    "not text"), binary is not UTF-8, each one line naming the flag."""
    from hpcml.centre.cli.serve import _tokens
    from hpcml.errors import UsageError
    kind, exc = _within(3, _tokens, fifo, "--token-file")
    assert kind == "raised" and isinstance(exc, UsageError), exc
    assert "FIFO" in str(exc) and "not text" not in str(exc) and "--token-file" in str(exc), str(exc)
    bad = tmp_path / "bin"
    bad.write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(UsageError, match=r"not UTF-8 text \(bad byte at offset 0\)"):
        _tokens(bad, "--token-file")
