"""Versions come and go while clients run: no request fails, the new version is
served afterwards, a broken version is reported and harms nobody, and the
model set can be reloaded over ModelService."""

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
from tensorflow_serving.apis import get_model_status_pb2, model_management_pb2
from tensorflow_serving.config import model_server_config_pb2

from tests.serving.harness import (
    Server,
    copy_version,
    predict_request,
    running_server,
    wait_for,
)

State = get_model_status_pb2.ModelVersionStatus.State
X = np.full((2, 32), 0.25, np.float32)


@pytest.fixture
def base_path(tmp_path: Path, mlp_model: str) -> Path:
    """A fresh base path holding mlp version 1; each test adds what it needs."""
    path = tmp_path / "mlp"
    copy_version(mlp_model, path, 1)
    return path


@pytest.fixture
def server(base_path: Path) -> Iterator[Server]:
    args = ["--model_name=mlp", f"--model_base_path={base_path}",
            "--file_system_poll_wait_seconds=1", "--max_num_load_retries=0",
            "--allow_reload_config_request", f"--reload_config_allowed_roots={base_path.parent}"]
    with running_server(args, base_path.parent, {"mlp": [1]}) as server:
        yield server


def test_new_version_is_picked_up_without_failed_requests(server: Server, base_path: Path,
                                                          mlp_model: str) -> None:
    grpc_clients, rest_clients = 8, 8
    # Versions each gRPC client was answered by, in that client's order: the
    # order of answers across clients says nothing about when they were sent.
    versions: list[list[int]] = [[] for _ in range(grpc_clients)]
    rest_answers = [0] * rest_clients
    errors: list[str] = []
    stop = threading.Event()
    stub = server.predictions

    def grpc_client(k: int) -> None:
        while not stop.is_set():
            try:
                response = stub.Predict(predict_request("mlp", {"x": X}), timeout=30)
                assert tf.make_ndarray(response.outputs["probs"]).shape == (2, 10)
                versions[k].append(response.model_spec.version.value)
            except Exception as e:
                errors.append(repr(e))

    def rest_client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
        while not stop.is_set():
            try:
                conn.request("POST", "/v1/models/mlp:predict",
                             body=json.dumps({"instances": X.tolist()}))
                response = conn.getresponse()
                body = response.read()
                if response.status != 200:
                    errors.append(body.decode())
                rest_answers[k] += 1
            except Exception as e:
                errors.append(repr(e))
        conn.close()

    threads = [threading.Thread(target=grpc_client, args=(k,)) for k in range(grpc_clients)] + \
        [threading.Thread(target=rest_client, args=(k,)) for k in range(rest_clients)]
    for thread in threads:
        thread.start()
    try:
        # Every client is answered by version 1 before version 2 exists ...
        wait_for(lambda: all(versions) and all(rest_answers), "every client's first answer")
        copy_version(mlp_model, base_path, 2)
        # ... and keeps going until every gRPC client has been answered by 2.
        wait_for(lambda: all(2 in v for v in versions), "version 2 to answer every client")
        served = list(rest_answers)
        wait_for(lambda: all(a > b for a, b in zip(rest_answers, served)),
                 "REST clients to be answered after the switch")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors[:5]
    for answered in versions:
        assert answered[0] == 1 and answered[-1] == 2, answered
        # Once 2 answered a client, 1 never did again (latest policy, availability
        # preserving): a request sent after that answer found 2 available.
        assert 1 not in answered[answered.index(2):], answered
    wait_for(lambda: server.available_versions("mlp") == [2], "version 1 to be unloaded", 10)
    states = {s.version: s.state for s in server.status("mlp").model_version_status}
    assert states == {2: State.AVAILABLE, 1: State.END}


def test_broken_version_is_reported_and_harms_nobody(server: Server, base_path: Path) -> None:
    broken = base_path.parent / ".broken"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"this is not a SavedModel")
    broken.rename(base_path / "2")

    def version_2_ended() -> bool:
        states = {s.version: s.state for s in server.status("mlp").model_version_status}
        return states.get(2) == State.END

    wait_for(version_2_ended, "the broken version 2 to be reported")
    status = {s.version: s for s in server.status("mlp").model_version_status}
    assert status[2].status.error_code != 0
    assert "Loading servable: {name: mlp version: 2} failed" in status[2].status.error_message
    assert status[1].state == State.AVAILABLE  # still serving
    response = server.predictions.Predict(predict_request("mlp", {"x": X}), timeout=30)
    assert response.model_spec.version.value == 1
    code, body = server.http("GET", "/v1/models/mlp/versions/2")
    assert code == 200 and body["model_version_status"][0]["state"] == "END"
    assert body["model_version_status"][0]["status"]["error_code"] != "OK"


def _reload(server: Server, config: model_server_config_pb2.ModelServerConfig
            ) -> model_management_pb2.ReloadConfigResponse:
    return server.models.HandleReloadConfigRequest(
        model_management_pb2.ReloadConfigRequest(config=config), timeout=60)


def test_reload_config(server: Server, base_path: Path, toy_model_dir: str,
                       tmp_path: Path) -> None:
    toy_base = tmp_path / "toy"
    copy_version(toy_model_dir, toy_base, 5)
    config = model_server_config_pb2.ModelServerConfig()
    mlp = config.model_config_list.config.add(name="mlp", base_path=str(base_path),
                                              model_platform="tensorflow")
    config.model_config_list.config.add(name="toy", base_path=str(toy_base),
                                        model_platform="tensorflow")
    response = _reload(server, config)
    assert response.status.error_code == 0, response.status.error_message
    assert server.available_versions("toy") == [5]
    response = server.predictions.Predict(predict_request(
        "toy", {"a": np.ones((1, 2), np.float32), "b": np.ones(1, np.int64)}), timeout=30)
    assert response.model_spec.version.value == 5

    # A label on a version that is not loaded is refused, as TF Serving does.
    mlp.version_labels["stable"] = 7
    response = _reload(server, config)
    assert response.status.error_code == 9  # FAILED_PRECONDITION
    assert "version 7 of model mlp, which is not currently available" in \
        response.status.error_message

    # Dropping a model unloads it; its requests are then NOT_FOUND.
    del config.model_config_list.config[1]
    del mlp.version_labels["stable"]
    response = _reload(server, config)
    assert response.status.error_code == 0, response.status.error_message
    with pytest.raises(grpc.RpcError) as raised:
        server.predictions.Predict(predict_request(
            "toy", {"a": np.ones((1, 2), np.float32), "b": np.ones(1, np.int64)}), timeout=30)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert server.available_versions("mlp") == [1]
