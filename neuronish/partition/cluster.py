"""Stages 2 and 3: group supported nodes into clusters, then drop the small ones.

Rules of `cluster`:

- Static nodes are handled apart.  A node is *static* when its value depends
  only on Consts and on tensor shapes and the device can compute it
  (`values.device_static_nodes`).  Inside a compiled program such values are
  compile-time constants; on TensorFlow a shape-derived value follows the
  batch it is run at.  So a static node never decides which cluster anything
  joins: each cluster gets its own copy of every static node its members
  read (Consts included: "absorbed"), and the original stays on TensorFlow
  for consumers there.  For the cycle check a static node stands for edges
  from the nodes it reads (or waits for) to its consumers.
- The other supported nodes are merged along data edges with union-find,
  visiting nodes in topological order (inputs in input order, retried while
  merges succeed).  A merge is refused when another path leads from one
  cluster to the other, through an unsupported node or a third cluster: the
  fused op would have to run before and after that node.  Control edges
  count as paths.
- Clusters are named `neuron_op_0`, `neuron_op_1`, ... in the topological
  order of their first member, skipping names the graph already uses.

Rule of `drop_small`: a cluster with fewer than `minimum_segment_size`
compute nodes (members that are not static copies nor Const/Identity/NoOp-
like) stays on TensorFlow, unless one of its own members (not a copy) was
forced by `force_fuse_ops`.  A cluster with no compute node at all is
dropped unless forced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tensorflow.core.framework import graph_pb2

from neuronish.contracts import PASS_THROUGH_OPS
from neuronish.graph import Graph, producer
from neuronish.partition.dag import ContractibleDag
from neuronish.partition.mark import Marking
from neuronish.shape_inference.values import device_static_nodes

NAME_PREFIX = "neuron_op_"


@dataclass(frozen=True)
class Cluster:
    """A set of nodes to fuse into one NeuronOp."""

    name: str
    nodes: tuple[str, ...]  # every member, in topological order (static copies included)
    # Members whose value depends only on Consts and shapes; they are copies:
    # the original also stays on TensorFlow while anything there reads it.
    static_nodes: frozenset[str]
    compute_nodes: tuple[str, ...]  # members that count toward minimum_segment_size
    forced: bool = False  # a member (not a static copy) was named by force_fuse_ops


@dataclass(frozen=True)
class DroppedCluster:
    cluster: Cluster
    reason: str


@dataclass(frozen=True)
class SizeFilter:
    """The result of `drop_small`."""

    kept: tuple[Cluster, ...]
    dropped: tuple[DroppedCluster, ...]


def cluster(graph: Graph | graph_pb2.GraphDef, marking: Marking) -> list[Cluster]:
    """Cluster the supported nodes of `graph` (see the module docstring)."""
    graph = Graph.of(graph)
    static = device_static_nodes(graph, marking.supported)
    dynamic = [n for n in graph.order if n not in static]
    ids = {n: i for i, n in enumerate(dynamic)}

    # Dependencies between non-static nodes; a static node passes on the
    # dependencies of the nodes whose shapes it reads.
    reads: dict[str, frozenset[int]] = {}
    edges: set[tuple[int, int]] = set()
    for name in graph.order:
        sources: set[int] = set()
        for p in graph.producers(name):
            if p in static:
                sources |= reads[p]
            else:
                sources.add(ids[p])
        if name in static:
            reads[name] = frozenset(sources)
        else:
            edges.update((s, ids[name]) for s in sources)

    dag = ContractibleDag(len(dynamic), edges)
    for name in dynamic:
        if not marking.supported(name):
            continue
        sources = [ids[p] for p in dict.fromkeys(producer(t) for t in graph.data_inputs[name])
                   if p not in static and marking.supported(p)]
        # One merge can make another possible (the path that blocked it now
        # runs inside the cluster), so retry until nothing changes.
        merged = True
        while merged:
            merged = False
            for source in sources:
                a, b = dag.find(source), dag.find(ids[name])
                if a != b and dag.contract(a, b):
                    merged = True

    groups: dict[int, list[str]] = {}
    for name in dynamic:  # topological order, so each group is too
        if marking.supported(name):
            groups.setdefault(dag.find(ids[name]), []).append(name)

    taken = set(graph.nodes)
    clusters, counter = [], 0
    for members in groups.values():  # dict order: by first member
        copies = _static_inputs(members, graph, static)
        while f"{NAME_PREFIX}{counter}" in taken:
            counter += 1
        name = f"{NAME_PREFIX}{counter}"
        counter += 1
        clusters.append(Cluster(
            name=name,
            nodes=tuple(sorted([*members, *copies], key=graph.position.__getitem__)),
            static_nodes=frozenset(copies),
            compute_nodes=tuple(m for m in members
                                if graph.nodes[m].op not in PASS_THROUGH_OPS),
            forced=any(marking.nodes[m].forced for m in members),
        ))
    return clusters


def _static_inputs(members: Sequence[str], graph: Graph, static: frozenset[str]) -> set[str]:
    """The static nodes `members` read, directly or through other static nodes."""
    found: set[str] = set()
    stack = [producer(t) for m in members for t in graph.data_inputs[m]]
    while stack:
        name = stack.pop()
        if name in static and name not in found:
            found.add(name)
            stack.extend(producer(t) for t in graph.data_inputs[name])
    return found


def drop_small(clusters: Sequence[Cluster], minimum_segment_size: int) -> SizeFilter:
    """Keep clusters with at least `minimum_segment_size` compute nodes, or a forced member."""
    kept: list[Cluster] = []
    dropped: list[DroppedCluster] = []
    for c in clusters:
        size = len(c.compute_nodes)
        if c.forced:
            kept.append(c)
        elif size == 0:
            dropped.append(DroppedCluster(c, "no compute node (only Const, Identity, NoOp and "
                                             "shape arithmetic): nothing worth a device call"))
        elif size < minimum_segment_size:
            dropped.append(DroppedCluster(
                c, f"{size} compute node{'s' if size > 1 else ''} < minimum_segment_size "
                   f"{minimum_segment_size}"))
        else:
            kept.append(c)
    return SizeFilter(tuple(kept), tuple(dropped))
