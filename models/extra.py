"""Reference SavedModels that exercise the SavedModel compile, not the compiler.

These are not whole-graph compilable on purpose, so they live apart from
`models.zoo.SPECS` (whose models the compiler tests compile in one piece):

- `tf1_mlp`: a TF1 SavedModel written with `tf.compat.v1.saved_model.Builder`
  from a graph with variables (one resource variable, one classic
  `VariableV2`), a placeholder with a dynamic batch, and a TF1 signature.
- `cnn_cumsum`: a small CNN with an op the device cannot run (`CumulativeLogsumexp`, a
  running log-sum-exp) in the middle, so the compiled model is device -> TensorFlow -> device.

Same conventions as the zoo: fixed seeds, `serving_default` signature,
readable input keys, dynamic batch dimension.
"""

from __future__ import annotations

import os
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models.zoo import SIGNATURE_KEY  # noqa: E402


def build_tf1_mlp(export_dir: str) -> None:
    """x float32 [None, 16] -> relu(x W1 + b1) W2 + b2 -> softmax: `probs` [None, 4]."""
    rng = np.random.default_rng(11)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        w1 = tf.compat.v1.get_variable(
            "w1", initializer=rng.standard_normal((16, 32)).astype(np.float32) * 0.3)
        b1 = tf.compat.v1.get_variable(
            "b1", initializer=rng.standard_normal(32).astype(np.float32) * 0.1)
        # A classic reference variable too: old SavedModels are full of them.
        w2 = tf.compat.v1.get_variable(
            "w2", initializer=rng.standard_normal((32, 4)).astype(np.float32) * 0.3,
            use_resource=False)
        b2 = tf.compat.v1.get_variable(
            "b2", initializer=rng.standard_normal(4).astype(np.float32) * 0.1,
            use_resource=False)
        h = tf.nn.relu(tf.matmul(x, w1) + b1)
        probs = tf.nn.softmax(tf.matmul(h, w2) + b2, name="probs")
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(export_dir)
            signature = tf.compat.v1.saved_model.predict_signature_def(
                inputs={"x": x}, outputs={"probs": probs})
            builder.add_meta_graph_and_variables(
                sess, [tf.saved_model.SERVING], signature_def_map={SIGNATURE_KEY: signature})
            builder.save()


class _Serving(tf.Module):
    def __init__(self, model: keras.Model) -> None:
        super().__init__()
        self.model = model


def build_cnn_cumsum(export_dir: str) -> None:
    """Conv -> relu -> CumulativeLogsumexp over width (not on the device) -> conv -> pool
    -> dense.

    Input x float32 [None, 16, 16, 3]; output `logits` [None, 10].
    """
    keras.utils.set_random_seed(12)
    front = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv_a"),
    ], name="front")
    back = keras.Sequential([
        keras.Input((16, 16, 8)),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv_b"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10, name="logits"),
    ], name="back")
    module = _Serving(keras.Sequential([front, back]))
    module.front, module.back = front, back

    @tf.function(input_signature=[tf.TensorSpec((None, 16, 16, 3), tf.float32, name="x")])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        h = front(x, training=False)
        # A running log-sum-exp: a scan like Cumsum, which the device now runs; this one
        # it does not. Scaled so the values keep a sane range.
        h = tf.math.cumulative_logsumexp(h, axis=2) * 0.25
        return {"logits": back(h, training=False)}

    tf.saved_model.save(module, export_dir, signatures={SIGNATURE_KEY: serve})


BUILDERS: dict[str, Callable[[str], None]] = {
    "tf1_mlp": build_tf1_mlp,
    "cnn_cumsum": build_cnn_cumsum,
}
