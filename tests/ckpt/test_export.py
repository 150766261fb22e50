"""``hpcml ckpt export`` and the offline load of a shard whose index a corruption (or an
attacker) made disagree with its bytes, its checksums rewritten to match: refused, nothing
written, nothing allocated from the index's word alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpcml.ckpt import Checkpointer, CheckpointError, layout, load
from hpcml.ckpt.export import export
from hpcml.errors import UsageError


def _forge_index(step_dir: Path, change) -> None:
    index = step_dir / "rank-00000.json"
    doc = json.loads(index.read_text())
    change(doc)
    index.write_text(json.dumps(doc))
    man = json.loads((step_dir / "manifest.json").read_text())
    man["ranks"]["0"].update(json_size=index.stat().st_size, json_crc32=layout.file_crc(index))
    (step_dir / "manifest.json").write_text(json.dumps(man))


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
    _forge_index(step, lambda doc: doc["entries"][0].update(shape=[2]))           # 16 bytes, 2 float32s
    with pytest.raises(CheckpointError, match="tensor 'w'"):
        export(tmp_path / "b", out)
    _forge_index(step, lambda doc: doc["entries"][0].update(shape=[4], offset=-4))
    with pytest.raises(CheckpointError, match="tensor 'w'"):
        export(tmp_path / "b", out)
    assert not out.exists() and not out.with_name(out.name + ".tmp").exists()

    _forge_index(step, lambda doc: doc.update(size=1 << 50))                     # a petabyte: not allocated
    with pytest.raises(CheckpointError, match="key 'size'"):
        load(tmp_path / "b")
