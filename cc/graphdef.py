"""Read a TensorFlow GraphDef (binary or text) into plain Python records.

Uses this project's own wire-compatible schema (`proto/tf_graph.proto`), so the
compiler never imports TensorFlow. Attribute values are decoded once, here:
lowerings see ints, floats, strs, dtype names, shapes and numpy arrays.

A GraphDef is untrusted input, so its sizes are bounded before anything sized by
them is allocated: the file is read up to protobuf's own 2 GiB message limit, and
a constant may declare at most `MAX_CONSTANT_BYTES` (a splat — one value for a
whole shape — could otherwise ask for any amount of memory). Cycles (through
data or control edges, except a TF1 loop's NextIteration -> Merge back edge) are
refused here, as TensorFlow's graph import refuses them.

The weights are not copied: protobuf's parser would copy every `tensor_content`
into its message and each read of the field again (three copies of 1.4 GB took
~5 s for ConvNeXtXLarge), so a binary GraphDef is split into its nodes here, large
nodes' `tensor_content` fields are cut out before protobuf parses the rest, and the
constants become views of the file's bytes, mapped read-only (`TensorValue`).
"""

from __future__ import annotations

import graphlib
import itertools
import math
import mmap
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from neuronish.common.nogc import paused_gc
from neuronish.common.protowire import MalformedWire, UnusualWire, length_delimited, wire_fields

from .errors import InvalidGraph, NodeError
from .proto import tf_graph_pb2 as pb
from .signature import value_key

# TF DataType enum value -> numpy dtype name. Types numpy cannot hold natively
# (bfloat16, strings, resources, ...) map to a descriptive name and are refused
# by the lowerings that see them.
_DTYPES: dict[int, str] = {
    pb.DT_FLOAT: "float32", pb.DT_DOUBLE: "float64", pb.DT_HALF: "float16",
    pb.DT_INT32: "int32", pb.DT_INT64: "int64", pb.DT_INT16: "int16", pb.DT_INT8: "int8",
    pb.DT_UINT8: "uint8", pb.DT_UINT16: "uint16", pb.DT_UINT32: "uint32",
    pb.DT_UINT64: "uint64", pb.DT_BOOL: "bool",
}
NUMPY_TO_TF: dict[str, int] = {v: k for k, v in _DTYPES.items()}

MAX_GRAPH_BYTES = 2**31 - 1  # protobuf refuses larger messages anyway
MAX_CONSTANT_BYTES = 2**31 - 1  # no one constant in a GraphDef can hold more
MAX_RANK = 254  # TensorFlow's TensorShape limit


def dtype_name(enum_value: int) -> str:
    if enum_value in _DTYPES:
        return _DTYPES[enum_value]
    name = pb.DataType.Name(enum_value) if enum_value in pb.DataType.values() else str(enum_value)
    return name.removeprefix("DT_").lower()  # e.g. "string", "resource", "bfloat16"


class TensorRef(NamedTuple):
    """One output of one node: `node:index`. A NamedTuple: the compiler hashes these
    millions of times for a large graph, and a tuple's hash and equality are native."""

    node: str
    index: int = 0

    def __str__(self) -> str:
        return f"{self.node}:{self.index}"

    @staticmethod
    def parse(text: str) -> TensorRef:
        name, _, index = text.partition(":")
        if index and not index.isdigit():
            raise InvalidGraph(f"bad tensor name {text!r}: expected 'node' or 'node:index'")
        return TensorRef(name, int(index) if index else 0)


@dataclass(frozen=True)
class TensorValue:
    """A tensor attribute whose `tensor_content` is held outside its TensorProto: a view
    of the GraphDef's bytes (`proto` has every other field, its tensor_content empty)."""

    proto: pb.TensorProto
    content: memoryview


TENSOR_TYPES = (pb.TensorProto, TensorValue)  # what a tensor-valued attribute can be


