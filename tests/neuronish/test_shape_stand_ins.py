"""The shape-inference stand-ins for string splits (neuronish/shape_inference/strings.py)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from neuronish.graph import Graph
from neuronish.shape_inference import strings


@pytest.mark.parametrize("suffix", ["", ":0"])
def test_a_ragged_to_dense_conversion_given_its_row_count_is_sized_by_it(suffix: str) -> None:
    """Either spelling of the constant shape operand ("c" or "c:0") is recognised."""
    split = tf.function(lambda s: tf.strings.split(s).to_tensor(shape=[None, 8]),
                        input_signature=[tf.TensorSpec([None], tf.string)])
    graph_def = split.get_concrete_function().graph.as_graph_def()
    (convert,) = [n for n in graph_def.node if n.op == "RaggedTensorToTensor"]
    convert.input[0] += suffix
    graph = Graph(graph_def)
    strings.stand_in(graph)
    graph.verify()  # every stand-in was added and wired through the index
    ops = {n.name: n.op for n in graph_def.node}
    assert ops[convert.name] == "Fill"
    assert ops[f"{convert.name}/neuronish_rest"] == "StridedSlice"
    # The split's dense shape (output 2) is read as the stand-in's [rows, -1] instead.
    (split_op,) = [n.name for n in graph_def.node if n.op == "StringSplitV2"]
    assert graph.readers(f"{split_op}:2") == ()
    assert graph.readers(f"{split_op}/neuronish_dense_shape:0")
