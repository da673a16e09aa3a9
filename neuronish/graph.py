"""A read-only view of a GraphDef shared by the rewrites, shape inference and partitioner.

GraphDef input strings come in three spellings: "node" (output 0),
"node:2" (output 2) and "^node" (a control edge).  Every stage works on
canonical tensor names ("node:0") and node names, built once here.
"""

from __future__ import annotations

import graphlib
import heapq
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from tensorflow.core.framework import function_pb2, graph_pb2, node_def_pb2
from tensorflow.python.framework import op_def_registry
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def

from neuronish.contracts import INPUT_OPS
from neuronish.errors import NeuronishError


class PartitionError(NeuronishError):
    """The graph cannot be partitioned as asked; the message names the node and the fix."""


def parse_input(ref: str) -> tuple[str, int]:
    """("node", output index) for a GraphDef input string; index -1 for "^node"."""
    if ref.startswith("^"):
        return ref[1:], -1
    name, sep, index = ref.rpartition(":")
    if sep and index.isascii() and index.isdigit():
        return name, int(index)
    return ref, 0


def canonical(ref: str) -> str:
    """"node" -> "node:0"; "node:1" stays; control inputs are not tensors."""
    node, index = parse_input(ref)
    if index < 0:
        raise ValueError(f"{ref!r} is a control input, not a tensor")
    return f"{node}:{index}"


def producer(tensor: str) -> str:
    """The node that produces `tensor` ("node:1" -> "node")."""
    return parse_input(tensor)[0]


def is_control(ref: str) -> bool:
    """Whether a GraphDef input string is a control edge ("^node")."""
    return ref.startswith("^")


def data_refs(node: node_def_pb2.NodeDef) -> list[str]:
    """`node`'s data inputs, as written ("node", "node:1"), in input order."""
    return [r for r in node.input if not r.startswith("^")]


def control_refs(node: node_def_pb2.NodeDef) -> list[str]:
    """`node`'s control inputs, as written ("^node")."""
    return [r for r in node.input if r.startswith("^")]


def rename_ref(ref: str, renamed: Mapping[str, str]) -> str:
    """`ref` with its node renamed by `renamed` (old name -> new), its port and "^" kept."""
    name, index = parse_input(ref)
    new = renamed.get(name, name)
    return "^" + new if index < 0 else new + ref[len(name):]


def is_stateful(op: str) -> bool:
    """Whether `op`'s result or side effect may differ from call to call. An op this
    TensorFlow does not know (a custom op whose library is not loaded) counts as stateful:
    the safe answer, as nothing can show it is not."""
    op_def = op_def_registry.get(op)
    return op_def is None or op_def.is_stateful


def keep_only(graph_def: graph_pb2.GraphDef, names: Collection[str]) -> None:
    """Delete, in place, the nodes of `graph_def` not named in `names` (order kept)."""
    for i in reversed([i for i, n in enumerate(graph_def.node) if n.name not in names]):
        del graph_def.node[i]


def topological_order(dependencies: Mapping[str, Iterable[str]]) -> list[str]:
    """graphlib's order of node -> the nodes it depends on, released one node at a time:
    of the nodes ready, the first in `dependencies`' order, so the same graph always
    gives the same order. Every dependency must be a key. Raises graphlib.CycleError."""
    rank = {name: i for i, name in enumerate(dependencies)}
    sorter = graphlib.TopologicalSorter({n: set(d) for n, d in dependencies.items()})
    sorter.prepare()
    ready = [(rank[n], n) for n in sorter.get_ready()]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, name = heapq.heappop(ready)
        order.append(name)
        sorter.done(name)
        for user in sorter.get_ready():
            heapq.heappush(ready, (rank[user], user))
    return order


