"""The server under hostile traffic: every request bounded before work starts,
deadlines honoured, REST framing and JSON abuse answered 400, metrics that do not
grow with request names, HandleReloadConfigRequest restricted, slow, idle and
chunked connections that neither hold a thread forever nor delay good requests,
and gRPC over TLS. Clients are the official tensorflow-serving-api stubs (gRPC)
and raw sockets / http.client (REST)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
)
from tensorflow_serving.config import model_server_config_pb2

from tests.serving.harness import (
    SERVER,
    Server,
    copy_version,
    predict_request,
    running_server,
    write_text,
)

ROW = [0.5] * 32
MAX_ELEMENTS = 100_000
IDLE_TIMEOUT_S = 2.0
SERVER_TIMEOUT_MS = 800
SLOW_N = 1_000_000  # loop iterations: ~3 s on an idle 2-CPU machine, ~10 s loaded


class _Slow(tf.Module):
    """`y = n` after a loop of n steps: a model whose run time the request chooses."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="n")])
    def serve(self, n: tf.Tensor) -> dict[str, tf.Tensor]:
        _, count = tf.while_loop(lambda i, c: i < n[0], lambda i, c: (i + 1, c + 1.0),
                                 [tf.constant(0, tf.int64), tf.constant(0.0)])
        return {"y": tf.fill(tf.shape(n), count)}


@pytest.fixture(scope="module")
def slow_model_dir(serving_dir: Path) -> str:
    path = serving_dir / "slow_src"
    slow = _Slow()
    tf.saved_model.save(slow, str(path), signatures={"serving_default": slow.serve})
    return str(path)


@pytest.fixture(scope="module")
def hostile_server(serving_dir: Path, mlp_model: str, slow_model_dir: str,
                   toy_model_dir: str) -> Iterator[Server]:
    root = serving_dir / "hostile"
    copy_version(mlp_model, root / "mlp", 1)
    copy_version(slow_model_dir, root / "slow", 1)
    copy_version(toy_model_dir, root / "toy", 1)
    (root / "allowed").mkdir()
    config = write_text(root / "models.config", f"""
model_config_list {{
  config {{ name: "mlp" base_path: "{root / 'mlp'}" model_platform: "tensorflow" }}
  config {{ name: "slow" base_path: "{root / 'slow'}" model_platform: "tensorflow" }}
  config {{ name: "toy" base_path: "{root / 'toy'}" model_platform: "tensorflow" }}
}}
""")
    monitoring = write_text(root / "monitoring.config", "prometheus_config { enable: true }\n")
    args = [f"--model_config_file={config}", f"--monitoring_config_file={monitoring}",
            f"--rest_api_max_body_bytes={1 << 20}", f"--request_max_elements={MAX_ELEMENTS}",
            f"--rest_api_idle_timeout_in_ms={int(IDLE_TIMEOUT_S * 1000)}",
            f"--request_timeout_in_ms={SERVER_TIMEOUT_MS}",
            "--allow_reload_config_request", f"--reload_config_allowed_roots={root / 'allowed'}"]
    with running_server(args, root, {"mlp": [1], "slow": [1], "toy": [1]}) as server:
        yield server


def _good_grpc(server: Server) -> None:
    response = server.predictions.Predict(
        predict_request("mlp", {"x": np.full((1, 32), 0.5, np.float32)}), timeout=30)
    assert list(response.outputs) and response.model_spec.version.value == 1


def _good_rest(server: Server) -> float:
    start = time.perf_counter()
    status, body = server.http("POST", "/v1/models/mlp:predict", {"instances": [ROW]})
    assert status == 200 and len(body["predictions"]) == 1, body
    return time.perf_counter() - start


def _grpc_error(server: Server, request: predict_pb2.PredictRequest,
                timeout: float = 30) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        server.predictions.Predict(request, timeout=timeout)
    return raised.value


# --------------------------------------------------------------- bounded requests


