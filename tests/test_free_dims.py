"""Models whose inputs leave more than the batch free (`keras.applications.X(input_shape=
(None, None, 3))`, a text model exported with free sequence lengths): compile names every
such input at once with the argument to pass, ready to fill in; given the shapes, the
model compiles and matches TensorFlow at any batch, and a call of another size is
refused naming the compiled shape."""

from __future__ import annotations

import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish.errors import SavedModelError


def _free_image_model(path: Path) -> str:
    keras.utils.set_random_seed(0)
    x = keras.Input((None, None, 3), name="image")
    y = keras.layers.Conv2D(4, 3, strides=2, activation="relu")(x)
    keras.Model(x, keras.layers.GlobalMaxPooling2D()(y)).export(str(path), verbose=False)
    return str(path)


def test_every_free_input_is_named_with_what_to_pass(tmp_path: Path) -> None:
    module = tf.Module()
    module.table = tf.Variable(tf.random.stateless_normal([10, 4], seed=[0, 1]))
    ids = tf.TensorSpec([None, None], tf.int32, name="token_ids")
    mask = tf.TensorSpec([None, None], tf.int32, name="padding_mask")

    @tf.function(input_signature=[ids, mask])
    def serve(token_ids: tf.Tensor, padding_mask: tf.Tensor) -> dict[str, tf.Tensor]:
        x = tf.gather(module.table, token_ids) * tf.cast(padding_mask, tf.float32)[..., None]
        return {"y": tf.reduce_sum(x, axis=1)}

    src, out = str(tmp_path / "text"), tmp_path / "out"
    tf.saved_model.save(module, src, signatures={"serving_default": serve})
    with pytest.raises(SavedModelError) as e:
        neuronish.saved_model.compile(src, str(out), batch_size=2)
    said = str(e.value)
    assert "'padding_mask' [?, ?], 'token_ids' [?, ?] have dimensions other than the batch" \
        in said, said
    assert "model_shape_feed_dict={'padding_mask': [2, d1], 'token_ids': [2, d1]}" in said
    assert "--input-shape padding_mask=2,d1 --input-shape token_ids=2,d1" in said
    assert not out.exists()

    src = _free_image_model(tmp_path / "image")
    with pytest.raises(SavedModelError, match=re.escape(
            "model_shape_feed_dict={'image': [1, H, W, 3]}")):
        neuronish.saved_model.compile(src, str(out))


def test_given_a_size_it_compiles_and_refuses_others_by_name(tmp_path: Path) -> None:
    src = _free_image_model(tmp_path / "src")
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), model_shape_feed_dict={
        "image": [1, 16, 16, 3]})
    assert report["OnNeuronRatio"] == 1.0
    assert all(op["dynamic_batch"] for op in report["NeuronOps"])
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(str(out)).signatures["serving_default"]
    for batch in (1, 3):
        x = tf.constant(np.random.default_rng(batch).standard_normal((batch, 16, 16, 3)),
                        tf.float32)
        np.testing.assert_allclose(compiled(image=x)["output_0"],
                                   original(image=x)["output_0"], rtol=1e-5, atol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"has shape \[1,20,20,3\]; expected float32\[\*,16,16,3\]"):
        compiled(image=tf.zeros((1, 20, 20, 3)))


def test_the_batch_may_be_given_as_free_in_a_shape(tmp_path: Path) -> None:
    """[None, 16, 16, 3] or [-1, ...] (how TensorFlow writes a free batch) compiles at
    batch_size; a free dimension elsewhere, or a shape that is no list of integers, is
    an error naming the input."""
    src = _free_image_model(tmp_path / "src")
    for i, batch in enumerate((None, -1)):
        report = neuronish.saved_model.compile(src, str(tmp_path / f"out{i}"), batch_size=2,
                                               model_shape_feed_dict={"image": [batch, 16, 16, 3]})
        (op,) = report["NeuronOps"]
        assert list(op["inputs"].values()) == [[[2, 16, 16, 3], "float32"]]
    with pytest.raises(SavedModelError, match=re.escape("'image' [?, ?, ?, 3] has dimensions")):
        neuronish.saved_model.compile(src, str(tmp_path / "a"),
                                      model_shape_feed_dict={"image": [1, None, 16, 3]})
    with pytest.raises(SavedModelError, match=r"model_shape_feed_dict\['image'\] is 'big'"):
        neuronish.saved_model.compile(src, str(tmp_path / "a"),
                                      model_shape_feed_dict={"image": "big"})
    from neuronish.cli import _parse_shapes

    assert _parse_shapes(["image=?,16,16,3", "mask=-1,8"]) == {"image": [-1, 16, 16, 3],
                                                              "mask": [-1, 8]}
