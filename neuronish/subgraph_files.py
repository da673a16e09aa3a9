"""Subgraphs written to their files without copies of the weights in between.

Encapsulating a cluster copies its nodes into a new GraphDef, weights included: a
second copy of them (1.4 GB for ConvNeXtXLarge, ~3 s) held next to the frozen graph
until the subgraph is written. So before partitioning, `hold_constants` puts a copy
of each large Const without its `tensor_content` in the graph index the partitioner
copies nodes from, and `write_subgraph` writes each such node with its content
taken from the frozen graph's node, spliced into its bytes: the file holds exactly
the bytes `Subgraph.serialize()` would give for the complete subgraph.

A subgraph built this way lacks those contents in memory (`sg.graph_def`), so only
its file may be read afterwards; `release_constants` puts the frozen graph's nodes
back in the index for splice and later stages.
"""

from __future__ import annotations

import math
import os

import tensorflow as tf
from tensorflow.core.framework import node_def_pb2, tensor_pb2

from .common.protowire import LENGTH_DELIMITED, encode_varint, wire_fields
from .external import BlobFile
from .graph import Graph
from .partition.encapsulate import Subgraph, graph_def_parts

HELD_FROM = 1 << 20  # bytes of tensor_content from which a Const's is held back
_ATTR, _ENTRY_KEY, _ENTRY_VALUE, _ATTR_TENSOR, _TENSOR_CONTENT = 5, 1, 2, 8, 4
_TYPED_VALUES = [f.name for f in tensor_pb2.TensorProto.DESCRIPTOR.fields
                 if f.name.endswith("_val")]  # half_val, float_val, ... (repeated)


def hold_constants(index: Graph) -> dict[str, node_def_pb2.NodeDef]:
    """Put in `index.nodes`, for each Const with at least HELD_FROM bytes of
    tensor_content, a copy without them; returns the original nodes by name."""
    held = {}
    for name, node in index.nodes.items():
        if node.op == "Const" and "value" in node.attr and _content_bytes(node) >= HELD_FROM:
            held[name] = node
    for name, node in held.items():
        index.nodes[name] = _without_content(node)
    return held


def release_constants(index: Graph, held: dict[str, node_def_pb2.NodeDef]) -> None:
    """Undo `hold_constants`."""
    index.nodes.update(held)


def _content_bytes(node: node_def_pb2.NodeDef) -> int:
    """The tensor_content a Const should hold, from its shape and dtype (reading the
    field would copy it); 0 unless the values are in tensor_content alone."""
    value = node.attr["value"]
    if value.WhichOneof("value") != "tensor":
        return 0
    tensor = value.tensor
    if any(len(getattr(tensor, name)) for name in _TYPED_VALUES):
        return 0
    try:
        dtype = tf.as_dtype(tensor.dtype)
    except TypeError:
        return 0
    if not dtype.is_numpy_compatible or dtype == tf.string or dtype.size == 0:
        return 0
    return math.prod(d.size for d in tensor.tensor_shape.dim) * dtype.size


def _without_content(node: node_def_pb2.NodeDef) -> node_def_pb2.NodeDef:
    copy = node_def_pb2.NodeDef(name=node.name, op=node.op, input=node.input,
                                device=node.device)
    for key, value in node.attr.items():
        if key != "value":
            copy.attr[key].CopyFrom(value)
    tensor = node.attr["value"].tensor
    stripped = copy.attr["value"].tensor
    stripped.dtype = tensor.dtype
    stripped.version_number = tensor.version_number
    stripped.tensor_shape.CopyFrom(tensor.tensor_shape)
    for field in ("experimental_debug_info", "experimental_type"):
        if node.HasField(field):
            getattr(copy, field).CopyFrom(getattr(node, field))
    return copy


def write_subgraph(sg: Subgraph, path: str, held: dict[str, node_def_pb2.NodeDef]) -> BlobFile:
    """Write `sg.serialize()`'s bytes to `path`, piece by piece (the held Consts' contents
    straight from the frozen graph). Not hashed here: the caller hashes the file on
    another thread while it is compiled."""
    size = 0
    parts = graph_def_parts(sg.graph_def)  # per node: its tag and length, then its bytes
    with open(path, "wb") as f:

        def put(*pieces: bytes) -> None:
            nonlocal size
            for piece in pieces:
                f.write(piece)
                size += len(piece)

        for node in sg.graph_def.node:
            header, data = next(parts), next(parts)
            original = held.get(node.name)
            if original is None:
                put(header, data)
                continue
            content = original.attr["value"].tensor.tensor_content
            prefix, suffix = _splice(memoryview(data), _TENSOR_PATH, content)
            put(b"\x0a" + encode_varint(len(prefix) + len(content) + len(suffix)),
                prefix, content, suffix)
        for rest in parts:
            put(rest)
    return BlobFile(os.fspath(path), size)


# Where a Const's content goes: NodeDef.attr entry "value" -> AttrValue.tensor ->
# TensorProto.tensor_content.
_TENSOR_PATH = (_ATTR, _ENTRY_VALUE, _ATTR_TENSOR, _TENSOR_CONTENT)


def _splice(message: memoryview, path: tuple[int, ...], content: bytes) -> tuple[bytes, bytes]:
    """(prefix, suffix) such that prefix + content + suffix is `message` (serialized
    deterministically, so fields in number order) with `content` as the field at the
    end of `path`, each enclosing length grown to hold it."""
    if not content:
        return bytes(message), b""
    number, rest = path[0], path[1:]
    if not rest:  # the bytes field itself, before the first field numbered above it
        at = next((tag for f, _, tag, _, _ in wire_fields(message, 0, len(message))
                   if f > number), len(message))
        head = encode_varint(number << 3 | LENGTH_DELIMITED) + encode_varint(len(content))
        return bytes(message[:at]) + head, bytes(message[at:])
    for f, wire, tag, start, end in wire_fields(message, 0, len(message)):
        if f != number or wire != LENGTH_DELIMITED:
            continue
        if number == _ATTR and not _is_value_entry(message, start, end):
            continue
        inner_prefix, inner_suffix = _splice(message[start:end], rest, content)
        grown = len(inner_prefix) + len(content) + len(inner_suffix)
        head = encode_varint(number << 3 | LENGTH_DELIMITED) + encode_varint(grown)
        return (bytes(message[:tag]) + head + inner_prefix,
                inner_suffix + bytes(message[end:]))
    raise ValueError(f"field {number} not found where a held constant's content goes")


def _is_value_entry(message: memoryview, start: int, end: int) -> bool:
    return any(f == _ENTRY_KEY and bytes(message[s:e]) == b"value"
               for f, _, _, s, e in wire_fields(message, start, end))
