"""Every kind of bad request gets TF Serving's code and a message naming what
was wrong, and a good request succeeds right after it."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
)

from tests.serving.conftest import MAX_BODY
from tests.serving.harness import Server, predict_request

ROW = [0.5] * 32
GOOD = {"instances": [ROW]}

# (id, method, path, body, HTTP status, text the error must contain)
REST_CASES = [
    ("unknown model", "POST", "/v1/models/nope:predict", GOOD, 404,
     "Servable not found for request: Latest(nope)"),
    ("unknown version", "POST", "/v1/models/mlp/versions/7:predict", GOOD, 404,
     "Servable not found for request: Specific(mlp, 7)"),
    ("unknown label", "POST", "/v1/models/mlp/labels/nope:predict", GOOD, 400,
     "Unrecognized servable version label: nope"),
    ("unknown signature", "POST", "/v1/models/mlp:predict",
     {"signature_name": "nope", **GOOD}, 400, 'Serving signature name: "nope" not found'),
    ("missing input (columnar)", "POST", "/v1/models/toy:predict",
     {"inputs": {"a": [[1.0, 2.0]]}}, 400, "Missing named input: b in 'inputs' object."),
    ("missing input (row)", "POST", "/v1/models/toy:predict",
     {"instances": [{"a": [1.0, 2.0]}]}, 400, "keys must be equal to: a,b"),
    ("extra input (columnar)", "POST", "/v1/models/mlp:predict",
     {"inputs": {"x": [ROW], "y": [1]}}, 400, "Unexpected named input(s): y"),
    ("extra input (row)", "POST", "/v1/models/mlp:predict",
     {"instances": [{"x": ROW, "y": 1}]}, 400, "does not have named input: y"),
    ("plain list for several inputs", "POST", "/v1/models/toy:predict",
     {"instances": [[1.0, 2.0]]}, 400, "expecting list of objects"),
    ("wrong dtype", "POST", "/v1/models/mlp:predict", {"instances": [["a"] * 32]}, 400,
     'JSON Value: "a" Type: String is not of expected type: float'),
    ("wrong dtype (int input)", "POST", "/v1/models/toy:predict",
     {"inputs": {"a": [[1.0, 2.0]], "b": [1.5]}}, 400, "is not of expected type: int64"),
    ("wrong shape", "POST", "/v1/models/mlp:predict", {"instances": [[0.5] * 31]}, 400,
     "input 'x' of signature 'serving_default' expects shape [-1,32] (-1 = any size), "
     "but the request sent [1,31]"),
    ("ragged list", "POST", "/v1/models/mlp:predict", {"inputs": [ROW, ROW[:-1]]}, 400,
     "Encountered list at unexpected size: 31 at level: 1 expected size: 32"),
    ("lossy float", "POST", "/v1/models/mlp:predict", {"instances": [[16777217] * 32]}, 400,
     "without loss of precision"),
    ("malformed JSON", "POST", "/v1/models/mlp:predict", '{"instances": [1,', 400,
     "JSON Parse error"),
    ("empty body", "POST", "/v1/models/mlp:predict", "", 400,
     "JSON Parse error: The document is empty"),
    ("not an object", "POST", "/v1/models/mlp:predict", "[1, 2]", 400, "Is not object"),
    ("neither instances nor inputs", "POST", "/v1/models/mlp:predict", {}, 400,
     "Missing 'inputs' or 'instances' key"),
    ("both instances and inputs", "POST", "/v1/models/mlp:predict",
     {"instances": [ROW], "inputs": [ROW]}, 400, "expecting only one of"),
    ("signature_name not a string", "POST", "/v1/models/mlp:predict",
     {"signature_name": 1, **GOOD}, 400, "'signature_name' key must be a string value."),
    ("lone surrogate", "POST", "/v1/models/toy:predict",
     '{"signature_name": "text", "instances": ["\\ud800"]}', 400, "lone UTF-16 surrogate"),
    ("malformed base64", "POST", "/v1/models/toy:predict",
     {"signature_name": "text", "instances": [{"b64": "@@not base64@@"}]}, 400,
     "Unable to base64 decode"),
    ("classify on a predict signature", "POST", "/v1/models/mlp:classify",
     {"examples": [{"x": [1.0]}]}, 400, "No classification inputs found"),
    ("classify without examples", "POST", "/v1/models/toy:classify",
     {"signature_name": "classify"}, 400, "key 'examples' is expected"),
    ("status of an unknown model", "GET", "/v1/models/nope", None, 404,
     "Could not find any versions of model nope"),
    ("status of an unknown version", "GET", "/v1/models/mlp/versions/9", None, 404,
     "Could not find version 9 of model mlp"),
    ("metadata of an unknown model", "GET", "/v1/models/nope/metadata", None, 404,
     "Servable not found for request: Latest(nope)"),
    ("wrong method", "PUT", "/v1/models/mlp:predict", GOOD, 400,
     "Malformed request: PUT /v1/models/mlp:predict"),
    ("GET on predict", "GET", "/v1/models/mlp:predict", None, 400, "Malformed request"),
    ("not an API path", "GET", "/v3/models/mlp", None, 404, "Not found"),  # (/v2: test_v2.py)
]


def _good_rest(server: Server) -> None:
    status, body = server.http("POST", "/v1/models/mlp:predict", GOOD)
    assert status == 200 and len(body["predictions"]) == 1, body


@pytest.mark.parametrize("case", REST_CASES, ids=[c[0] for c in REST_CASES])
def test_rest_bad_request(main_server: Server, case: tuple) -> None:
    _, method, path, body, want_status, want_text = case
    status, answer = main_server.http(method, path, body)
    assert status == want_status, answer
    assert isinstance(answer, dict) and set(answer) == {"error"}, answer
    assert want_text in answer["error"]
    _good_rest(main_server)


def test_rest_body_over_the_limit(main_server: Server) -> None:
    # Refused from its Content-Length, before any of it is read (so the client
    # need not send it: the test does not depend on socket buffer sizes).
    status, answer = main_server.http("POST", "/v1/models/mlp:predict", None,
                                      headers={"Content-Length": str(MAX_BODY + 1)})
    assert status == 413
    assert answer["error"] == (f"Request body of {MAX_BODY + 1} bytes is larger than the "
                               f"limit of {MAX_BODY} bytes (--rest_api_max_body_bytes)")
    _good_rest(main_server)


def test_rest_keeps_a_connection_after_an_error(main_server: Server) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", main_server.rest_port, timeout=30)
    try:
        for body, want in (("{bad", 400), (json.dumps(GOOD), 200)):
            conn.request("POST", "/v1/models/mlp:predict", body=body)
            response = conn.getresponse()
            response.read()
            assert response.status == want
    finally:
        conn.close()


def test_rest_options_without_cors_is_a_malformed_request(main_server: Server) -> None:
    import http.client

    def request_counts() -> list[str]:
        status, text = main_server.http("GET", "/monitoring/prometheus/metrics")
        assert status == 200 and isinstance(text, str)
        return [line for line in text.splitlines()
                if line.startswith(":tensorflow:serving:request_count{")]

    before = request_counts()
    conn = http.client.HTTPConnection("127.0.0.1", main_server.rest_port, timeout=30)
    try:
        # With a body, which must be read off the connection for the next request.
        conn.request("OPTIONS", "/v1/models/mlp:predict", body=json.dumps(GOOD),
                     headers={"Origin": "http://page.example",
                              "Access-Control-Request-Method": "POST"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        assert response.status == 400, answer
        assert answer["error"] == "Malformed request: OPTIONS /v1/models/mlp:predict"
        assert response.headers["Access-Control-Allow-Origin"] is None
        # Not an API request: no request_count sample moved.
        assert request_counts() == before
        conn.request("POST", "/v1/models/mlp:predict", body=json.dumps(GOOD))
        response = conn.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200 and len(answer["predictions"]) == 1, answer
    finally:
        conn.close()


def _bad_tensor() -> tensor_pb2.TensorProto:
    proto = tf.make_tensor_proto(np.ones((1, 32), np.float32))
    proto.tensor_content = proto.tensor_content[:-4]  # one float short
    return proto


X = np.full((1, 32), 0.5, np.float32)


def _predict(**kwargs: object):  # noqa: ANN202
    return lambda server: server.predictions.Predict(
        predict_request("mlp", {"x": X}, **kwargs), timeout=30)


def _raw_predict(model: str, inputs: dict, **kwargs: object):  # noqa: ANN202
    return lambda server: server.predictions.Predict(
        predict_request(model, inputs, **kwargs), timeout=30)


def _bad_proto(server: Server) -> object:
    request = predict_request("mlp", {})
    request.inputs["x"].CopyFrom(_bad_tensor())
    return server.predictions.Predict(request, timeout=30)


def _metadata_field(server: Server) -> object:
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["nope"])
    request.model_spec.name = "mlp"
    return server.predictions.GetModelMetadata(request, timeout=30)


def _status_unknown(server: Server) -> object:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "nope"
    return server.models.GetModelStatus(request, timeout=30)


def _classify_empty(server: Server) -> object:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "toy"
    request.model_spec.signature_name = "classify"
    return server.predictions.Classify(request, timeout=30)


TOO_BIG = predict_request("mlp", {"x": np.zeros((MAX_BODY // 128 + 1, 32), np.float32)})


def _too_big(server: Server) -> object:
    return server.predictions.Predict(TOO_BIG, timeout=30)


GRPC_CASES = [
    ("unknown model", _raw_predict("nope", {"x": X}), grpc.StatusCode.NOT_FOUND,
     "Servable not found for request: Latest(nope)"),
    ("unknown version", _predict(version=7), grpc.StatusCode.NOT_FOUND,
     "Servable not found for request: Specific(mlp, 7)"),
    ("unknown label", _predict(label="nope"), grpc.StatusCode.INVALID_ARGUMENT,
     "Unrecognized servable version label: nope"),
    ("unknown signature", _predict(signature="nope"), grpc.StatusCode.FAILED_PRECONDITION,
     'Serving signature key "nope" not found.'),
    ("missing input", _raw_predict("toy", {"a": np.ones((1, 2), np.float32)}),
     grpc.StatusCode.INVALID_ARGUMENT, "Missing but required: {b}."),
    ("extra input", _raw_predict("mlp", {"x": X, "y": X}), grpc.StatusCode.INVALID_ARGUMENT,
     "Sent extra: {y}."),
    ("misnamed input", _raw_predict("mlp", {"y": X}), grpc.StatusCode.INVALID_ARGUMENT,
     "input tensor alias not found in signature: y. Inputs expected to be in the set {x}."),
    ("wrong dtype", _raw_predict("mlp", {"x": X.astype(np.int32)}),
     grpc.StatusCode.INVALID_ARGUMENT,
     "input 'x' of signature 'serving_default' expects dtype DT_FLOAT, but the request sent "
     "DT_INT32"),
    ("wrong shape", _raw_predict("mlp", {"x": np.ones((2, 3, 32), np.float32)}),
     grpc.StatusCode.INVALID_ARGUMENT, "expects shape [-1,32]"),
    ("malformed tensor", _bad_proto, grpc.StatusCode.INVALID_ARGUMENT, "tensor parsing error: x"),
    ("unknown output", _predict(output_filter=["nope"]), grpc.StatusCode.INVALID_ARGUMENT,
     "output tensor alias not found in signature: nope"),
    ("unknown metadata field", _metadata_field, grpc.StatusCode.INVALID_ARGUMENT,
     "Metadata field nope is not supported"),
    ("status of an unknown model", _status_unknown, grpc.StatusCode.NOT_FOUND,
     "Could not find any versions of model nope"),
    ("classify with no examples", _classify_empty, grpc.StatusCode.INVALID_ARGUMENT,
     "Input is empty."),
    # gRPC's own wording: the message's size vs. the limit --grpc_channel_arguments set.
    ("message over the limit", _too_big, grpc.StatusCode.RESOURCE_EXHAUSTED,
     f"Received message larger than max ({TOO_BIG.ByteSize()} vs. {MAX_BODY})"),
]


@pytest.mark.parametrize("case", GRPC_CASES, ids=[c[0] for c in GRPC_CASES])
def test_grpc_bad_request(main_server: Server, case: tuple) -> None:
    _, call, want_code, want_text = case
    with pytest.raises(grpc.RpcError) as raised:
        call(main_server)
    assert raised.value.code() == want_code, raised.value.details()
    assert want_text in raised.value.details()
    response = main_server.predictions.Predict(predict_request("mlp", {"x": X}), timeout=30)
    assert tf.make_ndarray(response.outputs["probs"]).shape == (1, 10)
