"""Keras 2 (tf_keras, `TF_USE_LEGACY_KERAS=1`) and TF1-era models run batch norm as one
`FusedBatchNormV3`, whose outputs besides `y` nothing reads in inference, and one of
which (reserve_space_3) TensorFlow leaves without a shape. Those outputs decide nothing:
the node compiles, and the whole model is one NeuronOp with a dynamic batch (tf_keras'
MobileNetV2 saved with `model.save` was 52 batch norms on TensorFlow, 45 NeuronOps)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

import neuronish.saved_model


class _ConvBatchNorm(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.kernel = tf.Variable(rng.standard_normal((3, 3, 3, 8)).astype("float32"))
        self.stats = [tf.Variable(rng.uniform(0.5, 1.5, 8).astype("float32")) for _ in range(4)]

    @tf.function(input_signature=[tf.TensorSpec([None, 10, 10, 3], tf.float32, name="image")])
    def serve(self, image: tf.Tensor) -> dict[str, tf.Tensor]:
        x = tf.nn.conv2d(image, self.kernel, 1, "SAME")
        scale, offset, mean, variance = self.stats
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, mean, variance,
                                                   epsilon=1e-3, is_training=False)
        return {"y": tf.nn.relu(y)}


def test_inference_fused_batch_norm_compiles_whole(tmp_path: Path) -> None:
    module = _ConvBatchNorm()
    src, out = str(tmp_path / "src"), tmp_path / "out"
    tf.saved_model.save(module, src, signatures={"serving_default": module.serve})
    report = neuronish.saved_model.compile(src, str(out))
    assert report["OnNeuronRatio"] == 1.0, report["OnTensorFlowNodes"]
    (op,) = report["NeuronOps"]
    assert op["dynamic_batch"] and op["op_counts"]["FusedBatchNormV3"] == 1
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(str(out)).signatures["serving_default"]
    for batch in (1, 3):
        x = tf.constant(np.random.default_rng(batch).standard_normal((batch, 10, 10, 3)),
                        tf.float32)
        np.testing.assert_allclose(compiled(image=x)["y"], original(image=x)["y"], rtol=1e-5,
                                   atol=1e-5)


class _Keras2LayerNorm(tf.Module):
    """Keras 2's LayerNormalization: the batch folded into the channels of a
    [1, b * s, d, 1] tensor, normalized by a training-mode FusedBatchNormV3 (NCHW),
    reshaped back; a dense layer on either side."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        rng = np.random.default_rng(1)
        self.scale = scale
        self.w1 = tf.Variable(rng.standard_normal((6, 8)).astype("float32"))
        self.w2 = tf.Variable(rng.standard_normal((8, 4)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 5, 6], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        h = tf.nn.relu(tf.einsum("bsi,ij->bsj", x, self.w1) + 0.5)
        shape = tf.shape(h)
        rows = shape[0] * shape[1]
        folded = tf.reshape(h, [1, rows, 8, 1])
        normed, _, _ = tf.compat.v1.nn.fused_batch_norm(
            folded, tf.fill([rows], self.scale), tf.zeros([rows]), epsilon=1e-3,
            data_format="NCHW")
        return {"y": tf.tanh(tf.einsum("bsj,jk->bsk", tf.reshape(normed, shape), self.w2))}


def _compile_layer_norm(tmp_path: Path, scale: float) -> tuple[dict, str, Path]:
    module = _Keras2LayerNorm(scale)
    src, out = str(tmp_path / "src"), tmp_path / "out"
    tf.saved_model.save(module, src, signatures={"serving_default": module.serve})
    return neuronish.saved_model.compile(src, str(out)), src, out


def _assert_matches(src: str, out: Path) -> None:
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(str(out)).signatures["serving_default"]
    for batch in (1, 3):
        x = tf.constant(np.random.default_rng(batch).standard_normal((batch, 5, 6)), tf.float32)
        np.testing.assert_allclose(compiled(x=x)["y"], original(x=x)["y"], rtol=1e-5, atol=1e-5)


def test_keras2_layer_norm_compiles_whole_as_a_layer_norm(tmp_path: Path) -> None:
    """Rewritten into mean, variance and rsqrt over the last axis of [b, s, d]: one
    NeuronOp with a dynamic batch (the fold, the batch norm and the unfold stayed on
    TensorFlow, splitting the model there)."""
    report, src, out = _compile_layer_norm(tmp_path, 1.0)
    assert report["OnNeuronRatio"] == 1.0, report["OnTensorFlowNodes"]
    (op,) = report["NeuronOps"]
    assert op["dynamic_batch"] and "FusedBatchNormV3" not in op["op_counts"]
    _assert_matches(src, out)


def test_an_unfoldable_batch_fold_keeps_the_rest_dynamic(tmp_path: Path) -> None:
    """With a scale other than 1 the rewrite does not apply: the [1, b * s, d, 1] tensor
    has no batch axis shapes can tell, so what reads it stays on TensorFlow with what
    made it, and the dense layers compile with a dynamic batch (the cluster reading it
    was compiled at batch 1 and refused batch 3)."""
    report, src, out = _compile_layer_norm(tmp_path, 2.0)
    assert report["NeuronOps"] and all(op["dynamic_batch"] for op in report["NeuronOps"]), \
        [op["dynamic_batch_note"] for op in report["NeuronOps"]]
    assert report["OnNeuronRatio"] < 1.0
    _assert_matches(src, out)
