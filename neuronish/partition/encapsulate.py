"""Stage 4: turn one cluster into a standalone subgraph with a compile signature.

Rules:

- Inputs: every tensor a member reads from outside the cluster, in order of
  first use (members in topological order, then input order).  Each becomes
  one Placeholder with the compile-time shape and dtype, named after the
  outer node ("x" for "x:0", "split__1" for "split:1", suffixed if taken).
- Outputs: every tensor of a non-static member that is read outside the
  cluster or fetched.  With `fetches=None` the outputs of members nothing
  reads (the graph's sinks) count as fetched.  Members keep their names, so
  an output's name inside the subgraph equals its outer name.
- Static members (values from Consts and shapes only) are never outputs:
  a shape-derived value computed at the compile batch would be wrong at any
  other batch.  A static member read outside the cluster (or fetched) is
  *duplicated*: it also stays on TensorFlow, and the non-static members
  its TensorFlow copy reads become outputs.  (A control edge from a static
  member does not keep it on TensorFlow: see `splice`.)
- Control inputs from outside are not part of the subgraph; they are listed
  in `control_inputs` for the fused op to carry.
- Batch axes come from `shapes.batch_axes`.  Every axis is set to -1 and
  `dynamic_batch_reason` says why when dynamic batching is off, an input's
  or output's batch axis is ambiguous, no input or output is batched, or the
  cluster mixes samples: some non-static tensor without a batch axis is
  computed from a batched input (a reduction over the batch, picking one
  sample...), so running chunks of the batch separately would be wrong.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from neuronish import contracts
from neuronish.common.protowire import encode_varint
from neuronish.graph import Graph, PartitionError, canonical, parse_input, producer
from neuronish.partition.cluster import Cluster
from neuronish.runtime.signature import TensorSignature
from neuronish.shape_inference.shapes import TensorInfo

# Attributes that refer to the outer graph or cache its shapes.
_OUTER_ATTRS = ("_class", "_output_shapes")


@dataclass(frozen=True)
class Subgraph:
    """One cluster, ready for `neuronish-cc compile` and for `splice`.

    `inputs`/`outputs` are outer tensor names (what the fused op reads, what
    it replaces); `input_names`/`output_names` are the matching tensor names
    inside `graph_def` (the io-config keys).  All per-tensor tuples are
    aligned with those.
    """

    name: str
    node_names: tuple[str, ...]  # outer nodes copied into the subgraph, topological order
    duplicated_nodes: tuple[str, ...]  # of those, the ones that also stay on TensorFlow
    static_nodes: tuple[str, ...]  # of those, the ones computed from Consts and shapes only
    graph_def: graph_pb2.GraphDef
    io_config: dict
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    input_batch_axes: tuple[int, ...]
    output_batch_axes: tuple[int, ...]
    control_inputs: tuple[str, ...]  # outer nodes members wait for through control edges
    dynamic_batch_reason: str | None  # why every batch axis is -1; None if batches can split
    op_counts: dict[str, int]  # op type -> members of that type
    # The members that mix samples across the batch (the first is the reason's node), if
    # that is why: every one found in one pass, so the partitioner can keep them all on
    # TensorFlow at once (a BatchNormalization on batch statistics has two per layer).
    batch_mixing_nodes: tuple[str, ...] = ()

    @property
    def dynamic_batch(self) -> bool:
        return self.dynamic_batch_reason is None

    @property
    def input_signature(self) -> list[TensorSignature]:
        """The io-config's inputs as records: what the executable must say it takes."""
        return [TensorSignature(*t) for t in zip(self.input_names, self.input_dtypes,
                                                 self.input_shapes, self.input_batch_axes,
                                                 strict=True)]

    @property
    def output_signature(self) -> list[TensorSignature]:
        return [TensorSignature(*t) for t in zip(self.output_names, self.output_dtypes,
                                                 self.output_shapes, self.output_batch_axes,
                                                 strict=True)]

    def serialize(self) -> bytes:
        """`graph_def` as bytes, the same bytes for the same subgraph in any process.
        Serialized once: the compile job, its cache key and the recovery digest all
        read it, and it holds the weights."""
        return self._bytes

    @functools.cached_property
    def _bytes(self) -> bytes:
        return serialize_graph_def(self.graph_def)


def serialize_graph_def(graph_def: graph_pb2.GraphDef) -> bytes:
    """`graph_def.SerializeToString(deterministic=True)` (the same bytes for its known
    fields), node by node and joined: upb serializes one message of a GB about twice as
    slowly as its parts (ConvNeXtXLarge's 1.4 GB subgraph)."""
    return b"".join(graph_def_parts(graph_def))