def test_a_34_byte_request_declaring_16m_elements_is_refused(hostile_server: Server) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mlp"
    tensor = request.inputs["x"]
    tensor.dtype = types_pb2.DT_FLOAT
    tensor.tensor_shape.dim.add(size=1048576)
    tensor.tensor_shape.dim.add(size=16)
    tensor.float_val.append(1.0)
    assert request.ByteSize() <= 34
    start = time.monotonic()
    error = _grpc_error(hostile_server, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "declares 16777216 elements but the request carries 1 value" in error.details()
    assert time.monotonic() - start < 10  # refused, not computed (it took 33 s before)
    _good_grpc(hostile_server)


def test_a_small_splat_is_still_a_tensor(hostile_server: Server) -> None:
    """TF's encoding of a constant tensor (one value for the shape) keeps working
    where it cannot be abused: the rows compute like the full tensor."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mlp"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(0.5, tf.float32, [3, 32]))
    assert len(request.inputs["x"].float_val) == 1
    splat = hostile_server.predictions.Predict(request, timeout=30)
    full = hostile_server.predictions.Predict(
        predict_request("mlp", {"x": np.full((3, 32), 0.5, np.float32)}), timeout=30)
    assert splat.outputs == full.outputs


@pytest.mark.parametrize("dims", [[-1, 32], [2**62, 2**62]])
def test_an_invalid_declared_shape_is_refused(hostile_server: Server, dims: list[int]) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mlp"
    tensor = request.inputs["x"]
    tensor.dtype = types_pb2.DT_FLOAT
    for d in dims:
        tensor.tensor_shape.dim.add(size=d)
    tensor.float_val.append(1.0)
    error = _grpc_error(hostile_server, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "tensor parsing error: x" in error.details()


def test_a_request_over_the_element_limit(hostile_server: Server) -> None:
    rows = MAX_ELEMENTS // 32 + 1
    x = np.full((rows, 32), 0.5, np.float32)
    error = _grpc_error(hostile_server, predict_request("mlp", {"x": x}))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--request_max_elements" in error.details()
    status, body = hostile_server.http("POST", "/v1/models/mlp:predict",
                                       {"instances": [ROW] * rows})
    assert status == 429 and "--request_max_elements" in body["error"]
    _good_grpc(hostile_server)


def test_a_classify_request_over_the_limit(hostile_server: Server) -> None:
    from tensorflow_serving.apis import classification_pb2

    from tests.serving.toy_model import example

    request = classification_pb2.ClassificationRequest()
    request.model_spec.name, request.model_spec.signature_name = "toy", "classify"
    one = example(1.0, 2.0)
    request.input.example_list.examples.extend([one] * (MAX_ELEMENTS + 1))
    with pytest.raises(grpc.RpcError) as raised:
        hostile_server.predictions.Classify(request, timeout=60)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    del request.input.example_list.examples[2:]
    assert len(hostile_server.predictions.Classify(request, timeout=30)
               .result.classifications) == 2


# --------------------------------------------------------------- deadlines


def test_a_call_past_its_grpc_deadline_is_abandoned(hostile_server: Server) -> None:
    request = predict_request("slow", {"n": np.array([SLOW_N], np.int64)})
    start = time.monotonic()
    error = _grpc_error(hostile_server, request, timeout=0.3)
    waited = time.monotonic() - start
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert waited < 5, waited
    _good_grpc(hostile_server)  # the server answers others while the call runs out
    # The server's own answer (not only the client's timer): with a client deadline
    # longer than --request_timeout_in_ms, the server's wins.
    error = _grpc_error(hostile_server, request, timeout=30)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "abandoned" in error.details()


def test_a_rest_call_past_the_server_timeout_is_504(hostile_server: Server) -> None:
    start = time.monotonic()
    status, body = hostile_server.http("POST", "/v1/models/slow:predict",
                                       {"instances": [SLOW_N]})
    assert status == 504 and "Deadline exceeded" in body["error"], body
    assert time.monotonic() - start < SERVER_TIMEOUT_MS / 1000 + 5
    # The abandoned call was cancelled (its TF while loop stops): the idle server burns
    # no CPU (run on, the loop would take a CPU for seconds more), and answers at once.
    time.sleep(0.5)
    before = _cpu_seconds(hostile_server.proc.pid)
    time.sleep(1.0)
    assert _cpu_seconds(hostile_server.proc.pid) - before < 0.5
    status, body = hostile_server.http("POST", "/v1/models/slow:predict", {"instances": [3]})
    assert status == 200 and body["predictions"] == [3.0], body


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------- REST framing and JSON


def _raw(server: Server, data: bytes, timeout: float = 10) -> bytes:
    """Send `data` on a fresh connection; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


POST = b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize("framing", [
    b"Transfer-Encoding: chunked\r\n\r\n-1\r\n",
    b"Transfer-Encoding: chunked\r\n\r\n-0x10\r\nabc\r\n",
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"Transfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\n",
    b"Transfer-Encoding: chunked\r\n\r\n5\r\nabcdeXX",  # no CRLF after the data
    b"Content-Length: 1_0\r\n\r\n0123456789",
    b"Content-Length: -5\r\n\r\n",
    b"Content-Length: +5\r\n\r\n12345",
], ids=["chunk -1", "chunk -0x10", "chunk zz", "chunk 40 hex digits", "chunk unterminated",
        "length 1_0", "length -5", "length +5"])
def test_bad_body_framing_is_400_and_closes(hostile_server: Server, framing: bytes) -> None:
    answer = _raw(hostile_server, POST + framing + b"Connection: keep-alive\r\n")
    assert _status_of(answer) == 400, answer[:300]
    assert b"Malformed Content-Length or chunked body" in answer
    _good_rest(hostile_server)


def test_chunks_cannot_pass_the_body_limit(hostile_server: Server) -> None:
    """Chunks adding up past --rest_api_max_body_bytes are refused 413 as soon as a
    chunk size says so, before that chunk is read."""
    big = f"{(1 << 20) + 1:x}".encode()
    answer = _raw(hostile_server, POST + b"Transfer-Encoding: chunked\r\n\r\n"
                  + b"10\r\n" + b"x" * 16 + b"\r\n" + big + b"\r\n")
    assert _status_of(answer) == 413 and b"--rest_api_max_body_bytes" in answer
    _good_rest(hostile_server)


@pytest.mark.parametrize("body", [
    "[" * 100_000 + "]" * 100_000,
    '{"instances": ' + "[" * 50_000 + "]" * 50_000 + "}",
    '{"instances": [[' + "9" * 5000 + "]]}",
    '{"instances": [[' + "9" * 400 + "]]}",
    '{"inputs": {"x": [' + ",".join(["1e999"] * 32) + "]}}",
], ids=["nested array", "nested instances", "5000-digit integer", "400-digit integer",
        "1e999"])
def test_json_abuse_is_400(hostile_server: Server, body: str) -> None:
    status, answer = hostile_server.http("POST", "/v1/models/mlp:predict", body)
    assert status == 400, answer
    assert isinstance(answer, dict) and answer["error"]
    _good_rest(hostile_server)


# --------------------------------------------------------------- metrics, reload


def test_unknown_model_names_do_not_grow_the_metrics_page(hostile_server: Server) -> None:
    def page() -> str:
        status, text = hostile_server.http("GET", "/monitoring/prometheus/metrics")
        assert status == 200
        return text

    for i in range(30):  # every label the page can have appears once
        hostile_server.http("POST", f"/v1/models/warm{i}:predict", {"instances": [ROW]})
        with pytest.raises(grpc.RpcError):
            hostile_server.predictions.Predict(predict_request(f"w{i}", {"x": np.ones((1, 32))}),
                                               timeout=10)
    before = len(page())
    for i in range(300):
        hostile_server.http("POST", f"/v1/models/nope{i}:predict", {"instances": [ROW]})
        with pytest.raises(grpc.RpcError):
            hostile_server.predictions.Predict(
                predict_request(f"nope-{i}-{'x' * 200}", {"x": np.ones((1, 32))}), timeout=10)
    text = page()
    assert "nope" not in text
    assert 'model_name="<unknown>"' in text
    assert len(text) - before < 200, len(text) - before  # only counters' digits grew
    assert 'model_name="mlp"' in text  # configured models keep their own series


def _reload(channel: grpc.Channel, base_path: str
            ) -> model_management_pb2.ReloadConfigResponse:
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name="other", base_path=base_path,
                                        model_platform="tensorflow")
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    return stub.HandleReloadConfigRequest(
        model_management_pb2.ReloadConfigRequest(config=config), timeout=60)


