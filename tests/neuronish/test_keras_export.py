"""`neuronish compile model.keras --input-shape ...` exports with those shapes, and a failure
inside Keras while exporting reaches the user as one message naming the layer."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from neuronish.cli import main


@keras.saving.register_keras_serializable(package="neuronish_tests")
class FlattenFixed(keras.layers.Layer):
    """Needs a known length: traced with a free one, `x.shape[1] * 6` is None * 6."""

    def call(self, x: object) -> object:
        return ops.reshape(x, (-1, x.shape[1] * x.shape[2]))  # type: ignore[attr-defined]

    def compute_output_shape(self, s: tuple) -> tuple:
        return (s[0], None if s[1] is None else s[1] * s[2])


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    inp = keras.Input((None, 6), name="tokens")
    out = keras.layers.Activation("tanh")(FlattenFixed()(inp))
    path = tmp_path_factory.mktemp("keras") / "m.keras"
    keras.Model(inp, out).save(path)
    return path


def test_export_failure_names_the_layer_and_what_to_try(
        keras_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", str(keras_file), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "in layer FlattenFixed" in err and "--input-shape" in err
    assert "Traceback" not in err and "\x1b[" not in err
    assert not (tmp_path / "out").exists()


def test_input_shape_is_used_for_the_export(keras_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["compile", str(keras_file), str(out), "--input-shape", "tokens=-1,4,6",
                 "--batch-size", "2"]) == 0
    model = keras.models.load_model(keras_file)
    x = np.random.default_rng(0).normal(size=(3, 4, 6)).astype(np.float32)
    got = tf.saved_model.load(str(out)).signatures["serving_default"](tokens=tf.constant(x))
    np.testing.assert_allclose(next(iter(got.values())).numpy(), model(x).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_input_shape_naming_no_input_is_an_error(
        keras_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", str(keras_file), str(tmp_path / "out"), "--input-shape",
                 "token_ids=-1,4,6"]) == 1
    err = capsys.readouterr().err
    assert "'token_ids'" in err and "tokens" in err