@dataclass
class TFNode:
    name: str
    op: str
    inputs: list[TensorRef]
    control_inputs: list[str]
    attr: dict[str, object] = field(default_factory=dict)

    def get(self, key: str, default: object = None) -> object:
        return self.attr.get(key, default)

    def attr_key(self) -> object:
        """`value_key(self.attr)` (cc/signature.py: None if not keyable), worked out once:
        the batch check's lowering at batch + 1 and its verdicts each ask it per node.
        (Nothing edits a parsed node's attributes.)"""
        key = self.__dict__.get("_attr_key", _UNKEYED)
        if key is _UNKEYED:
            key = self.__dict__["_attr_key"] = value_key(self.attr)
        return key


_UNKEYED = object()


class BadConstant(NodeError):
    """A TensorProto that TensorFlow itself would refuse, or larger than the limits."""


def _constant_shape(t: pb.TensorProto) -> tuple[int, ...]:
    shape = tuple([int(d.size) for d in t.tensor_shape.dim])
    if len(shape) > MAX_RANK:
        raise BadConstant(f"constant has rank {len(shape)}; TensorFlow allows at most "
                          f"{MAX_RANK}")
    if shape and min(shape) < 0:
        raise BadConstant(f"constant has shape {list(shape)}; every dim of a constant must be "
                          ">= 0 (TensorFlow refuses this TensorProto too)",
                          "export the graph again; a constant's shape is always known")
    return shape


# TF dtype enum -> (numpy name, numpy dtype, its little-endian form): made once each
# (numpy's dtype constructor and byte-order calls took ~5 us per constant).
_NUMPY_DTYPES: dict[int, tuple[str, np.dtype, np.dtype]] = {}


def tensor_to_numpy(t: pb.TensorProto | TensorValue) -> np.ndarray:
    """Decode a TensorProto (raw `tensor_content` or the typed repeated fields) the
    way TensorFlow's Tensor::FromProto does, refusing what it refuses and anything
    larger than MAX_CONSTANT_BYTES before allocating it."""
    content: bytes | memoryview
    if isinstance(t, TensorValue):
        t, content = t.proto, t.content
    else:
        content = t.tensor_content  # each read of the field copies it: read once
    enum = t.dtype
    known = _NUMPY_DTYPES.get(enum)
    if known is None:
        if enum not in _DTYPES:
            raise BadConstant(f"constant of dtype {dtype_name(enum)} is not supported on the "
                              "device")
        np_dtype = np.dtype(_DTYPES[enum])
        known = _NUMPY_DTYPES[enum] = (_DTYPES[enum], np_dtype, np_dtype.newbyteorder("<"))
    dtype, np_dtype, little_endian = known
    shape = _constant_shape(t)
    count = math.prod(shape)
    nbytes = count * np_dtype.itemsize
    if nbytes > MAX_CONSTANT_BYTES:
        raise BadConstant(f"constant of shape {list(shape)} {dtype} would take {nbytes} bytes, "
                          f"more than the limit of {MAX_CONSTANT_BYTES} bytes for one constant",
                          "keep this node on TensorFlow")
    if content:
        if len(content) != nbytes:
            raise BadConstant(f"constant of shape {list(shape)} {dtype} needs {nbytes} bytes of "
                              f"tensor_content, it has {len(content)}",
                              "the GraphDef is damaged: export it again")
        # A read-only view of the bytes; converted only on a big-endian host.
        return np.frombuffer(content, dtype=little_endian).astype(
            np_dtype, copy=False).reshape(shape)
    # The typed fields are wider than the dtype (int_val holds int8 ... int32,
    # half_val the float16 bits); out-of-range values wrap, as C++'s casts do in TF.
    if t.dtype == pb.DT_HALF:
        values = np.array(t.half_val, dtype=np.int32).astype(np.uint16).view(np.float16)
    else:
        field_name, stored = {
            "float32": ("float_val", np.float32), "float64": ("double_val", np.float64),
            "int64": ("int64_val", np.int64), "bool": ("bool_val", np.bool_),
            "uint32": ("uint32_val", np.uint32), "uint64": ("uint64_val", np.uint64),
        }.get(dtype, ("int_val", np.int32))
        values = np.array(getattr(t, field_name), dtype=stored).astype(np_dtype)
    if values.size >= count:  # TF ignores values past the shape's element count
        return values[:count].reshape(shape)
    # TF stores a splat as its single value; a partial list repeats the last one.
    out = np.empty(count, dtype=np_dtype)
    if values.size:
        out[: values.size] = values
        out[values.size:] = values[-1]
    else:
        out[:] = 0
    return out.reshape(shape)


