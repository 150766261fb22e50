"""Keras model configs: the JSON a Keras file holds beside its weights, judged for what runs
code when Keras loads or calls the model.

A legacy ``.h5`` keeps it in the root group's ``model_config`` attribute, a Keras 3
``.keras`` archive in ``config.json``, a SavedModel in ``keras_metadata.pb``. In it:

- a ``Lambda`` layer holds Python code (Keras 2: base64 marshalled bytecode or a function
  looked up by name; Keras 3: a ``__lambda__`` object), run when the model is built or
  called. Keras 3 refuses it only in ``safe_mode``; legacy ``.h5`` loading runs it.
- an object with a ``module`` outside Keras: Keras 3 before 3.9 imports whatever module a
  config names (CVE-2025-1550). The name is judged by the scan policy, as a pickle's global.
- a ``TFOpLambda`` calls a TensorFlow function by name; one that runs Python or touches
  files (``io.write_file``, ``py_function``) does so whenever the model runs.
- ``keras.utils.get_file`` named as a function downloads a file (CVE-2025-8747).

Without an HDF5 library the JSON is found in the bytes: every ``{"`` starts a candidate
parsed as JSON (bounded); a ``"class_name": "Lambda"`` in text that does not parse whole is
still reported.
"""

from __future__ import annotations

import bisect
import json
import re
import zipfile
from typing import TYPE_CHECKING, Any, BinaryIO

from hpcml.scan.formats.bounded import chunks
from hpcml.scan.model import Verdict

if TYPE_CHECKING:
    from hpcml.scan.context import FileScan

#: the most JSON text parsed in one piece (real model configs are a few MiB at most)
MAX_JSON = 16 << 20
#: decode attempts on every candidate grow through these sizes; random bytes fail in the first
_STEPS = (4096, 1 << 16, 1 << 20, MAX_JSON)
KERAS_PACKAGES = frozenset({"keras", "tf_keras", "keras_hub", "keras_cv", "keras_nlp"})
LAMBDAS = frozenset({"Lambda", "__lambda__"})
_WS = rb"[ \t\r\n]{0,64}"
_OPEN = re.compile(rb"\{" + _WS + rb'"')
_LAMBDA_TEXT = re.compile(rb'"class_name"' + _WS + rb":" + _WS + rb'"(?:Lambda|__lambda__)"')
_OVERLAP = 256
#: TensorFlow functions a TFOpLambda may name that run Python or read, write or list files
_TF_RISKY = re.compile(r"(^|\.)(io|gfile)\.|py_func|numpy_function|py_function|write_file|read_file|"
                       r"matching_files|(^|\.)(save|restore)(_v2)?$")
_KERAS_RISKY = {"get_file": "downloads a file when the config is loaded (CVE-2025-8747)"}
_DECODER = json.JSONDecoder()


def judge_config(fs: FileScan, config: Any, member: str, offset: int | None) -> bool:
    """Add a finding for each construct in a parsed Keras config that runs code; whether it
    looks like a Keras config at all (an object with a ``class_name``)."""
    stack, keras = [config], isinstance(config, dict) and "class_name" in config
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if isinstance(node.get("class_name"), str):
                _judge_object(fs, node, member, offset)
                if node["class_name"] in LAMBDAS:
                    continue                       # its function is the one finding
            stack.extend(node.values())
    return keras


def _judge_object(fs: FileScan, node: dict[str, Any], member: str, offset: int | None) -> None:
    cls, config, module = node["class_name"], node.get("config"), node.get("module")
    name = config.get("name") if isinstance(config, dict) else None
    label = f"keras {cls} {name!r}" if isinstance(name, str) else f"keras {cls}"
    if cls in LAMBDAS:
        fs.add(Verdict.DANGEROUS, label, "holds Python code (marshalled bytecode, source or a function "
               "named for lookup) that Keras runs when it builds or calls the model; legacy .h5 loading and "
               "Keras 2 run it, Keras 3 only outside safe_mode", member, offset, "keras Lambda")
        return
    function = config.get("function") if isinstance(config, dict) else None
    if cls.endswith("OpLambda") and isinstance(function, str) and _TF_RISKY.search(function):
        fs.add(Verdict.DANGEROUS, f"{label} calls tf.{function}", "a TensorFlow function that runs Python "
               "or reads, writes or lists files, whenever the model runs", member, offset, "keras TFOpLambda")
    if not isinstance(module, str) or not module:
        return
    target = config if cls == "function" and isinstance(config, str) else cls
    if module.split(".")[0] in KERAS_PACKAGES:
        if target in _KERAS_RISKY:
            fs.add(Verdict.DANGEROUS, f"{module}.{target}", _KERAS_RISKY[target], member, offset, "keras module")
        return
    verdict, why = fs.policy.judge(module, target)
    if verdict is not Verdict.SAFE:
        fs.add(verdict, f"{module}.{target}", f"a Keras config names it, and Keras 3 before 3.9 imports any "
               f"module a config names (CVE-2025-1550): {why}", member, offset, "keras module")


