"""What a Checkpointer leaves behind in the process and on disk: the caller's signal
handlers back after close, and files only the user can read (they hold model weights)."""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer


def _modes(root: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for p in root.rglob("*"):
        out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


@pytest.mark.parametrize(("mode", "want_file", "want_dir"), [(None, 0o600, 0o700), (0o640, 0o640, 0o750)])
def test_checkpoint_files_are_private_unless_a_mode_is_given(tmp_path, mode, want_file, want_dir):
    old = os.umask(0)                            # not the umask's doing
    try:
        kw = {} if mode is None else {"mode": mode}
        ck, local = tmp_path / "new" / "ck", tmp_path / "local"
        with Checkpointer(ck, local_dir=local, max_write_rate=None, **kw) as c:
            for s in (1, 2):
                c.save({"w": np.full(100, s)}, s)
            c.wait()
            stop = ck / f".stop-{c.token}"
            c.stop_signal = "SIGUSR1"
            c.world = 2                          # the file-based agreement path writes .stop-TOKEN
            c._stop_now(3)
            c.world = 1
            assert stop.exists()
    finally:
        os.umask(old)
    modes = {**_modes(ck), **{f"local/{k}": v for k, v in _modes(local).items()}}
    assert any(k.endswith(".bin") for k in modes) and ".owner" in modes
    for name, m in modes.items():
        is_dir = (local / name[6:] if name.startswith("local/") else ck / name).is_dir()
        assert m == (want_dir if is_dir else want_file), (name, oct(m))


@pytest.fixture
def callers_handlers() -> Iterator[tuple[Callable, list[int]]]:
    """The caller's own USR1 and TERM handler (it records what it gets), set before the
    test and the previous ones put back after it."""
    got: list[int] = []

    def mine(sig, _frame) -> None:
        got.append(sig)
    before = {s: signal.signal(s, mine) for s in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        yield mine, got
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_close_gives_the_callers_signal_handlers_back(tmp_path, callers_handlers):
    mine, got = callers_handlers
    with Checkpointer(tmp_path / "ck") as ck:
        assert signal.getsignal(signal.SIGUSR1) == ck._on_signal
        os.kill(os.getpid(), signal.SIGUSR1)
        assert ck.stop_signal == "SIGUSR1" and got == []
    assert signal.getsignal(signal.SIGUSR1) is mine and signal.getsignal(signal.SIGTERM) is mine
    os.kill(os.getpid(), signal.SIGUSR1)
    assert got == [signal.SIGUSR1]
    ck2 = Checkpointer(tmp_path / "ck")
    ck2.close()
    assert signal.getsignal(signal.SIGTERM) is mine


@pytest.mark.parametrize("closing", ["ab", "ba", "bac", "cba"])
def test_checkpointers_closed_in_any_order_give_the_callers_handlers_back(tmp_path, closing, callers_handlers):
    """Two Checkpointers open at once (a model's, an EMA's) closed in the order they were
    opened: the second put back the first's handler, and SIGTERM went on to a closed one."""
    mine, _ = callers_handlers
    cks = {name: Checkpointer(tmp_path / name) for name in sorted(closing)}
    for name in closing:
        cks[name].close()
    assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGUSR1) is mine
    again = Checkpointer(tmp_path / "d")
    again.close()
    assert signal.getsignal(signal.SIGTERM) is mine


def test_a_shard_holds_its_leaves_and_zeros_nothing_of_the_process_memory(tmp_path):
    """The staging buffer is ``np.empty`` and reused: the alignment padding after each leaf
    went to disk as whatever the heap held (pointers of the process; here the previous
    save's bytes), and a scan of the whole file once read such bytes as a pickle opcode and
    refused a benign checkpoint (a flaky suite run). Every byte no leaf fills is now zero,
    and the same state saves to the same bytes."""
    import json
    with Checkpointer(tmp_path / "c", keep=5, max_write_rate=None) as ck:
        ck.save({"big": np.full(100_000, 0xAB, dtype=np.uint8)}, 1)
        ck.wait()
        for step in (2, 3):
            ck.save({"obj": {b"scanned"}, "n": 1, "w": np.arange(3, dtype=np.float32)}, step)
            ck.wait()
    shards = [(tmp_path / "c" / f"step-0000000{s}" / "rank-00000.bin").read_bytes() for s in (2, 3)]
    assert shards[0] == shards[1]
    doc = json.loads((tmp_path / "c" / "step-00000002" / "rank-00000.json").read_text())
    filled = bytearray(len(shards[0]))
    for e in doc["entries"]:
        filled[e["offset"]:e["offset"] + e["nbytes"]] = b"\x01" * e["nbytes"]
    rest = bytes(b for b, f in zip(shards[0], filled) if not f)
    assert rest and set(rest) == {0}, set(rest)


@pytest.mark.parametrize("kind", ["aligned", "unicode", "recarray", "void-in-a-tuple"])
def test_a_structured_array_loads_and_none_of_its_padding_is_the_heap(tmp_path, kind):
    """numpy leaves the padding between an aligned dtype's fields uninitialised (the review
    found a heap pointer there) and a structured array's bytes went to disk with it. Each
    now goes from a copy in zeros: as a leaf (its records' bytes, as before), or inside a
    pickled value (a record in a tuple). Each loads, through ``safe_load`` and
    ``load_latest`` (a first fix pickled every structured array: one with a unicode field,
    or a record array, then saved and never loaded, and ``load_latest`` skipped the step)."""
    from hpcml.scan.loader import safe_load
    dt = np.dtype([("a", "u1"), ("b", "<f8")] + ([("s", "<U3")] if kind == "unicode" else []), align=True)
    a = np.frombuffer(bytearray(b"\xab" * dt.itemsize * 2), dtype=dt)    # padding 0xAB, as garbage would be
    a["a"], a["b"] = [1, 3], [2.0, 4.5]
    if kind == "unicode":
        a["s"] = ["x", "y"]
    value = {"aligned": a, "unicode": a, "recarray": a.view(np.recarray), "void-in-a-tuple": (a[0], "x")}[kind]
    with Checkpointer(tmp_path / "c", keep=5, max_write_rate=None) as ck:
        ck.save({"s": value}, 1)
        ck.wait()
        state, step = ck.load_latest()
    assert step == 1
    got = safe_load(tmp_path / "c" / "step-00000001")["s"]
    for loaded in (got, state["s"]):
        records = np.asarray(loaded[0] if kind == "void-in-a-tuple" else loaded)
        assert records.reshape(-1)[:1].tobytes()[:1] == b"\x01"                 # the first field's byte
    assert b"\xab" not in (tmp_path / "c" / "step-00000001" / "rank-00000.bin").read_bytes()


def test_a_masked_array_is_refused_not_saved_without_its_mask(tmp_path):
    """It loaded back as a plain array, its mask gone, without a word (the review)."""
    from hpcml.errors import UsageError
    with Checkpointer(tmp_path / "c", keep=5, max_write_rate=None) as ck:
        with pytest.raises(UsageError, match="key 'm'.*masked array.*mask would be lost"):
            ck.save({"m": np.ma.masked_array([1.0, 2.0], mask=[0, 1])}, 1)


def test_lazy_views_save_their_values_and_a_sparse_tensor_is_refused_in_one_line(tmp_path):
    """A conjugate or negative view (its bit set, not its values) raised torch's RuntimeError
    at save; it now saves the values it shows. A sparse tensor has no flat bytes: refused,
    naming the key and what to do."""
    import torch

    from hpcml.errors import UsageError
    from hpcml.scan.loader import safe_load
    c, x = torch.tensor([1 + 2j, 3 - 1j]), torch.tensor([1.0, 2.0])
    with Checkpointer(tmp_path / "c", keep=5, max_write_rate=None) as ck:
        ck.save({"c": c.conj(), "n": torch._neg_view(x)}, 1)
        ck.wait()
        got = safe_load(tmp_path / "c" / "step-00000001")
        assert torch.equal(got["c"], c.conj().resolve_conj()) and torch.equal(got["n"], -x)
        with pytest.raises(UsageError, match="key 's'.*layout sparse_coo.*to_dense"):
            ck.save({"s": torch.eye(3).to_sparse()}, 2)
        with pytest.raises(UsageError, match="key 'n'.*layout nested"):
            ck.save({"n": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])}, 3)
        with pytest.raises(UsageError, match="key 'm'.*meta device"):
            ck.save({"m": torch.empty(3, device="meta")}, 4)
