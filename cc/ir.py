"""The compiler's IR: a typed SSA graph that remembers which TF nodes it came from.

Every `Value` has a static shape and a numpy dtype name. A value is either a
graph input, a constant (`data` is set), or the output of exactly one `Node`.
Nodes are kept in a topological order. Each node records the TF node names it
came from (`origin`) so errors and profiles can point back at the model.

The graph keeps use lists (who reads each value) up to date through every edit, so a
pass asks `graph.uses(v)` / `graph.use_count(v)` in O(uses) instead of rebuilding a
consumers map, and removing or inserting a node costs O(1): with a rebuilt map and
list `remove`/`index` per rewrite, a 5,000-node graph of fusable blocks spent 45 s in
fold_scale_shift alone (0.25 s now, benchmarks/compiler_scale.py).
"""

from __future__ import annotations

import itertools
import math
import mmap
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

_ids = itertools.count()
_INT64 = 1 << 63
_ITEMSIZE: dict[str, int] = {}  # dtype name -> bytes per element


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name: "float32", "int32", "bool", ...

    @property
    def size(self) -> int:
        n = math.prod(self.shape)  # (numpy's prod took 5 us: a 100k-node plan asks 200k times)
        if type(n) is int and -_INT64 <= n < _INT64:
            return n
        return int(np.prod(self.shape, dtype=np.int64))  # as before: wrapped to int64

    @property
    def nbytes(self) -> int:
        itemsize = _ITEMSIZE.get(self.dtype)
        if itemsize is None:
            itemsize = _ITEMSIZE[self.dtype] = np.dtype(self.dtype).itemsize
        return self.size * itemsize

    def __str__(self) -> str:
        short = {"float32": "f32", "float16": "f16", "float64": "f64", "int32": "i32",
                 "int64": "i64", "bool": "i1", "int8": "i8", "uint8": "u8", "int16": "i16"}
        return f"{short.get(self.dtype, self.dtype)}[{','.join(map(str, self.shape))}]"


class Value:
    """A tensor: a graph input, a constant (`data` is set) or one node's output.

    Setting `type` tells the producer's graph, so the verifier re-checks the readers."""

    __slots__ = ("_type", "producer", "data", "name", "id")

    def __init__(self, type: TensorType, producer: Node | None = None,
                 data: np.ndarray | None = None, name: str = "", id: int | None = None):
        self._type = type
        self.producer = producer
        self.data = data  # set for constants
        self.name = name  # TF tensor name, for graph inputs/outputs and debugging
        self.id = next(_ids) if id is None else id

    @property
    def type(self) -> TensorType:
        return self._type

    @type.setter
    def type(self, new: TensorType) -> None:
        self._type = new
        graph = self.producer.graph if self.producer is not None else None
        if graph is not None:
            graph._retyped(self)
        else:  # (a graph input or a detached value: the next verification is a full one)
            Graph.untracked_edits += 1

    @property
    def is_const(self) -> bool:
        return self.data is not None

    @property
    def shape(self) -> tuple[int, ...]:
        return self._type.shape

    @property
    def dtype(self) -> str:
        return self._type.dtype

    def __repr__(self) -> str:
        return f"Value(%{self.id}: {self._type}{' const' if self.is_const else ''})"


def constant(array: np.ndarray, name: str = "", owned: bool = False) -> Value:
    """A constant value; the array is frozen so no pass can change it in place.

    `owned`: the caller just computed `array` and keeps no other reference to it, so an
    array owning its memory is frozen where it is instead of copied (fold_scale_shift
    made 75,000 such copies of arrays it had just computed)."""
    array = np.asarray(array)
    frozen = owned and array.base is None and type(array) is np.ndarray
    if frozen:
        array.flags.writeable = False
    dtype = array.dtype
    dtype_name = _DTYPE_NAMES.get(dtype)
    if dtype_name is None:  # (numpy's `dtype.name` is Python code: 5 us, 100k constants)
        if dtype.kind == "f" and dtype != np.float16 and dtype.itemsize > 8:
            raise ValueError(f"unsupported constant dtype {dtype}")
        dtype_name = _DTYPE_NAMES[dtype] = dtype.name
    if not frozen and not _immutable(array):
        array = np.array(array, copy=True)
        array.flags.writeable = False
    return Value(TensorType(array.shape, dtype_name), data=array,  # (ints: numpy's shape)
                 name=name)


