"""End to end: a TF1 model's classify and regress signatures, compiled, are
served by neuronish-model-server with --enable_signature_method_name_check (the
compiled model's method names were `predict`, so Classify was refused on it while the
original was served), with the same results as the original; and the compiled
model's fingerprint.pb matches its saved_model.pb after the method names were put
back (it hashed the file as tf.saved_model.save wrote it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import fingerprint_pb2
from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting
from tensorflow_serving.apis import classification_pb2, regression_pb2

import neuronish.saved_model
from tests.serving.harness import Server, copy_version, running_server

ROWS = [[0.0, -1.0, 2.0, 0.5], [3.0, 1.0, -2.0, 0.25]]


def _tf1_model(path: str) -> None:
    graph = tf.Graph()
    with graph.as_default():
        serialized = tf.compat.v1.placeholder(tf.string, [None], name="tf_example")
        x = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([4], tf.float32)})["x"]
        w = tf.compat.v1.get_variable("w", initializer=tf.random.stateless_normal(
            [4, 3], seed=[3, 4]))
        scores = tf.nn.softmax(tf.nn.relu(tf.matmul(x, w) + 1.0))
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(path)
            sm = tf.compat.v1.saved_model
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": sm.predict_signature_def({"examples": serialized},
                                                            {"y": scores}),
                "classify": sm.classification_signature_def(serialized, None, scores),
                "regress": sm.regression_signature_def(serialized, tf.reduce_sum(
                    scores * 2.0, 1, keepdims=True))})
            builder.save()


@pytest.fixture(scope="module")
def models(serving_dir: Path) -> tuple[str, str]:
    src, out = serving_dir / "tf1_classify_src", serving_dir / "tf1_classify_compiled"
    _tf1_model(str(src))
    report = neuronish.saved_model.compile(str(src), str(out), model_shape_feed_dict={
        "examples": [2], "inputs": [2]})
    assert report["OnNeuronRatio"] > 0
    return str(src), str(out)


@pytest.fixture(scope="module")
def server(serving_dir: Path, models: tuple[str, str]) -> Iterator[Server]:
    root = serving_dir / "classify_check"
    copy_version(models[0], root / "original", 1)
    copy_version(models[1], root / "compiled", 1)
    config = root / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{n}" base_path: "{root / n}" model_platform: "tensorflow" }}\n'
        for n in ("original", "compiled")) + "}\n")
    with running_server([f"--model_config_file={config}",
                         "--enable_signature_method_name_check"], root,
                        {"original": [1], "compiled": [1]}) as s:
        yield s


def _input(request: classification_pb2.ClassificationRequest) -> None:
    for row in ROWS:
        example = request.input.example_list.examples.add()
        example.features.feature["x"].float_list.value.extend(row)


def test_classify_and_regress_on_the_compiled_model_match_the_original(server: Server
                                                                      ) -> None:
    answers = {}
    for name in ("original", "compiled"):
        request = classification_pb2.ClassificationRequest()
        request.model_spec.name, request.model_spec.signature_name = name, "classify"
        _input(request)
        response = server.predictions.Classify(request, timeout=60)
        scores = [[c.score for c in cl.classes] for cl in response.result.classifications]
        regress = regression_pb2.RegressionRequest()
        regress.model_spec.name, regress.model_spec.signature_name = name, "regress"
        _input(regress)
        values = [r.value for r in server.predictions.Regress(regress, timeout=60)
                  .result.regressions]
        status, rest = server.http("POST", f"/v1/models/{name}:classify", {
            "signature_name": "classify",
            "examples": [{"x": row} for row in ROWS]})
        assert status == 200, rest
        answers[name] = (np.array(scores), np.array(values),
                         np.array([[s for _, s in r] for r in rest["results"]]))
    for got, want in zip(answers["compiled"], answers["original"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert answers["compiled"][0].shape == (2, 3)


def test_the_check_is_on_classify_on_a_predict_signature_is_refused(server: Server
                                                                      ) -> None:
    """The check really runs: Classify on the predict signature is refused, on the
    compiled model as on the original, in the same words."""
    details = {}
    for name in ("original", "compiled"):
        request = classification_pb2.ClassificationRequest()
        request.model_spec.name, request.model_spec.signature_name = name, "serving_default"
        _input(request)
        with pytest.raises(grpc.RpcError) as caught:
            server.predictions.Classify(request, timeout=60)
        details[name] = (caught.value.code(), caught.value.details())
        assert "tensorflow/serving/classify" in caught.value.details(), details
    assert details["original"] == details["compiled"]


def test_the_compiled_fingerprint_matches_its_saved_model(models: tuple[str, str]) -> None:
    for path in models[1:]:  # the TF1 Builder writes no fingerprint.pb
        stored = fingerprint_pb2.FingerprintDef.FromString(
            fingerprinting.ReadSavedModelFingerprint(path))
        fresh = fingerprint_pb2.FingerprintDef.FromString(
            fingerprinting.CreateFingerprintDef(path))
        assert stored.saved_model_checksum == fresh.saved_model_checksum, path
        assert stored.signature_def_hash == fresh.signature_def_hash, path


def test_a_tensorflow_error_reaches_the_client_without_the_python_wrapper(server: Server
                                                                          ) -> None:
    """An example without the feature: TensorFlow's own words and the node, as TF Serving
    reports them; not the eager wrapper's header, stack and traced-function name."""
    for name in ("original", "compiled"):
        request = classification_pb2.ClassificationRequest()
        request.model_spec.name, request.model_spec.signature_name = name, "classify"
        request.input.example_list.examples.add()  # no "x"
        with pytest.raises(grpc.RpcError) as caught:
            server.predictions.Classify(request, timeout=60)
        details = caught.value.details()
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details
        assert "Feature: x (data type: float) is required" in details, details
        for internal in ("Graph execution error", "__inference", "most recent call last",
                         'File "'):
            assert internal not in details, details
