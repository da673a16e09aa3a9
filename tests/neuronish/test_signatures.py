"""A SavedModel with several signatures compiles into one that serves them all: Keras'
`model.export` (`serve` and `serving_default`, one function), a `keras.export.ExportArchive`
with two endpoints, a `tf.Module` saved with two signatures and no default. Each signature
of the compiled model gives TensorFlow's numbers; one that cannot be compiled stays on
TensorFlow, one that cannot be frozen is named as dropped."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish.errors import CompileWarning
from tests.neuronish.test_compile_options import two_signature_model


def _cnn() -> keras.Model:
    keras.utils.set_random_seed(0)
    x = keras.Input((12, 12, 3))
    y = keras.layers.Conv2D(8, 3, activation="relu")(x)
    y = keras.layers.GlobalAveragePooling2D(name="features")(y)
    return keras.Model(x, keras.layers.Dense(4)(y))


def _assert_same(compiled: object, original: object, keys: list[str]) -> None:
    for key in keys:
        want_fn, got_fn = original.signatures[key], compiled.signatures[key]
        (name, spec), = want_fn.structured_input_signature[1].items()
        for batch in (1, 3):
            x = np.random.default_rng(batch).standard_normal(
                [batch, *(d or 5 for d in spec.shape[1:])]).astype("float32")
            want, got = want_fn(**{name: tf.constant(x)}), got_fn(**{name: tf.constant(x)})
            assert set(got) == set(want), key
            for out in want:
                np.testing.assert_allclose(got[out], want[out], rtol=1e-5, atol=1e-6,
                                           err_msg=f"{key}/{out} at batch {batch}")


def test_export_archive_endpoints_are_all_compiled(tmp_path: Path) -> None:
    model = _cnn()
    features = keras.Model(model.input, model.get_layer("features").output)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(features)
    spec = [tf.TensorSpec([None, 12, 12, 3], tf.float32)]
    archive.add_endpoint("serve", model.call, input_signature=spec)
    archive.add_endpoint("features", features.call, input_signature=spec)
    archive.write_out(str(tmp_path / "src"), verbose=False)
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(str(tmp_path / "src"), str(out))
    original = tf.saved_model.load(str(tmp_path / "src"))
    compiled = tf.saved_model.load(str(out))
    assert set(compiled.signatures) == set(original.signatures) == {
        "serving_default", "serve", "features"}
    # serving_default is the `serve` endpoint: compiled once, saved under both keys
    assert report["aliases"] == ["serve"] and list(report["signatures"]) == ["features"]
    assert report["signatures"]["features"]["OnNeuronRatio"] == 1.0
    _assert_same(compiled, original, ["serving_default", "serve", "features"])
    # Keras documents calling an export as `reloaded.serve(x)`: the endpoints are there too
    x = tf.constant(np.random.default_rng(0).standard_normal((2, 12, 12, 3)), tf.float32)
    for endpoint in ("serve", "features"):
        np.testing.assert_allclose(getattr(compiled, endpoint)(x),
                                   getattr(original, endpoint)(x), rtol=1e-5, atol=1e-6)


def test_keras_serve_keeps_its_output_structure(tmp_path: Path) -> None:
    """A model with two outputs: `serve(x)` returns a list, the signatures a dict of
    output_0, output_1."""
    keras.utils.set_random_seed(0)
    x = keras.Input((6,), name="numbers")
    hidden = keras.layers.Dense(5, activation="relu")(x)
    model = keras.Model(x, [keras.layers.Dense(2)(hidden), keras.layers.Dense(3)(hidden)])
    src, out = str(tmp_path / "src"), tmp_path / "out"
    model.export(src, verbose=False)
    neuronish.saved_model.compile(src, str(out))
    original, compiled = tf.saved_model.load(src), tf.saved_model.load(str(out))
    numbers = tf.constant(np.random.default_rng(1).standard_normal((3, 6)), tf.float32)
    want, got = original.serve(numbers), compiled.serve(numbers)
    assert isinstance(got, list) and len(got) == len(want) == 2
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    _assert_same(compiled, original, ["serving_default", "serve"])


def test_a_module_with_two_signatures_and_no_default(tmp_path: Path) -> None:
    src = two_signature_model(tmp_path / "src")
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out))
    assert report["signature_def_key"] == "double" and report["OnNeuronRatio"] == 1.0
    assert report["signatures"]["square"]["OnNeuronRatio"] == 1.0
    compiled = tf.saved_model.load(str(out))
    assert set(compiled.signatures) == {"double", "square"}
    _assert_same(compiled, tf.saved_model.load(src), ["double", "square"])


def test_a_signature_that_cannot_be_compiled_stays_on_tensorflow(tmp_path: Path) -> None:
    """The second signature cannot take the shape given for `x` (rank 2 for its rank-3
    input), the third writes a variable (nothing to freeze): the first is compiled, the
    second kept on TensorFlow, the third named as dropped; each with a warning saying so."""
    module = tf.Module()
    module.w = tf.Variable(tf.random.stateless_normal([3, 4], seed=[1, 2]))
    module.count = tf.Variable(0.0)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def logits(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.nn.relu(tf.matmul(x, module.w)) * 2.0}

    @tf.function(input_signature=[tf.TensorSpec([None, None, 3], tf.float32, name="x")])
    def pooled(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.matmul(tf.reduce_mean(x, axis=1), module.w)}

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def counted(x: tf.Tensor) -> dict[str, tf.Tensor]:
        module.count.assign_add(1.0)
        return {"y": x + module.count}

    src, out = str(tmp_path / "src"), tmp_path / "out"
    tf.saved_model.save(module, src, signatures={"serving_default": logits, "pooled": pooled,
                                                 "counted": counted})
    with pytest.warns(CompileWarning) as warned:
        report = neuronish.saved_model.compile(src, str(out),
                                               model_shape_feed_dict={"x": [1, 3]})
    said = " ".join(str(w.message) for w in warned)
    assert "'pooled'" in said and "stays on TensorFlow" in said and \
        "the signature declares [?, ?, 3]" in said
    assert "'counted'" in said and "not in the compiled model" in said
    assert report["OnNeuronRatio"] == 1.0
    assert report["signatures"]["pooled"]["OnNeuronRatio"] == 0.0
    assert "the signature declares" in report["signatures"]["pooled"]["error"]
    assert "AssignAddVariableOp" in report["signatures_dropped"]["counted"]
    text = neuronish.saved_model.format_report(report)
    assert "signature 'pooled': stays on TensorFlow" in text
    assert "signature 'counted' is not in the compiled model" in text
    compiled = tf.saved_model.load(str(out))
    assert set(compiled.signatures) == {"serving_default", "pooled"}
    _assert_same(compiled, tf.saved_model.load(src), ["serving_default", "pooled"])


def test_an_explicit_signature_key_compiles_that_one_only(tmp_path: Path) -> None:
    """With the keys serving the same function: `serve` is Keras' `serving_default`."""
    src = str(tmp_path / "src")
    _cnn().export(src, verbose=False)
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), signature_def_key="serving_default")
    assert report["signatures"] == {} and report["aliases"] == ["serve"]
    compiled = tf.saved_model.load(str(out))
    assert set(compiled.signatures) == {"serving_default", "serve"}
    x, original = tf.zeros((2, 12, 12, 3)), tf.saved_model.load(src)
    np.testing.assert_allclose(compiled.serve(x), original.serve(x), atol=1e-6)

    src = two_signature_model(tmp_path / "two")
    report = neuronish.saved_model.compile(src, str(tmp_path / "square"),
                                           signature_def_key="square")
    assert report["signatures"] == {} and report["aliases"] == []
    assert set(tf.saved_model.load(str(tmp_path / "square")).signatures) == {"square"}