# dtype -> its name, for the dtypes a constant may have (checked once each)
_DTYPE_NAMES: dict[np.dtype, str] = {}


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


class Node:
    """One instruction. `inputs` is a tuple: change it by assigning a new sequence, which
    keeps the owning graph's use lists right (in-place edits would bypass them)."""

    __slots__ = ("kind", "_inputs", "_outputs", "_attrs", "origin", "graph", "_prev", "_next")

    def __init__(self, kind: str, inputs: Iterable[Value], outputs: list[Value], attrs: dict,
                 origin: tuple[str, ...] = ()):
        self.kind = kind
        self._inputs: tuple[Value, ...] = tuple(inputs)
        self._outputs = outputs
        self._attrs = attrs
        self.origin = origin  # TF node names this instruction implements
        self.graph: Graph | None = None  # the graph whose schedule holds this node
        self._prev: Node | None = None
        self._next: Node | None = None

    @property
    def inputs(self) -> tuple[Value, ...]:
        return self._inputs

    @inputs.setter
    def inputs(self, new: Iterable[Value]) -> None:
        new = tuple(new)
        if self.graph is not None:
            self.graph._rewire(self, self._inputs, new)
        self._inputs = new

    @property
    def outputs(self) -> list[Value]:
        return self._outputs

    @outputs.setter
    def outputs(self, new: list[Value]) -> None:
        self._outputs = new
        if self.graph is not None:
            self.graph._touch(self)

    @property
    def attrs(self) -> dict:
        """Replace, do not edit in place, once the node is in a graph (the verifier
        re-checks the nodes whose attributes were replaced)."""
        return self._attrs

    @attrs.setter
    def attrs(self, new: dict) -> None:
        self._attrs = new
        if self.graph is not None:
            self.graph._touch(self)

    def __repr__(self) -> str:
        return f"Node({self.kind}, origin={self.origin})"


class _Outputs(list):
    """The graph's outputs: a list that knows its value ids, so `Graph.is_output` is
    O(1) however many outputs there are (every in-place change drops the cached set)."""

    _ids: set[int] | None = None

    def ids(self) -> set[int]:
        if self._ids is None:
            self._ids = {v.id for v in self}
        return self._ids

    def _changed(self) -> None:
        self._ids = None


def _dropping_ids(name: str) -> Callable:
    method = getattr(list, name)

    def changed(self: _Outputs, *args: object) -> object:
        self._ids = None
        return method(self, *args)

    changed.__name__ = name
    return changed


for _name in ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend",
              "insert", "pop", "remove", "clear", "reverse", "sort"):
    setattr(_Outputs, _name, _dropping_ids(_name))


class _UsesView(Mapping):
    """value id -> [reader, ...] (a node once per operand), read from the use lists."""

    def __init__(self, uses: dict[int, dict[Node, int]]):
        self._uses = uses

    def __getitem__(self, vid: int) -> list[Node]:
        users = self._uses[vid]
        return [n for n, k in users.items() for _ in range(k)]

    def __iter__(self) -> Iterator[int]:
        return iter(self._uses)

    def __len__(self) -> int:
        return len(self._uses)


