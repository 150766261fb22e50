"""``hpcml ckpt export`` and the offline load of a shard whose index a corruption (or an
attacker) made disagree with its bytes, its checksums rewritten to match: refused, nothing
written, nothing allocated from the index's word alone."""

from __future__ import annotations

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer, CheckpointError, load
from hpcml.ckpt.export import export
from hpcml.errors import UsageError
from tests.ckpt.forge import forge


def test_export_refuses_a_reserved_name_and_bytes_that_do_not_fit_the_shape(tmp_path):
    out = tmp_path / "m.safetensors"
    with Checkpointer(tmp_path / "a") as c:
        c.save({"__metadata__": np.arange(4, dtype=np.float32), "w": np.ones(3, dtype=np.float32)}, 1)
    with pytest.raises(UsageError, match="__metadata__"):
        export(tmp_path / "a", out)
    assert not out.exists()

    with Checkpointer(tmp_path / "b") as c:
        c.save({"w": np.arange(4, dtype=np.float32), "v": np.ones(2, dtype=np.float64)}, 1)
    step = tmp_path / "b" / "step-00000001"
    forge(step, lambda doc: doc["entries"][0].update(shape=[2]))           # 16 bytes, 2 float32s
    # refused when the step is verified, as the load refuses it: an index that is not its bytes
    with pytest.raises(CheckpointError, match=r"key 'entries\.0': shape \[2\] of <f4 is 8 bytes, the entry's are 16"):
        export(tmp_path / "b", out)
    forge(step, lambda doc: doc["entries"][0].update(shape=[4], offset=-4))
    # refused when the step is verified, before any tensor is read (its index points outside its shard)
    with pytest.raises(CheckpointError, match=r"key 'entries\.0': bytes -4\+16 are not inside"):
        export(tmp_path / "b", out)
    assert not out.exists() and not out.with_name(out.name + ".tmp").exists()

    forge(step, lambda doc: doc.update(size=1 << 50))                     # a petabyte: not allocated
    with pytest.raises(CheckpointError, match="key 'size'"):
        load(tmp_path / "b")


def test_an_export_killed_at_random_leaves_the_old_file_or_the_new_one_and_nothing_else(tmp_path):
    """Issue 61: ``hpcml ckpt export`` killed with SIGKILL at random moments (40 times) while
    it writes a 24 MB model over an earlier export: the file is whole, nothing half-written
    is left, and the next export leaves nothing else."""
    from tests.killloop import kill_loop, left

    with Checkpointer(tmp_path / "ck") as c:
        c.save({"w": np.arange(6 << 20, dtype=np.float32)}, 1)
    out = tmp_path / "out" / "m.safetensors"
    out.parent.mkdir()
    export(tmp_path / "ck", out)
    whole = out.read_bytes()

    tmp = out.with_name(out.name + ".tmp")

    def after():                                      # a temporary file only ever whole: killed
        assert set(left(out.parent)) <= {"m.safetensors", "m.safetensors.tmp"}     # between link and rename
        assert out.read_bytes() == whole and (not tmp.exists() or tmp.read_bytes() == whole)
    k = kill_loop(lambda i: export(tmp_path / "ck", out), after=after)
    assert k.killed == 40 and k.done > 0, k
    export(tmp_path / "ck", out)                      # the next export removes it
    assert left(out.parent) == ["m.safetensors"] and out.read_bytes() == whole