def graph_def_parts(graph_def: graph_pb2.GraphDef) -> Iterator[bytes]:
    """`serialize_graph_def`'s bytes in pieces, one node at a time, so that a writer can
    stream them to a file without ever holding the whole (the weights) in memory."""
    rest = graph_pb2.GraphDef()
    for field, value in graph_def.ListFields():
        if field.name == "node":
            continue
        if field.message_type is not None:
            getattr(rest, field.name).CopyFrom(value)
        else:
            setattr(rest, field.name, value)
    for node in graph_def.node:  # field 1, the first in field-number order
        data = node.SerializeToString(deterministic=True)
        yield _NODE_TAG + encode_varint(len(data))
        yield data
    yield rest.SerializeToString(deterministic=True)


_NODE_TAG = b"\x0a"  # GraphDef.node: field 1, length-delimited


def encapsulate(
    graph: Graph | graph_pb2.GraphDef,
    cluster: Cluster,
    infos: Mapping[str, TensorInfo],
    batch_axes: Mapping[str, int | None],
    dynamic_batch_size: bool,
    fetches: Iterable[str] | None = None,
) -> Subgraph:
    """Build the Subgraph of `cluster` (see the module docstring for the rules).

    `infos` is `shapes.infer` at the compile batch, `batch_axes` is
    `shapes.batch_axes`; `fetches` are the outer tensors the caller reads
    (signature outputs).
    """
    graph = Graph.of(graph)
    graph_def = graph.graph_def
    members = set(cluster.nodes)
    fetched = None if fetches is None else {canonical(f) for f in fetches}
    kept = _duplicated(cluster, graph, infos, fetched)

    inputs = list(dict.fromkeys(
        t for m in cluster.nodes for t in graph.data_inputs[m] if producer(t) not in members))
    outputs = []
    for m in cluster.nodes:
        if m in cluster.static_nodes:
            continue
        for t in _outputs(m, infos):
            readers = graph.readers(t)
            if (any(r not in members or r in kept for r in readers)
                    or (fetched is not None and t in fetched)
                    or (fetched is None and not graph.consumers(m))):
                outputs.append(t)
    for t in inputs + outputs:
        if not infos[t].fully_known:
            raise PartitionError(f"cluster {cluster.name}: tensor {t} has shape "
                                 f"{infos[t].shape} at the compile batch; mark() should have "
                                 f"kept its node off the device (were infos from another batch?)")

    placeholders = _placeholder_names(inputs, members)
    subgraph = _subgraph_def(graph_def, cluster, graph, inputs, placeholders, infos)
    in_axes = [batch_axes.get(t) for t in inputs]
    out_axes = [batch_axes.get(t) for t in outputs]
    reason, mixers = _no_dynamic_batch_reason(cluster, graph, infos, batch_axes, inputs,
                                             outputs, dynamic_batch_size)
    if reason is not None:
        in_axes, out_axes = [-1] * len(inputs), [-1] * len(outputs)
    input_names = tuple(f"{p}:0" for p in placeholders)
    return Subgraph(
        name=cluster.name,
        node_names=cluster.nodes,
        duplicated_nodes=tuple(n for n in cluster.nodes if n in kept),
        static_nodes=tuple(n for n in cluster.nodes if n in cluster.static_nodes),
        graph_def=subgraph,
        io_config=contracts.io_config(
            ((name, infos[t].shape, infos[t].dtype, axis)
             for name, t, axis in zip(input_names, inputs, in_axes)),
            dict(zip(outputs, out_axes))),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        input_names=input_names,
        output_names=tuple(outputs),
        input_shapes=tuple(tuple(infos[t].shape) for t in inputs),
        output_shapes=tuple(tuple(infos[t].shape) for t in outputs),
        input_dtypes=tuple(infos[t].dtype for t in inputs),
        output_dtypes=tuple(infos[t].dtype for t in outputs),
        input_batch_axes=tuple(in_axes),
        output_batch_axes=tuple(out_axes),
        control_inputs=tuple(dict.fromkeys(
            c for m in cluster.nodes for c in graph.control_inputs[m] if c not in members)),
        dynamic_batch_reason=reason,
        batch_mixing_nodes=mixers,
        op_counts=dict(sorted(Counter(graph.nodes[m].op for m in cluster.nodes).items())),
    )


def _outputs(name: str, infos: Mapping[str, TensorInfo]) -> list[str]:
    outputs, k = [], 0
    while f"{name}:{k}" in infos:
        outputs.append(f"{name}:{k}")
        k += 1
    return outputs


def _duplicated(
    cluster: Cluster, graph: Graph, infos: Mapping[str, TensorInfo], fetched: set[str] | None
) -> set[str]:
    """Static members that must also stay on TensorFlow, with the static members they read."""
    members = set(cluster.nodes)
    # Control consumers do not count: splice points them at what the static
    # node waits for instead (it has no side effects).
    kept = {
        s for s in cluster.static_nodes
        if any(c not in members for c in graph.data_consumers(s))
        or (fetched is not None and any(t in fetched for t in _outputs(s, infos)))
    }
    stack = list(kept)
    while stack:
        for t in graph.data_inputs[stack.pop()]:
            p = producer(t)
            if p in cluster.static_nodes and p not in kept:
                kept.add(p)
                stack.append(p)
    return kept


