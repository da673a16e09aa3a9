"""The partitioner: which parts of a frozen TF graph run on the device, as fused ops.

Stages, each a module with one public function, each testable alone:

    shape_inference.shapes.infer       static shape, dtype and batch axis of every tensor
      / .batch_axes                    (a package of its own, re-exported here)
    mark.mark                          supported or not, and why not, per node
    cluster.cluster                    supported nodes -> clusters, never closing a cycle
    cluster.drop_small                 clusters too small to be worth a device call
    encapsulate.encapsulate            cluster -> standalone subgraph + io-config
    splice.splice                      subgraphs' fused NodeDefs -> the new outer graph

`partition` chains the first five for the SavedModel compile; the caller
compiles each `Subgraph`, builds its NeuronOp NodeDef (inputs =
`Subgraph.inputs`) and calls `splice`.  When the compiler rejects nodes, call
`partition` again with `exclude_nodes={node: reason}` and the same `Graph`
(`Partition.graph`): shapes and batch axes are then inferred once, not per round.
Each stage takes the `Graph` (`neuronish.graph`) shared by the whole compile, or a
GraphDef, which it indexes for the call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tensorflow.core.framework import graph_pb2

from neuronish.graph import Graph, PartitionError, canonical, producer
from neuronish.partition.cluster import Cluster, DroppedCluster, SizeFilter, cluster, drop_small
from neuronish.partition.encapsulate import Subgraph, encapsulate
from neuronish.partition.mark import (
    DEVICE_DTYPES,
    CompilerSupport,
    Marking,
    NodeMark,
    Reason,
    compiler_support,
    mark,
    supported_ops,
)
from neuronish.partition.splice import Spliced, splice, unread_duplicates
from neuronish.shape_inference.shapes import (
    TensorInfo,
    batch_axes,
    batched_inputs,
    infer,
    infer_once,
    shapes_at_batch,
)

__all__ = [
    "DEVICE_DTYPES", "Cluster", "CompilerSupport", "DroppedCluster", "Marking", "NodeMark",
    "OnTensorFlow", "Partition", "PartitionError", "Reason", "SizeFilter", "Spliced", "Subgraph",
    "TensorInfo",
    "batch_axes", "cluster", "compiler_support", "drop_small", "encapsulate", "infer", "mark",
    "partition",
    "shapes_at_batch", "splice", "supported_ops",
]


@dataclass(frozen=True)
class OnTensorFlow:
    """Why one node stays on TensorFlow."""

    reason: str  # the rule, shared by many nodes ("op type not supported by neuronish-cc")
    detail: str = ""  # what about this node triggered it

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


@dataclass(frozen=True)
class Partition:
    """What `partition` decided: subgraphs to compile and why the rest stays on TensorFlow."""

    subgraphs: tuple[Subgraph, ...]
    dropped: tuple[DroppedCluster, ...]  # clusters left on TensorFlow, with why
    marking: Marking  # every node's verdict; `marking.unsupported` are the nodes kept off
    infos: dict[str, TensorInfo]  # shapes and dtypes at the compile batch
    batch_axes: dict[str, int | None]  # empty when dynamic_batch_size is off
    # Nodes of the graph that stay on TensorFlow (wholly or as a copy), with why.
    left_on_tensorflow: dict[str, OnTensorFlow]
    # The graph of the partitioned graph, for `splice` and further rounds to reuse.
    graph: Graph | None = field(default=None, compare=False, repr=False)

    def reasons(self) -> dict[str, str]:
        """node -> why it stays on TensorFlow, as text."""
        return {name: str(why) for name, why in self.left_on_tensorflow.items()}

    def op_types_left_on_tensorflow(self) -> dict[str, dict[str, int]]:
        """op type -> {reason: node count}, for the compile report."""
        summary: dict[str, Counter[str]] = {}
        for name, why in self.left_on_tensorflow.items():
            summary.setdefault(self.marking.nodes[name].op, Counter())[why.reason] += 1
        return {op: dict(sorted(c.items())) for op, c in sorted(summary.items())}


def partition(
    graph: Graph | graph_pb2.GraphDef,
    input_shapes: Mapping[str, Sequence[int]],
    supported: Collection[str] | None = None,
    *,
    batch_size: int | None = None,
    dynamic_batch_size: bool = False,
    minimum_segment_size: int = 2,
    no_fuse_ops: Iterable[str] = (),
    force_fuse_ops: Iterable[str] = (),
    exclude_nodes: Mapping[str, str] | None = None,
    fetches: Iterable[str] | None = None,
    device_dtypes: Collection[str] = DEVICE_DTYPES,
    refused: Mapping[str, str] | None = None,
    batch_mixing: Mapping[str, str] | None = None,
) -> Partition:
    """mark -> cluster -> drop_small -> encapsulate over a frozen GraphDef.

    `input_shapes` maps Placeholders ("x" or "x:0") to their compile shapes;
    Placeholders left out keep the GraphDef's shape.  `supported` (op types) and
    `refused` (node -> why the compiler refuses its attribute values) default to
    `compiler_support(graph_def)`, one `neuronish-cc` process.  With `dynamic_batch_size`, dim
    0 of every batched input (`shapes.batched_inputs`) is the batch
    (`batch_size`, by default read from the input shapes) and batch axes are
    found by `shapes.batch_axes`.
    `batch_mixing` maps nodes already known to mix samples across the batch (the
    compiler's batch check, `cc/batch.py`) to why; they stay on TensorFlow.
    `fetches` are the tensors the caller reads (signature outputs); None
    treats the outputs of nodes nothing reads as fetched.  A cluster none of
    whose results is used is dropped.
    """
    graph = Graph.of(graph)
    graph_def = graph.graph_def
    if supported is None:
        support = compiler_support(graph_def)
        supported, refused = support.ops, {**support.refused, **(refused or {})}
    fetch_list = None if fetches is None else [canonical(f) for f in fetches]
    for t in fetch_list or ():
        if producer(t) not in graph.nodes:
            raise PartitionError(f"fetch {t} names no node of the graph")

    batch: int | None = None  # the compile batch when it is dynamic
    if dynamic_batch_size:
        batched = batched_inputs(graph_def)
        batch = batch_size if batch_size is not None else _batch_of(
            {k: v for k, v in input_shapes.items() if producer(k) in batched})
        for name, shape in input_shapes.items():
            if len(shape) and producer(name) in batched and shape[0] != batch:
                raise PartitionError(f"input {name} has shape {list(shape)}, but the batch size "
                                     f"is {batch}: with dynamic_batch_size every input's dim 0 "
                                     f"is the batch")
    infos, axes = _shapes(graph, input_shapes, batch)
    # A node that mixes samples across the batch (a reduction over it, a reshape moving
    # it) would make its whole cluster run at the compiled batch only; it stays on
    # TensorFlow instead, and the rest is partitioned again, so the device's part keeps a
    # dynamic batch and every batch size gives TensorFlow's numbers.
    mixing: dict[str, str] = dict(batch_mixing or {})
    for _ in range(_MAX_MIXING_ROUNDS):
        marking = mark(graph, infos, supported, no_fuse_ops, force_fuse_ops,
                       exclude_nodes=exclude_nodes, device_dtypes=device_dtypes,
                       refused=refused, batch_mixing=mixing,
                       fetches=fetch_list)
        sized = drop_small(cluster(graph, marking), minimum_segment_size)
        subgraphs, dropped, clusters = [], list(sized.dropped), {}
        for c in sized.kept:
            sub = encapsulate(graph, c, infos, axes, dynamic_batch_size, fetch_list)
            if sub.outputs:
                subgraphs.append(sub)
                clusters[sub.name] = c
            else:
                dropped.append(DroppedCluster(c, "none of its results is used outside it; if "
                                                 "the caller reads one, pass it in fetches"))
        mixers = {m: s.dynamic_batch_reason or "" for s in subgraphs
                  for m in s.batch_mixing_nodes if m not in mixing}
        if not mixers:
            break
        mixing.update(mixers)
    else:
        # Still mixing after every round: such a cluster would run at the compiled batch
        # only, and a call of another size would fail; it stays on TensorFlow instead.
        stuck = [s for s in subgraphs if s.batch_mixing_nodes]
        subgraphs = [s for s in subgraphs if not s.batch_mixing_nodes]
        dropped += [DroppedCluster(clusters[s.name], f"its batch could not be made dynamic in "
                                   f"{_MAX_MIXING_ROUNDS} round(s) ({s.dynamic_batch_reason}); "
                                   "kept on TensorFlow so that every batch size works")
                    for s in stuck]
    return Partition(tuple(subgraphs), tuple(dropped), marking, infos, axes,
                     _left_on_tensorflow(graph, marking, subgraphs, dropped, fetch_list or ()),
                     graph)


_MAX_MIXING_ROUNDS = 8


def _shapes(
    graph: Graph,
    input_shapes: Mapping[str, Sequence[int]],
    batch: int | None,
) -> tuple[dict[str, TensorInfo], dict[str, int | None]]:
    """Shapes and dtypes at the compile batch, and batch axes when `batch` is given (the
    batch is dynamic), each inferred once per version of the graph: a recovery round
    partitions the same graph at the same shapes again, and each inference imports the
    whole graph into TensorFlow (ResNet50: a second or more). The results are only read
    downstream."""
    if batch is None:
        return infer_once(graph, input_shapes), {}
    key = ("batch_axes", tuple(sorted((k, tuple(v)) for k, v in input_shapes.items())), batch)
    if key not in graph.memo:
        full_shapes = shapes_at_batch(graph.graph_def, input_shapes, batch)
        infos = infer_once(graph, full_shapes)
        graph.memo[key] = infos, batch_axes(graph.graph_def, full_shapes, batch, infos, graph)
    return graph.memo[key]


def _batch_of(input_shapes: Mapping[str, Sequence[int]]) -> int:
    batches = {int(s[0]) for s in input_shapes.values() if len(s)}
    if len(batches) != 1 or min(batches) < 1:
        raise PartitionError(f"cannot tell the compile batch size from input shapes "
                             f"{dict(input_shapes)}: pass batch_size=")
    return batches.pop()


def _left_on_tensorflow(
    graph: Graph,
    marking: Marking,
    subgraphs: Sequence[Subgraph],
    dropped: Sequence[DroppedCluster],
    fetches: Iterable[str],
) -> dict[str, OnTensorFlow]:
    """Why each node that `splice` will not remove stays on TensorFlow."""
    moved = {n for s in subgraphs for n in s.node_names if n not in s.duplicated_nodes}
    moved |= unread_duplicates(subgraphs, graph, moved, set(fetches))  # as splice will
    copied = {n for s in subgraphs for n in s.duplicated_nodes}
    in_dropped = {n: d for d in dropped for n in d.cluster.nodes}
    reasons: dict[str, OnTensorFlow] = {}
    for name in graph.order:
        node_mark = marking.nodes[name]
        if name in moved:
            continue
        if node_mark.reason is not None:
            reasons[name] = OnTensorFlow(node_mark.reason.value, node_mark.detail)
        elif name in copied:
            reasons[name] = OnTensorFlow("constant or shape value also read on TensorFlow",
                                         "the op computes its own copy")
        elif name in in_dropped:
            d = in_dropped[name]
            reasons[name] = OnTensorFlow("in a dropped cluster", f"{d.cluster.name}: {d.reason}")
        else:
            reasons[name] = OnTensorFlow("constant or shape value read only on TensorFlow")
    return reasons
