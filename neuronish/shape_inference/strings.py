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
from tensorflow.core.framework import graph_pb2, node_def_pb2

from neuronish.graph import parse_input
from neuronish.shape_inference.stand_ins import concat, const, replace_with_fill, vector

SPLIT_OPS = frozenset({"StringSplitV2"})


def stand_in(graph_def: graph_pb2.GraphDef) -> None:
    """Rewrite (in place) string splits' dense shapes and ragged-to-dense conversions
    given their row count, as above."""
    _split_shapes(graph_def)
    consts = {n.name: n for n in graph_def.node if n.op == "Const"}
    for node in list(graph_def.node):
        types = [t.decode() for t in node.attr["row_partition_types"].list.s] \
            if node.op == "RaggedTensorToTensor" else []
        shape = consts.get(parse_input(node.input[0])[0]) if node.input else None
        # (a shape given as a constant vector: a scalar -1 would be "any rank")
        if types[:1] == ["FIRST_DIM_SIZE"] and len(node.input) > 3 and shape is not None \
                and len(shape.attr["value"].tensor.tensor_shape.dim) == 1:
            _ragged_to_dense(graph_def, node)


def _ragged_to_dense(graph_def: graph_pb2.GraphDef, node: node_def_pb2.NodeDef) -> None:
    """`node`: RaggedTensorToTensor(shape, values, default, first_dim_size, ...)."""
    index = tf.as_dtype(node.attr["Tindex"].type)
    rows = vector(graph_def, f"{node.name}/neuronish_rows", node.input[3], index)
    rest = graph_def.node.add(name=f"{node.name}/neuronish_rest", op="StridedSlice")
    rest.input.extend([node.input[0]] + [
        const(graph_def, f"{node.name}/neuronish_{what}", [value], tf.int32)
        for what, value in (("begin", 1), ("end", 0), ("stride", 1))])
    rest.attr["T"].type = node.attr["Tshape"].type
    rest.attr["Index"].type = tf.int32.as_datatype_enum
    rest.attr["end_mask"].i = 1
    dims = concat(graph_def, f"{node.name}/neuronish_dims", [rows, rest.name], index)
    replace_with_fill(graph_def, node, dims, tf.as_dtype(node.attr["T"].type), index_type=index)


def _split_shapes(graph_def: graph_pb2.GraphDef) -> None:
    splits = [n for n in graph_def.node if n.op in SPLIT_OPS and n.input]
    for split in splits:
        size = graph_def.node.add(name=f"{split.name}/neuronish_rows", op="Size")
        size.input.append(split.input[0])
        size.attr["T"].type = tf.string.as_datatype_enum
        size.attr["out_type"].type = tf.int64.as_datatype_enum
        rows = vector(graph_def, f"{split.name}/neuronish_rows_1d", size.name, tf.int64)
        longest = const(graph_def, f"{split.name}/neuronish_longest", [-1], tf.int64)
        dense = concat(graph_def, f"{split.name}/neuronish_dense_shape", [rows, longest],
                       tf.int64)
        output_2 = f"{split.name}:2"
        for node in graph_def.node:
            for i, ref in enumerate(node.input):
                if ref == output_2:
                    node.input[i] = dense
