"""fold_pad_into_window: explicit zero padding becomes a conv's (or max pool's) pads."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from neuronish.runtime.executable import from_bytes
from tests.graphs import trace

RNG = np.random.default_rng(11)
W = tf.constant(RNG.standard_normal((3, 3, 4, 8)).astype(np.float32))
PAD = [[0, 0], [1, 2], [0, 1], [0, 0]]


def _case(name: str):  # noqa: ANN202
    def conv(x):  # noqa: ANN001, ANN202
        return tf.nn.conv2d(tf.pad(x, PAD), W, 2, "VALID")

    def depthwise(x):  # noqa: ANN001, ANN202
        return tf.nn.depthwise_conv2d(tf.pad(x, PAD), tf.transpose(W[..., :1], [0, 1, 2, 3]),
                                      [1, 2, 2, 1], "VALID")

    def max_after_relu(x):  # noqa: ANN001, ANN202
        y = tf.nn.relu(tf.nn.conv2d(x, W, 1, "SAME"))
        return tf.nn.max_pool2d(tf.pad(y, [[0, 0], [1, 1], [1, 1], [0, 0]]), 3, 2, "VALID")

    def max_of_signed(x):  # noqa: ANN001, ANN202
        y = tf.nn.conv2d(x, W, 1, "SAME")  # negative values: a zero pad can win the max
        return tf.nn.max_pool2d(tf.pad(y, [[0, 0], [1, 1], [1, 1], [0, 0]]), 3, 2, "VALID")

    def avg(x):  # noqa: ANN001, ANN202
        return tf.nn.avg_pool2d(tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]]), 3, 2, "VALID")

    fn = {"conv": conv, "depthwise": depthwise, "max_after_relu": max_after_relu,
          "max_of_signed": max_of_signed, "avg": avg}[name]
    return trace(fn, tf.TensorSpec([None, 9, 10, 4], tf.float32, name="x"), batch=2)


@pytest.mark.parametrize("name,folded", [("conv", True), ("depthwise", True),
                                         ("max_after_relu", True), ("max_of_signed", False),
                                         ("avg", False)])
def test_zero_pad_folds_only_where_it_means_the_same(name: str, folded: bool) -> None:
    g = _case(name)
    exe = compile_graph(g.graph_def, g.io_config)
    kinds = [i.kind for p in from_bytes(exe).programs for i in p]
    assert ("pad" not in kinds) == folded, kinds
    x = RNG.standard_normal((2, 9, 10, 4)).astype(np.float32)
    with load(exe) as model:
        got = model.run({"x:0": x})
    for key, want in g.reference({"x:0": x}).items():
        np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-5)
