"""Values computed from constants alone, computed once when compiling.

Models compute fixed tables at serving time: a mel filter bank from linspace and
broadcasts (`tf.signal.linear_to_mel_weight_matrix`, Keras' MelSpectrogram), DCT twiddle
factors, positional encodings. Every call recomputes them, and an op the compiler does
not take among them (BroadcastArgs) leaves the table on TensorFlow feeding a device op
that needs it as a compile-time constant, which splits the model. `fold_constants` runs
such computations once in TensorFlow, so the values are TensorFlow's own, and puts each
result in a Const where it is read.

What is not folded: pass-through and reshaping ops alone (a weight read through Identity
or reshaped stays as it is: copying every weight would cost time and memory for
nothing), stateful ops and graph inputs (PlaceholderWithDefault can be fed), results over
`MAX_BYTES` (a large broadcast is cheaper computed than stored), strings, resources and
variants.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from neuronish import contracts
from neuronish.graph import (
    Graph,
    PartitionError,
    canonical,
    is_control,
    is_stateful,
    parse_input,
    producer,
)

MAX_BYTES = 1 << 20
# Ops that only re-label a value's shape: a weight reshaped for a convolution's bias is not
# worth folding (the compiler takes it as it is), and finding none spares copying the graph.
_RELABELS = contracts.PASS_THROUGH_OPS | {"Reshape", "Squeeze", "ExpandDims"}
_NOT_FOLDED_DTYPES = (tf.string, tf.resource, tf.variant)


def fold_constants(graph: Graph, fetches: Sequence[str] = ()) -> bool:
    """Replace, in `graph`, each value computed from Consts alone by a non-pass-through op
    by a Const; whether anything was."""
    try:
        graph.order  # noqa: B018 (a cycle: the partitioner says what is wrong)
    except PartitionError:
        return False
    fixed, computed = _fixed_nodes(graph)
    fetched = {canonical(f) for f in fetches}
    tensors = sorted({t for name in graph.order if name not in fixed
                      for t in graph.data_inputs[name] if producer(t) in computed} - fetched)
    if not tensors:
        return False
    values = _evaluate(_closure(graph, tensors), tensors)
    if values is None:
        return False
    for tensor, value in values.items():
        name, output = parse_input(tensor)
        node = graph.add_node(graph.unique_name(f"{name}/folded" + (f"_{output}" if output
                                                                    else "")), "Const")
        node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
        graph.replace_uses(tensor, node.name)
    graph.drop_dead(fetches)
    return True


def _fixed_nodes(graph: Graph) -> tuple[set[str], set[str]]:
    """(nodes whose outputs follow from Consts alone, those of them that compute)."""
    fixed: set[str] = set()
    computed: set[str] = set()
    for name in graph.order:  # producers first
        node, sources = graph.nodes[name], graph.producers(name)
        if not _foldable(node) or not (node.op == "Const" or (
                sources and all(s in fixed for s in sources))):
            continue
        fixed.add(name)
        if node.op not in _RELABELS or any(s in computed for s in sources):
            computed.add(name)
    return fixed, computed


def _foldable(node: object) -> bool:
    if node.op in contracts.INPUT_OPS:
        return False
    return not is_stateful(node.op)


def _closure(graph: Graph, tensors: list[str]) -> graph_pb2.GraphDef:
    """The nodes `tensors` are computed from (Consts at the roots), as their own graph: the
    model's other weights are not copied to compute a few small tables.

    Identity nodes are bypassed, their readers reading what they forward: a frozen weight
    comes through two of them (the variable read and Keras' own), 1,536 of the 3,456 nodes
    NASNetMobile's 192 batch norms were folded from, and each node costs TensorFlow's
    import and session time. An Identity is a copy, so the values do not change."""
    def source(tensor: str) -> str:
        while (node := graph.nodes[producer(tensor)]).op == "Identity" and \
                not graph.control_inputs[node.name]:
            tensor = graph.data_inputs[node.name][0]
        return tensor

    keep: set[str] = set()
    todo = [producer(t) for t in tensors]  # a fetched Identity itself stays
    while todo:
        name = todo.pop()
        if name not in keep:
            keep.add(name)
            todo += [producer(source(t)) for t in graph.data_inputs[name]]
            todo += graph.control_inputs[name]
    sub = graph_pb2.GraphDef()
    sub.versions.CopyFrom(graph.graph_def.versions)
    sub.library.CopyFrom(graph.graph_def.library)
    for node in graph.graph_def.node:
        if node.name in keep:
            copy = sub.node.add()
            copy.CopyFrom(node)
            del copy.input[:]
            copy.input.extend(r if is_control(r) else source(canonical(r)) for r in node.input)
    return sub


# The closure runs once, each op on its own kernel: Grappler's optimizing it first cost
# more than it saved (NASNetMobile's fold, median of 5 under load 4-8: 0.88 s as it was,
# 0.69 s with Identities bypassed, 0.48 s with Grappler off too; the values identical).
_PLAIN_RUN = tf.compat.v1.ConfigProto()
_PLAIN_RUN.graph_options.rewrite_options.disable_meta_optimizer = True


def _evaluate(graph_def: graph_pb2.GraphDef, tensors: list[str]) -> dict | None:
    """The values of `tensors` that are worth a Const, or None when TensorFlow cannot
    compute them here (the graph is then left as it is)."""
    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        wanted = [t for t in tensors if graph.get_tensor_by_name(t).dtype.base_dtype
                  not in _NOT_FOLDED_DTYPES]
        if not wanted:
            return None
        with tf.compat.v1.Session(graph=graph, config=_PLAIN_RUN) as session:
            values = session.run(wanted)
    except (tf.errors.OpError, ValueError, KeyError):
        return None
    return {t: v for t, v in zip(wanted, values) if v.nbytes <= MAX_BYTES}
