"""Batching's limits: a full queue answers UNAVAILABLE (503) at once, a request
larger than a batch is INVALID_ARGUMENT, a REST request past
--rest_api_timeout_in_ms is DEADLINE_EXCEEDED (504); and SIGTERM lets the
requests in flight finish before the server exits 0."""

from __future__ import annotations

import concurrent.futures
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf

from tests.serving.harness import Server, copy_version, predict_request, running_server, write_text

# A batch of up to 4 rows waits up to 1 s for company; one batch may wait.
BATCHING = """
max_batch_size { value: 4 }
batch_timeout_micros { value: 1000000 }
max_enqueued_batches { value: 1 }
num_batch_threads { value: 1 }
"""


def _rows(n: int) -> np.ndarray:
    return np.full((n, 32), 0.5, np.float32)


def _slow_batching_server(root: Path, mlp_model: str, *flags: str) -> Iterator[Server]:
    copy_version(mlp_model, root / "mlp", 1)
    batching = write_text(root / "batching.config", BATCHING)
    args = ["--model_name=mlp", f"--model_base_path={root / 'mlp'}", "--enable_batching",
            f"--batching_parameters_file={batching}", *flags]
    with running_server(args, root, {"mlp": [1]}) as server:
        yield server


@pytest.fixture
def limits_server(serving_dir: Path, mlp_model: str) -> Iterator[Server]:
    yield from _slow_batching_server(serving_dir / "limits", mlp_model,
                                     "--rest_api_timeout_in_ms=300")


@pytest.fixture
def drain_server(serving_dir: Path, mlp_model: str) -> Iterator[Server]:
    yield from _slow_batching_server(serving_dir / "drain", mlp_model)


def test_limits(limits_server: Server) -> None:
    server = limits_server
    stub = server.predictions
    # One row opens a batch, which then waits (up to 1 s) for more rows.
    waiting = stub.Predict.future(predict_request("mlp", {"x": _rows(1)}), timeout=30)
    time.sleep(0.2)
    # Four more rows do not fit in that batch and a second batch may not queue.
    with pytest.raises(grpc.RpcError) as raised:
        stub.Predict(predict_request("mlp", {"x": _rows(4)}), timeout=30)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "The batch scheduling queue to which this task was submitted is full" in \
        raised.value.details()
    status, body = server.http("POST", "/v1/models/mlp:predict", {"instances": _rows(4).tolist()})
    assert status == 503 and "queue" in body["error"]
    # Larger than any batch: refused as a bad request.
    status, body = server.http("POST", "/v1/models/mlp:predict", {"instances": _rows(5).tolist()})
    assert status == 400
    assert "Task size 5 is larger than maximum input batch size 4" in body["error"]
    # The waiting request is served (its batch times out after 1 s).
    assert tf.make_ndarray(waiting.result().outputs["probs"]).shape == (1, 10)

    # REST's deadline (300 ms) expires while the lone row waits for its batch (1 s):
    # a 504, where waiting out the batch would have answered 200.
    status, body = server.http("POST", "/v1/models/mlp:predict", {"instances": _rows(1).tolist()})
    assert status == 504, body
    assert "Deadline exceeded" in body["error"]
    time.sleep(1.0)  # let that batch drain
    # A full batch needs no waiting: served within the deadline.
    status, body = server.http("POST", "/v1/models/mlp:predict", {"instances": _rows(4).tolist()})
    assert status == 200 and len(body["predictions"]) == 4


def test_sigterm_finishes_in_flight_requests(drain_server: Server) -> None:
    server = drain_server
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # Both wait in the open batch (up to 1 s) when SIGTERM arrives.
        grpc_call = server.predictions.Predict.future(
            predict_request("mlp", {"x": _rows(1)}), timeout=30)
        rest_call = pool.submit(server.http, "POST", "/v1/models/mlp:predict",
                                {"instances": _rows(2).tolist()})
        time.sleep(0.3)
        assert not grpc_call.done() and not rest_call.done()  # still waiting: in flight
        start = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert tf.make_ndarray(grpc_call.result().outputs["probs"]).shape == (1, 10)
        status, body = rest_call.result()
        assert status == 200 and len(body["predictions"]) == 2, body
        assert time.monotonic() - start < 5
    assert server.terminate(timeout=30) == 0, server.log()[-3000:]
    assert "Server stopped" in server.log()
    with pytest.raises(OSError):
        server.http("GET", "/v1/models/mlp", timeout=2)