def _shape(s: pb.TensorShapeProto) -> tuple[int, ...] | None:
    return None if s.unknown_rank else tuple(int(d.size) for d in s.dim)


def _attr(a: pb.AttrValue) -> object:
    which = a.WhichOneof("value")
    if which == "s":
        try:
            return a.s.decode()
        except UnicodeDecodeError:
            return a.s
    if which in ("i", "f", "b"):
        return getattr(a, which)
    if which == "type":
        return dtype_name(a.type)
    if which == "shape":
        return _shape(a.shape)
    if which == "tensor":
        return a.tensor  # decoded lazily by the lowering that needs the values
    if which == "func":
        return {"func": a.func.name}
    if which == "placeholder":
        return {"placeholder": a.placeholder}
    if which == "list":
        lst = a.list
        for name in ("s", "i", "f", "b", "type", "shape", "tensor", "func"):
            items = getattr(lst, name)
            if len(items):
                if name == "s":
                    return [x.decode(errors="replace") for x in items]
                if name == "type":
                    return [dtype_name(x) for x in items]
                if name == "shape":
                    return [_shape(x) for x in items]
                if name == "func":
                    return [{"func": f.name} for f in items]
                return list(items)
        return []
    return None


def parse_graph_def(data: bytes | bytearray | memoryview | mmap.mmap, *,
                    text: bool = False) -> list[TFNode]:
    """Parse a serialized GraphDef (or its text form) into TFNodes. Binary constants are
    views of `data` (not copied), so `data` must not change afterwards."""
    with paused_gc():
        return _parse_graph_def(data, text)


def _parse_graph_def(data: bytes | bytearray | memoryview | mmap.mmap,
                     text: bool) -> list[TFNode]:
    parsed: list[tuple[pb.NodeDef, dict[str, memoryview]]]
    try:
        if text:
            graph = pb.GraphDef()
            text_format.Parse(bytes(data).decode(), graph, allow_unknown_field=True)
            parsed = [(n, {}) for n in graph.node]
        else:
            parsed = _parse_binary(memoryview(data).cast("B"))
    except (DecodeError, text_format.ParseError, UnicodeDecodeError, RecursionError,
            ValueError) as e:
        kind = "text GraphDef (.pbtxt)" if text else "binary GraphDef (.pb)"
        raise InvalidGraph(f"cannot parse the input as a {kind}: {e}") from None
    nodes = []
    seen: set[str] = set()
    refs: dict[str, TensorRef] = {}  # input string -> its ref (a graph repeats a few)
    for n, contents in parsed:
        name = n.name
        if name in seen:
            raise InvalidGraph(f"node name {name!r} appears twice in the GraphDef")
        seen.add(name)
        data_inputs, control = [], []
        for i in n.input:
            ref = refs.get(i)
            if ref is not None:
                data_inputs.append(ref)
            elif i.startswith("^"):
                control.append(i[1:])
            else:
                ref = refs[i] = TensorRef.parse(i)
                data_inputs.append(ref)
        attr = n.attr
        attrs = {k: _attr(attr[k]) for k in attr}  # (not .items(): a Python-level view)
        for key, content in contents.items():
            value = n.attr.get(key)
            if value is not None and value.WhichOneof("value") == "tensor" \
                    and not value.tensor.tensor_content:
                attrs[key] = TensorValue(value.tensor, content)
        nodes.append(TFNode(name, n.op, data_inputs, control, attrs))
    if not nodes:
        raise InvalidGraph("the GraphDef has no nodes (is this really a GraphDef?)")
    _refuse_cycles(nodes)
    return nodes


