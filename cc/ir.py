"""The compiler's IR: a typed SSA graph that remembers which TF nodes it came from.

Every `Value` has a static shape and a numpy dtype name. A value is either a
graph input, a constant (`data` is set), or the output of exactly one `Node`.
Nodes are kept in a topological order. Each node records the TF node names it
came from (`origin`) so errors and profiles can point back at the model.
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

_ids = itertools.count()


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name: "float32", "int32", "bool", ...

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        short = {"float32": "f32", "float16": "f16", "float64": "f64", "int32": "i32",
                 "int64": "i64", "bool": "i1", "int8": "i8", "uint8": "u8", "int16": "i16"}
        return f"{short.get(self.dtype, self.dtype)}[{','.join(map(str, self.shape))}]"


@dataclass(eq=False)
class Value:
    type: TensorType
    producer: Node | None = None
    data: np.ndarray | None = None  # set for constants
    name: str = ""  # TF tensor name, for graph inputs/outputs and debugging
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def is_const(self) -> bool:
        return self.data is not None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype


def constant(array: np.ndarray, name: str = "") -> Value:
    """A constant value; the array is frozen so no pass can change it in place."""
    array = np.asarray(array)
    if array.dtype.kind == "f" and array.dtype != np.float16 and array.dtype.itemsize > 8:
        raise ValueError(f"unsupported constant dtype {array.dtype}")
    if not _immutable(array):
        array = np.array(array, copy=True)
        array.flags.writeable = False
    return Value(TensorType(tuple(int(d) for d in array.shape), array.dtype.name), data=array,
                 name=name)


def _immutable(array: np.ndarray) -> bool:
    """Whether nothing can change `array`'s contents: a read-only view of `bytes` or of a
    read-only file mapping (a GraphDef constant); copying those cost a second copy of
    every weight."""
    base = array
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    if isinstance(base, memoryview) and base.readonly:
        base = base.obj
    if isinstance(base, mmap.mmap):  # mapped with ACCESS_READ: nothing can write it
        with memoryview(base) as view:
            return view.readonly
    return isinstance(base, bytes)


@dataclass(eq=False)
class Node:
    kind: str
    inputs: list[Value]
    outputs: list[Value]
    attrs: dict
    origin: tuple[str, ...] = ()  # TF node names this instruction implements

    def __repr__(self) -> str:
        return f"Node({self.kind}, origin={self.origin})"


@dataclass(eq=False)
class Graph:
    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node]
    # Batch axis per graph input/output (-1: none), parallel to inputs/outputs.
    input_batch_axes: list[int] = field(default_factory=list)
    output_batch_axes: list[int] = field(default_factory=list)

    def consumers(self) -> dict[int, list[Node]]:
        uses: dict[int, list[Node]] = {}
        for node in self.nodes:
            for v in node.inputs:
                uses.setdefault(v.id, []).append(node)
        return uses

    def constants(self) -> list[Value]:
        seen: dict[int, Value] = {}
        for v in itertools.chain((i for n in self.nodes for i in n.inputs), self.outputs):
            if v.is_const:
                seen.setdefault(v.id, v)
        return list(seen.values())

    def replace_uses(self, old: Value, new: Value) -> None:
        """Point every use of `old` (node inputs and graph outputs) at `new`."""
        for node in self.nodes:
            node.inputs = [new if v is old else v for v in node.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]


def _fmt_attr(v: object) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt_attr(x) for x in v) + "]"
    return str(v)


def format_graph(graph: Graph) -> str:
    """Readable text form, e.g.
    `%7: f32[1,112,112,64] = conv2d(%1, %c2) strides=[2,2]  # tf: conv1/Conv2D`."""
    names: dict[int, str] = {}

    def ref(v: Value) -> str:
        if v.id not in names:
            names[v.id] = f"%c{len(names)}" if v.is_const else f"%{len(names)}"
        return names[v.id]

    lines = []
    for v in graph.inputs:
        lines.append(f"input {ref(v)}: {v.type}  # {v.name}")
    for node in graph.nodes:
        outs = ", ".join(f"{ref(o)}: {o.type}" for o in node.outputs)
        args = ", ".join(ref(v) for v in node.inputs)
        attrs = " ".join(f"{k}={_fmt_attr(v)}" for k, v in sorted(node.attrs.items()))
        origin = f"  # tf: {', '.join(node.origin)}" if node.origin else ""
        lines.append(f"{outs} = {node.kind}({args}) {attrs}".rstrip() + origin)
    for v in graph.constants():
        lines.append(f"const {ref(v)}: {v.type}")
    lines.append("return " + ", ".join(f"{ref(v)}  # {v.name}" for v in graph.outputs))
    return "\n".join(lines) + "\n"


def neighbours(graph: Graph, node: Node) -> Iterable[Node]:
    ids = {v.id for v in node.inputs} | {v.id for v in node.outputs}
    for other in graph.nodes:
        touched = {v.id for v in other.inputs} | {v.id for v in other.outputs}
        if other is not node and touched & ids:
            yield other
