"""ONNX (issue 47): recognised by name and first field, never ``safe``; an external-data
location outside the model's directory is ``dangerous``; a broken protobuf is an ``error``."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from hpcml.scan.formats.onnx import outside
from hpcml.scan.model import Verdict
from tests.scan.formats.protobuf import blob, msg, num
from tests.scan.formats.scanning import scan_written


def _scan(tmp_path: Path, data: bytes, name: str = "model.onnx"):
    return scan_written(tmp_path, data, name)


def _tensor(name: str, location: str | None = None) -> bytes:
    """A TensorProto as onnx.external_data_helper leaves it: dims, FLOAT, the name, then
    either raw_data or external_data entries with data_location EXTERNAL."""
    fields = [num(1, 2), num(1, 2), num(2, 1), blob(8, name)]
    if location is None:
        fields.append(blob(9, struct.pack("<4f", 1, 2, 3, 4)))
    else:
        fields += [blob(13, msg(blob(1, "location"), blob(2, location))),
                   blob(13, msg(blob(1, "offset"), blob(2, "0"))),
                   blob(13, msg(blob(1, "length"), blob(2, "16"))), num(14, 1)]
    return msg(*fields)


def model(*, location: str | None = None, domain: str = "", subgraph_location: str | None = None) -> bytes:
    """A ModelProto as torch.onnx.export writes one: ir_version, producer, graph (a node, an
    initializer, an If whose branch has its own initializer), opset imports."""
    node = msg(blob(1, "x"), blob(1, "w"), blob(2, "y"), blob(3, "/MatMul"), blob(4, "MatMul"))
    custom = msg(blob(1, "y"), blob(2, "z"), blob(3, "/Custom"), blob(4, "Gelu2"), blob(7, domain)) if domain else b""
    branch = msg(blob(5, _tensor("b", subgraph_location)), blob(2, "then"))
    if_node = msg(blob(1, "c"), blob(2, "o"), blob(4, "If"),
                  blob(5, msg(blob(1, "then_branch"), blob(6, branch), num(20, 5))))
    graph = msg(blob(1, node), blob(1, custom) if domain else b"", blob(1, if_node), blob(2, "main_graph"),
                blob(5, _tensor("w", location)))
    opsets = blob(8, msg(blob(1, ""), num(2, 17))) + (blob(8, msg(blob(1, domain), num(2, 1))) if domain else b"")
    return msg(num(1, 8), blob(2, "pytorch"), blob(3, "2.3.0"), blob(7, graph), opsets)


def test_onnx_is_recognised_and_not_scanned(tmp_path):
    result = _scan(tmp_path, model())
    assert (result.format, result.verdict) == ("onnx", Verdict.NOT_SCANNED), (result.findings, result.errors)
    assert [f.name for f in result.findings] == ["ONNX graph"]


def test_onnx_needs_its_name_to_be_recognised(tmp_path):
    assert _scan(tmp_path, model(), name="model.bin").format != "onnx"


def test_external_data_beside_the_model_is_noted(tmp_path):
    result = _scan(tmp_path, model(location="weights.bin"))
    assert result.verdict is Verdict.NOT_SCANNED
    assert any("1 tensors stored in files beside the model" in n for n in result.notes), result.notes


@pytest.mark.parametrize("where", ["../../etc/passwd", "/etc/passwd", "sub/../../x", "C:\\secrets", "..\\x"])
def test_external_data_outside_the_directory_is_dangerous(tmp_path, where):
    result = _scan(tmp_path, model(location=where))
    assert result.verdict is Verdict.DANGEROUS
    assert [f.name for f in result.findings if f.verdict is Verdict.DANGEROUS] == [f"ONNX external data {where!r}"]


def test_external_data_in_a_subgraph_is_found(tmp_path):
    assert _scan(tmp_path, model(subgraph_location="/etc/shadow")).verdict is Verdict.DANGEROUS


def test_custom_operator_domain_is_noted(tmp_path):
    result = _scan(tmp_path, model(domain="com.example.ops"))
    assert result.verdict is Verdict.NOT_SCANNED
    assert any("'com.example.ops'" in n for n in result.notes), result.notes


@pytest.mark.parametrize("data", [
    model()[:-3],                                        # cut inside the last opset import
    model() + b"\x3a\xff\xff\xff\x0f",                   # a graph field longer than the file
    b"\x08\x08\x12\x07pytorch\x0b",                      # wire type 3 (a group)
])
def test_malformed_onnx_is_an_error(tmp_path, data):
    result = _scan(tmp_path, data)
    assert (result.format, result.verdict) == ("onnx", Verdict.ERROR), result.errors


def test_outside():
    assert not outside("weights/w.bin") and not outside("w..bin")
    assert outside("../w.bin") and outside("/abs") and outside("D:w") and outside("a\\..\\..\\b")
