"""A fetch from the object tier takes what the step's manifest names and nothing else, each
object no larger than the manifest states: another object under the step's prefix (64 MiB
of junk, a name too long for the filesystem) was downloaded, or ended ``load_latest`` in an
OSError traceback instead of trying the step before."""

from __future__ import annotations

import errno
import shutil

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer, layout
from hpcml.ckpt.objtier import ObjectTier
from hpcml.errors import HpcmlError


def _two_steps(s3, tmp_path, name: str) -> None:
    with Checkpointer(tmp_path / "ck", keep=3, object_store=s3.url(name), max_write_rate=None) as ck:
        for step in (10, 20):
            ck.save({"w": np.full(4, float(step))}, step)
            ck.wait()
    shutil.rmtree(tmp_path / "ck")                                      # the shared tier lost them


@pytest.mark.parametrize("name", ["junk.bin", "a" * 300], ids=["junk", "name-too-long"])
def test_objects_the_manifest_does_not_name_are_never_fetched(s3, tmp_path, name):
    _two_steps(s3, tmp_path, "extra")
    s3.client().put_object(Bucket=s3.bucket, Key=f"extra/step-00000020/{name}", Body=b"\0" * (1 << 20))
    state, step = Checkpointer(tmp_path / "ck", object_store=s3.url("extra")).load_latest()
    assert step == 20 and np.all(state["w"] == 20.0)
    assert sorted(p.name for p in (tmp_path / "ck" / "step-00000020").iterdir()) == \
        [layout.MANIFEST, "rank-00000.bin", "rank-00000.json"]


def test_an_object_larger_than_the_manifest_states_is_refused_and_the_step_before_taken(s3, tmp_path):
    _two_steps(s3, tmp_path, "grown")
    s3.client().put_object(Bucket=s3.bucket, Key="grown/step-00000020/rank-00000.bin", Body=b"\0" * (4 << 20))
    with pytest.raises(HpcmlError, match="rank-00000.bin: larger than the 4096 bytes the manifest states"):
        ObjectTier(s3.url("grown")).fetch(20, tmp_path)
    assert not list(tmp_path.glob("*step-00000020*"))                  # nothing of it left, nor put in place
    ck = Checkpointer(tmp_path / "ck", object_store=s3.url("grown"))
    state, step = ck.load_latest()
    assert step == 10 and np.all(state["w"] == 10.0)
    assert not (tmp_path / "ck" / "step-00000020").exists()


def test_a_file_the_fetch_cannot_create_is_one_line_and_the_step_before_is_taken(s3, tmp_path, monkeypatch):
    """ENAMETOOLONG (or a full disk) creating a fetched file escaped as an OSError traceback."""
    _two_steps(s3, tmp_path, "noname")
    real = layout.create

    def create(path, *args, **kwargs):
        if ".fetch-step-00000020" in str(path):
            raise OSError(errno.ENAMETOOLONG, "File name too long")
        return real(path, *args, **kwargs)
    monkeypatch.setattr(layout, "create", create)
    with pytest.raises(HpcmlError, match="cannot be created.*File name too long"):
        ObjectTier(s3.url("noname")).fetch(20, tmp_path)
    state, step = Checkpointer(tmp_path / "ck", object_store=s3.url("noname")).load_latest()
    assert step == 10 and np.all(state["w"] == 10.0)