class Graph:
    """Inputs, outputs and a schedule of nodes in topological order, with use lists.

    The schedule is a linked list (insert and remove anywhere in O(1)); `nodes` is a
    tuple of it, cached until the next edit. Use lists (`uses`, `use_count`) are kept
    right by every edit: `Node.inputs = ...`, `replace_uses`, `insert_before`,
    `remove`, `replace`, `append` and assigning `nodes` (which re-reads the whole
    list). The graph also remembers which nodes changed since `take_changes`, so the
    verifier between passes re-infers types of those only (cc/verify.py)."""

    # Type edits of values no graph could be told about (graph inputs, detached values).
    untracked_edits = 0

    def __init__(self, inputs: list[Value], outputs: list[Value], nodes: Iterable[Node] = (),
                 input_batch_axes: list[int] | None = None,
                 output_batch_axes: list[int] | None = None):
        self.inputs = inputs
        self.outputs = outputs  # (graph outputs are not nodes: see `is_output`)
        # Batch axis per graph input/output (-1: none), parallel to inputs/outputs.
        self.input_batch_axes = input_batch_axes if input_batch_axes is not None else []
        self.output_batch_axes = output_batch_axes if output_batch_axes is not None else []
        self._head: Node | None = None
        self._tail: Node | None = None
        self._count = 0
        self._cache: tuple[Node, ...] | None = ()
        self._uses: dict[int, dict[Node, int]] = {}
        self._use_counts: dict[int, int] = {}
        self._changed: set[Node] = set()
        self._all_changed = True
        # Counts every edit of the schedule, the use lists or a node (the verifier skips a
        # graph that did not move since its last check).
        self.edits = 0
        # Called with each node an edit touches (the rewrite driver's worklist).
        self.listeners: list[Callable[[Node], None]] = []
        self.nodes = nodes

    @property
    def outputs(self) -> list[Value]:
        return self._outputs

    @outputs.setter
    def outputs(self, new: Iterable[Value]) -> None:
        self._outputs = _Outputs(new)

    # -- the schedule -------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[Node, ...]:
        if self._cache is None:
            out = []
            node = self._head
            while node is not None:
                out.append(node)
                node = node._next
            self._cache = tuple(out)
        return self._cache

    @nodes.setter
    def nodes(self, new: Iterable[Node]) -> None:
        """A whole new schedule (whole-graph passes): nodes already here keep their state,
        new ones count as changed, dropped ones leave the graph."""
        new = tuple(new)
        if new == self.nodes:
            # The schedule as it is (a clean-up pass that found nothing to drop): nothing
            # to relink, and no edit for the verifier to re-walk 200,000 nodes for.
            return
        keep = set(new)
        node = self._head
        while node is not None:
            after = node._next
            if node not in keep:
                self._detach(node)
            node = after
        self._head = self._tail = None
        self._count = 0
        for node in new:
            if node.graph is not None and node.graph is not self:
                raise ValueError(f"{node!r} is already in another graph")
            fresh = node.graph is None
            node._prev = node._next = None
            self._link_before(node, None)
            if fresh:
                self._attach(node)
        self._cache = tuple(new)

    @property
    def node_count(self) -> int:
        return self._count

    def __contains__(self, node: Node) -> bool:
        return node.graph is self

    def next_node(self, node: Node) -> Node | None:
        return node._next

    def _link_before(self, node: Node, anchor: Node | None) -> None:
        if anchor is None:
            node._prev, node._next = self._tail, None
            if self._tail is None:
                self._head = node
            else:
                self._tail._next = node
            self._tail = node
        else:
            node._prev, node._next = anchor._prev, anchor
            if anchor._prev is None:
                self._head = node
            else:
                anchor._prev._next = node
            anchor._prev = node
        self._count += 1
        self._cache = None
        self.edits += 1

    def _unlink(self, node: Node) -> None:
        if node._prev is None:
            self._head = node._next
        else:
            node._prev._next = node._next
        if node._next is None:
            self._tail = node._prev
        else:
            node._next._prev = node._prev
        node._prev = node._next = None
        self._count -= 1
        self._cache = None
        self.edits += 1

    def _attach(self, node: Node) -> None:
        node.graph = self
        for v in node._inputs:
            self._add_use(v, node)
        self._touch(node)

    def _detach(self, node: Node) -> None:
        for v in node._inputs:
            self._drop_use(v, node)
        node.graph = None
        self._changed.discard(node)
        self.edits += 1

    def _insert(self, node: Node, anchor: Node | None) -> Node:
        if node.graph is not None:
            raise ValueError(f"{node!r} is already in a graph")
        if anchor is not None and anchor.graph is not self:
            raise ValueError(f"{anchor!r} is not in this graph")
        self._link_before(node, anchor)
        self._attach(node)
        return node

    def append(self, node: Node) -> Node:
        """Schedule `node` last."""
        return self._insert(node, None)

    def insert_before(self, anchor: Node, node: Node) -> Node:
        """Schedule `node` right before `anchor`."""
        return self._insert(node, anchor)

    def remove(self, node: Node) -> None:
        """Take `node` out of the schedule (its outputs should be unread by then)."""
        if node.graph is not self:
            raise ValueError(f"{node!r} is not in this graph")
        self._unlink(node)
        self._detach(node)
        for listener in self.listeners:  # (its operands' producers may now match more)
            listener(node)

    def replace(self, old: Node, new: Node) -> Node:
        """`new` takes `old`'s place in the schedule; `old` leaves the graph."""
        self.insert_before(old, new)
        self.remove(old)
        return new

    def move_before(self, anchor: Node, node: Node) -> None:
        """Reschedule `node` (already in this graph) right before `anchor`."""
        if node is anchor:
            return
        self._unlink(node)
        self._link_before(node, anchor)
        self._touch(node)

    # -- use lists ----------------------------------------------------------------------

    def _add_use(self, v: Value, node: Node) -> None:
        users = self._uses.get(v.id)
        if users is None:
            users = self._uses[v.id] = {}
        users[node] = users.get(node, 0) + 1
        self._use_counts[v.id] = self._use_counts.get(v.id, 0) + 1

    def _drop_use(self, v: Value, node: Node) -> None:
        users = self._uses[v.id]
        left = users[node] - 1
        if left:
            users[node] = left
        else:
            del users[node]
            if not users:
                del self._uses[v.id]
        left = self._use_counts[v.id] - 1
        if left:
            self._use_counts[v.id] = left
        else:
            del self._use_counts[v.id]

    def _rewire(self, node: Node, old: tuple[Value, ...], new: tuple[Value, ...]) -> None:
        for v in old:
            self._drop_use(v, node)
        for v in new:
            self._add_use(v, node)
        self._touch(node)

    def uses(self, v: Value) -> list[Node]:
        """The nodes reading `v`, a node once per operand it reads `v` as (graph outputs
        are not nodes: see `is_output`)."""
        users = self._uses.get(v.id)
        if not users:
            return []
        return [n for n, k in users.items() for _ in range(k)]

    def readers(self, v: Value) -> list[Node]:
        """The distinct nodes reading `v`."""
        return list(self._uses.get(v.id, ()))

    def use_count(self, v: Value) -> int:
        """How many operands read `v` (a node reading it twice counts twice), in O(1)."""
        return self._use_counts.get(v.id, 0)

    def is_output(self, v: Value) -> bool:
        return v.id in self._outputs.ids()

    def consumers(self) -> Mapping[int, list[Node]]:
        """value id -> the nodes reading it, as `uses` gives them: a live read-only view
        of the use lists, so asking for it costs nothing (passes that once rebuilt a
        consumers map after every edit may simply ask again)."""
        return _UsesView(self._uses)

    def constants(self) -> list[Value]:
        seen: dict[int, Value] = {}
        for v in itertools.chain((i for n in self.nodes for i in n.inputs), self.outputs):
            if v.is_const:
                seen.setdefault(v.id, v)
        return list(seen.values())

    def replace_uses(self, old: Value, new: Value) -> None:
        """Point every use of `old` (node inputs and graph outputs) at `new`, in the time
        of `old`'s uses."""
        if old is new:
            return
        for node in list(self._uses.get(old.id, ())):
            node.inputs = [new if v is old else v for v in node._inputs]
        if self.is_output(old):
            self.outputs = [new if v is old else v for v in self.outputs]

    # -- what changed, for the verifier --------------------------------------------------

    def _touch(self, node: Node) -> None:
        self._changed.add(node)
        self.edits += 1
        for listener in self.listeners:
            listener(node)

    def _retyped(self, v: Value) -> None:
        self.edits += 1
        if v.producer is not None and v.producer.graph is self:
            self._touch(v.producer)
        for reader in list(self._uses.get(v.id, ())):
            self._touch(reader)

    def take_changes(self) -> set[Node] | None:
        """The nodes added or changed since the last call (None: take every node), and
        start counting afresh."""
        changed = None if self._all_changed else {n for n in self._changed if n.graph is self}
        self._changed = set()
        self._all_changed = False
        return changed

    def mark_all_changed(self) -> None:
        self._all_changed = True
        self.edits += 1


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
    """The producers of `node`'s inputs and the readers of its outputs."""
    seen = {node}
    near = [v.producer for v in node.inputs if v.producer is not None]
    near += [u for o in node.outputs for u in graph.readers(o)]
    for other in near:
        if other not in seen:
            seen.add(other)
            yield other
