"""On the server: REST requests count in the server-wide memory
budget (they did not: only gRPC Predicts reserved), a JSON value nested deeper than a
tensor can be is 400 with our message (numpy's "maximum supported dimension" leaked as
a 500), and an unexpected exception answers INTERNAL with an incident number, never
the library's message."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2

from neuronish.serving import codec
from neuronish.serving.metrics import Metrics
from neuronish.serving.rest import RestApi
from neuronish.serving.v2_rest import V2RestApi
from tests.serving.harness import Server, copy_version, running_server

BUDGET = 64 << 10
ROW = [0.5] * 32


@pytest.fixture(scope="module")
def bounded_server(serving_dir: Path, mlp_model: str) -> Iterator[Server]:
    root = serving_dir / "bounded"
    copy_version(mlp_model, root / "mlp", 1)
    args = ["--model_name=mlp", f"--model_base_path={root / 'mlp'}",
            f"--request_memory_budget_bytes={BUDGET}"]
    with running_server(args, root, {"mlp": [1]}) as server:
        yield server


def _v2_body(rows: int) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 32],
                        "data": [0.5] * (rows * 32)}]}


def test_rest_requests_count_in_the_memory_budget(bounded_server: Server) -> None:
    small = json.dumps({"instances": [ROW] * 4}).encode()
    assert codec.rest_request_bytes(small) < BUDGET
    status, answer = bounded_server.http("POST", "/v1/models/mlp:predict", small)
    assert status == 200 and len(answer["predictions"]) == 4, answer
    big = json.dumps({"instances": [ROW] * 64}).encode()  # 21 KB of JSON, ~390 KB counted
    assert len(big) < BUDGET < codec.rest_request_bytes(big)
    status, answer = bounded_server.http("POST", "/v1/models/mlp:predict", big)
    assert status == 429, answer
    assert "--request_memory_budget_bytes" in answer["error"]
    assert "its body" in answer["error"]  # says how a REST request was counted


def test_v2_rest_requests_count_in_the_memory_budget(bounded_server: Server) -> None:
    status, answer = bounded_server.http("POST", "/v2/models/mlp/infer", _v2_body(4))
    assert status == 200, answer
    status, answer = bounded_server.http("POST", "/v2/models/mlp/infer", _v2_body(64))
    assert status == 429 and "--request_memory_budget_bytes" in answer["error"], answer


@pytest.mark.parametrize("depth", [65, 900])
def test_json_nested_deeper_than_a_tensor_is_400(bounded_server: Server, depth: int) -> None:
    body = '{"instances": ' + "[" * depth + "1" + "]" * depth + "}"
    status, answer = bounded_server.http("POST", "/v1/models/mlp:predict", body)
    assert status == 400, answer
    assert answer["error"].endswith(f"JSON Value: a list nested more than {codec.MAX_RANK} "
                                    f"deep; a tensor has at most {codec.MAX_RANK} dimensions")
    body = '{"inputs": {"x": ' + "[" * depth + "1" + "]" * depth + "}}"
    status, answer = bounded_server.http("POST", "/v1/models/mlp:predict", body)
    assert status == 400 and "nested more than" in answer["error"], answer


def test_v2_shapes_of_too_many_dimensions_are_400(bounded_server: Server) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1] * 100, "data": [1.0]}]}
    status, answer = bounded_server.http("POST", "/v2/models/mlp/infer", body)
    assert status == 400 and "at most 64" in answer["error"], answer
    body = '{"inputs": [' + "[" * 4000 + "]" * 4000 + "]}"  # too deep for json.loads
    status, answer = bounded_server.http("POST", "/v2/models/mlp/infer", body)
    assert status == 400 and "nested too deeply" in answer["error"], answer


def test_a_grpc_tensor_of_too_many_dimensions_is_invalid_argument(bounded_server: Server
                                                                  ) -> None:
    for rank in (65, 254):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "mlp"
        tensor: tensor_pb2.TensorProto = request.inputs["x"]
        tensor.dtype = types_pb2.DT_FLOAT
        for _ in range(rank):
            tensor.tensor_shape.dim.add(size=1)
        tensor.float_val.append(1.0)
        with pytest.raises(grpc.RpcError) as caught:
            bounded_server.predictions.Predict(request, timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "rank <= 64" in caught.value.details(), caught.value.details()
    ok = bounded_server.predictions.Predict(
        _predict(np.full((1, 32), 0.5, np.float32)), timeout=30)
    assert list(ok.outputs)


def _predict(x: np.ndarray) -> predict_pb2.PredictRequest:
    from tests.serving.harness import predict_request
    return predict_request("mlp", {"x": x})


class _Broken:
    """A serving core with a bug: its first step raises with a library-looking message."""

    def deadline(self, client_deadline: float | None) -> float | None:
        raise KeyError("/secret/path/in/a/library: internal state 0x7f")


@pytest.mark.parametrize("api", ["tf_serving", "v2"])
def test_an_internal_error_never_leaks_the_librarys_message(
        api: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="neuronish.serving")
    if api == "tf_serving":
        status, body, _ = RestApi(_Broken(), Metrics(), 0, None).handle(
            "POST", "/v1/models/m:predict", b'{"instances": [1]}')
    else:
        class Service:
            core = _Broken()
        status, body, _ = V2RestApi(Service(), Metrics(), 0).handle(
            "POST", "/v2/models/m/infer", b'{"inputs": []}', {})
    text = body if isinstance(body, str) else body.decode()
    assert status == 500
    assert "secret" not in text and "KeyError" not in text, text
    assert "internal error in neuronish-model-server (incident" in json.loads(text)["error"]
    assert "secret" in caplog.text and "incident" in caplog.text  # the log keeps it all


def test_op_error_messages_lose_the_eager_wrappers_header_and_stack() -> None:
    from neuronish.serving.servable import op_error_message

    wrapped = ("Graph execution error:\n\nDetected at node y defined at (most recent call "
               'last):\n\n  File "/srv/app/model.py", line 3, in f\n\n  File "/x.py", line 9, '
               "in g\n\nNode: 'y'\nbad thing\n\t [[{{node y}}]] [Op:__inference_f_1]")
    assert op_error_message(wrapped) == "Node: 'y'\nbad thing\n\t [[{{node y}}]]"
    assert op_error_message("plain [not an Op suffix]") == "plain [not an Op suffix]"
