"""neuronish.trace: a Keras model, a tf.function or a concrete function compiled from
Python; the result runs with NeuronOps, matches TensorFlow, reports OnNeuronRatio and is
saved with tf.saved_model.save."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import neuronish
from neuronish.tracing import TraceError


def _neuron_ops(traced: neuronish.tracing.TracedModel) -> int:
    graph = traced.serve.get_concrete_function().graph.as_graph_def()
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return sum(n.op == "NeuronOp" for n in nodes)


def _rows(n: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


def test_keras_model_traces_runs_and_saves(tmp_path: Path) -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4)])
    traced = neuronish.trace(model, _rows(2, 8))
    assert traced.report["OnNeuronRatio"] == 1.0 and len(traced.report["NeuronOps"]) == 1
    assert _neuron_ops(traced) >= 1
    for n in (2, 5):  # the compiled batch, and one split into compiled-size chunks
        x = _rows(n, 8, seed=n)
        np.testing.assert_allclose(traced(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
    tf.saved_model.save(traced, str(tmp_path / "saved"))
    x = _rows(3, 8, seed=7)
    np.save(tmp_path / "x.npy", x)
    script = ("import sys, json, numpy as np, neuronish, tensorflow as tf\n"
              "from neuronish.runtime import get_device\n"
              "m = tf.saved_model.load(sys.argv[1])\n"
              "y = m.signatures['serving_default'](input_0=tf.constant(np.load(sys.argv[2])))\n"
              "print(json.dumps({'y': y['output_0'].numpy().tolist(),"
              " 'device': sum(c['used'] for c in get_device().memory_report().values())}))")
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "saved"),
                        str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["device"] > 0, "the saved traced model never reached the device"
    np.testing.assert_allclose(np.array(got["y"], np.float32), model(x).numpy(), rtol=1e-5,
                               atol=1e-5)


def test_tf_function_with_two_inputs_and_structured_outputs() -> None:
    w = tf.Variable(np.linspace(-1, 1, 8 * 6).reshape(8, 6).astype(np.float32))

    @tf.function
    def fn(a: tf.Tensor, b: tf.Tensor) -> dict:
        h = tf.nn.relu(tf.matmul(a, w) + b)
        return {"h": h, "pair": (tf.tanh(h), h * 2.0)}

    a, b = _rows(4, 8), _rows(4, 6, seed=1)
    traced = neuronish.trace(fn, (a, b))
    assert traced.report["OnNeuronRatio"] > 0
    got, want = traced(a, b), fn(a, b)
    assert set(got) == {"h", "pair"} and isinstance(got["pair"], tuple)
    for g, w_ in zip(tf.nest.flatten(got), tf.nest.flatten(want), strict=True):
        np.testing.assert_allclose(g.numpy(), w_.numpy(), rtol=1e-5, atol=1e-5)
    # A concrete function works the same.
    concrete = fn.get_concrete_function(tf.TensorSpec([None, 8]), tf.TensorSpec([None, 6]))
    traced2 = neuronish.trace(concrete, [a, b])
    np.testing.assert_allclose(traced2(a, b)["h"].numpy(), want["h"].numpy(), rtol=1e-5,
                               atol=1e-5)


def test_keras_model_of_two_inputs_with_strings_and_a_lookup_table(tmp_path: Path) -> None:
    """A functional model of two inputs (called as model([a, b])), one of them strings
    through a StringLookup: its table is kept by the traced model, which saves whole."""
    keras.utils.set_random_seed(1)
    words = keras.Input((), dtype="string")
    numbers = keras.Input((3,))
    lookup = keras.layers.StringLookup(vocabulary=["cat", "dog"])
    joined = keras.layers.Concatenate()([keras.layers.Embedding(3, 4)(lookup(words)), numbers])
    model = keras.Model([words, numbers], keras.layers.Dense(2)(joined))
    traced = neuronish.trace(model, [np.array([b"cat", b"emu"], dtype=object), _rows(2, 3)])
    assert traced.report["OnNeuronRatio"] > 0.5 and _neuron_ops(traced) >= 1
    x = [tf.constant(["dog", "cat", "yak"]), tf.constant(_rows(3, 3, seed=2))]
    np.testing.assert_allclose(traced(*x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
    tf.saved_model.save(traced, str(tmp_path / "saved"))
    reloaded = tf.saved_model.load(str(tmp_path / "saved")).signatures["serving_default"]
    got = reloaded(input_0=x[0], input_1=x[1])["output_0"]
    np.testing.assert_allclose(got.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_clear() -> None:
    with pytest.raises(TraceError, match="tf.function, a concrete function, a Keras model"):
        neuronish.trace(42, _rows(1, 8))
    with pytest.raises(TraceError, match="example_inputs is empty"):
        neuronish.trace(tf.function(lambda: tf.constant(1.0)), ())
    with pytest.raises(TraceError, match="failed"):
        neuronish.trace(tf.function(lambda x: tf.matmul(x, tf.ones((3, 3)))), _rows(2, 8))


def test_dict_inputs_keep_their_names_and_the_result_saves_like_tfnx(tmp_path: Path) -> None:
    """tensorflow-neuronx's `trace` result: `.save(path)`, `.on_neuron_ratio`; a dict of
    examples names the saved signature's inputs, a dict of outputs its outputs; another
    sequence length is refused naming the traced shape."""
    table = tf.Variable(np.linspace(-1, 1, 20 * 4).reshape(20, 4).astype(np.float32))

    @tf.function
    def encode(features: dict) -> dict:
        h = tf.nn.embedding_lookup(table, features["token_ids"])
        h = h * tf.cast(features["mask"], tf.float32)[..., None]
        return {"pooled": tf.reduce_sum(h, axis=1), "tokens": tf.nn.relu(h)}

    examples = {"token_ids": np.array([[1, 2, 3, 4, 5, 6]] * 2, np.int32),
                "mask": np.ones((2, 6), np.int32)}
    traced = neuronish.trace(encode, examples)
    assert traced.on_neuron_ratio == traced.report["OnNeuronRatio"] > 0
    got = traced(examples)
    assert set(got) == {"pooled", "tokens"}
    np.testing.assert_allclose(got["pooled"].numpy(), encode(examples)["pooled"].numpy(),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(TraceError, match=r"input 'token_ids' has shape \[2, 9\]; it was traced "
                                         r"and compiled at \['batch', 6\]"):
        traced({"token_ids": np.zeros((2, 9), np.int32), "mask": np.ones((2, 6), np.int32)})
    traced.save(str(tmp_path / "saved"))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    fn = loaded.signatures["serving_default"]
    assert sorted(fn.structured_input_signature[1]) == ["mask", "token_ids"]
    assert sorted(fn.structured_outputs) == ["pooled", "tokens"]
    again = fn(token_ids=tf.constant(examples["token_ids"]), mask=tf.constant(examples["mask"]))
    np.testing.assert_allclose(again["tokens"].numpy(), got["tokens"].numpy(), rtol=1e-6)
