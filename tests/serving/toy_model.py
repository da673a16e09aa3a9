"""A small SavedModel with the signature kinds the server must handle beyond
the zoo's single float input: several named inputs, strings in and `_bytes`
strings out, and tf.Example classification and regression.

    serving_default  a: float32 [-1, 2], b: int64 [-1]  ->  sum: float32 [-1],
                                                             scaled: float32 [-1, 2]
    text             text: string [-1]                   ->  length: int32 [-1],
                                                             echo_bytes: string [-1]
    classify         inputs: serialized tf.Example [-1]  ->  scores: float32 [-1, 3],
                                                             classes: string [-1, 3]
    regress          inputs: serialized tf.Example [-1]  ->  outputs: float32 [-1]

Examples carry one feature, `x`: 2 floats. Scores are softmax([x0, x1, x0 + x1]),
classes are "a", "b", "c"; regression is 2 * x0 + x1.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

CLASSES = (b"a", b"b", b"c")


def _parse(serialized: tf.Tensor) -> tf.Tensor:
    features = tf.io.parse_example(
        serialized, {"x": tf.io.FixedLenFeature([2], tf.float32)})
    return features["x"]


class _Toy(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable([2.0, -1.0])

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="a"),
                                  tf.TensorSpec([None], tf.int64, name="b")])
    def predict(self, a: tf.Tensor, b: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"sum": tf.reduce_sum(a, axis=1) + tf.cast(b, tf.float32),
                "scaled": a * self.w}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def text(self, text: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"length": tf.strings.length(text), "echo_bytes": text}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def classify(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        x = _parse(inputs)
        logits = tf.stack([x[:, 0], x[:, 1], x[:, 0] + x[:, 1]], axis=1)
        classes = tf.tile(tf.constant([list(CLASSES)]), [tf.shape(x)[0], 1])
        return {"scores": tf.nn.softmax(logits), "classes": classes}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        x = _parse(inputs)
        return {"outputs": 2.0 * x[:, 0] + x[:, 1]}


def build(export_dir: str) -> None:
    module = _Toy()
    tf.saved_model.save(module, export_dir, signatures={
        "serving_default": module.predict, "text": module.text,
        "classify": module.classify, "regress": module.regress})


def example(x0: float, x1: float) -> tf.train.Example:
    return tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[x0, x1]))}))


def expected_scores(x: np.ndarray) -> np.ndarray:
    logits = np.stack([x[:, 0], x[:, 1], x[:, 0] + x[:, 1]], axis=1).astype(np.float32)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
