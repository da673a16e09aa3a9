"""Protobuf's wire format read and written without a schema, importing nothing.

Both sides of the process boundary handle GraphDef bytes below protobuf's
message classes: the compiler cuts large tensor contents out of a GraphDef
before parsing it (`cc/graphdef.py`), and the TensorFlow side splices held-back
weights into a subgraph file and streams nodes into one (`subgraph_files.py`,
`partition/encapsulate.py`). The TensorFlow side never imports the compiler
in-process (docs/contracts.md), so the few wire-format facts both need live
here, beside `neuronish.contracts`.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


class MalformedWire(ValueError):
    """Bytes that are not well-formed protobuf wire format."""


class UnusualWire(Exception):
    """Wire features these readers leave to protobuf itself (groups): the caller
    falls back to protobuf's parser, which knows the schema."""


def read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """The varint at buf[pos:end] and the position after it."""
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise MalformedWire("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def wire_fields(buf: memoryview, start: int, end: int
                ) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, start of the tag, start of the value, end) of each field
    of the message in buf[start:end]; a length-delimited value starts after its length."""
    pos = start
    while pos < end:
        tag_start = pos
        key, pos = read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise MalformedWire("field number 0")
        if wire == VARINT:
            _, value_end = read_varint(buf, pos, end)
        elif wire == FIXED64:
            value_end = pos + 8
        elif wire == FIXED32:
            value_end = pos + 4
        elif wire == LENGTH_DELIMITED:
            length, pos = read_varint(buf, pos, end)
            value_end = pos + length
        else:  # groups: not in a GraphDef's schema
            raise UnusualWire
        if value_end > end:
            raise MalformedWire("a field runs past the end of its message")
        yield number, wire, tag_start, pos, value_end
        pos = value_end


def encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def length_delimited(field: int, body: bytes) -> bytes:
    """Field `field` holding `body` (a submessage, string or bytes), tag and length first."""
    return encode_varint(field << 3 | LENGTH_DELIMITED) + encode_varint(len(body)) + body
