"""TF SavedModel (issue 47): ``saved_model.pb`` recognised by name, never ``safe``; ops that
call Python or write files are ``dangerous``; the saver's own checkpoint ops are not noted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_paths
from tests.scan.formats.hdf5files import LAMBDA_CONFIG
from tests.scan.formats.protobuf import blob, msg, num
from tests.scan.formats.scanning import scan_written


def _scan(tmp_path: Path, data: bytes, name: str = "saved_model.pb"):
    return scan_written(tmp_path, data, name)


def _node(name: str, op: str, *inputs: str) -> bytes:
    return msg(blob(1, name), blob(2, op), *(blob(3, i) for i in inputs), blob(4, "/device:CPU:0"))


def _function(name: str, *nodes: bytes) -> bytes:
    return msg(blob(1, msg(blob(1, name))), *(blob(3, n) for n in nodes))


def saved_model(*ops: tuple[str, str], function_ops: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A SavedModel as tf.saved_model.save writes one: schema version 1, one meta graph
    (tags, a graph of nodes that call functions, the library with the serving function
    and the saver's __inference__traced_save/_restore functions)."""
    nodes = [_node("serving_default_x", "Placeholder"), _node("StatefulPartitionedCall", "StatefulPartitionedCall"),
             _node("saver_filename", "Placeholder"), *(_node(n, op) for n, op in ops)]
    library = msg(
        blob(1, _function("__inference_signature_wrapper_123", _node("MatMul", "MatMul"),
                          *(_node(n, op) for n, op in function_ops))),
        blob(1, _function("__inference__traced_save_456", _node("SaveV2", "SaveV2"),
                          _node("MergeV2Checkpoints", "MergeV2Checkpoints"))),
        blob(1, _function("__inference__traced_restore_789", _node("RestoreV2", "RestoreV2"))))
    graph = msg(*(blob(1, n) for n in nodes), blob(2, library), blob(4, msg(num(1, 1808))))
    meta = msg(blob(1, msg(blob(4, "serve"), blob(5, "2.16.1"))), blob(2, graph))
    return msg(num(1, 1), blob(2, meta))


def test_saved_model_is_recognised_and_not_scanned(tmp_path):
    result = _scan(tmp_path, saved_model())
    assert (result.format, result.verdict) == ("tf-savedmodel", Verdict.NOT_SCANNED), (result.findings, result.errors)
    assert result.notes == []                           # the saver's SaveV2/RestoreV2 are its own


@pytest.mark.parametrize("op", ["PyFunc", "PyFuncStateless", "EagerPyFunc", "WriteFile"])
def test_python_and_file_writing_ops_are_dangerous(tmp_path, op):
    in_graph = _scan(tmp_path, saved_model(("evil", op)))
    in_function = _scan(tmp_path, saved_model(function_ops=(("evil", op),)))
    for result in (in_graph, in_function):
        assert result.verdict is Verdict.DANGEROUS
        assert [f.name for f in result.findings if f.verdict is Verdict.DANGEROUS] == [f"TF op {op}"]
    assert "__inference_signature_wrapper_123" in in_function.findings[0].why


def test_file_ops_and_checkpoint_ops_outside_the_saver_are_noted(tmp_path):
    result = _scan(tmp_path, saved_model(("r", "ReadFile"), function_ops=(("s", "SaveV2"),)))
    assert result.verdict is Verdict.NOT_SCANNED
    assert result.notes == ["ops that read, list or write files outside the saver: ReadFile (1x), SaveV2 (1x)"]


def test_text_saved_model_is_read(tmp_path):
    text = b'meta_graphs {\n  graph_def {\n    node {\n      name: "f"\n      op: "EagerPyFunc"\n    }\n  }\n}\n'
    result = _scan(tmp_path, text, name="saved_model.pbtxt")
    assert result.verdict is Verdict.DANGEROUS


def test_keras_metadata_lambda_is_dangerous(tmp_path):
    layer = json.dumps({"class_name": "Sequential", "config": LAMBDA_CONFIG["config"]}).encode()
    metadata = msg(blob(1, msg(num(1, 0), blob(2, "_tf_keras_sequential"), blob(3, "root"),
                               blob(4, msg(num(1, 2), num(2, 1))), blob(5, layer))))
    result = _scan(tmp_path, metadata, name="keras_metadata.pb")
    assert result.verdict is Verdict.DANGEROUS
    assert "keras Lambda 'lambda'" in [f.name for f in result.findings]


def test_a_saved_model_directory_is_never_safe(tmp_path):
    root = tmp_path / "export"
    (root / "variables").mkdir(parents=True)
    (root / "saved_model.pb").write_bytes(saved_model())
    (root / "fingerprint.pb").write_bytes(msg(num(1, 123456789), num(2, 42)))
    (root / "variables" / "variables.index").write_bytes(b"\0\0\0\0\x01\x00" + b"\x88" * 40)
    (root / "variables" / "variables.data-00000-of-00001").write_bytes(bytes(64))
    results = {Path(r.path).name: r for r in scan_paths([root], jobs=1)}
    assert results["saved_model.pb"].verdict is Verdict.NOT_SCANNED
    assert all(r.verdict is not Verdict.SAFE or not r.scanned for r in results.values()), results


@pytest.mark.parametrize("data", [saved_model()[:-5], b"\x08\x01\x12\xff\xff\xff\x7f", b"\x00\x01"])
def test_malformed_saved_model_is_an_error(tmp_path, data):
    result = _scan(tmp_path, data)
    assert (result.format, result.verdict) == ("tf-savedmodel", Verdict.ERROR), result.errors
