"""The server-wide budget for request memory: a gRPC Predict reserves
REQUEST_MEMORY_MULTIPLE x its tensors' bytes before it is decoded; one larger than
the budget is RESOURCE_EXHAUSTED at once, one that does not fit beside those in
flight waits for them until its deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from neuronish.serving import codec
from neuronish.serving.core import MemoryBudget
from neuronish.serving.status import ServingError
from tests.serving.harness import Server, copy_version, predict_request, running_server

BUDGET = codec.REQUEST_MEMORY_MULTIPLE * 4 * 32 * 4  # four rows of the mlp's float32 [?, 32]


def test_a_request_larger_than_the_budget_is_refused_at_once() -> None:
    budget = MemoryBudget(1000)
    with pytest.raises(ServingError, match="more than the server's budget") as caught:
        with budget.hold(1001, None):
            pass
    assert caught.value.code_name == "RESOURCE_EXHAUSTED"
    assert budget.used == 0


def test_a_request_waits_for_those_in_flight_until_its_deadline() -> None:
    budget = MemoryBudget(1000)
    release = threading.Event()
    held = threading.Event()

    def first() -> None:
        with budget.hold(700, None):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(30)
    with pytest.raises(ServingError, match="held by requests in flight"):
        with budget.hold(400, time.monotonic() + 0.2):
            pass
    got: list[int] = []

    def second() -> None:
        with budget.hold(400, time.monotonic() + 30):
            got.append(budget.used)

    waiter = threading.Thread(target=second)
    waiter.start()
    time.sleep(0.2)
    assert not got  # still waiting for the first
    release.set()
    thread.join(30)
    waiter.join(30)
    assert got == [400] and budget.used == 0


def test_check_request_size_returns_the_memory_to_reserve() -> None:
    request = predict_request("m", {"x": np.zeros((3, 5), np.float32),
                                    "i": np.zeros(7, np.int64)})
    nbytes = codec.check_request_size(dict(request.inputs), 0)
    assert nbytes == codec.REQUEST_MEMORY_MULTIPLE * (3 * 5 * 4 + 7 * 8)


@pytest.fixture(scope="module")
def budget_server(serving_dir: Path, mlp_model: str) -> Iterator[Server]:
    root = serving_dir / "budget"
    copy_version(mlp_model, root / "mlp", 1)
    args = ["--model_name=mlp", f"--model_base_path={root / 'mlp'}",
            f"--request_memory_budget_bytes={BUDGET}"]
    with running_server(args, root, {"mlp": [1]}, rest=False) as server:
        yield server


def test_the_server_refuses_a_request_over_its_memory_budget(budget_server: Server) -> None:
    ok = budget_server.predictions.Predict(
        predict_request("mlp", {"x": np.full((4, 32), 0.5, np.float32)}), timeout=30)
    assert list(ok.outputs)
    with pytest.raises(grpc.RpcError) as caught:
        budget_server.predictions.Predict(
            predict_request("mlp", {"x": np.full((5, 32), 0.5, np.float32)}), timeout=30)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--request_memory_budget_bytes" in caught.value.details()
    assert f"needs about {codec.REQUEST_MEMORY_MULTIPLE * 5 * 32 * 4} bytes" in \
        caught.value.details()