def scan_bytes(fs: FileScan, fh: BinaryIO, size: int, member: str) -> bool:
    """Find and judge the JSON objects in ``size`` bytes of ``fh`` (an HDF5 file's attributes,
    a protobuf's strings); whether one was a Keras config."""
    keras = False
    spans: list[tuple[int, int]] = []           # parsed objects, in order
    budget = 64 * MAX_JSON + 4 * size           # decoded characters: many long false starts stop early
    for at, data, fresh in chunks(fh, size, _OVERLAP):
        for m in _OPEN.finditer(data):
            pos = at + m.start()
            if m.start() >= fresh or (spans and pos < spans[-1][1]) or budget <= 0:
                continue
            obj, end, cost = _decode(fh, size, data, m.start(), pos)
            budget -= cost
            if obj is not None:
                spans.append((pos, end))
                keras = judge_config(fs, obj, member, pos) or keras
        for m in _LAMBDA_TEXT.finditer(data):
            pos = at + m.start()
            i = bisect.bisect_right(spans, (pos, float("inf"))) - 1
            if m.start() < fresh and not (i >= 0 and spans[i][0] <= pos < spans[i][1]):
                fs.add(Verdict.DANGEROUS, "keras Lambda", "a Lambda layer in JSON hpcml could not parse whole "
                       "(too large, or broken): Keras runs its Python code", member, pos, "keras Lambda")
                keras = True
    if budget <= 0:
        fs.note(f"{member + ': ' if member else ''}stopped looking for JSON after too many long false starts")
    return keras


def _decode(fh: BinaryIO, size: int, data: bytes, start: int, pos: int) -> tuple[Any, int, int]:
    """The JSON value at ``pos`` (``data[start:]`` holds its first bytes) and where it ends;
    (None, 0, cost) when it is not one. Latin-1 keeps every byte one character: the
    structure and the ASCII names that matter decode as UTF-8 would."""
    cost = 0
    for step in _STEPS:
        if start + step <= len(data) or pos + len(data) - start >= size:
            raw = data[start:start + step]
        else:
            fh.seek(pos)
            raw = fh.read(min(step, size - pos))
        text = raw.decode("latin-1")
        cost += len(text)
        try:
            obj, end = _DECODER.raw_decode(text)
        except RecursionError:
            return None, 0, cost
        except json.JSONDecodeError as exc:
            cut = len(raw) == step and pos + step < size
            if cut and (exc.msg.startswith("Unterminated string") or exc.pos >= len(text) - 16):
                continue                                            # ran off this window: a larger one
            return None, 0, cost
        return obj, pos + end, cost
    return None, 0, cost


def scan_archive(fs: FileScan, zf: zipfile.ZipFile, member: str) -> bool:
    """A Keras 3 ``.keras`` archive (``config.json`` at its root, a Keras config): judge the
    config and say the weights were not read; whether it was one."""
    try:
        info = zf.getinfo("config.json")
    except KeyError:
        return False
    where = f"{member}!config.json" if member else "config.json"
    if info.file_size > MAX_JSON:
        fs.not_scanned("keras config.json", f"{info.file_size} bytes, more than the {MAX_JSON >> 20} MiB "
                       "hpcml parses", where)
        return True
    try:
        with zf.open(info) as f:
            config = json.loads(f.read(MAX_JSON + 1))
    except (OSError, ValueError, RecursionError, zipfile.BadZipFile, NotImplementedError, RuntimeError):
        return False                       # Keras cannot read it either; the members are still scanned
    if not judge_config(fs, config, where, None):
        return False
    fs.not_scanned("keras weights", "a Keras archive: hpcml judged its config.json; the weights "
                   "(HDF5 or npz) it does not read", member)
    return True
