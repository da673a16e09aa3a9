"""The server answers like TF Serving, over gRPC (official stubs) and REST, and
its predictions are the model's own."""

from __future__ import annotations

import base64
import re

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    regression_pb2,
)

from tests.serving import toy_model
from tests.serving.harness import metric_value, predict_request

RNG = np.random.default_rng(0)


def _x(rows: int) -> np.ndarray:
    return RNG.standard_normal((rows, 32)).astype(np.float32)


def test_grpc_predict_equals_in_process(main_server, mlp_reference) -> None:
    x = _x(5)
    response = main_server.predictions.Predict(predict_request("mlp", {"x": x}), timeout=30)
    want = mlp_reference(x=tf.constant(x))["probs"].numpy()
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["probs"]), want)
    # TF Serving fills the typed field, which clients read directly.
    assert len(response.outputs["probs"].float_val) == want.size
    assert response.model_spec.name == "mlp"
    assert response.model_spec.version.value == 2  # policy `all`: latest is 2
    assert response.model_spec.signature_name == "serving_default"


def test_grpc_versions_and_labels(main_server) -> None:
    x = _x(1)
    for kwargs, version in (({"version": 1}, 1), ({"label": "stable"}, 1),
                            ({"label": "canary"}, 2)):
        response = main_server.predictions.Predict(predict_request("mlp", {"x": x}, **kwargs),
                                                   timeout=30)
        assert response.model_spec.version.value == version


def test_rest_row_and_columnar_equal_in_process(main_server, mlp_reference) -> None:
    x = _x(3)
    want = mlp_reference(x=tf.constant(x))["probs"].numpy()
    status, body = main_server.http("POST", "/v1/models/mlp:predict", {"instances": x.tolist()})
    assert status == 200, body
    np.testing.assert_array_equal(np.array(body["predictions"], np.float32), want)
    for payload in ({"inputs": x.tolist()}, {"inputs": {"x": x.tolist()}},
                    {"signature_name": "serving_default", "inputs": x.tolist()}):
        status, body = main_server.http("POST", "/v1/models/mlp/versions/1:predict", payload)
        assert status == 200, body
        np.testing.assert_array_equal(np.array(body["outputs"], np.float32), want)
    status, body = main_server.http("POST", "/v1/models/mlp/labels/canary:predict",
                                    {"instances": [{"x": row} for row in x.tolist()]})
    assert status == 200, body
    np.testing.assert_array_equal(np.array(body["predictions"], np.float32), want)


def test_rest_several_inputs_and_outputs(main_server) -> None:
    a = np.array([[1.5, 2.0], [3.0, -1.0]], np.float32)
    b = np.array([10, 20], np.int64)
    status, body = main_server.http("POST", "/v1/models/toy:predict", {
        "instances": [{"a": a[i].tolist(), "b": int(b[i])} for i in range(2)]})
    assert status == 200, body
    assert body == {"predictions": [{"scaled": [3.0, -2.0], "sum": 13.5},
                                    {"scaled": [6.0, 1.0], "sum": 22.0}]}
    status, body = main_server.http("POST", "/v1/models/toy:predict",
                                    {"inputs": {"a": a.tolist(), "b": b.tolist()}})
    assert status == 200, body
    assert body == {"outputs": {"scaled": [[3.0, -2.0], [6.0, 1.0]], "sum": [13.5, 22.0]}}


def test_b64_in_and_bytes_out(main_server) -> None:
    raw = "héllo".encode()
    status, body = main_server.http("POST", "/v1/models/toy:predict", {
        "signature_name": "text",
        "instances": [{"b64": base64.b64encode(raw).decode()}, "plain"]})
    assert status == 200, body
    # Outputs whose key ends in _bytes come back base64-encoded.
    assert body["predictions"] == [
        {"echo_bytes": {"b64": base64.b64encode(raw).decode()}, "length": len(raw)},
        {"echo_bytes": {"b64": base64.b64encode(b"plain").decode()}, "length": 5}]
    response = main_server.predictions.Predict(predict_request(
        "toy", {"text": np.array([raw], dtype=object)}, signature="text"), timeout=30)
    assert list(response.outputs["echo_bytes"].string_val) == [raw]
    assert list(response.outputs["length"].int_val) == [len(raw)]


def test_output_filter(main_server) -> None:
    request = predict_request("toy", {"a": np.ones((1, 2), np.float32),
                                      "b": np.ones(1, np.int64)}, output_filter=["sum"])
    response = main_server.predictions.Predict(request, timeout=30)
    assert list(response.outputs) == ["sum"]


