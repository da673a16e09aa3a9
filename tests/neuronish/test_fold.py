"""Values computed from constants alone are computed once when compiling
(neuronish/rewrites/fold.py): a table built at serving time from ops the compiler does not
take no longer splits the model, and the folded values are TensorFlow's own. Weights read
through Identity, graph inputs with defaults and large results are left as they are."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import neuronish.saved_model
from neuronish.graph import Graph
from neuronish.rewrites import fold
from neuronish.rewrites.fold import fold_constants
from tests.helpers import rewritten_copy
from tests.neuronish.test_unroll import _frozen, _run


def _mel_like_table(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """A filter bank built per call (linspace broadcasts through BroadcastArgs, which
    neuronish-cc does not take), applied to x [b, 5, 4]; plus the weights, read as they are."""
    edges = tf.linspace(tf.constant([0.0, 1.0]), tf.constant([2.0, 5.0]), 4, axis=1)  # [2, 4]
    table = tf.exp(-tf.square(edges[:, :, None] - tf.range(4, dtype=tf.float32)))      # [2,4,4]
    return tf.einsum("bti,ni->btn", x, table[0] + table[1]) + tf.matmul(x, module.w[:4, :4])


def test_a_table_computed_from_constants_is_folded_with_tf_values(tmp_path: Path) -> None:
    frozen = _frozen(tmp_path, _mel_like_table, [None, 5, 4])
    fetches = list(frozen.outputs.values())
    assert "BroadcastArgs" in {n.op for n in frozen.graph_def.node}
    _, folded = rewritten_copy(fold_constants, frozen.graph_def, fetches)
    ops = {n.op for n in folded.node}
    assert not {"BroadcastArgs", "LinSpace", "Exp", "Range"} & ops, ops
    assert any(n.name.endswith("/folded") for n in folded.node)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 5, 4)).astype("float32")
        (want,), (got,) = _run(frozen.graph_def, fetches, x), _run(folded, fetches, x)
        np.testing.assert_array_equal(got, want)  # the same values, computed by TensorFlow


def test_the_model_compiles_whole_once_the_table_is_folded(tmp_path: Path) -> None:
    _frozen(tmp_path, _mel_like_table, [None, 5, 4])
    report = neuronish.saved_model.compile(str(tmp_path / "src"), str(tmp_path / "out"),
                                           batch_size=1)
    assert report["OnNeuronRatio"] == 1.0 and not report["OnTensorFlow"], report["OnTensorFlow"]
    x = tf.constant(np.random.default_rng(0).standard_normal((3, 5, 4)).astype("float32"))
    want = tf.saved_model.load(str(tmp_path / "src")).signatures["serving_default"](x=x)["y"]
    got = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"](x=x)["y"]
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def _weights_default_and_big(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    scale = tf.compat.v1.placeholder_with_default(tf.constant(2.0) * 3.0, [])
    big = tf.ones([600, 600]) * 2.0  # 1.4 MB, read by data: cheaper computed than stored
    spread = tf.matmul(tf.tile(x[:, :1], [1, 600]), big)
    return tf.matmul(x, module.w) * scale + tf.reduce_mean(spread, -1, keepdims=True)


def test_weights_fed_defaults_and_large_values_are_left_as_they_are(tmp_path: Path,
                                                                    ) -> None:
    frozen = _frozen(tmp_path, _weights_default_and_big, [None, 4])
    fetches = list(frozen.outputs.values())
    _, folded = rewritten_copy(fold_constants, frozen.graph_def, fetches)
    by_name = {n.name: n for n in folded.node}
    names = [n.name for n in folded.node if n.name.endswith("/folded")]
    # The scalar product under the default is folded; the default itself stays an input.
    assert any(n.op == "PlaceholderWithDefault" for n in folded.node)
    assert names and all(by_name[n].attr["value"].tensor.ByteSize() <= fold.MAX_BYTES
                         for n in names)
    assert "Fill" in {n.op for n in folded.node}, "the 600x600 broadcast must stay computed"
    weights = [n for n in frozen.graph_def.node if n.op == "Const" and
               n.attr["value"].tensor.tensor_shape.dim and
               [d.size for d in n.attr["value"].tensor.tensor_shape.dim] == [4, 4]]
    assert weights and all(w.name in by_name for w in weights), "weights are not copied"
    x = np.random.default_rng(0).standard_normal((3, 4)).astype("float32")
    np.testing.assert_array_equal(_run(folded, fetches, x)[0], _run(frozen.graph_def, fetches,
                                                                    x)[0])


def test_a_graph_with_a_cycle_is_left_as_it_is() -> None:
    """A TF1 loop (Merge <- NextIteration) is a cycle; the partitioner names it. Folding
    leaves such a graph alone, and must not chase the cycle forever."""
    graph = graph_pb2.GraphDef()
    one = graph.node.add(name="one", op="Const")
    one.attr["dtype"].type = tf.float32.as_datatype_enum
    one.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.float32(1.0)))
    merge = graph.node.add(name="merge", op="Merge")
    merge.input.extend(["one", "next"])
    merge.attr["T"].type = tf.float32.as_datatype_enum
    merge.attr["N"].i = 2
    step = graph.node.add(name="next", op="NextIteration")
    step.input.append("merge")
    step.attr["T"].type = tf.float32.as_datatype_enum
    result: list = []
    thread = threading.Thread(
        target=lambda: result.append(fold_constants(Graph(graph), ["merge:0"])), daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "folding chased the cycle"
    assert result == [False] and [n.name for n in graph.node] == ["one", "merge", "next"]
