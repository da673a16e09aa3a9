"""Nodes that stand in for others, for TensorFlow's shape inference only.

`lists.py`, `tables.py` and `strings.py` give shape inference shapes it cannot work out
itself, in the copy of the graph used for shape inference (never in the graph that is
compiled or run): a node is replaced by one computing a tensor of the right shape,
whose value is never used. These are the nodes they build that from, added to that
copy's `Graph` so that its index sees them.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

from neuronish.graph import Graph


def const(graph: Graph, name: str, value: object, dtype: tf.DType) -> str:
    """A Const node `name` holding `value`; returns its name."""
    node = graph.add_node(name, "Const")
    node.attr["dtype"].type = dtype.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype))
    return name


def vector(graph: Graph, name: str, scalar: str, dtype: tf.DType) -> str:
    """The scalar `scalar` (of `dtype`) as a vector of one element; returns its name."""
    node = graph.add_node(name, "Reshape")
    node.attr["T"].type = dtype.as_datatype_enum
    node.attr["Tshape"].type = tf.int32.as_datatype_enum
    graph.set_inputs(name, [scalar, const(graph, f"{name}/shape", [1], tf.int32)])
    return name


def concat(graph: Graph, name: str, parts: Sequence[str], dtype: tf.DType) -> str:
    """ConcatV2 of the vectors `parts` (of `dtype`) on axis 0; returns its name."""
    node = graph.add_node(name, "ConcatV2")
    node.attr["N"].i = len(parts)
    node.attr["T"].type = dtype.as_datatype_enum
    node.attr["Tidx"].type = tf.int32.as_datatype_enum
    graph.set_inputs(name, [*parts, const(graph, f"{name}/axis", 0, tf.int32)])
    return name


def replace_with_fill(graph: Graph, node: node_def_pb2.NodeDef, dims: str, dtype: tf.DType,
                      index_type: tf.DType = tf.int32) -> None:
    """Turn `node` (in place, keeping its name and place) into `Fill(dims, zero of
    dtype)`: a node of the shape `dims` holds, for shape inference to see."""
    value = b"" if dtype == tf.string else False if dtype == tf.bool else 0
    zero = const(graph, f"{node.name}/neuronish_zero", value, dtype)
    name = node.name
    node.Clear()
    node.name, node.op = name, "Fill"
    node.attr["T"].type = dtype.as_datatype_enum
    node.attr["index_type"].type = index_type.as_datatype_enum
    graph.set_inputs(name, [dims, zero])