def test_reload_config_is_off_by_default(main_server: Server, tmp_path: Path) -> None:
    response = _reload(main_server.channel, str(tmp_path))
    assert response.status.error_code == 7  # PERMISSION_DENIED
    assert "--allow_reload_config_request" in response.status.error_message
    assert main_server.available_versions("mlp") == [1, 2]  # nothing changed


@pytest.mark.parametrize("where", ["/etc", "allowed/../mlp/../..", "link"])
def test_reload_config_only_under_the_allowed_roots(hostile_server: Server, where: str) -> None:
    root = hostile_server.log_path.parent
    if where == "link":  # a symlink inside the root pointing out of it
        link = root / "allowed" / "escape"
        if not link.exists():
            link.symlink_to("/etc")
        path = str(link)
    else:
        path = where if where.startswith("/") else str(root / where)
    response = _reload(hostile_server.channel, path)
    assert response.status.error_code == 7, response.status.error_message
    assert "--reload_config_allowed_roots" in response.status.error_message
    assert hostile_server.available_versions("mlp") == [1]


def test_a_reloaded_version_linked_out_of_the_allowed_roots_is_not_served(
        hostile_server: Server) -> None:
    """The base path is under the allowed root, its version directory a symlink out of
    it (to a model served elsewhere on the machine): not served."""
    from google.protobuf import text_format

    root = hostile_server.log_path.parent
    base = root / "allowed" / "linked"
    base.mkdir(exist_ok=True)
    if not (base / "1").is_symlink():
        (base / "1").symlink_to(root / "mlp" / "1")
    config = text_format.Parse((root / "models.config").read_text(),
                               model_server_config_pb2.ModelServerConfig())
    config.model_config_list.config.add(name="linked", base_path=str(base),
                                        model_platform="tensorflow")
    stub = model_service_pb2_grpc.ModelServiceStub(hostile_server.channel)
    response = stub.HandleReloadConfigRequest(
        model_management_pb2.ReloadConfigRequest(config=config), timeout=60)
    assert response.status.error_code != 0  # "linked" did not become available
    assert "linked" in response.status.error_message
    assert hostile_server.available_versions("linked") == []
    assert hostile_server.available_versions("mlp") == [1]  # the others keep serving
    status, answer = hostile_server.http("POST", "/v1/models/linked:predict",
                                         {"instances": [ROW]})
    assert status == 404, answer
    assert "reload_config_allowed_roots" in hostile_server.log()