def test_tf1_signatures_of_one_graph_are_told_apart(tmp_path: Path) -> None:
    """TF1 signatures prune one graph: same inputs and output keys, other tensors."""
    src = str(tmp_path / "src")
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", initializer=tf.random.stateless_normal(
            [4, 3], seed=[3, 4]))
        h = tf.matmul(x, w)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(src)
            sig = tf.compat.v1.saved_model.predict_signature_def
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": sig({"x": x}, {"y": tf.nn.relu(h)}),
                "tanh": sig({"x": x}, {"y": tf.tanh(h)})})
            builder.save()
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out))
    assert report["aliases"] == [] and list(report["signatures"]) == ["tanh"]
    compiled = tf.saved_model.load(str(out))
    _assert_same(compiled, tf.saved_model.load(src), ["serving_default", "tanh"])


def test_tf1_classify_and_regress_signatures_keep_their_method_name(tmp_path: Path) -> None:
    """tf.saved_model.save writes every signature as a predict one; TF Serving's
    --enable_signature_method_name_check would then refuse Classify/Regress on the
    compiled model while it serves the original."""
    from tensorflow.core.protobuf import saved_model_pb2

    src = str(tmp_path / "src")
    graph = tf.Graph()
    with graph.as_default():
        serialized = tf.compat.v1.placeholder(tf.string, [None], name="tf_example")
        x = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([4], tf.float32)})["x"]
        w = tf.compat.v1.get_variable("w", initializer=tf.random.stateless_normal(
            [4, 3], seed=[3, 4]))
        scores = tf.nn.softmax(tf.nn.relu(tf.matmul(x, w) + 1.0))
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(src)
            sm = tf.compat.v1.saved_model
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": sm.predict_signature_def({"examples": serialized},
                                                            {"y": scores}),
                "classify": sm.classification_signature_def(serialized, None, scores),
                "regress": sm.regression_signature_def(serialized, tf.reduce_sum(
                    scores * 2.0, 1, keepdims=True))})
            builder.save()
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), model_shape_feed_dict={
        "examples": [2], "inputs": [2]})
    assert report["OnNeuronRatio"] > 0
    examples = tf.constant([tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, -1.0, 2.0, 0.5]))}))
        .SerializeToString() for i in (0.0, 3.0)])
    compiled, original = tf.saved_model.load(str(out)), tf.saved_model.load(src)
    for key, arg, output in (("serving_default", "examples", "y"), ("classify", "inputs",
                                                                     "scores"),
                             ("regress", "inputs", "outputs")):
        np.testing.assert_allclose(compiled.signatures[key](**{arg: examples})[output],
                                   original.signatures[key](**{arg: examples})[output],
                                   rtol=1e-5, atol=1e-6)

    def methods(path: str) -> dict[str, str]:
        sm = saved_model_pb2.SavedModel()
        sm.ParseFromString((Path(path) / "saved_model.pb").read_bytes())
        return {k: v.method_name for k, v in sm.meta_graphs[0].signature_def.items()
                if not k.startswith("__")}

    assert methods(str(out)) == methods(src) == {
        "serving_default": "tensorflow/serving/predict",
        "classify": "tensorflow/serving/classify", "regress": "tensorflow/serving/regress"}