class Graph:
    """A GraphDef indexed once and edited in place: the one graph object the rewrites,
    shape inference, the partitioner and splice share.

    It holds each node by name, each node's inputs parsed (canonical data tensors,
    control producers), and the use lists of every tensor and node. Its edit methods
    change the GraphDef and those indexes together, so a lookup after an edit sees the
    edit; the topological order and `memo` (results computed from the graph, such as
    shapes inferred at given input shapes) are dropped by every edit and rebuilt on
    demand. A stage that changes a NodeDef's inputs, op or attributes directly says so
    with `updated(name)`.

    `order` is topological over data and control edges; ties keep the GraphDef's order,
    so the same graph always gives the same order.
    """

    def __init__(self, graph_def: graph_pb2.GraphDef) -> None:
        self.graph_def = graph_def
        self.nodes: dict[str, node_def_pb2.NodeDef] = {}
        self.data_inputs: dict[str, tuple[str, ...]] = {}  # node -> canonical input tensors
        self.control_inputs: dict[str, tuple[str, ...]] = {}  # node -> producers of "^" inputs
        # Use lists: tensor -> {reader: edge count}, node -> {data reader: edge count},
        # node -> {control reader: None}. Dicts keep them ordered and O(1) to edit.
        self._tensor_readers: dict[str, dict[str, int]] = {}
        self._data_readers: dict[str, dict[str, int]] = {}
        self._control_readers: dict[str, dict[str, None]] = {}
        self._order: tuple[str, ...] | None = None
        self._position: dict[str, int] | None = None
        self.memo: dict[Any, Any] = {}
        self.version = 0  # counts edits: a result computed at one version is stale at another
        for node in graph_def.node:
            if node.name in self.nodes:
                raise PartitionError(
                    f"the graph has two nodes named {node.name!r} "
                    f"({self.nodes[node.name].op} and {node.op}); names must be unique")
            self.nodes[node.name] = node
        for node in graph_def.node:
            self._link(node)
        self._check_inputs_exist(self.nodes)

    @classmethod
    def build(cls, graph_def: graph_pb2.GraphDef) -> Graph:
        """`Graph(graph_def)` with its order found at once, so that a cycle is refused here
        (naming it) rather than at the first stage that asks for the order."""
        graph = cls(graph_def)
        graph.order  # noqa: B018
        return graph

    @classmethod
    def of(cls, graph: Graph | graph_pb2.GraphDef) -> Graph:
        """`graph` itself, or a GraphDef indexed (`build`): what a stage taking either
        works on."""
        return graph if isinstance(graph, Graph) else cls.build(graph)

    # -- reading ---------------------------------------------------------------------

    @property
    def order(self) -> tuple[str, ...]:
        """Node names, producers first (cached until the next edit)."""
        if self._order is None:
            self._check_inputs_exist(self.nodes)
            self._order = tuple(_topological_order(self.graph_def, self.data_inputs,
                                                   self.control_inputs))
        return self._order

    @property
    def position(self) -> dict[str, int]:
        """node -> its index in `order`."""
        if self._position is None:
            self._position = {n: i for i, n in enumerate(self.order)}
        return self._position

    def readers(self, tensor: str) -> tuple[str, ...]:
        """Nodes with a data input `tensor` ("node:0")."""
        return tuple(self._tensor_readers.get(tensor, ()))

    def data_consumers(self, name: str) -> tuple[str, ...]:
        """Nodes that read any output of node `name`."""
        return tuple(self._data_readers.get(name, ()))

    def control_consumers(self, name: str) -> tuple[str, ...]:
        """Nodes with a control input "^name"."""
        return tuple(self._control_readers.get(name, ()))

    def producers(self, name: str) -> list[str]:
        """Nodes `name` depends on directly, through data or control edges."""
        return [producer(t) for t in self.data_inputs[name]] + list(self.control_inputs[name])

    def consumers(self, name: str) -> list[str]:
        """Nodes that depend on `name` directly, through data or control edges."""
        return [*self._data_readers.get(name, ()), *self._control_readers.get(name, ())]

    def needed(self, roots: Iterable[str], *, control: bool = True) -> set[str]:
        """Names of the nodes `roots` need, the roots included: their ancestors through
        data and (unless `control` is False) control edges. Roots are node or tensor names
        ("n", "n:1", "^n"); names of no node are ignored."""
        needed: set[str] = set()
        todo = [producer(r) for r in roots]
        while todo:
            name = todo.pop()
            if name in needed or name not in self.nodes:
                continue
            needed.add(name)
            todo.extend(producer(t) for t in self.data_inputs[name])
            if control:
                todo.extend(self.control_inputs[name])
        return needed

    # -- editing ---------------------------------------------------------------------

    def add_node(self, name: str, op: str, inputs: Iterable[str] = ()) -> node_def_pb2.NodeDef:
        """A new node at the end of the GraphDef, indexed; its attributes are the caller's
        to set (then no `updated` is needed: attributes are not indexed)."""
        if name in self.nodes:
            raise PartitionError(f"the graph already has a node named {name!r} "
                                 f"({self.nodes[name].op}); names must be unique")
        node = self.graph_def.node.add(name=name, op=op)
        node.input.extend(inputs)
        self.nodes[name] = node
        self._link(node)
        self._edited()
        return node

    def set_inputs(self, name: str, inputs: Iterable[str]) -> None:
        """Node `name`'s inputs replaced by `inputs` (GraphDef spellings)."""
        node = self.nodes[name]
        self._unlink(node)
        del node.input[:]
        node.input.extend(inputs)
        self._link(node)
        self._edited()

    def updated(self, name: str) -> None:
        """Node `name` was changed in place (inputs, op or attributes): index it again."""
        node = self.nodes[name]
        self._unlink(node)
        self._link(node)
        self._edited()

    def replace_uses(self, tensor: str, ref: str) -> None:
        """Every data input reading `tensor` ("node:0") reads `ref` instead (found through
        the use list, not by scanning the graph)."""
        tensor = canonical(tensor)
        for reader in list(self._tensor_readers.get(tensor, ())):
            node = self.nodes[reader]
            self._unlink(node)
            for k, r in enumerate(node.input):
                if not is_control(r) and canonical(r) == tensor:
                    node.input[k] = ref
            self._link(node)
        self._edited()

    def remove(self, names: Collection[str]) -> None:
        """Delete nodes `names`; a node left reading one of them is an error."""
        gone = set(names) & self.nodes.keys()
        for name in gone:
            left = [c for c in self.consumers(name) if c not in gone]
            if left:
                raise PartitionError(f"cannot remove node {name!r}: {left[0]!r} still reads it")
        for name in gone:
            self._unlink(self.nodes[name])
        keep_only(self.graph_def, self.nodes.keys() - gone)
        for name in gone:
            del self.nodes[name], self.data_inputs[name], self.control_inputs[name]
            self._data_readers.pop(name, None)
            self._control_readers.pop(name, None)
        self._edited()

    def keep_only(self, names: Collection[str]) -> None:
        """Delete the nodes not named in `names` (GraphDef order kept)."""
        self.remove([n for n in self.nodes if n not in names])

    def drop_dead(self, fetches: Iterable[str]) -> None:
        """Remove the nodes a rewrite left that nothing reads any more: all but what
        `fetches` (tensor or node names) and the graph's inputs need. No fetches: the
        graph is left as it is."""
        keep = {producer(f) for f in fetches}
        if keep:
            self.keep_only(self.needed(
                [*keep, *(n for n, node in self.nodes.items() if node.op in INPUT_OPS)]))

    def replace_node(self, name: str, op: str, inputs: Iterable[str] = ()
                     ) -> node_def_pb2.NodeDef:
        """Node `name` replaced by a new node of that name at the end of the GraphDef
        (`op` over `inputs`, attributes the caller's to set): its readers read the new
        node. For a node whose replacement reads nodes added after it (an unrolled loop's
        IdentityN reads the last step's copies)."""
        self._unlink(self.nodes.pop(name))
        del self.graph_def.node[next(i for i, n in enumerate(self.graph_def.node)
                                     if n.name == name)]
        return self.add_node(name, op, inputs)  # the name is free again: just removed

    def adopt(self, other: Graph | graph_pb2.GraphDef) -> None:
        """Become `other` (a GraphDef, indexed anew, or a Graph, its indexes taken over):
        for a rewrite that works on a copy because it may give up halfway (unrolling
        loops), handing over its result. Holders of the old `graph_def` keep the old
        graph; read `graph_def` from here."""
        edits = self.version
        if isinstance(other, Graph):
            vars(self).update(vars(other))
            self.memo = {}
        else:
            self.__init__(other)  # type: ignore[misc]
        self.version = max(edits, self.version) + 1

    def rename(self, renamed: Mapping[str, str]) -> None:
        """Rename nodes (old name -> new) and every input reading them, GraphDef order
        kept. The new names must be free. The indexes are built anew: the one rename
        there is (freezing's, of every node inlining prefixed) moves most of their keys."""
        if not renamed:
            return
        taken = self.nodes.keys() - renamed.keys()
        for old, new in renamed.items():
            if new in taken:
                raise PartitionError(f"cannot rename node {old!r} to {new!r}: another node "
                                     "has that name")
            taken.add(new)
        readers = {r for old in renamed for r in self.consumers(old)}
        for name in readers:
            node = self.nodes[name]
            refs = [rename_ref(r, renamed) for r in node.input]
            del node.input[:]
            node.input.extend(refs)
        for old, new in renamed.items():
            self.nodes[old].name = new
        self.adopt(self.graph_def)

    def unique_name(self, name: str) -> str:
        """`name`, with "_" appended until no node has it."""
        while name in self.nodes:
            name += "_"
        return name

    def verify(self) -> None:
        """Raise PartitionError naming the first node whose indexed inputs or use lists no
        longer match its NodeDef: a stage edited a NodeDef without `updated`. For tests
        and debugging; it reads every edge."""
        fresh = Graph(self.graph_def) if [n.name for n in self.graph_def.node] == \
            list(self.nodes) else None
        if fresh is None:
            raise PartitionError("the graph's nodes are not the GraphDef's: a node was added "
                                 "or removed without Graph.add_node/remove")
        for name in self.nodes:
            if (self.data_inputs[name], self.control_inputs[name]) != \
                    (fresh.data_inputs[name], fresh.control_inputs[name]):
                raise PartitionError(f"node {name!r} reads {list(self.nodes[name].input)}, but "
                                     f"the graph's index says {list(self.data_inputs[name])} "
                                     f"and ^{list(self.control_inputs[name])}: call "
                                     "Graph.updated after editing a NodeDef")
        for name in self.nodes:
            if sorted(self.consumers(name)) != sorted(fresh.consumers(name)):
                raise PartitionError(f"the use list of node {name!r} is stale")

    # -- the indexes -----------------------------------------------------------------

    def _link(self, node: node_def_pb2.NodeDef) -> None:
        data: list[str] = []
        control: list[str] = []
        for ref in node.input:
            source, index = parse_input(ref)
            if index < 0:
                if source not in control:
                    control.append(source)
                    self._control_readers.setdefault(source, {})[node.name] = None
                continue
            tensor = f"{source}:{index}"
            data.append(tensor)
            readers = self._tensor_readers.setdefault(tensor, {})
            readers[node.name] = readers.get(node.name, 0) + 1
            users = self._data_readers.setdefault(source, {})
            users[node.name] = users.get(node.name, 0) + 1
        self.data_inputs[node.name] = tuple(data)
        self.control_inputs[node.name] = tuple(control)

    def _unlink(self, node: node_def_pb2.NodeDef) -> None:
        name = node.name
        for tensor in self.data_inputs.get(name, ()):
            for table, key in ((self._tensor_readers, tensor),
                               (self._data_readers, producer(tensor))):
                readers = table[key]
                readers[name] -= 1
                if not readers[name]:
                    del readers[name]
                    if not readers:
                        del table[key]
        for source in self.control_inputs.get(name, ()):
            readers = self._control_readers[source]
            del readers[name]
            if not readers:
                del self._control_readers[source]

    def _edited(self) -> None:
        self._order = self._position = None
        self.memo.clear()
        self.version += 1

    def _check_inputs_exist(self, nodes: Mapping[str, node_def_pb2.NodeDef]) -> None:
        for table in (self._data_readers, self._control_readers):
            for source, readers in table.items():
                if source not in nodes:
                    reader = self.nodes[next(iter(readers))]
                    ref = next(r for r in reader.input if parse_input(r)[0] == source)
                    raise PartitionError(
                        f"node {reader.name!r} ({reader.op}) reads {ref!r}, but the graph has "
                        f"no node {source!r}; pass a complete GraphDef")