# Nodes at least this large have their tensor_content cut out before protobuf parses
# them; smaller ones are parsed whole (copying a few KB costs less than cutting).
_CUT_NODES_FROM = 64 << 10
_NODE, _ATTR, _ENTRY_KEY, _ENTRY_VALUE, _ATTR_TENSOR, _TENSOR_CONTENT = 1, 5, 1, 2, 8, 4


def _parse_binary(buf: memoryview) -> list[tuple[pb.NodeDef, dict[str, memoryview]]]:
    """Each node with the `tensor_content` views cut out of it (by attribute key).

    Consecutive small nodes are parsed by protobuf in one call, as the GraphDef they
    make on their own (a run of `node` fields is one): a call per node cost a
    100,000-node graph about a second."""
    try:
        nodes: list[tuple[pb.NodeDef, dict[str, memoryview]]] = []
        rest = bytearray()
        run_start = run_end = 0  # buf[run_start:run_end]: small nodes not parsed yet

        def flush() -> None:
            if run_end > run_start:
                nodes.extend((n, {}) for n in pb.GraphDef.FromString(buf[run_start:run_end]).node)

        for number, wire, tag, start, end in _top_level_fields(buf):
            if number == _NODE and wire == 2 and end - start < _CUT_NODES_FROM:
                if tag != run_end:
                    flush()
                    run_start = tag
                run_end = end
                continue
            flush()
            run_start = run_end = end
            if number == _NODE and wire == 2:
                contents: dict[str, memoryview] = {}
                cut = _cut_node(buf, start, end, contents)
                nodes.append((pb.NodeDef.FromString(cut), contents))
            else:
                rest += buf[tag:end]
        flush()
        pb.GraphDef.FromString(bytes(rest))  # the other fields, checked as protobuf would
        return nodes
    except MalformedWire as e:
        raise DecodeError(f"Error parsing message: {e}") from None
    except UnusualWire:
        graph = pb.GraphDef.FromString(buf)
        return [(n, {}) for n in graph.node]


def _top_level_fields(buf: memoryview) -> Iterator[tuple[int, int, int, int, int]]:
    """`wire_fields` of the whole buffer, with one-byte tags and lengths under 2^14
    (nearly every node's) read inline: this loop runs once per node."""
    end = len(buf)
    pos = 0
    while pos < end:
        key = buf[pos]
        if key == 2 << 3 | 2 or key == _NODE << 3 | 2:  # (field 1 or 2, length-delimited)
            if pos + 1 < end and buf[pos + 1] < 0x80:
                value_start = pos + 2
                value_end = value_start + buf[pos + 1]
            elif pos + 2 < end and buf[pos + 2] < 0x80:
                value_start = pos + 3
                value_end = value_start + ((buf[pos + 1] & 0x7F) | buf[pos + 2] << 7)
            else:
                value_start = -1
            if value_start >= 0 and value_end <= end:
                yield key >> 3, 2, pos, value_start, value_end
                pos = value_end
                continue
        for one in wire_fields(buf, pos, end):  # anything else: the general reader, for
            yield one                           # one field
            pos = one[4]
            break


def _cut_node(buf: memoryview, start: int, end: int, contents: dict[str, memoryview]) -> bytes:
    """The NodeDef in buf[start:end] without the tensor_content of its tensor attributes,
    which go to `contents` (a later map entry for a key replaces an earlier one, and a
    later tensor_content an earlier one, as protobuf's parser does)."""
    out = bytearray()
    for number, wire, tag, vstart, vend in wire_fields(buf, start, end):
        if number != _ATTR or wire != 2:
            out += buf[tag:vend]
            continue
        key, entry, content = "", bytearray(), None
        for f, w, t, s, e in wire_fields(buf, vstart, vend):
            if f == _ENTRY_KEY and w == 2:
                key = bytes(buf[s:e]).decode("utf-8", "replace")
            if f == _ENTRY_VALUE and w == 2:
                value = bytearray()
                for f2, w2, t2, s2, e2 in wire_fields(buf, s, e):
                    if f2 == _ATTR_TENSOR and w2 == 2:
                        tensor = bytearray()
                        for f3, w3, t3, s3, e3 in wire_fields(buf, s2, e2):
                            if f3 == _TENSOR_CONTENT and w3 == 2:
                                content = buf[s3:e3]
                            else:
                                tensor += buf[t3:e3]
                        value += length_delimited(_ATTR_TENSOR, bytes(tensor))
                    else:
                        value += buf[t2:e2]
                entry += length_delimited(_ENTRY_VALUE, bytes(value))
            else:
                entry += buf[t:e]
        contents.pop(key, None)
        if content is not None:
            contents[key] = content
        out += length_delimited(_ATTR, bytes(entry))
    return bytes(out)


