"""Static shapes after `tf.strings.split` (Keras `TextVectorization`, tokenizers).

`StringSplitV2` returns the tokens as a sparse tensor whose dense shape (output 2)
is `[len(input), longest row]`: the first element is the input's size, the second
depends on the text. TensorFlow's constant evaluation cannot look inside the op, so
the number of rows is unknown too; and `RaggedTensorToTensor`, the ragged-to-dense
conversion after it, does not size its result by the row count it is given
(`FIRST_DIM_SIZE`). So the embedding and the network of a text model stayed on
TensorFlow. In the copy of the graph used for shape inference only, readers of the
split's output 2 read `[Size(input), -1]` instead (the row count constant-evaluates
to the batch; -1, an unknown dimension in a shape, stands for the longest row), and
a conversion given its row count becomes `Fill([rows, *shape[1:]], 0)`.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

from neuronish.graph import Graph, producer
from neuronish.shape_inference.stand_ins import concat, const, replace_with_fill, vector

SPLIT_OPS = frozenset({"StringSplitV2"})


def stand_in(graph: Graph) -> None:
    """Rewrite (in place) string splits' dense shapes and ragged-to-dense conversions
    given their row count, as above."""
    _split_shapes(graph)
    for node in list(graph.graph_def.node):
        types = [t.decode() for t in node.attr["row_partition_types"].list.s] \
            if node.op == "RaggedTensorToTensor" else []
        shape = graph.nodes.get(producer(node.input[0])) if node.input else None
        # (a shape given as a constant vector: a scalar -1 would be "any rank")
        if types[:1] == ["FIRST_DIM_SIZE"] and len(node.input) > 3 and shape is not None \
                and shape.op == "Const" \
                and len(shape.attr["value"].tensor.tensor_shape.dim) == 1:
            _ragged_to_dense(graph, node)


def _ragged_to_dense(graph: Graph, node: node_def_pb2.NodeDef) -> None:
    """`node`: RaggedTensorToTensor(shape, values, default, first_dim_size, ...)."""
    index = tf.as_dtype(node.attr["Tindex"].type)
    rows = vector(graph, f"{node.name}/neuronish_rows", node.input[3], index)
    rest = graph.add_node(f"{node.name}/neuronish_rest", "StridedSlice")
    rest.attr["T"].type = node.attr["Tshape"].type
    rest.attr["Index"].type = tf.int32.as_datatype_enum
    rest.attr["end_mask"].i = 1
    graph.set_inputs(rest.name, [node.input[0]] + [
        const(graph, f"{node.name}/neuronish_{what}", [value], tf.int32)
        for what, value in (("begin", 1), ("end", 0), ("stride", 1))])
    dims = concat(graph, f"{node.name}/neuronish_dims", [rows, rest.name], index)
    replace_with_fill(graph, node, dims, tf.as_dtype(node.attr["T"].type), index_type=index)


def _split_shapes(graph: Graph) -> None:
    splits = [n for n in graph.graph_def.node if n.op in SPLIT_OPS and n.input]
    for split in splits:
        size = graph.add_node(f"{split.name}/neuronish_rows", "Size", [split.input[0]])
        size.attr["T"].type = tf.string.as_datatype_enum
        size.attr["out_type"].type = tf.int64.as_datatype_enum
        rows = vector(graph, f"{split.name}/neuronish_rows_1d", size.name, tf.int64)
        longest = const(graph, f"{split.name}/neuronish_longest", [-1], tf.int64)
        dense = concat(graph, f"{split.name}/neuronish_dense_shape", [rows, longest],
                       tf.int64)
        graph.replace_uses(f"{split.name}:2", dense)
