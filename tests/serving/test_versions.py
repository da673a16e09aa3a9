"""Versions come and go while clients run: no request fails, the new version is
served afterwards, a broken version is reported and harms nobody, and the
model set can be reloaded over ModelService."""

from __future__ import annotations

import http.client
import json
import threading
import time
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
)

State = get_model_status_pb2.ModelVersionStatus.State
X = np.full((2, 32), 0.25, np.float32)


@pytest.fixture(scope="module")
def base_path(serving_dir: Path) -> Path:
    return serving_dir / "versions" / "mlp"


@pytest.fixture(scope="module")
def server(serving_dir: Path, base_path: Path, mlp_model: str) -> Iterator[Server]:
    copy_version(mlp_model, base_path, 1)
    args = ["--model_name=mlp", f"--model_base_path={base_path}",
            "--file_system_poll_wait_seconds=1", "--max_num_load_retries=0"]
    with running_server(args, base_path.parent, {"mlp": [1]}) as server:
        yield server


def test_new_version_is_picked_up_without_failed_requests(server: Server, base_path: Path,
                                                          mlp_model: str) -> None:
    versions: list[int] = []
    errors: list[str] = []
    stop = threading.Event()
    stub = server.predictions

    def grpc_client() -> None:
        while not stop.is_set():
            try:
                response = stub.Predict(predict_request("mlp", {"x": X}), timeout=30)
                versions.append(response.model_spec.version.value)
                assert tf.make_ndarray(response.outputs["probs"]).shape == (2, 10)
            except Exception as e:
                errors.append(repr(e))

    def rest_client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
        while not stop.is_set():
            try:
                conn.request("POST", "/v1/models/mlp:predict",
                             body=json.dumps({"instances": X.tolist()}))
                response = conn.getresponse()
                body = response.read()
                if response.status != 200:
                    errors.append(body.decode())
            except Exception as e:
                errors.append(repr(e))
        conn.close()

    threads = [threading.Thread(target=grpc_client) for _ in range(8)] + \
        [threading.Thread(target=rest_client) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        copy_version(mlp_model, base_path, 2)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not versions or versions[-1] != 2):
            time.sleep(0.1)
        time.sleep(1.0)  # and keep serving a while on the new version
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors[:5]
    assert versions[0] == 1 and versions[-1] == 2
    # Once 2 answered, 1 never did again (latest policy, availability preserving).
    assert 1 not in versions[versions.index(2):]
    deadline = time.monotonic() + 10
    while server.available_versions("mlp") != [2] and time.monotonic() < deadline:
        time.sleep(0.1)
    states = {s.version: s.state for s in server.status("mlp").model_version_status}
    assert states == {2: State.AVAILABLE, 1: State.END}


def test_broken_version_is_reported_and_harms_nobody(server: Server, base_path: Path) -> None:
    broken = base_path.parent / ".broken"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"this is not a SavedModel")
    broken.rename(base_path / "3")
    deadline = time.monotonic() + 30
    status = None
    while time.monotonic() < deadline:
        status = {s.version: s for s in server.status("mlp").model_version_status}
        if 3 in status and status[3].state == State.END:
            break
        time.sleep(0.1)
    assert status is not None and status[3].state == State.END
    assert status[3].status.error_code != 0
    assert "Loading servable: {name: mlp version: 3} failed" in status[3].status.error_message
    assert status[2].state == State.AVAILABLE  # still serving
    response = server.predictions.Predict(predict_request("mlp", {"x": X}), timeout=30)
    assert response.model_spec.version.value == 2
    code, body = server.http("GET", "/v1/models/mlp/versions/3")
    assert code == 200 and body["model_version_status"][0]["state"] == "END"
    assert body["model_version_status"][0]["status"]["error_code"] != "OK"


def _reload(server: Server, config: model_server_config_pb2.ModelServerConfig
            ) -> model_management_pb2.ReloadConfigResponse:
    return server.models.HandleReloadConfigRequest(
        model_management_pb2.ReloadConfigRequest(config=config), timeout=60)


def test_reload_config(server: Server, base_path: Path, toy_model_dir: str,
                       serving_dir: Path) -> None:
    toy_base = serving_dir / "versions" / "toy"
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
    mlp.version_labels["stable"] = 1
    response = _reload(server, config)
    assert response.status.error_code == 9  # FAILED_PRECONDITION
    assert "version 1 of model mlp, which is not currently available" in \
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
    assert server.available_versions("mlp") == [2]