def function_body(fdef: function_pb2.FunctionDef) -> tuple[Graph, list[str]]:
    """A library function's body as a Graph, and the tensors it returns ("node:0"), in
    its outputs' order. Its arguments are Placeholders named after them. A body refers to
    a tensor by its op-def output name ("node:output:0"), which `parse_input` does not
    take; TensorFlow's converter rewrites those references in GraphDef spelling, so the
    rewrites and shape inference read a body with the same index and parser as the graph.
    Raises what the converter raises (ValueError, KeyError) for a body it cannot read."""
    graph_def, flat = function_def_to_graph_def(fdef)
    return Graph(graph_def), [flat[fdef.ret[a.name]] for a in fdef.signature.output_arg]


def _topological_order(
    graph_def: graph_pb2.GraphDef,
    data_inputs: dict[str, tuple[str, ...]],
    control_inputs: dict[str, tuple[str, ...]],
) -> list[str]:
    """`topological_order` in GraphDef order: clusters are named in GraphDef order."""
    try:
        return topological_order(
            {node.name: {producer(t) for t in data_inputs[node.name]}
             | set(control_inputs[node.name]) for node in graph_def.node})
    except graphlib.CycleError as e:
        cycle = " -> ".join(repr(n) for n in e.args[1])
        raise PartitionError(
            f"the graph has a cycle: {cycle}; control flow loops (NextIteration) cannot be "
            "partitioned: freeze with functional control flow") from None
