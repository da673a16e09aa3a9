"""A read-only view of a GraphDef shared by the rewrites, shape inference and partitioner.

GraphDef input strings come in three spellings: "node" (output 0),
"node:2" (output 2) and "^node" (a control edge).  Every stage works on
canonical tensor names ("node:0") and node names, built once here.
"""

from __future__ import annotations

import graphlib
import heapq
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.python.framework import op_def_registry

from neuronish.contracts import INPUT_OPS
from neuronish.errors import NeuronishError


class PartitionError(NeuronishError):
    """The graph cannot be partitioned as asked; the message names the node and the fix."""


def parse_input(ref: str) -> tuple[str, int]:
    """("node", output index) for a GraphDef input string; index -1 for "^node"."""
    if ref.startswith("^"):
        return ref[1:], -1
    name, sep, index = ref.rpartition(":")
    if sep and index.isdigit():
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


def needed_nodes(nodes: Iterable[node_def_pb2.NodeDef] | Mapping[str, node_def_pb2.NodeDef],
                 roots: Iterable[str], *, control: bool = True) -> set[str]:
    """Names of the nodes `roots` need, the roots included: their ancestors through data
    and (unless `control` is False) control edges. `nodes` is the graph's nodes, or them
    by name; roots are node or tensor names ("n", "n:1", "^n"); names of no node are
    ignored."""
    by_name = nodes if isinstance(nodes, Mapping) else {n.name: n for n in nodes}
    needed: set[str] = set()
    todo = [producer(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in needed or name not in by_name:
            continue
        needed.add(name)
        todo.extend(producer(i) for i in by_name[name].input if control or not is_control(i))
    return needed


def keep_only(graph_def: graph_pb2.GraphDef, names: Collection[str]) -> None:
    """Delete, in place, the nodes of `graph_def` not named in `names` (order kept)."""
    for i in reversed([i for i, n in enumerate(graph_def.node) if n.name not in names]):
        del graph_def.node[i]


def drop_dead(graph_def: graph_pb2.GraphDef, fetches: Iterable[str]) -> None:
    """Remove, in place, the nodes a rewrite left that nothing reads any more: all but
    what `fetches` (tensor or node names) and the graph's inputs need. No fetches: the
    graph is left as it is."""
    keep = {producer(f) for f in fetches}
    if keep:
        keep_only(graph_def, needed_nodes(graph_def.node, [
            *keep, *(n.name for n in graph_def.node if n.op in INPUT_OPS)]))


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


@dataclass(frozen=True)
class GraphIndex:
    """Nodes, edges and a topological order of a GraphDef.

    `order` is topological over data and control edges; ties keep the
    GraphDef's order, so the same graph always gives the same order.
    """

    nodes: dict[str, node_def_pb2.NodeDef]
    order: tuple[str, ...]
    position: dict[str, int]  # node -> index in `order`
    data_inputs: dict[str, tuple[str, ...]]  # node -> canonical input tensors, in input order
    control_inputs: dict[str, tuple[str, ...]]  # node -> producer nodes of its "^" inputs
    tensor_consumers: dict[str, tuple[str, ...]]  # tensor -> nodes reading it (data edges)
    data_consumers: dict[str, tuple[str, ...]]  # node -> nodes reading any of its outputs
    control_consumers: dict[str, tuple[str, ...]]  # node -> nodes with a "^node" input
    # Results computed from the graph alone (shape inference at given input shapes), kept
    # for the index's life: the partitioner's recovery rounds change which nodes are
    # excluded, never the graph, so TensorFlow's shape inference runs once per compile.
    # An index is a view of a graph nobody edits; one edited needs a new index.
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, graph_def: graph_pb2.GraphDef) -> GraphIndex:
        nodes: dict[str, node_def_pb2.NodeDef] = {}
        for node in graph_def.node:
            if node.name in nodes:
                raise PartitionError(f"the graph has two nodes named {node.name!r} "
                                     f"({nodes[node.name].op} and {node.op}); names must be unique")
            nodes[node.name] = node
        data_inputs: dict[str, tuple[str, ...]] = {}
        control_inputs: dict[str, tuple[str, ...]] = {}
        tensor_consumers: dict[str, list[str]] = {}
        data_consumers: dict[str, list[str]] = {n: [] for n in nodes}
        control_consumers: dict[str, list[str]] = {n: [] for n in nodes}
        for node in graph_def.node:
            data, control = [], []
            for ref in node.input:
                source, index = parse_input(ref)
                if source not in nodes:
                    raise PartitionError(f"node {node.name!r} ({node.op}) reads {ref!r}, but the "
                                         f"graph has no node {source!r}; pass a complete GraphDef")
                if index < 0:
                    if source not in control:
                        control.append(source)
                        control_consumers[source].append(node.name)
                    continue
                tensor = f"{source}:{index}"
                data.append(tensor)
                readers = tensor_consumers.setdefault(tensor, [])
                if node.name not in readers:
                    readers.append(node.name)
                if node.name not in data_consumers[source]:
                    data_consumers[source].append(node.name)
            data_inputs[node.name] = tuple(data)
            control_inputs[node.name] = tuple(control)
        order = _topological_order(graph_def, data_inputs, control_inputs)
        return cls(
            nodes=nodes,
            order=tuple(order),
            position={n: i for i, n in enumerate(order)},
            data_inputs=data_inputs,
            control_inputs=control_inputs,
            tensor_consumers={t: tuple(c) for t, c in tensor_consumers.items()},
            data_consumers={n: tuple(c) for n, c in data_consumers.items()},
            control_consumers={n: tuple(c) for n, c in control_consumers.items()},
        )

    def producers(self, name: str) -> list[str]:
        """Nodes `name` depends on directly, through data or control edges."""
        return [producer(t) for t in self.data_inputs[name]] + list(self.control_inputs[name])

    def consumers(self, name: str) -> list[str]:
        """Nodes that depend on `name` directly, through data or control edges."""
        return list(self.data_consumers[name]) + list(self.control_consumers[name])


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
