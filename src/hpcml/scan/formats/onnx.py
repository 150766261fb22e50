"""ONNX models: the graph is read for what reaches outside the model, never run.

An ONNX file is a protobuf ``ModelProto`` (``onnx/onnx.proto``). It is recognised
conservatively, by its ``.onnx`` name and its first field, ``ir_version`` (tag 0x08, a small
number), followed by another ``ModelProto`` field. The scan walks the graph, its subgraphs
(``If``/``Loop`` bodies), training graphs and local functions for:

- tensors stored outside the file (``data_location`` EXTERNAL, ``external_data`` key
  ``location``): a location that is absolute or climbs out with ``..`` makes the loader read
  a file outside the model's directory (``dangerous``; CVE-2022-25882, CVE-2024-27318);
- operator domains beyond ONNX's and ONNX Runtime's own: running them needs a custom-op
  library, native code the loading process registers (noted).

Operators are not executed and weights are not checked, so a model is at best ``not-scanned``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, BinaryIO

from hpcml.scan.formats import ScanContent, ScanFormat
from hpcml.scan.formats.bounded import ByteReader, Truncated
from hpcml.scan.formats.protowalk import ProtoError, Schema, parse
from hpcml.scan.model import Verdict

if TYPE_CHECKING:
    from hpcml.scan.context import FileScan

#: the fields on the way to operator domains and tensor locations (onnx.proto numbering)
SCHEMA: Schema = {
    "model": {1: "int", 7: "graph", 8: "opset", 20: "training", 25: "function"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "node": {3: "str", 4: "str", 5: "attribute", 7: "str"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
    "tensor": {8: "str", 13: "entry", 14: "int"},
    "entry": {1: "str", 2: "str"},
    "opset": {1: "str"},
    "training": {1: "graph", 2: "graph"},
    "function": {7: "node", 9: "opset", 10: "str", 11: "attribute"},
}
#: ModelProto's field tags, one of which follows ir_version in a real file
_MODEL_TAGS = {0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72, 0xA2, 0xCA}
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training",
                              "com.microsoft", "com.microsoft.nchwc", "com.microsoft.experimental",
                              "com.ms.internal.nhwc"})
EXTERNAL = 1


def looks_like(head: bytes, name: str) -> bool:
    if not name.lower().endswith(".onnx") or len(head) < 3 or head[0] != 0x08 or not 0 < head[1] < 0x80:
        return False
    return head[2] in _MODEL_TAGS


def outside(location: str) -> bool:
    """Whether an external-data location reaches outside the model's directory."""
    parts = re.split(r"[\\/]", location)
    return location.startswith(("/", "\\")) or bool(re.match(r"[A-Za-z]:", location)) or ".." in parts


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    fs.set_format("onnx")
    try:
        model = parse(ByteReader(fh, size), SCHEMA, "model")
    except (ProtoError, Truncated) as exc:
        fs.error(f"ONNX: not a well-formed ModelProto: {exc}", member)
        return
    local = {msg.text(10) for msg, _ in model.walk() if msg.kind == "function"}
    domains: set[str] = set()
    external = 0
    for msg, _ in model.walk():
        if msg.kind in ("opset", "node"):
            domains.add(msg.text(1 if msg.kind == "opset" else 7))
        elif msg.kind == "tensor":      # a location counts even where data_location does not say EXTERNAL
            locations = [entry for entry in msg.children if entry.text(1) == "location"]
            external += bool(locations) or msg.first(14, 0) == EXTERNAL
            for entry in locations:
                where = entry.text(2)
                if outside(where):
                    fs.add(Verdict.DANGEROUS, f"ONNX external data {where!r}", f"tensor {msg.text(8)!r} is read "
                           "from a file outside the model's directory (an absolute path or '..')",
                           member, entry.offset, "external data")
    custom = sorted(domains - STANDARD_DOMAINS - local)
    if custom:
        fs.note(f"{member + ': ' if member else ''}custom operator domains {', '.join(map(repr, custom))}: "
                "running them needs a custom-op library, native code the loading process registers")
    if external:
        fs.note(f"{member + ': ' if member else ''}{external} tensors stored in files beside the model")
    fs.not_scanned("ONNX graph", "hpcml read the graph's operator domains and external-data locations; "
                   "it does not run or check the operators and weights", member)


FORMAT = ScanFormat(lambda head, size, name: looks_like(head, name), _scan)
