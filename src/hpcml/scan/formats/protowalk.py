"""A protobuf reader for the few fields a scan needs (ONNX, TF SavedModel), without the
protobuf library or the formats' ``.proto`` files.

A ``Schema`` names, per message, the fields to keep: ``"int"`` (a varint), ``"str"`` (a
length-delimited string, kept up to ``MAX_STRING`` bytes) or another message's name (read
recursively). Every other field is skipped by its length, unread, so tensor bytes cost a
seek; nesting, the number of messages and every length are bounded by the file.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from hpcml.scan.formats.bounded import ByteReader

Schema = Mapping[str, Mapping[int, str]]
MAX_DEPTH = 64
MAX_MESSAGES = 2_000_000
MAX_STRING = 4096


class ProtoError(ValueError):
    """The bytes are not a well-formed protobuf message."""


@dataclass
class Message:
    kind: str
    offset: int
    fields: dict[int, list[int | bytes]] = field(default_factory=dict)
    children: list[Message] = field(default_factory=list)

    def first(self, number: int, default: int | bytes = b"") -> int | bytes:
        values = self.fields.get(number)
        return values[0] if values else default

    def text(self, number: int) -> str:
        value = self.first(number)
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""

    def walk(self) -> Iterator[tuple[Message, tuple[Message, ...]]]:
        """Every message below (and including) this one, with its ancestors."""
        stack: list[tuple[Message, tuple[Message, ...]]] = [(self, ())]
        while stack:
            msg, above = stack.pop()
            yield msg, above
            stack.extend((child, (*above, msg)) for child in reversed(msg.children))


def parse(reader: ByteReader, schema: Schema, root: str, start: int = 0, end: int | None = None) -> Message:
    """The ``root`` message occupying ``[start, end)`` of the reader (its whole size by default)."""
    count = [0]
    return _parse(reader, schema, root, start, reader.size if end is None else end, 0, count)


def _parse(reader: ByteReader, schema: Schema, kind: str, start: int, end: int, depth: int,
           count: list[int]) -> Message:
    if depth > MAX_DEPTH:
        raise ProtoError(f"messages nested more than {MAX_DEPTH} deep at byte {start}")
    count[0] += 1
    if count[0] > MAX_MESSAGES:
        raise ProtoError(f"more than {MAX_MESSAGES} messages of interest")
    msg = Message(kind, start)
    wanted = schema[kind]
    pos = start
    while pos < end:
        key, pos = _varint(reader, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ProtoError(f"field number 0 at byte {pos}")
        what = wanted.get(number)
        if wire == 0:
            value, pos = _varint(reader, pos, end)
            if what == "int":
                msg.fields.setdefault(number, []).append(value)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            length, pos = _varint(reader, pos, end)
            if pos + length > end:
                raise ProtoError(f"field {number} at byte {pos} is {length} bytes long, past the end of its "
                                 f"message (byte {end})")
            if what == "str":
                msg.fields.setdefault(number, []).append(reader.read(pos, min(length, MAX_STRING), "a string"))
            elif what is not None:
                msg.children.append(_parse(reader, schema, what, pos, pos + length, depth + 1, count))
            pos += length
        else:   # groups (3, 4) are long deprecated: neither ONNX nor TensorFlow writes them
            raise ProtoError(f"wire type {wire} (field {number}) at byte {pos}")
    if pos != end:
        raise ProtoError(f"the last field runs past the end of its message (byte {end})")
    return msg


def _varint(reader: ByteReader, pos: int, end: int) -> tuple[int, int]:
    raw = reader.read(pos, min(10, end - pos), "a varint")
    value = 0
    for i, byte in enumerate(raw):
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, pos + i + 1
    raise ProtoError(f"a varint at byte {pos} does not end")
