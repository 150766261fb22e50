"""``hpcml.files``' bounded reads: what a hostile replacement of a small record can do to
the reader (block it, fill its memory, crash its parser) turns into one ValueError."""

from __future__ import annotations

import os
import threading

import pytest

from hpcml.files import load_json_bounded, read_bounded, write_atomic


def test_a_small_regular_file_is_read(tmp_path):
    write_atomic(tmp_path / "r.json", '{"a": 1}')
    assert load_json_bounded(tmp_path / "r.json", 100) == {"a": 1}


@pytest.mark.parametrize("kind", ["fifo", "directory", "devzero-link", "sparse-huge", "too-deep", "not-json"])
def test_what_is_not_a_small_json_file_is_a_value_error(tmp_path, kind):
    p = tmp_path / "r.json"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    elif kind == "devzero-link":
        os.symlink("/dev/zero", p)
    elif kind == "sparse-huge":
        with open(p, "wb") as f:
            f.truncate(1 << 36)
    elif kind == "too-deep":
        p.write_text("[" * 200_000)
    else:
        p.write_text("{not json")
    done: list[BaseException] = []

    def read() -> None:
        try:
            load_json_bounded(p, 1 << 20, follow_symlinks=kind != "devzero-link")
        except BaseException as exc:             # noqa: BLE001 - the test looks at what it was
            done.append(exc)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(60)
    assert done, f"the read of a {kind} did not return"
    expected = OSError if kind == "devzero-link" else ValueError     # O_NOFOLLOW: ELOOP
    assert isinstance(done[0], expected), repr(done[0])


def test_a_followed_symlink_is_still_bounded(tmp_path):
    os.symlink("/dev/zero", tmp_path / "z")
    with pytest.raises(ValueError):
        read_bounded(tmp_path / "z", 4096)          # /dev/zero is a character device: not read
