"""A Keras model with a `Resizing` layer in front (how users feed a keras.applications
model images of another size) serves its BatchNormalization layers in training mode:
Keras resolves the model's `training` from Resizing's default (True), so at serving the
layers normalize by the batch's statistics and write their moving averages, which
nothing in the signature reads. Such writes are left out of the frozen graph (named in
the report and a warning), the batch reductions stay on TensorFlow, all of them found in
one pass however many layers there are, and the compiled model gives TensorFlow's
numbers at every batch size."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish.errors import CompileWarning

LAYERS = 6  # two batch reductions each: more than the partitioner's rounds of old


def _resized_cnn(path: Path) -> str:
    keras.utils.set_random_seed(0)
    image = keras.Input((12, 12, 3), name="image")
    x = keras.layers.Resizing(8, 8)(image)
    for _ in range(LAYERS):
        x = keras.layers.Conv2D(4, 3, padding="same")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    keras.Model(image, keras.layers.Dense(3)(x)).export(str(path), verbose=False)
    return str(path)


def test_batch_norm_on_batch_statistics_compiles_and_matches_at_any_batch(
        tmp_path: Path) -> None:
    src, out = _resized_cnn(tmp_path / "src"), tmp_path / "out"
    with pytest.warns(CompileWarning, match="writes variables no output reads"):
        report = neuronish.saved_model.compile(src, str(out), batch_size=1)
    writes = report["dropped_variable_writes"]["serving_default"]
    assert len(writes) == 2 * LAYERS and all("AssignVariableOp" in w for w in writes)
    assert report["NeuronOps"] and all(op["dynamic_batch"] for op in report["NeuronOps"]), \
        [op["dynamic_batch_note"] for op in report["NeuronOps"]]
    assert report["OnTensorFlow"]["Mean"]["count"] == 2 * LAYERS, report["OnTensorFlow"]
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(str(out)).signatures["serving_default"]
    for batch in (1, 3, 4):
        x = tf.constant(np.random.default_rng(batch).standard_normal((batch, 12, 12, 3)),
                        tf.float32)
        want, got = original(image=x)["output_0"], compiled(image=x)["output_0"]
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert err <= 1e-4, f"batch {batch}: relative error {err:.1e}"


def test_a_cluster_still_mixing_after_every_round_stays_on_tensorflow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given one round only, the clusters holding batch reductions cannot be made dynamic:
    they stay on TensorFlow, so every batch size still works (they were compiled at the
    compile batch and refused any other)."""
    import neuronish.partition

    monkeypatch.setattr(neuronish.partition, "_MAX_MIXING_ROUNDS", 1)
    src, out = _resized_cnn(tmp_path / "src"), tmp_path / "out"
    with pytest.warns(CompileWarning):
        report = neuronish.saved_model.compile(src, str(out), batch_size=1)
    assert all(op["dynamic_batch"] for op in report["NeuronOps"]), \
        [op["dynamic_batch_note"] for op in report["NeuronOps"]]
    assert any("could not be made dynamic in 1 round(s)" in why
               for why in report["OnTensorFlowNodes"].values()), report["OnTensorFlowNodes"]
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(str(out)).signatures["serving_default"]
    x = tf.constant(np.random.default_rng(3).standard_normal((3, 12, 12, 3)), tf.float32)
    want, got = original(image=x)["output_0"], compiled(image=x)["output_0"]
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) <= 1e-4
