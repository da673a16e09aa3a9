"""Stage 5: put the fused ops into the outer graph in place of their clusters.

Rules of `splice`:

- Each cluster's nodes leave the graph, except its duplicated (static)
  nodes, which stay while anything on TensorFlow still reads them or the
  caller fetches them; a duplicated node nobody reads any more is removed.
- The fused NodeDef goes where the cluster's first node was.  Its data
  inputs must be `Subgraph.inputs` (the caller sets them); an input that
  another cluster now produces is rewired to that cluster's op.
- Every reader of `Subgraph.outputs[k]` now reads `<op name>:k`; a control
  input `^member` becomes `^<op name>`; control inputs that members had from
  outside move onto the fused op.  A removed static node (a value from
  Consts and shapes, without side effects) is waited for by waiting for the
  non-static nodes it waits for instead (`^<op>` could close a cycle, and a
  Const alone orders nothing).
- `Spliced.renamed` maps each replaced tensor to its new name, so the
  caller can point signature outputs at it.  Fetching a removed tensor that
  no cluster exports is an error (pass it to `partition(fetches=...)`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from tensorflow.core.framework import graph_pb2, node_def_pb2

from neuronish.graph import (
    Graph,
    PartitionError,
    canonical,
    data_refs,
    parse_input,
    producer,
)
from neuronish.partition.encapsulate import Subgraph


class Spliced(NamedTuple):
    """The new outer graph; a NamedTuple so `graph_def, renamed = splice(...)` works."""

    graph_def: graph_pb2.GraphDef
    renamed: dict[str, str]  # replaced outer tensor ("dense/Relu:0") -> "<op name>:k"


def splice(
    graph: Graph | graph_pb2.GraphDef,
    replacements: Sequence[tuple[Subgraph, node_def_pb2.NodeDef]],
    fetches: Iterable[str] = (),
) -> Spliced:
    """Replace each Subgraph's cluster in `graph` by its NodeDef (see the module docstring).

    `fetches` are tensors the caller will read (they keep duplicated nodes
    alive and are checked to exist or be renamed). `graph` is the partitioned one
    (`Partition.graph`); splice leaves it as it was and returns a new GraphDef.
    """
    graph = Graph.of(graph)
    graph_def = graph.graph_def
    names = [op.name for _, op in replacements]
    if len(set(names)) != len(names):
        raise PartitionError(f"two replacement nodes share a name: {sorted(names)}; name each "
                             f"after its Subgraph")
    owner: dict[str, str] = {}  # removed node -> op replacing it
    renamed: dict[str, str] = {}
    for subgraph, op in replacements:
        _check_replacement(subgraph, op, graph)
        for name in subgraph.node_names:
            if name in subgraph.duplicated_nodes:
                continue
            if name in owner:
                raise PartitionError(f"node {name!r} is in both {owner[name]} and {op.name}; "
                                     f"splice subgraphs of one partition")
            owner[name] = op.name
        renamed.update({t: f"{op.name}:{k}" for k, t in enumerate(subgraph.outputs)})
    fetched = {canonical(f) for f in fetches}
    subgraphs = [s for s, _ in replacements]
    gone = set(owner) | unread_duplicates(subgraphs, graph, set(owner), fetched)
    for t in fetched:
        if producer(t) in gone and t not in renamed:
            raise PartitionError(f"fetch {t} is computed inside {owner.get(producer(t))} but is "
                                 f"not one of its outputs; pass it to partition(fetches=...)")

    static = {n for s in subgraphs for n in s.static_nodes}

    def wait_for(source: str) -> list[str]:
        """What a control input `^source` becomes."""
        if source not in gone:
            return [source]
        if source not in static:
            return [owner[source]]
        return [owner.get(r, r) for r in _reads(source, static, graph)]

    def rewire(node: node_def_pb2.NodeDef, own: str | None, extra_control: Iterable[str]) -> None:
        data, control = [], []
        for ref in node.input:
            source, k = parse_input(ref)
            if k < 0:
                control.extend(wait_for(source))
                continue
            tensor = f"{source}:{k}"
            if tensor in renamed:
                data.append(renamed[tensor])
            elif source in gone:
                raise PartitionError(f"node {node.name!r} reads {tensor}, which was removed with "
                                     f"{owner.get(source, 'a duplicated node')} but is not "
                                     f"an output; this is a partitioner bug, please report it")
            else:
                data.append(ref)
        for c in extra_control:
            control.extend(wait_for(c))
        del node.input[:]
        node.input.extend(data)
        node.input.extend(f"^{c}" for c in dict.fromkeys(control) if c != own)

    ops = {op.name: (subgraph, op) for subgraph, op in replacements}
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in owner and owner[node.name] in ops:
            # First member reached: the fused op takes its place.
            subgraph, op = ops.pop(owner[node.name])
            new = out.node.add()
            new.CopyFrom(op)
            rewire(new, op.name, subgraph.control_inputs)
        if node.name in gone:
            continue
        new = out.node.add()
        new.CopyFrom(node)
        rewire(new, None, ())
    try:
        Graph.build(out)  # a dangling input or a cycle: fail here, not in TensorFlow
    except PartitionError as e:
        raise PartitionError(f"splice produced an invalid graph ({e}); this is a partitioner "
                             f"bug, please report it with the graph") from None
    return Spliced(out, renamed)


def _check_replacement(subgraph: Subgraph, op: node_def_pb2.NodeDef, graph: Graph) -> None:
    data = [canonical(r) for r in data_refs(op)]
    if data != list(subgraph.inputs):
        raise PartitionError(f"the node replacing {subgraph.name} ({op.name!r}) reads {data}; "
                             f"set its inputs to Subgraph.inputs {list(subgraph.inputs)}")
    removed = set(subgraph.node_names) - set(subgraph.duplicated_nodes)
    if op.name in graph.nodes and op.name not in removed:
        raise PartitionError(f"the node replacing {subgraph.name} is named {op.name!r}, which "
                             f"the graph already uses; name it after the Subgraph")


def unread_duplicates(
    subgraphs: Iterable[Subgraph],
    graph: Graph,
    removed: set[str],
    fetched: set[str],
) -> set[str]:
    """Duplicated nodes left with no reader on TensorFlow (their readers were all fused)."""
    subgraphs = list(subgraphs)
    candidates = {n for s in subgraphs for n in s.duplicated_nodes if n not in removed}
    # Fused ops read their inputs and control inputs from TensorFlow too.
    read_by_ops = {producer(t) for s in subgraphs for t in s.inputs}
    read_by_ops.update(c for s in subgraphs for c in s.control_inputs)
    candidates -= read_by_ops
    gone: set[str] = set()
    # Readers come later in topological order: decide them first.
    for name in sorted(candidates, key=graph.position.__getitem__, reverse=True):
        readers = graph.data_consumers(name)  # control readers are rewired (module doc)
        if all(r in removed or r in gone for r in readers) and not any(
            producer(t) == name for t in fetched
        ):
            gone.add(name)
    return gone


def _reads(name: str, static: set[str], graph: Graph) -> list[str]:
    """The non-static nodes the static node `name` waits for, directly or not."""
    found: dict[str, None] = {}
    stack, seen = [name], {name}
    while stack:
        for p in graph.producers(stack.pop()):
            if p in static:
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
            else:
                found[p] = None
    return list(found)
