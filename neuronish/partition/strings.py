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

from neuronish.partition.lists import replace_with_fill

SPLIT_OPS = frozenset({"StringSplitV2"})


def stand_in(graph_def: graph_pb2.GraphDef) -> None:
    """Rewrite (in place) string splits' dense shapes and ragged-to-dense conversions
    given their row count, as above."""
    _split_shapes(graph_def)
    consts = {n.name: n for n in graph_def.node if n.op == "Const"}
    for node in list(graph_def.node):
        types = [t.decode() for t in node.attr["row_partition_types"].list.s] \
            if node.op == "RaggedTensorToTensor" else []
        shape = consts.get(node.input[0]) if node.input else None
        # (a shape given as a constant vector: a scalar -1 would be "any rank")
        if types[:1] == ["FIRST_DIM_SIZE"] and len(node.input) > 3 and shape is not None \
                and len(shape.attr["value"].tensor.tensor_shape.dim) == 1:
            _ragged_to_dense(graph_def, node)


def _ragged_to_dense(graph_def: graph_pb2.GraphDef, node: node_def_pb2.NodeDef) -> None:
    """`node`: RaggedTensorToTensor(shape, values, default, first_dim_size, ...)."""
    index = node.attr["Tindex"].type
    rows = graph_def.node.add(name=f"{node.name}/neuronish_rows", op="Reshape")
    one = _const(graph_def, f"{node.name}/neuronish_one", [1], tf.int32)
    rows.input.extend([node.input[3], one])
    rows.attr["T"].type = index
    rows.attr["Tshape"].type = tf.int32.as_datatype_enum
    rest = graph_def.node.add(name=f"{node.name}/neuronish_rest", op="StridedSlice")
    rest.input.extend([node.input[0], _const(graph_def, f"{node.name}/neuronish_begin", [1],
                                             tf.int32),
                       _const(graph_def, f"{node.name}/neuronish_end", [0], tf.int32),
                       _const(graph_def, f"{node.name}/neuronish_stride", [1], tf.int32)])
    rest.attr["T"].type = node.attr["Tshape"].type
    rest.attr["Index"].type = tf.int32.as_datatype_enum
    rest.attr["end_mask"].i = 1
    dims = graph_def.node.add(name=f"{node.name}/neuronish_dims", op="ConcatV2")
    dims.input.extend([rows.name, rest.name, _const(graph_def, f"{node.name}/neuronish_axis",
                                                    0, tf.int32)])
    dims.attr["N"].i = 2
    dims.attr["T"].type = index
    dims.attr["Tidx"].type = tf.int32.as_datatype_enum
    replace_with_fill(graph_def, node, dims.name, tf.as_dtype(node.attr["T"].type),
                      index_type=tf.as_dtype(index))


def _const(graph_def: graph_pb2.GraphDef, name: str, value: object, dtype: tf.DType) -> str:
    node = graph_def.node.add(name=name, op="Const")
    node.attr["dtype"].type = dtype.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype))
    return name


def _split_shapes(graph_def: graph_pb2.GraphDef) -> None:
    splits = [n for n in graph_def.node if n.op in SPLIT_OPS and n.input]
    for split in splits:
        int64 = tf.int64.as_datatype_enum
        size = graph_def.node.add(name=f"{split.name}/neuronish_rows", op="Size")
        size.input.append(split.input[0])
        size.attr["T"].type = tf.string.as_datatype_enum
        size.attr["out_type"].type = int64
        rows = graph_def.node.add(name=f"{split.name}/neuronish_rows_1d", op="Reshape")
        shape_1 = graph_def.node.add(name=f"{split.name}/neuronish_one", op="Const")
        shape_1.attr["dtype"].type = tf.int32.as_datatype_enum
        shape_1.attr["value"].tensor.CopyFrom(tf.make_tensor_proto([1], tf.int32))
        rows.input.extend([size.name, shape_1.name])
        rows.attr["T"].type = int64
        rows.attr["Tshape"].type = tf.int32.as_datatype_enum
        longest = graph_def.node.add(name=f"{split.name}/neuronish_longest", op="Const")
        longest.attr["dtype"].type = int64
        longest.attr["value"].tensor.CopyFrom(tf.make_tensor_proto([-1], tf.int64))
        axis = graph_def.node.add(name=f"{split.name}/neuronish_axis", op="Const")
        axis.attr["dtype"].type = tf.int32.as_datatype_enum
        axis.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(0, tf.int32))
        dense = graph_def.node.add(name=f"{split.name}/neuronish_dense_shape", op="ConcatV2")
        dense.input.extend([rows.name, longest.name, axis.name])
        dense.attr["N"].i = 2
        dense.attr["T"].type = int64
        dense.attr["Tidx"].type = tf.int32.as_datatype_enum
        output_2 = f"{split.name}:2"
        for node in graph_def.node:
            for i, ref in enumerate(node.input):
                if ref == output_2:
                    node.input[i] = dense.name
