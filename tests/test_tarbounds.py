"""A tar member's size is checked against what the archive holds, in a file and in a stream:
a header claiming 10**20 bytes ends the walk at once with the member named, where tarfile
alone spins (stream) or raises a ValueError (file). Honest PAX and base-256 sizes pass."""

from __future__ import annotations

import bz2
import gzip
import io
import tarfile
import time

import pytest

from hpcml.tarbounds import EXTENDED_MAX, checked_members, file_room, open_tar
from tests.hostile_tars import B_SIZE, HUGE, MEMBERS, gnu_size_tar, huge_extended_header, pax_size_tar

BUILDERS = {"pax size record": pax_size_tar, "gnu base-256 size": gnu_size_tar}


class SpinGuard(io.BytesIO):
    """A file that fails the test when read at its end again and again: tarfile's stream
    skip, unchecked, would call it for ever, and a hung test fails nothing."""

    def read(self, n: int | None = -1) -> bytes:
        data = super().read(n)
        self.empty = getattr(self, "empty", 0) + (not data and n != 0)
        assert self.empty < 1000, "the reader keeps reading at the end of the file"
        return data


#: how each form of a tar is opened: a file (seekable, length known) or a decompressed stream
FORMS = {
    "file": lambda raw: (open_tar(SpinGuard(raw), "r:"), len(raw)),
    "plain stream, length known": lambda raw: (open_tar(SpinGuard(raw), "r|"), len(raw)),
    "plain stream": lambda raw: (open_tar(SpinGuard(raw), "r|"), None),
    "gzip stream": lambda raw: (open_tar(SpinGuard(gzip.compress(raw)), "r|*"), None),
    "bzip2 stream": lambda raw: (open_tar(SpinGuard(bz2.compress(raw)), "r|*"), None),
}


def walk(tf: tarfile.TarFile, room: int | None) -> list[tuple[str, int, bytes]]:
    """Every member with its data, as a reader of the archive sees it."""
    out = []
    for info in checked_members(tf, room=room):
        data = tf.extractfile(info)
        out.append((info.name, info.size, data.read() if data else b""))
    return out


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("build", BUILDERS)
def test_a_member_claiming_more_than_the_archive_holds_is_named_at_once(build, form):
    tf, room = FORMS[form](BUILDERS[build](HUGE))
    start = time.monotonic()
    seen = []
    with pytest.raises(tarfile.ReadError, match=r"member 'b\.txt' claims 100,000,000,000,000,000,000 bytes"):
        for info in checked_members(tf, room=room):
            seen.append(info.name)
    assert time.monotonic() - start < 5
    # with the length known the member is refused before it is handed out; in a stream, once
    # its data runs out (extractfile's reads raise on their own)
    assert seen == (["a.txt"] if room is not None else ["a.txt", "b.txt"])


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("build", BUILDERS)
def test_honest_pax_and_base256_sizes_read_whole(build, form):
    tf, room = FORMS[form](BUILDERS[build](B_SIZE))
    assert walk(tf, room) == [(name, len(data), data) for name, data in MEMBERS]


@pytest.mark.parametrize("form", ["file", "gzip stream"])
@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax x", "gnu L"])
def test_an_extended_header_is_not_read_into_memory_whatever_it_claims(fmt, form):
    tf, room = FORMS[form](huge_extended_header(fmt))
    with pytest.raises(tarfile.ReadError, match=f"claims {HUGE:,} bytes, more than the {EXTENDED_MAX:,}") as exc:
        walk(tf, room)
    assert "after member 'a.txt'" in str(exc.value)


def test_a_member_skipped_unread_in_a_stream_is_checked_too():
    """The caller reads nothing (a directory walk, an index): the skip here meets the end."""
    tf = open_tar(SpinGuard(gzip.compress(pax_size_tar(HUGE))), "r|*")
    with pytest.raises(tarfile.ReadError, match="but the archive ends after"):
        list(checked_members(tf, room=None))


def test_file_room_keeps_the_position():
    fh = io.BytesIO(b"x" * 1000)
    fh.seek(17)
    assert file_room(fh) == 1000 and fh.tell() == 17


@pytest.mark.parametrize("fmt", ["gnu", "posix"])
def test_a_sparse_member_gnu_tar_writes_is_refused_naming_it(tmp_path, fmt):
    """GNU tar's own sparse members (``--sparse``: an old-GNU ``S`` header, or PAX
    ``GNU.sparse.*`` records with the map in the data): tarfile hands out the data through
    the map, a reader of offsets the bytes stored; the walk refuses the member, naming it
    (was: handed out, and the shard reader returned other bytes than the scanner judged)."""
    import shutil
    import subprocess
    tar = shutil.which("tar")
    if tar is None:
        pytest.fail("GNU tar is not installed (Debian's tar package)")
    with open(tmp_path / "000000.bin", "wb") as f:
        f.seek(1 << 20)
        f.write(b"x" * 10)                    # a hole of 1 MiB, then data: what --sparse stores sparse
    out = tmp_path / f"{fmt}.tar"
    subprocess.run([tar, "--sparse", f"--format={fmt}", "-cf", str(out), "000000.bin"], cwd=tmp_path, check=True)
    with tarfile.open(out) as plain:
        assert plain.getmembers()[0].issparse(), "this filesystem kept no hole: the member is not sparse"
    for form in ("file", "plain stream"):
        raw = out.read_bytes()
        tf, room = FORMS[form](raw)
        with pytest.raises(tarfile.ReadError, match="member '000000.bin' is sparse"):
            walk(tf, room)
