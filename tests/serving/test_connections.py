"""The REST server's connections under stress, in-process with a stub API
(the sockets, threads and HTTP are the real server's):
- a slow-loris client reaped at its deadline cost a BrokenPipe traceback in the log
  (300 clients: 282 tracebacks); now one line per class of connection error;
- when no thread could be started for a connection, the client got an empty reply;
  now 503 with our message, and one log line;
- on a drain (SIGTERM) a new connection waited in the backlog for the grace period
  and was reset; now it is refused at once, and a request still running after the
  grace period is answered 503 UNAVAILABLE instead of an empty reply."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from neuronish.serving.rest import RestServer


class _StubApi:
    """Answers every request 200, after `gate` opens (tests hold requests in flight)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, str, str]:
        self.started.set()
        self.gate.wait(60)
        return 200, json.dumps({"ok": path}), "application/json"


@pytest.fixture
def rest() -> Iterator[tuple[RestServer, _StubApi]]:
    api = _StubApi()
    server = RestServer(0, api, 1 << 20, 4, idle_timeout_s=0.5)  # type: ignore[arg-type]
    server.start()
    try:
        yield server, api
    finally:
        api.gate.set()
        if not server.closing:
            server.stop(1)


def _port(server: RestServer) -> int:
    return server.server_address[1]


def _get(server: RestServer, path: str = "/v1/x", timeout: float = 30) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", _port(server), timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_reaped_slow_clients_log_one_line_per_class_and_no_tracebacks(
        rest: tuple[RestServer, _StubApi], caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture) -> None:
    server, _ = rest
    caplog.set_level(logging.DEBUG, logger="neuronish.serving")
    def slow_client(i: int) -> None:  # a byte every 0.2 s: no socket timeout fires
        try:
            with socket.create_connection(("127.0.0.1", _port(server))) as s:
                s.sendall(b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                for _ in range(15):
                    s.sendall(b"a")
                    time.sleep(0.2)
        except OSError:
            pass  # closed by the server's reaper: what should happen

    clients = [threading.Thread(target=slow_client, args=(i,)) for i in range(40)]
    for c in clients:
        c.start()
    for c in clients:
        c.join(30)
    time.sleep(0.5)
    assert _get(server)[0] == 200  # the server still serves
    out, err = capfd.readouterr()
    assert "Traceback" not in err + out and "Exception occurred" not in err + out, err[-2000:]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) <= 3, [r.getMessage() for r in warnings]  # one per class
    assert all(r.exc_info is None for r in caplog.records)


def test_a_connection_without_a_thread_is_answered_503(
        rest: tuple[RestServer, _StubApi], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture) -> None:
    server, _ = rest

    def no_thread(self: object, request: object, client_address: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(socketserver.ThreadingMixIn, "process_request", no_thread)
    caplog.set_level(logging.WARNING, logger="neuronish.serving")
    answers = [_get(server) for _ in range(20)]
    for status, body in answers:
        assert status == 503 and "cannot start a thread" in json.loads(body)["error"], body
    out, err = capfd.readouterr()
    assert "Traceback" not in err + out, err[-2000:]
    lines = [r.getMessage() for r in caplog.records if "no thread" in r.getMessage()]
    assert len(lines) == 1, lines  # one line for the class, not one per connection
    monkeypatch.undo()
    assert _get(server)[0] == 200  # threads again: served


def test_a_drain_refuses_new_connections_at_once_and_answers_late_requests_503(
        rest: tuple[RestServer, _StubApi]) -> None:
    server, api = rest
    api.gate.clear()  # the next request runs until the test opens the gate
    answer: list[tuple[int, str]] = []
    client = threading.Thread(target=lambda: answer.append(_get(server)))
    client.start()
    assert api.started.wait(30)
    stopper = threading.Thread(target=server.stop, args=(2.0,))
    start = time.monotonic()
    stopper.start()
    time.sleep(0.8)  # past the accept loop's poll interval, within the grace period
    refused_in = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", _port(server)), timeout=5)
    assert time.monotonic() - refused_in < 1.0  # refused, not left in the backlog
    client.join(30)
    stopper.join(30)
    assert answer, "the in-flight request got no answer"
    status, body = answer[0]
    assert status == 503 and "--shutdown_grace_period_seconds" in json.loads(body)["error"]
    assert 1.5 < time.monotonic() - start < 10
    api.gate.set()  # the late handler finishes: its answer is dropped, not sent twice