# --------------------------------------------------------------- slow, idle, chunked clients


def _closed_by_server_within(sock: socket.socket, seconds: float,
                             trickle: bytes = b"") -> float:
    """Seconds until the server closes `sock` (sending `trickle` byte by byte, one
    every 0.3 s, meanwhile); fails after `seconds`."""
    sock.settimeout(0.3)
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            pass
        except OSError:  # reset by the server
            return time.monotonic() - start
        if trickle:
            try:
                sock.sendall(trickle[sent % len(trickle):][:1])
            except OSError:
                return time.monotonic() - start
            sent += 1
    raise AssertionError(f"the server kept the connection open for {seconds} s")


def test_idle_and_slow_loris_connections_are_closed(hostile_server: Server) -> None:
    limit = IDLE_TIMEOUT_S + 3
    with socket.create_connection(("127.0.0.1", hostile_server.rest_port)) as idle:
        assert _closed_by_server_within(idle, limit) >= IDLE_TIMEOUT_S - 0.5
    with socket.create_connection(("127.0.0.1", hostile_server.rest_port)) as loris:
        # Never a whole header: a byte every 0.3 s keeps any socket timeout happy.
        _closed_by_server_within(loris, limit, POST + b"X-Padding: " + b"a" * 1000)
    with socket.create_connection(("127.0.0.1", hostile_server.rest_port)) as chunked:
        chunked.sendall(POST + b"Transfer-Encoding: chunked\r\n\r\n")
        _closed_by_server_within(chunked, limit, b"1\r\nx\r\n" * 100)
    with socket.create_connection(("127.0.0.1", hostile_server.rest_port)) as keep_alive:
        body = json.dumps({"instances": [ROW]}).encode()
        keep_alive.sendall(POST + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert keep_alive.recv(65536).startswith(b"HTTP/1.1 200")
        _closed_by_server_within(keep_alive, limit)  # then idle: closed too


def test_good_requests_go_through_500_idle_and_slow_connections(hostile_server: Server) -> None:
    """Functional here (each good request answered 200 while under attack); the
    latency figures are printed (`pytest -s`), and measured for the record by
    benchmarks/serving.py --hostile."""
    baseline = [_good_rest(hostile_server) for _ in range(20)]
    stop = threading.Event()
    idle = [socket.create_connection(("127.0.0.1", hostile_server.rest_port))
            for _ in range(500)]

    def slow_client(prefix: bytes) -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", hostile_server.rest_port)) as s:
                    s.sendall(prefix)
                    while not stop.is_set():
                        s.sendall(b"a")
                        time.sleep(0.2)
            except OSError:
                continue  # closed by the server's deadline: come back, as an attacker does

    attackers = [threading.Thread(target=slow_client, args=(p,), daemon=True) for p in (
        POST + b"X-Slow: ", POST + b"Transfer-Encoding: chunked\r\n\r\n1\r\n")]
    try:
        for t in attackers:
            t.start()
        time.sleep(0.5)
        under_attack = [_good_rest(hostile_server) for _ in range(20)]
        _good_grpc(hostile_server)
    finally:
        stop.set()
        for s in idle:
            s.close()
        for t in attackers:
            t.join(5)
    print(f"\nREST good request, median of 20: {statistics.median(baseline) * 1e3:.1f} ms alone, "
          f"{statistics.median(under_attack) * 1e3:.1f} ms with 500 idle + 2 slow connections "
          f"(max {max(under_attack) * 1e3:.1f} ms)")


def test_connections_past_the_limit_are_refused_and_open_ones_served(
        serving_dir: Path, toy_model_dir: str) -> None:
    root = serving_dir / "max_connections"
    copy_version(toy_model_dir, root / "toy", 1)
    args = [f"--model_base_path={root / 'toy'}", "--model_name=toy",
            "--rest_api_max_connections=3"]
    status_request = b"GET /v1/models/toy HTTP/1.1\r\nHost: x\r\n\r\n"
    with running_server(args, root, {"toy": [1]}) as server:
        held = [socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
                for _ in range(3)]  # accepted in this order, before the next one
        try:
            answer = _raw(server, status_request)  # the 4th: answered at once and closed
            assert _status_of(answer) == 503, answer
            assert b"Connection: close" in answer and b"--rest_api_max_connections" in answer
            for conn in held:  # the connections the server holds are served, keep-alive
                for _ in range(2):
                    conn.sendall(status_request)
                    response = http.client.HTTPResponse(conn)  # reads one answer off it
                    response.begin()
                    assert response.status == 200 and b"AVAILABLE" in response.read()
        finally:
            for conn in held:
                conn.close()
        deadline = time.monotonic() + 10  # the handlers see the closes a moment later
        while True:
            status, body = server.http("GET", "/v1/models/toy")
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE", body


# --------------------------------------------------------------- TLS


def _self_signed(directory: Path) -> tuple[str, str]:
    key, cert = directory / "server.key", directory / "server.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return key.read_text(), cert.read_text()


def _tf_serving_ssl_config(key: str, cert: str) -> str:
    """An SSLConfig text proto (tensorflow_serving/config/ssl_config.proto: server_key = 1,
    server_cert = 2, custom_ca = 3, client_verify = 4) as TF Serving users write it: each
    PEM on one line in single quotes, its base64 lines joined, `\\n` around the body."""
    def one_line(pem: str) -> str:
        lines = pem.strip().splitlines()
        return "\\n".join([lines[0], "".join(lines[1:-1]), lines[-1]])

    return (f"server_key: '{one_line(key)}'\nserver_cert: '{one_line(cert)}'\n"
            "custom_ca: ''\nclient_verify: false\n")


def test_grpc_over_tls_with_ssl_config_file(serving_dir: Path, toy_model_dir: str) -> None:
    root = serving_dir / "tls"
    copy_version(toy_model_dir, root / "toy", 1)
    key, cert = _self_signed(root)
    ssl_config = write_text(root / "ssl.config", _tf_serving_ssl_config(key, cert))
    bad = write_text(root / "bad_ssl.config", 'server_key: "x"\n')
    proc = subprocess.run([str(SERVER), "--port=0", f"--grpc_socket_path={root / 'sock'}",
                           f"--model_base_path={root / 'toy'}", f"--ssl_config_file={bad}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "server_key and server_cert" in proc.stderr + proc.stdout

    args = [f"--model_base_path={root / 'toy'}", "--model_name=toy",
            f"--ssl_config_file={ssl_config}"]
    with running_server(args, root, {}, rest=False) as server:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.encode())
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "toy"
        deadline = time.monotonic() + 120
        with grpc.secure_channel(f"localhost:{server.grpc_port}", credentials) as channel:
            stub = model_service_pb2_grpc.ModelServiceStub(channel)
            while True:  # the harness cannot see a TLS port: wait for the model here
                try:
                    response = stub.GetModelStatus(request, timeout=10)
                    if response.model_version_status[0].state == 30:  # AVAILABLE
                        break
                except grpc.RpcError as e:
                    starting = e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)
                    if not starting or time.monotonic() > deadline:
                        raise
                time.sleep(0.3)
        with grpc.insecure_channel(f"localhost:{server.grpc_port}") as plain:
            with pytest.raises(grpc.RpcError) as raised:
                model_service_pb2_grpc.ModelServiceStub(plain).GetModelStatus(request, timeout=5)
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_tensor_proto_with_content_of_the_wrong_size(hostile_server: Server) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mlp"
    tensor: tensor_pb2.TensorProto = request.inputs["x"]
    tensor.dtype = types_pb2.DT_FLOAT
    tensor.tensor_shape.dim.add(size=1)
    tensor.tensor_shape.dim.add(size=32)
    tensor.tensor_content = b"\0" * 7
    error = _grpc_error(hostile_server, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tensor parsing error: x" in error.details()


def test_sigterm_ends_the_server_while_an_abandoned_call_still_runs(
        serving_dir: Path, slow_model_dir: str) -> None:
    """SIGTERM ends the server while a call abandoned at its deadline is being
    cancelled (it used to wait for such calls forever)."""
    root = serving_dir / "sigterm"
    copy_version(slow_model_dir, root / "slow", 1)
    args = [f"--model_base_path={root / 'slow'}", "--model_name=slow",
            "--shutdown_grace_period_seconds=2"]
    with running_server(args, root, {"slow": [1]}, rest=False) as server:
        request = predict_request("slow", {"n": np.array([10**12], np.int64)})  # hours
        error = _grpc_error(server, request, timeout=0.5)
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        start = time.monotonic()
        assert server.terminate(timeout=30) == 0
        assert time.monotonic() - start < 30


def test_a_drain_answers_calls_past_the_grace_period_and_refuses_new_connections(
        serving_dir: Path, slow_model_dir: str) -> None:
    """SIGTERM with calls running longer than --shutdown_grace_period_seconds: gRPC
    answers them UNAVAILABLE, REST 503 (it used to close with an empty reply), and a
    new REST connection is refused at once (it waited in the backlog, then was reset)."""
    root = serving_dir / "drain"
    copy_version(slow_model_dir, root / "slow", 1)
    args = [f"--model_base_path={root / 'slow'}", "--model_name=slow",
            "--shutdown_grace_period_seconds=2"]
    with running_server(args, root, {"slow": [1]}) as server:
        answers: dict[str, object] = {}

        def grpc_call() -> None:
            try:
                server.predictions.Predict(
                    predict_request("slow", {"n": np.array([10**12], np.int64)}), timeout=120)
                answers["grpc"] = "ok"
            except grpc.RpcError as e:
                answers["grpc"] = e.code()

        def rest_call() -> None:
            try:
                answers["rest"] = server.http("POST", "/v1/models/slow:predict",
                                              {"instances": [10**12]}, timeout=120)
            except (OSError, http.client.HTTPException) as e:
                answers["rest"] = f"{type(e).__name__}: {e}"

        calls = [threading.Thread(target=grpc_call), threading.Thread(target=rest_call)]
        for c in calls:
            c.start()
        time.sleep(2)  # both calls are running
        server.proc.send_signal(15)
        time.sleep(1.5)  # past the accept loop's poll, within the grace period
        start = time.monotonic()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
        assert time.monotonic() - start < 1.0
        for c in calls:
            c.join(60)
        assert server.proc.wait(60) == 0
    assert answers["grpc"] == grpc.StatusCode.UNAVAILABLE, answers
    status, body = answers["rest"]
    assert status == 503 and "--shutdown_grace_period_seconds" in body["error"], answers
