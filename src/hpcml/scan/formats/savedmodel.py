"""TensorFlow SavedModel: the graph's operations, read without TensorFlow.

A SavedModel is a directory: ``saved_model.pb`` (a ``SavedModel`` protobuf: meta graphs,
each a ``GraphDef`` of nodes and a library of functions), ``variables/`` (tensor data),
and for Keras models ``keras_metadata.pb`` (the layers' configs as JSON). Each file is
recognised by its name (a directory scan meets them one by one):

- ``saved_model.pb`` (or the text form ``saved_model.pbtxt``): every node's op is read.
  ``PyFunc``, ``PyFuncStateless`` and ``EagerPyFunc`` call Python in the process that runs
  the graph, ``WriteFile`` writes wherever the graph says (``dangerous``); ``ReadFile``,
  ``MatchingFiles`` and checkpoint ops (``SaveV2``, ``RestoreV2``, ...) outside the saver's own
  functions touch files (noted).
- ``keras_metadata.pb``: its Keras configs are judged as an ``.h5``'s (``keras``).

The graph is never run and the variables never read, so a SavedModel is at best ``not-scanned``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, BinaryIO

from hpcml.scan.formats import ScanContent, ScanFormat, keras
from hpcml.scan.formats.bounded import ByteReader, Truncated, chunks
from hpcml.scan.formats.protowalk import Message, ProtoError, Schema, parse
from hpcml.scan.model import Verdict

if TYPE_CHECKING:
    from hpcml.scan.context import FileScan

#: SavedModel -> MetaGraphDef -> GraphDef -> NodeDef / FunctionDefLibrary -> FunctionDef
SCHEMA: Schema = {
    "saved_model": {2: "meta_graph"},
    "meta_graph": {2: "graph"},
    "graph": {1: "node", 2: "library"},
    "node": {1: "str", 2: "str"},
    "library": {1: "function"},
    "function": {1: "signature", 3: "node"},
    "signature": {1: "str"},
}
DANGEROUS_OPS = {
    "PyFunc": "calls a Python function in the process that runs the graph (tf.numpy_function, tf.py_func)",
    "PyFuncStateless": "calls a Python function in the process that runs the graph (tf.numpy_function)",
    "EagerPyFunc": "calls a Python function in the process that runs the graph (tf.py_function)",
    "WriteFile": "writes a file wherever the graph says, whenever it runs",
}
FILE_OPS = frozenset({"ReadFile", "MatchingFiles", "ImmutableConst"})
CHECKPOINT_OPS = frozenset({"Save", "SaveV2", "SaveSlices", "MergeV2Checkpoints", "Restore", "RestoreV2",
                            "RestoreSlice"})
#: the saver: TF1 ``save/...`` nodes, TF2 ``__inference__traced_save_N`` / ``_restore_N`` functions
_SAVER = re.compile(r"(?i)^save(_\d+)?/|traced_(save|restore)|(save|restore)_fn")
_TEXT_OP = re.compile(rb'\bop\s*:\s*"([A-Za-z0-9_>.]{1,200})"')
NAMES = ("saved_model.pb", "saved_model.pbtxt", "keras_metadata.pb")


def looks_like(name: str) -> bool:
    return name.rsplit("/", 1)[-1] in NAMES


def graph_ops(fh: BinaryIO, size: int) -> list[tuple[str, str, int, bool]]:
    """(op, where, offset, in the saver) of every node of a binary ``saved_model.pb``."""
    model = parse(ByteReader(fh, size), SCHEMA, "saved_model")
    ops = []
    for msg, above in model.walk():
        if msg.kind != "node":
            continue
        function = next((_signature(m) for m in above if m.kind == "function"), None)
        where = f"function {function!r}" if function is not None else f"node {msg.text(1)!r}"
        ops.append((msg.text(2), where, msg.offset, bool(_SAVER.search(function or msg.text(1)))))
    return ops


def _signature(function: Message) -> str:
    return next((c.text(1) for c in function.children if c.kind == "signature"), "")


def text_ops(fh: BinaryIO, size: int) -> list[tuple[str, str, int, bool]]:
    """The same from ``saved_model.pbtxt`` (no saver context: checkpoint ops pass)."""
    ops = []
    for at, data, fresh in chunks(fh, size, 256):
        ops += [(m.group(1).decode(), "the text graph", at + m.start(), True)
                for m in _TEXT_OP.finditer(data) if m.start() < fresh]
    return ops


def judge(fs: FileScan, ops: list[tuple[str, str, int, bool]], member: str) -> None:
    touching: dict[str, int] = {}
    for op, where, offset, saver in ops:
        if op in DANGEROUS_OPS:
            fs.add(Verdict.DANGEROUS, f"TF op {op}", f"{DANGEROUS_OPS[op]} (first in {where})", member, offset,
                   "TF op")
        elif op in FILE_OPS or (op in CHECKPOINT_OPS and not saver):
            touching[op] = touching.get(op, 0) + 1
    if touching:
        fs.note(f"{member + ': ' if member else ''}ops that read, list or write files outside the saver: "
                + ", ".join(f"{op} ({n}x)" for op, n in sorted(touching.items())))


def _scan(fs: FileScan, fh: BinaryIO, size: int, member: str, name: str, depth: int,
          scan_content: ScanContent) -> None:
    fs.set_format("tf-savedmodel")
    base = name.rsplit("/", 1)[-1]
    try:
        if base == "keras_metadata.pb":
            keras.scan_bytes(fs, fh, size, member)
        else:
            judge(fs, text_ops(fh, size) if base.endswith(".pbtxt") else graph_ops(fh, size), member)
    except (ProtoError, Truncated) as exc:
        fs.error(f"TF SavedModel: {base} is not a well-formed SavedModel: {exc}", member)
        return
    fs.not_scanned(f"TF SavedModel {base}", "hpcml read the graph's operations and Keras configs; it does "
                   "not run the graph or read the variables", member)


FORMAT = ScanFormat(lambda head, size, name: looks_like(name), _scan)