def _refuse_cycles(nodes: list[TFNode]) -> None:
    """Over data and control edges. The only back edges TensorFlow accepts are a TF1
    loop's NextIteration -> Merge; every other cycle is refused."""
    by_name = {n.name: n for n in nodes}
    if _acyclic(nodes, by_name):
        return

    def preds(n: TFNode) -> set[str]:
        names = {r.node for r in n.inputs} | set(n.control_inputs)
        if n.op in ("Merge", "RefMerge"):
            names = {p for p in names if by_name.get(p) is None
                     or by_name[p].op not in _NEXT_ITERATION}
        return {p for p in names if p in by_name}

    graph = {n.name: preds(n) for n in nodes}
    try:  # graphlib names the cycle (as it always has: the message stays the same)
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        # graphlib lists it producer first; read it as "consumer <- producer".
        cycle = list(reversed(e.args[1]))
        raise InvalidGraph("the graph has a cycle (through data or control edges): "
                           + " <- ".join(repr(c) for c in cycle)
                           + "; TensorFlow refuses such a graph too") from None


_NEXT_ITERATION = ("NextIteration", "RefNextIteration")


def _acyclic(nodes: list[TFNode], by_name: dict[str, TFNode]) -> bool:
    """Whether the graph has no cycle: Kahn's algorithm over every edge as listed (an
    edge listed twice is counted, and released, twice), in plain dicts and lists
    (graphlib's `prepare` walked every node in a Python-level search for a cycle first:
    1.2 s of a 200,000-node parse; sets of predecessors per node cost another 0.5 s)."""
    waiting: dict[str, int] = {}
    readers: dict[str, list[str]] = {}
    for n in nodes:
        name, count = n.name, 0
        merge = n.op in ("Merge", "RefMerge")
        for p in itertools.chain((r.node for r in n.inputs), n.control_inputs):
            producer = by_name.get(p)
            if producer is None or (merge and producer.op in _NEXT_ITERATION):
                continue
            count += 1
            found = readers.get(p)
            if found is None:
                readers[p] = [name]
            else:
                found.append(name)
        waiting[name] = count
    ready = [name for name, count in waiting.items() if not count]
    done = 0
    while ready:
        name = ready.pop()
        done += 1
        for reader in readers.get(name, ()):
            waiting[reader] -= 1
            if not waiting[reader]:
                ready.append(reader)
    return done == len(waiting)


def load_graph_def(path: str | Path) -> list[TFNode]:
    """Read a `.pb` (binary) or `.pbtxt` (text) GraphDef file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = _read(f)
    except OSError as e:
        raise InvalidGraph(f"cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_GRAPH_BYTES:
        raise InvalidGraph(f"{path} is larger than {MAX_GRAPH_BYTES} bytes, protobuf's limit "
                           "for one GraphDef")
    return parse_graph_def(data, text=path.suffix in (".pbtxt", ".txt"))


def _read(f: BinaryIO) -> bytes | mmap.mmap:
    """The file's bytes, at most MAX_GRAPH_BYTES + 1. A regular file is mapped (read-only),
    not read: the constants become views of the page cache, and no memory is allocated
    and filled for it (reading 1.4 GB into fresh memory took 0.4-4 s on this VM).
    A file truncated by someone else while it is compiled would fault (SIGBUS), as with
    any tool that maps its input."""
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0 or st.st_size > MAX_GRAPH_BYTES:
        return f.read(MAX_GRAPH_BYTES + 1)
    return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
