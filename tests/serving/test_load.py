"""64 concurrent clients: no errors, right answers; with batching, merged batches.
Durations are bounded (a few seconds); nothing here asserts a speed."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf

from tests.serving.harness import (
    Server,
    batching_and_metrics_flags,
    copy_version,
    metric_value,
    predict_request,
    run_clients,
    running_server,
)

CLIENTS = 64
SECONDS = 3.0
REST_CLIENTS = 16  # of the 64; the rest use gRPC


@pytest.fixture(scope="module")
def inputs_and_expected(mlp_reference) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    pool = []
    for rows in (1, 1, 2, 3):
        x = rng.standard_normal((rows, 32)).astype(np.float32)
        pool.append((x, mlp_reference(x=tf.constant(x))["probs"].numpy()))
    return pool


def _mixed_clients(server: Server, model: str, pool: list, exact: bool) -> tuple[int, list]:
    """gRPC clients over 8 channels, REST clients on keep-alive connections."""
    channels = [grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") for _ in range(8)]
    local = threading.local()
    check = np.testing.assert_array_equal if exact else (
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6))
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    def call(client: int, i: int) -> None:
        x, want = pool[(client + i) % len(pool)]
        if client < REST_CLIENTS:
            if not hasattr(local, "conn"):
                local.conn = http.client.HTTPConnection("127.0.0.1", server.rest_port,
                                                        timeout=30)
            local.conn.request("POST", f"/v1/models/{model}:predict",
                               body=json.dumps({"instances": x.tolist()}))
            response = local.conn.getresponse()
            body = json.loads(response.read())
            assert response.status == 200, body
            check(np.array(body["predictions"], np.float32), want)
        else:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channels[client % 8])
            response = stub.Predict(predict_request(model, {"x": x}), timeout=30)
            check(tf.make_ndarray(response.outputs["probs"]), want)

    try:
        return run_clients(CLIENTS, SECONDS, call)
    finally:
        for channel in channels:
            channel.close()


def test_64_clients_without_batching(main_server: Server, inputs_and_expected: list) -> None:
    calls, errors = _mixed_clients(main_server, "mlp", inputs_and_expected, exact=True)
    assert not errors, errors[:5]
    assert calls >= CLIENTS


@pytest.fixture(scope="module")
def batching_server(serving_dir: Path, mlp_model: str) -> Iterator[Server]:
    root = serving_dir / "batching"
    copy_version(mlp_model, root / "mlp", 1)
    args = ["--model_name=mlp", f"--model_base_path={root / 'mlp'}",
            *batching_and_metrics_flags(root)]
    with running_server(args, root, {"mlp": [1]}) as server:
        yield server


def test_64_clients_with_batching_merge_requests(batching_server: Server,
                                                 inputs_and_expected: list) -> None:
    calls, errors = _mixed_clients(batching_server, "mlp", inputs_and_expected, exact=False)
    assert not errors, errors[:5]
    _, text = batching_server.http("GET", "/monitoring/prometheus/metrics")
    name = ":tensorflow:serving:batching_session:batch_size"
    batches = metric_value(text, name + "_count", model_name="mlp")
    rows = metric_value(text, name + "_sum", model_name="mlp")
    # Every call went through the batcher, in fewer model calls than requests,
    # and every batch was padded to an allowed size.
    assert 0 < batches < calls
    assert rows / batches > 2
    assert metric_value(text, name + "_bucket", model_name="mlp", le="2") == 0
