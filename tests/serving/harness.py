"""Run the real `neuronish-model-server` as a subprocess and talk to it the way
TF Serving's users do: the official gRPC stubs and a plain HTTP client."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

SERVER = Path(sys.executable).with_name("neuronish-model-server")
AVAILABLE = get_model_status_pb2.ModelVersionStatus.State.AVAILABLE
START_TIMEOUT_S = 120


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports. The sockets are held open together: asked one
    after another, the kernel may hand back the port it just released (seen in CI: the
    gRPC and REST ports came out equal and the server could not bind the second)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def copy_version(saved_model: str, base_path: Path, version: int) -> Path:
    """Publish `saved_model` as `base_path/version` atomically (copy, then rename),
    the way versions should be dropped into a served base path."""
    base_path.mkdir(parents=True, exist_ok=True)
    staging = base_path / f".staging-{version}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(saved_model, staging)
    target = base_path / str(version)
    os.rename(staging, target)
    return target


@dataclass
class Server:
    proc: subprocess.Popen
    grpc_port: int
    rest_port: int
    log_path: Path
    _channel: grpc.Channel | None = field(default=None, repr=False)

    # -- clients -------------------------------------------------------------------
    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        return self._channel

    @property
    def predictions(self) -> prediction_service_pb2_grpc.PredictionServiceStub:
        return prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    @property
    def models(self) -> model_service_pb2_grpc.ModelServiceStub:
        return model_service_pb2_grpc.ModelServiceStub(self.channel)

    def http(self, method: str, path: str, body: bytes | str | dict | None = None,
             headers: Mapping[str, str] | None = None, timeout: float = 30
             ) -> tuple[int, object]:
        """One request on a fresh connection: (status, parsed JSON or text)."""
        status, _, answer = self.http_with_headers(method, path, body, headers, timeout)
        return status, answer

    def http_with_headers(self, method: str, path: str,
                          body: bytes | str | dict | None = None,
                          headers: Mapping[str, str] | None = None, timeout: float = 30
                          ) -> tuple[int, http.client.HTTPMessage, object]:
        """Like `http`, with the response headers too."""
        conn = http.client.HTTPConnection("127.0.0.1", self.rest_port, timeout=timeout)
        try:
            if isinstance(body, dict):
                body = json.dumps(body)
            conn.request(method, path, body=body, headers=dict(headers or {}))
            response = conn.getresponse()
            data = response.read().decode("utf-8")
        finally:
            conn.close()
        try:
            return response.status, response.headers, json.loads(data)
        except json.JSONDecodeError:
            return response.status, response.headers, data

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the server's Prometheus metrics (needs them enabled)."""
        status, text = self.http("GET", "/monitoring/prometheus/metrics")
        assert status == 200 and isinstance(text, str), text
        return metric_value(text, name, **labels)

    def status(self, name: str) -> get_model_status_pb2.GetModelStatusResponse:
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = name
        return self.models.GetModelStatus(request, timeout=10)

    def available_versions(self, name: str) -> list[int]:
        try:
            response = self.status(name)
        except grpc.RpcError:
            return []
        return sorted(s.version for s in response.model_version_status if s.state == AVAILABLE)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    # -- lifetime ------------------------------------------------------------------
    def wait_ready(self, models: Mapping[str, Sequence[int]], timeout: float = START_TIMEOUT_S
                   ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n"
                                   f"{self.log()[-4000:]}")
            if all(set(v) <= set(self.available_versions(m)) for m, v in models.items()):
                return
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()[-4000:]}")

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, wait for the exit (kill after `timeout`); the exit status."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                    raise
            return self.proc.returncode
        finally:
            if self._channel is not None:
                self._channel.close()
                self._channel = None


@contextlib.contextmanager
def running_server(args: Sequence[str], workdir: Path, models: Mapping[str, Sequence[int]],
                   rest: bool = True, command: Sequence[str] = (str(SERVER),),
                   env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """Start the server (`command`, then its flags) on free loopback ports, wait
    until `models` have the given versions available, and always terminate it."""
    grpc_port, rest_port = free_ports(2)
    rest_port = rest_port if rest else 0
    log_path = workdir / f"server-{grpc_port}.log"
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*command, f"--port={grpc_port}",
                                 f"--rest_api_port={rest_port}", *args],
                                stdout=log, stderr=subprocess.STDOUT, env=full_env)
    server = Server(proc, grpc_port, rest_port, log_path)
    try:
        server.wait_ready(models)
        yield server
    finally:
        if proc.poll() is None:
            server.terminate()


def predict_request(model: str, inputs: Mapping[str, np.ndarray], *, version: int | None = None,
                    label: str | None = None, signature: str = "",
                    output_filter: Sequence[str] = ()) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    request.model_spec.signature_name = signature
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    request.output_filter.extend(output_filter)
    return request


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def write_text(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def batching_and_metrics_flags(root: Path) -> list[str]:
    """Flags for batching up to 16 rows within 2 ms (padded to 4, 8 or 16) and
    Prometheus metrics, their config files written under `root`."""
    batching = write_text(root / "batching.config", """
max_batch_size { value: 16 }
batch_timeout_micros { value: 2000 }
num_batch_threads { value: 2 }
max_enqueued_batches { value: 1000 }
allowed_batch_sizes: 4
allowed_batch_sizes: 8
allowed_batch_sizes: 16
""")
    monitoring = write_text(root / "monitoring.config", "prometheus_config { enable: true }\n")
    return ["--enable_batching", f"--batching_parameters_file={batching}",
            f"--monitoring_config_file={monitoring}"]


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text, 0 if absent."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, label_text = head.partition("{")
        if sample != name:
            continue
        found = dict(item.split("=", 1) for item in label_text.rstrip("}").split(",") if item)
        if all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    return 0.0


def run_clients(count: int, seconds: float, call: Callable[[int, int], None]
                ) -> tuple[int, list[str]]:
    """`count` threads each calling `call(client, i)` in a loop for `seconds`;
    returns the number of calls that returned and the errors of the others."""
    stop = time.monotonic() + seconds
    done = [0] * count
    errors: list[str] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        i = 0
        while time.monotonic() < stop:
            try:
                call(index, i)
                done[index] += 1
            except Exception as e:  # every failure is reported, none ends the run
                with lock:
                    errors.append(f"client {index} call {i}: {type(e).__name__}: {e}")
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done), errors