def test_metadata(main_server) -> None:
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "toy"
    response = main_server.predictions.GetModelMetadata(request, timeout=30)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_map)
    assert {"serving_default", "text", "classify", "regress"} <= set(
        signature_map.signature_def)
    sd = signature_map.signature_def["serving_default"]
    assert sorted(sd.inputs) == ["a", "b"] and sorted(sd.outputs) == ["scaled", "sum"]
    assert response.model_spec.version.value == 1

    status, body = main_server.http("GET", "/v1/models/mlp/versions/1/metadata")
    assert status == 200, body
    assert body["model_spec"] == {"name": "mlp", "version": "1", "signature_name": ""}
    x = body["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]["x"]
    assert x["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in x["tensor_shape"]["dim"]] == ["-1", "32"]


def test_status(main_server) -> None:
    response = main_server.status("mlp")
    got = [(s.version, s.state, s.status.error_code) for s in response.model_version_status]
    available = get_model_status_pb2.ModelVersionStatus.State.AVAILABLE
    assert got == [(2, available, 0), (1, available, 0)]
    status, body = main_server.http("GET", "/v1/models/mlp")
    assert status == 200
    assert body == {"model_version_status": [
        {"version": str(v), "state": "AVAILABLE", "status": {"error_code": "OK",
                                                            "error_message": ""}}
        for v in (2, 1)]}
    status, body = main_server.http("GET", "/v1/models/mlp/labels/stable")
    assert status == 200 and [s["version"] for s in body["model_version_status"]] == ["1"]
    status, body = main_server.http("GET", "/v1/models/toy/versions/1")
    assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"


def test_classify_and_regress(main_server) -> None:
    xs = np.array([[1.0, 2.0], [0.5, -1.0]], np.float32)
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "toy"
    request.model_spec.signature_name = "classify"
    for x0, x1 in xs:
        request.input.example_list.examples.add().CopyFrom(toy_model.example(x0, x1))
    response = main_server.predictions.Classify(request, timeout=30)
    assert (response.model_spec.name, response.model_spec.version.value,
            response.model_spec.signature_name) == ("toy", 1, "classify")
    want = toy_model.expected_scores(xs)
    for i, classifications in enumerate(response.result.classifications):
        assert [c.label for c in classifications.classes] == ["a", "b", "c"]
        np.testing.assert_allclose([c.score for c in classifications.classes], want[i],
                                   rtol=1e-6)

    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name = "toy"
    regress.model_spec.signature_name = "regress"
    # A context feature is merged into every example (here: overridden by them).
    regress.input.example_list_with_context.context.CopyFrom(toy_model.example(9, 9))
    for x0, x1 in xs:
        regress.input.example_list_with_context.examples.add().CopyFrom(
            toy_model.example(x0, x1))
    response = main_server.predictions.Regress(regress, timeout=30)
    assert response.model_spec.signature_name == "regress"
    np.testing.assert_allclose([r.value for r in response.result.regressions],
                               2 * xs[:, 0] + xs[:, 1], rtol=1e-6)

    status, body = main_server.http("POST", "/v1/models/toy:classify", {
        "signature_name": "classify", "examples": [{"x": [1.0, 2.0]}, {"x": [0.5, -1.0]}]})
    assert status == 200, body
    assert [[label for label, _ in row] for row in body["results"]] == [["a", "b", "c"]] * 2
    np.testing.assert_allclose([[s for _, s in row] for row in body["results"]], want,
                               rtol=1e-6)
    status, body = main_server.http("POST", "/v1/models/toy:regress", {
        "signature_name": "regress", "examples": [{"x": [1.0, 2.0]}, {"x": [0.5, -1.0]}]})
    assert status == 200, body
    np.testing.assert_allclose(body["results"], [4.0, 0.0], rtol=1e-6)


def test_prometheus_metrics(main_server) -> None:
    main_server.http("POST", "/v1/models/mlp:predict", {"instances": _x(1).tolist()})
    main_server.http("POST", "/v1/models/nope:predict", {"instances": [[1.0]]})
    status, text = main_server.http("GET", "/monitoring/prometheus/metrics")
    assert status == 200 and isinstance(text, str)
    assert "# TYPE :tensorflow:serving:request_count counter" in text
    # TF Serving's labels, exactly: request_count{model_name,status},
    # request_latency{model_name,API,entrypoint}.
    assert re.search(r'^:tensorflow:serving:request_count\{model_name="mlp",status="OK"\} \d+$',
                     text, re.MULTILINE), text
    # A name no model has is counted under "<unknown>" (one series, not one per name).
    assert metric_value(text, ":tensorflow:serving:request_count", model_name="<unknown>",
                        status="NOT_FOUND") >= 1
    assert re.search(r'^:tensorflow:serving:request_latency_count\{model_name="mlp",'
                     r'API="predict",entrypoint="REST"\} \d+$', text, re.MULTILINE), text
