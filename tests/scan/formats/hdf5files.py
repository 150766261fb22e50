"""HDF5 files written byte by byte the way h5py lays out a Keras 2 ``model.save("m.h5")``:
a version 0 superblock, the root group's object header holding a ``model_config``
attribute whose value, a variable-length string, lies in a global heap collection
(``GCOL``) after it. Enough of the structure that the bytes sit where h5py puts them;
hpcml reads the superblock and the JSON, nothing else.
"""

from __future__ import annotations

import json
import struct
from typing import Any

SIGNATURE = b"\x89HDF\r\n\x1a\n"
UNDEFINED = 0xFFFFFFFFFFFFFFFF
HEAP_AT = 0x800                        # h5py's first global heap collection in a small file


def _pad8(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 8)


def _attribute(name: str, heap_addr: int) -> bytes:
    """An attribute message (type 0x000C, version 1): a scalar variable-length UTF-8 string."""
    name_b = _pad8(name.encode() + b"\0")
    char = struct.pack("<B3sI", 0x10, b"\0\0\0", 1) + struct.pack("<HH", 0, 8)     # 1-byte chars
    dtype = _pad8(struct.pack("<B3sI", 0x19, b"\x01\x01\x00", 16) + char)          # vlen string, UTF-8
    space = _pad8(struct.pack("<BBBx4x", 1, 0, 0))                                  # scalar
    data = struct.pack("<IQI", 1, heap_addr, 1)                                      # length, heap, index
    body = struct.pack("<BxHHH", 1, len(name.encode()) + 1, len(dtype), len(space)) + name_b + dtype + space + data
    body = _pad8(body)
    return struct.pack("<HHB3x", 0x000C, len(body), 0) + body


def keras_h5(config: Any | None = None, *, raw: bytes | None = None, user_block: int = 0,
             eof_extra: int = 0, version: int = 0) -> bytes:
    """A Keras .h5: ``config`` (dumped as Keras does) or ``raw`` JSON bytes in the root's
    ``model_config``; ``user_block`` bytes of zeros before the HDF5 signature; ``eof_extra``
    makes the superblock claim more bytes than the file has (a truncated file)."""
    text = raw if raw is not None else json.dumps(config).encode() if config is not None else b""
    header_at = 0x60
    attrs = _attribute("model_config", HEAP_AT) if text else b""
    ohdr = struct.pack("<BxHII4x", 1, 1 if text else 0, 1, len(attrs)) + attrs
    obj = struct.pack("<HHIQ", 1, 1, 0, len(text)) + _pad8(text)
    heap = b"GCOL" + struct.pack("<B3xQ", 1, max(4096, 16 + len(obj) + 16)) + obj
    heap += b"\0" * (struct.unpack_from("<Q", heap, 8)[0] - len(heap))
    body = bytearray(HEAP_AT + len(heap))
    body[header_at:header_at + len(ohdr)] = ohdr
    body[HEAP_AT:] = heap
    if version == 0:
        sb = SIGNATURE + bytes([0, 0, 0, 0, 0, 8, 8, 0]) + struct.pack("<HHI", 4, 16, 0)
        sb += struct.pack("<QQQQ", 0, UNDEFINED, len(body) + eof_extra, UNDEFINED)
        sb += struct.pack("<QQII16x", 0, header_at, 1, 0)                 # the root group's entry
    else:                                   # version 2 (libver="latest"): no symbol table entry
        sb = SIGNATURE + bytes([version, 8, 8, 0])
        sb += struct.pack("<QQQQ", 0, UNDEFINED, len(body) + eof_extra, header_at) + b"\0" * 4
    body[:len(sb)] = sb
    return b"\0" * user_block + bytes(body)


LAMBDA_CONFIG = {
    "class_name": "Sequential",
    "config": {"name": "sequential", "layers": [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 4], "dtype": "float32",
                                                "name": "input_1"}},
        # Keras 2's Lambda.get_config: the function is func_dump's (base64 marshal, defaults, closure)
        {"class_name": "Lambda", "config": {"name": "lambda", "trainable": True, "dtype": "float32",
                                            "function": ["4wEAAAAAAAAAAAAAAAEAAAACAAAAQwAAAHMIAAAAdACgAaEAUwApAU4p",
                                                         None, None],
                                            "function_type": "lambda", "module": "__main__",
                                            "output_shape": None, "output_shape_type": "raw",
                                            "output_shape_module": None, "arguments": {}}},
        {"class_name": "Dense", "config": {"name": "dense", "units": 2, "activation": "linear"}},
    ]},
}
PLAIN_CONFIG = {
    "class_name": "Sequential",
    "config": {"name": "sequential", "layers": [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 4], "name": "input_1"}},
        {"class_name": "Dense", "config": {"name": "dense", "units": 2, "activation": "relu"}},
    ]},
}