def _placeholder_names(inputs: list[str], members: set[str]) -> list[str]:
    taken = set(members)
    names = []
    for t in inputs:
        node, k = parse_input(t)
        base = node if k == 0 else f"{node}__{k}"
        name, suffix = base, 1
        while name in taken:
            name, suffix = f"{base}_{suffix}", suffix + 1
        taken.add(name)
        names.append(name)
    return names


def _subgraph_def(
    graph_def: graph_pb2.GraphDef,
    cluster: Cluster,
    graph: Graph,
    inputs: list[str],
    placeholders: list[str],
    infos: Mapping[str, TensorInfo],
) -> graph_pb2.GraphDef:
    """Placeholders for `inputs`, then the members with inputs rewired to them."""
    members = set(cluster.nodes)
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    for t, name in zip(inputs, placeholders):
        node = out.node.add(name=name, op="Placeholder")
        node.attr["dtype"].type = tf.as_dtype(infos[t].dtype).as_datatype_enum
        node.attr["shape"].shape.CopyFrom(tf.TensorShape(infos[t].shape).as_proto())
    renamed = dict(zip(inputs, placeholders))
    for m in cluster.nodes:
        node = out.node.add()
        node.CopyFrom(graph.nodes[m])
        rewired = []
        for ref in node.input:
            source, k = parse_input(ref)
            if source in members:
                rewired.append(ref)
            elif k >= 0:
                rewired.append(renamed[f"{source}:{k}"])
            # else: a control input from outside; the fused op carries it.
        del node.input[:]
        node.input.extend(rewired)
        node.ClearField("device")
        for attr in _OUTER_ATTRS:
            if attr in node.attr:
                del node.attr[attr]
    return out


def _no_dynamic_batch_reason(
    cluster: Cluster,
    graph: Graph,
    infos: Mapping[str, TensorInfo],
    axes: Mapping[str, int | None],
    inputs: list[str],
    outputs: list[str],
    dynamic_batch_size: bool,
) -> tuple[str | None, str | None]:
    """Why the cluster cannot run a batch in chunks (None: it can), and the members that
    mix samples when that is the reason (the reason's first)."""
    if not dynamic_batch_size:
        return "dynamic_batch_size is off: the op runs at the compiled batch size only", ()
    unclear = [t for t in inputs + outputs if axes.get(t) is None]
    if unclear:
        # An output's producer ([b, b] similarities, a flattened [b * s]) can stay on
        # TensorFlow, which computes it at any batch, so the rest keeps a dynamic batch;
        # so can the members reading such an input (Keras 2's LayerNormalization folds
        # the batch into a [1, b * s, d, 1] it normalizes on TensorFlow, then reshapes
        # it back).
        dark = set(unclear)
        movers = [producer(t) for t in unclear if t in outputs]
        movers += [m for m in cluster.nodes if any(t in dark for t in graph.data_inputs[m])]
        return (f"the batch axis of {unclear[0]} (shape {list(infos[unclear[0]].shape)}) cannot be "
                f"told from shapes: no axis, or more than one, follows the batch size "
                f"exactly"), tuple(dict.fromkeys(movers))
    if all(axes[t] == -1 for t in inputs + outputs):
        return "no input or output has a batch axis", ()
    mixing = getattr(axes, "mixing", {})  # shapes.BatchAxes
    moving = [m for m in cluster.nodes if m in mixing]
    if moving:
        return mixing[moving[0]], tuple(moving)
    # Which tensors carry data from a batched input (static members do not:
    # they depend on shapes only, which the compiled program fixes per chunk).
    batched = {t for t in inputs if axes[t] >= 0}
    reason, mixers = None, []
    for m in cluster.nodes:
        if m in cluster.static_nodes:
            continue
        data = graph.data_inputs[m]
        for k, t in enumerate(_outputs(m, infos)):
            # IdentityN's output k is its input k; any other op's outputs read all inputs.
            sources = data[k:k + 1] if graph.nodes[m].op == "IdentityN" else data
            if not any(s in batched for s in sources):
                continue
            if t not in outputs and not graph.readers(t):
                continue  # read by nothing (FusedBatchNormV3's batch_mean in inference)
            if axes.get(t) != -1:
                batched.add(t)
                continue
            # A mixer: off the device, its result comes back without a batch axis, so
            # what reads it is not a mixer for that (the scan goes on for the others).
            reason = reason or (
                f"{t} ({graph.nodes[m].op}) has no batch axis but is computed from "
                f"batched inputs: the cluster mixes samples across the batch (e.g. a "
                f"reduction over it), so a batch cannot be split into chunks")
            if m not in mixers:
                mixers.append(m)
    return reason, tuple(mixers)
