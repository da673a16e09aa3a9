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
"""

from __future__ import annotations

import graphlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from .errors import InvalidGraph, NodeError
from .proto import tf_graph_pb2 as pb

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


@dataclass(frozen=True)
class TensorRef:
    """One output of one node: `node:index`."""

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


@dataclass
class TFNode:
    name: str
    op: str
    inputs: list[TensorRef]
    control_inputs: list[str]
    attr: dict[str, object] = field(default_factory=dict)

    def get(self, key: str, default: object = None) -> object:
        return self.attr.get(key, default)


class BadConstant(NodeError):
    """A TensorProto that TensorFlow itself would refuse, or larger than the limits."""


def _constant_shape(t: pb.TensorProto) -> tuple[int, ...]:
    shape = tuple(int(d.size) for d in t.tensor_shape.dim)
    if len(shape) > MAX_RANK:
        raise BadConstant(f"constant has rank {len(shape)}; TensorFlow allows at most "
                          f"{MAX_RANK}")
    if any(d < 0 for d in shape):
        raise BadConstant(f"constant has shape {list(shape)}; every dim of a constant must be "
                          ">= 0 (TensorFlow refuses this TensorProto too)",
                          "export the graph again; a constant's shape is always known")
    return shape


def tensor_to_numpy(t: pb.TensorProto) -> np.ndarray:
    """Decode a TensorProto (raw `tensor_content` or the typed repeated fields) the
    way TensorFlow's Tensor::FromProto does, refusing what it refuses and anything
    larger than MAX_CONSTANT_BYTES before allocating it."""
    dtype = dtype_name(t.dtype)
    if t.dtype not in _DTYPES:
        raise BadConstant(f"constant of dtype {dtype} is not supported on the device")
    shape = _constant_shape(t)
    np_dtype = np.dtype(dtype)
    count = math.prod(shape)
    nbytes = count * np_dtype.itemsize
    if nbytes > MAX_CONSTANT_BYTES:
        raise BadConstant(f"constant of shape {list(shape)} {dtype} would take {nbytes} bytes, "
                          f"more than the limit of {MAX_CONSTANT_BYTES} bytes for one constant",
                          "keep this node on TensorFlow")
    content = t.tensor_content  # each read of the field copies it: read once
    if content:
        if len(content) != nbytes:
            raise BadConstant(f"constant of shape {list(shape)} {dtype} needs {nbytes} bytes of "
                              f"tensor_content, it has {len(content)}",
                              "the GraphDef is damaged: export it again")
        # A read-only view of the immutable bytes; converted only on a big-endian host.
        return np.frombuffer(content, dtype=np_dtype.newbyteorder("<")).astype(
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


def parse_graph_def(data: bytes, *, text: bool = False) -> list[TFNode]:
    """Parse a serialized GraphDef (or its text form) into TFNodes."""
    graph = pb.GraphDef()
    try:
        if text:
            text_format.Parse(data.decode(), graph, allow_unknown_field=True)
        else:
            graph.ParseFromString(data)
    except (DecodeError, text_format.ParseError, UnicodeDecodeError, RecursionError,
            ValueError) as e:
        kind = "text GraphDef (.pbtxt)" if text else "binary GraphDef (.pb)"
        raise InvalidGraph(f"cannot parse the input as a {kind}: {e}") from None
    nodes = []
    seen: set[str] = set()
    for n in graph.node:
        if n.name in seen:
            raise InvalidGraph(f"node name {n.name!r} appears twice in the GraphDef")
        seen.add(n.name)
        data_inputs = [TensorRef.parse(i) for i in n.input if not i.startswith("^")]
        control = [i[1:] for i in n.input if i.startswith("^")]
        nodes.append(TFNode(n.name, n.op, data_inputs, control,
                            {k: _attr(v) for k, v in n.attr.items()}))
    if not nodes:
        raise InvalidGraph("the GraphDef has no nodes (is this really a GraphDef?)")
    _refuse_cycles(nodes)
    return nodes


def _refuse_cycles(nodes: list[TFNode]) -> None:
    """Over data and control edges. The only back edges TensorFlow accepts are a TF1
    loop's NextIteration -> Merge; every other cycle is refused."""
    by_name = {n.name: n for n in nodes}

    def preds(n: TFNode) -> set[str]:
        names = {r.node for r in n.inputs} | set(n.control_inputs)
        if n.op in ("Merge", "RefMerge"):
            names = {p for p in names if by_name.get(p) is None
                     or by_name[p].op not in ("NextIteration", "RefNextIteration")}
        return {p for p in names if p in by_name}

    try:
        graphlib.TopologicalSorter({n.name: preds(n) for n in nodes}).prepare()
    except graphlib.CycleError as e:
        # graphlib lists it producer first; read it as "consumer <- producer".
        cycle = list(reversed(e.args[1]))
        raise InvalidGraph("the graph has a cycle (through data or control edges): "
                           + " <- ".join(repr(c) for c in cycle)
                           + "; TensorFlow refuses such a graph too") from None


def load_graph_def(path: str | Path) -> list[TFNode]:
    """Read a `.pb` (binary) or `.pbtxt` (text) GraphDef file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_GRAPH_BYTES + 1)
    except OSError as e:
        raise InvalidGraph(f"cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_GRAPH_BYTES:
        raise InvalidGraph(f"{path} is larger than {MAX_GRAPH_BYTES} bytes, protobuf's limit "
                           "for one GraphDef")
    return parse_graph_def(data, text=path.suffix in (".pbtxt", ".txt"))
