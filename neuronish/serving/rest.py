"""TF Serving's HTTP/REST API on the REST port.

    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]              status
    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata     metadata
    POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict      (:classify, :regress)
    GET  {prometheus path}                                         metrics, if enabled
    GET|POST /v2/...      the Open Inference Protocol (KServe v2), in v2_rest.py

Why the standard library's ThreadingHTTPServer: a thread per connection is
the simple model that fits here, because a request's time goes into the model
call (TensorFlow and numpy release the GIL) and JSON work, not into socket
handling; it needs no dependency beyond the project's, and keep-alive
(HTTP/1.1) keeps clients from paying a connection per request. What it does
not give is a bound on concurrent work, so `--rest_api_num_threads` (TF
Serving's flag for its executor's size) bounds the requests processed at once
here; the others wait for a slot.

Slow and idle clients: every connection has a socket timeout, and a request
(line, headers and body) must arrive in full within `--rest_api_idle_timeout_in_ms`
of when the server started waiting for it, else the connection is closed; an idle
keep-alive connection is closed after the same time. Each connection has its own
thread, so 500 idle or slow-loris connections cost threads, not the latency of
good requests (measured in tests/serving/test_hostile.py). Threads are bounded too:
past `--rest_api_max_connections` open connections, a new one is answered 503 at
once, from the accepting thread and without reading its request, and closed; the
connections already open are served as before.

Errors are `{"error": "..."}` with TF Serving's status -> HTTP mapping. A body
over `--rest_api_max_body_bytes` is refused with 413 before it is read, as
TF Serving's libevent server does for its own limit.

With `--rest_api_enable_cors_support` every answer carries
`Access-Control-Allow-Origin: *` and an `OPTIONS` preflight is answered 204
with the methods (GET, POST, OPTIONS) and the headers it asked for, so a
browser page on another origin can call the API. Without it, `OPTIONS` is
answered 400 "Malformed request", as TF Serving does, and not counted as an API
request.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2

from . import json_codec
from .codec import REST_COUNTED, rest_request_bytes
from .core import ServingCore, Target
from .metrics import Metrics
from .signatures import Signature
from .status import (
    INTERNAL,
    OK,
    ServingError,
    http_status,
    internal_error,
    invalid_argument,
    unavailable,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .v2_rest import V2RestApi

log = logging.getLogger("neuronish.serving")
ENTRYPOINT = "REST"

_SPEC = r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?"
_PREDICT = re.compile(_SPEC + r":(classify|regress|predict)", re.IGNORECASE)
_STATUS = re.compile(r"/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?"
                     r"(?:/(metadata))?", re.IGNORECASE)


class PayloadTooLarge(Exception):
    pass


_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_DIGITS = re.compile(r"[0-9]{1,19}")
_MAX_CHUNK_LINE = 1024
_MAX_TRAILERS = 64


def _target(name: str | None, version: str | None, label: str | None) -> Target:
    try:
        number = None if version is None else int(version)
    except ValueError:
        raise invalid_argument(f"Failed to convert version: {version} to numeric.") from None
    return Target(urllib.parse.unquote(name or ""), number,
                  urllib.parse.unquote(label) if label else None)


def _to_json(message: object) -> str:
    return json_format.MessageToJson(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True, indent=1)


class RestApi:
    """Request path + body -> (HTTP status, JSON text). No sockets here."""

    def __init__(self, core: ServingCore, metrics: Metrics, timeout_ms: int,
                 metrics_path: str | None):
        self.core = core
        self.metrics = metrics
        self.timeout_ms = timeout_ms
        self.metrics_path = metrics_path

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, str, str]:
        if self.metrics_path is not None and path == self.metrics_path and method == "GET":
            return 200, self.metrics.render(), "text/plain; version=0.0.4"
        if not path.lower().startswith("/v1/"):
            return 404, json.dumps({"error": f"Not found: {method} {path}"}), \
                "application/json"
        start = time.perf_counter()
        api, model, code = "unknown", "", OK
        try:
            deadline = self.core.deadline(
                (time.monotonic() + self.timeout_ms / 1000) if self.timeout_ms > 0 else None)
            if method == "POST" and (m := _PREDICT.fullmatch(path)):
                target = _target(m.group(1), m.group(2), m.group(3))
                api, model = m.group(4).lower(), target.name
                # Reserved from the server-wide budget (shared with gRPC) before parsing.
                with self.core.memory.hold(rest_request_bytes(body), deadline, REST_COUNTED):
                    return 200, self._infer(api, target, body, deadline), "application/json"
            if method == "GET" and (m := _STATUS.fullmatch(path)):
                target = _target(m.group(1), m.group(2), m.group(3))
                model = target.name
                if not target.name:
                    raise invalid_argument("Missing model name in request.")
                if m.group(4):
                    api = "get_model_metadata"
                    return 200, self._metadata(target), "application/json"
                api = "get_model_status"
                return 200, _to_json(self.core.status(target)), "application/json"
            raise invalid_argument(f"Malformed request: {method} {path}")
        except ServingError as e:
            code = e.code
            return http_status(e.code), json.dumps({"error": e.message}), "application/json"
        except Exception:  # a bug must cost one request, not the connection
            code = INTERNAL
            error = internal_error(log, f"REST {method} {path}")
            return 500, json.dumps({"error": error.message}), "application/json"
        finally:
            self.metrics.record_request(model, api, ENTRYPOINT, ServingError(code, "").code_name,
                                        (time.perf_counter() - start) * 1e6)

    def _infer(self, api: str, target: Target, body: bytes, deadline: float | None) -> str:
        doc = json_codec.parse_body(body)
        target = Target(target.name, target.version, target.label,
                        json_codec.signature_name(doc))
        if api == "predict":
            formats: list[str] = []

            def decode(signature: Signature) -> dict:
                arrays, fmt = json_codec.decode_predict(doc, signature.inputs)
                formats.append(fmt)
                return arrays

            _, outputs = self.core.predict(target, decode, (), deadline, rest=True)
            return json_codec.encode_predict(outputs, formats[0])
        request_input = json_codec.decode_examples(doc, api)
        if api == "classify":
            return json_codec.encode_classification(
                self.core.classify(target, request_input, deadline).result)
        return json_codec.encode_regression(
            self.core.regress(target, request_input, deadline).result)

    def _metadata(self, target: Target) -> str:
        response = self.core.metadata(target, ["signature_def"])
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)
        options = {"preserving_proto_field_name": True,
                   "always_print_fields_with_no_presence": True}
        return json.dumps({"model_spec": json_format.MessageToDict(response.model_spec,
                                                                   **options),
                           "metadata": {"signature_def": json_format.MessageToDict(
                               signature_map, **options)}}, indent=1)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server_version = "neuronish-model-server"
    server: RestServer

    def _read_body(self) -> bytes:
        """The body, framed by chunked encoding or Content-Length, never more than
        --rest_api_max_body_bytes of it read. Bad framing (a chunk size that is not
        hex, negative, truncated data) is ValueError: 400, and the connection closes."""
        limit = self.server.max_body_bytes
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts, total = [], 0
            while True:
                line = self.rfile.readline(_MAX_CHUNK_LINE + 1)
                size_text = line.split(b";")[0].strip()
                if not line.endswith(b"\n") or not _HEX.fullmatch(size_text):
                    raise ValueError(f"bad chunk size line {line[:40]!r}")
                size = int(size_text, 16)
                if size == 0:
                    for _ in range(_MAX_TRAILERS):
                        trailer = self.rfile.readline(_MAX_CHUNK_LINE + 1)
                        if trailer in (b"\r\n", b"\n"):
                            return b"".join(parts)
                        if not trailer.endswith(b"\n"):
                            raise ValueError("bad or unterminated trailer")
                    raise ValueError("too many trailers")
                total += size
                if total > limit:
                    raise PayloadTooLarge(total)
                chunk = self.rfile.read(size)
                if len(chunk) != size or self.rfile.readline(3) not in (b"\r\n", b"\n"):
                    raise ValueError("truncated chunk")
                parts.append(chunk)
        length = self.headers.get("Content-Length")
        if not length:
            return b""
        if not _DIGITS.fullmatch(length.strip()):
            raise ValueError(length)
        size = int(length)
        if size > limit:
            raise PayloadTooLarge(size)
        body = self.rfile.read(size)
        if len(body) != size:
            raise ValueError("body shorter than its Content-Length")
        return body

    def setup(self) -> None:
        # A socket timeout ends a connection that goes quiet mid-request or between
        # requests (idle keep-alive); the server's reaper bounds the whole read.
        self.timeout = self.server.idle_timeout_s
        super().setup()

    def handle_one_request(self) -> None:
        self._answer_lock = threading.Lock()
        self._answered = False  # a keep-alive connection: each request gets its answer
        self.server.reading_started(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server.reading_done(self.connection)

    # A drain past its grace period answers requests still in flight from another
    # thread (answer_unavailable); each request gets one answer, whichever comes first.
    _answered = False
    _answer_lock: threading.Lock

    def _claim_answer(self) -> bool:
        with self._answer_lock:
            if self._answered:
                self.close_connection = True
                return False
            self._answered = True
            return True

    def answer_unavailable(self) -> None:
        """503 UNAVAILABLE for this request, unless it was answered; then close."""
        if not self._claim_answer():
            return
        body = json.dumps({"error": "the server is shutting down and this request did not "
                                    "finish within --shutdown_grace_period_seconds"}).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        try:
            self.connection.sendall(head + body)
            self.connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the client has gone: nothing to tell it

    def _respond(self, status: int, payload: str, content_type: str, close: bool) -> None:
        if not self._claim_answer():
            return
        data = payload.encode("utf-8")
        self.send_response(status)
        if self.server.cors:
            self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _respond_bytes(self, status: int, data: bytes, headers: list[tuple[str, str]],
                       close: bool) -> None:
        if not self._claim_answer():
            return
        self.send_response(status)
        if self.server.cors:
            self.send_header("Access-Control-Allow-Origin", "*")
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _discard_body(self) -> bool:
        """Read and drop the request's body, so that the next request on this
        keep-alive connection starts at its own first byte. False if it cannot be
        (over the limit, bad framing): then the connection must close."""
        try:
            self._read_body()
        except (PayloadTooLarge, ValueError):
            return False
        return True

    def _preflight(self) -> None:
        close = not self._discard_body() or self.server.closing
        self.send_response(204)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
        asked = self.headers.get("Access-Control-Request-Headers")
        self.send_header("Access-Control-Allow-Headers", asked or "Content-Type")
        self.send_header("Access-Control-Max-Age", "3600")
        self.send_header("Content-Length", "0")
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()

    def _options_without_cors(self) -> None:
        # Without CORS support OPTIONS is no method of the API. TF Serving answers
        # it 400 "Malformed request" without counting it as an API request, so it
        # is answered here, before RestApi and its metrics.
        close = not self._discard_body() or self.server.closing
        message = f"Malformed request: OPTIONS {self.path}"
        self._respond(400, json.dumps({"error": message}), "application/json", close)

    def _dispatch(self) -> None:
        server = self.server
        if self.command == "OPTIONS":
            if server.cors:
                self._preflight()
            else:
                self._options_without_cors()
            return
        if not server.begin_request(self):
            error = unavailable("the server is shutting down")
            self._respond(503, json.dumps({"error": error.message}), "application/json", True)
            return
        try:
            try:
                body = self._read_body()
                server.reading_done(self.connection)  # the request is in: no read deadline
            except PayloadTooLarge as e:
                message = (f"Request body of {e.args[0]} bytes is larger than the limit of "
                           f"{server.max_body_bytes} bytes (--rest_api_max_body_bytes)")
                self._respond(413, json.dumps({"error": message}), "application/json", True)
                return
            except ValueError:
                self._respond(400, json.dumps({"error": "Malformed Content-Length or chunked "
                                                        "body"}), "application/json", True)
                return
            path = urllib.parse.urlsplit(self.path).path
            if server.v2 is not None and (path == "/v2" or path.startswith("/v2/")):
                # The Open Inference Protocol (v2_rest.py): bytes and headers of its own.
                with server.slots:
                    status, data, headers = server.v2.handle(self.command, path, body,
                                                             self.headers)
                self._respond_bytes(status, data, headers, server.closing)
                return
            with server.slots:
                status, payload, content_type = server.api.handle(self.command, path, body)
            self._respond(status, payload, content_type, server.closing)
        finally:
            server.end_request(self)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _dispatch  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (base signature)
        log.debug("REST %s - %s", self.address_string(), format % args)


class RestServer(ThreadingHTTPServer):
    # The Open Inference Protocol's handler (v2_rest.V2RestApi), when the server has set it.
    v2: V2RestApi | None = None
    daemon_threads = True  # idle keep-alive connections must not hold up exit
    request_queue_size = 128  # many clients connect at once under load

    def __init__(self, port: int, api: RestApi, max_body_bytes: int, num_threads: int,
                 cors: bool = False, idle_timeout_s: float = 30.0, max_connections: int = 0):
        self.api = api
        self.max_connections = max_connections if max_connections > 0 else None
        self._connections = 0  # open connections, each with its handler thread
        self._connections_lock = threading.Lock()
        self.max_body_bytes = max_body_bytes
        self.cors = cors
        self.idle_timeout_s = idle_timeout_s if idle_timeout_s > 0 else None
        # connection -> when its request (line, headers, body) must be in by.
        self._reading: dict[socket.socket, float] = {}
        self._reading_lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(num_threads)
        self.closing = False
        self._in_flight: set[_Handler] = set()  # requests being answered
        self._idle = threading.Condition()
        self._connection_errors = _OncePerClass()
        super().__init__(("0.0.0.0", port), _Handler)

    @property
    def _active(self) -> int:
        return len(self._in_flight)

    def begin_request(self, handler: _Handler) -> bool:
        with self._idle:
            if self.closing:
                return False
            self._in_flight.add(handler)
            return True

    def end_request(self, handler: _Handler) -> None:
        with self._idle:
            self._in_flight.discard(handler)
            self._idle.notify_all()

    def handle_error(self, request: object, client_address: object) -> None:
        """A connection ended by an exception outside a request's answer: a client that
        went away (reset, broken pipe: what every reaped slow-loris connection does) or a
        socket timeout. One log line per class of error, not a traceback per connection
        (socketserver's default), which let 300 slow clients write 421 KB of log."""
        error = sys.exc_info()[1]
        kind = type(error).__name__ if error is not None else "unknown"
        self._connection_errors.note(kind, f"REST: %d connection(s) ended by {kind} "
                                           "(clients that went away, timed out or were "
                                           "closed for being too slow)")

    # -- a bound on open connections ----------------------------------------------------
    def process_request(self, request: socket.socket, client_address: object) -> None:
        with self._connections_lock:
            full = self.max_connections is not None and self._connections >= self.max_connections
            if not full:
                self._connections += 1
        if full:
            self._refuse(request, f"Too many connections: the server holds "
                                  f"{self.max_connections} (--rest_api_max_connections); "
                                  "retry later",
                         f"REST: %d connection(s) refused, {self.max_connections} open "
                         "(--rest_api_max_connections)")
            return
        try:
            super().process_request(request, client_address)  # a thread for the connection
        except RuntimeError:  # "can't start new thread": out of threads or memory
            with self._connections_lock:
                self._connections -= 1
            # Answered 503 from here rather than dropped (an empty reply to the client).
            self._refuse(request, "the server cannot start a thread for this connection "
                                  "(out of threads or memory); retry later",
                         "REST: %d connection(s) refused: no thread could be started for "
                         "them (raise the process's thread limit, or lower "
                         "--rest_api_max_connections)")
        except BaseException:
            with self._connections_lock:
                self._connections -= 1
            raise

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._connections_lock:
                self._connections -= 1

    def _refuse(self, conn: socket.socket, message: str, log_line: str) -> None:
        """Answer 503 without a thread or a blocking call (the accept loop runs this)."""
        body = json.dumps({"error": message}).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        try:
            conn.setblocking(False)
            try:  # what the client already sent: unread, closing would reset the connection
                for _ in range(16):  # (and the client could lose the answer); bounded
                    if not conn.recv(65536):
                        break
            except (BlockingIOError, InterruptedError):
                pass
            conn.send(head + body)  # small: fits the socket's send buffer
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            conn.close()
        self._connection_errors.note(log_line, log_line)

    # -- slow clients: a whole request must arrive within the idle timeout ------------
    def reading_started(self, conn: socket.socket) -> None:
        if self.idle_timeout_s is not None:
            with self._reading_lock:
                self._reading[conn] = time.monotonic() + self.idle_timeout_s

    def reading_done(self, conn: socket.socket) -> None:
        with self._reading_lock:
            self._reading.pop(conn, None)

    def _reap(self) -> None:
        """Close connections whose request has not fully arrived by its deadline
        (slow-loris: a byte every few seconds never trips the socket timeout)."""
        assert self.idle_timeout_s is not None
        period = min(1.0, self.idle_timeout_s / 4)
        while not self.closing:
            time.sleep(period)
            now = time.monotonic()
            with self._reading_lock:
                late = [c for c, deadline in self._reading.items() if deadline < now]
                for conn in late:
                    del self._reading[conn]
            for conn in late:
                try:
                    conn.shutdown(socket.SHUT_RDWR)  # the handler's read returns at once
                except OSError:
                    pass

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="rest", daemon=True)
        thread.start()
        if self.idle_timeout_s is not None:
            threading.Thread(target=self._reap, name="rest-reaper", daemon=True).start()
        return thread

    def stop(self, grace_s: float, on_waiting: Callable[[int], None] | None = None) -> None:
        """Stop accepting (a new connection is refused at once), let in-flight requests
        finish (up to `grace_s`), answer those still running 503 UNAVAILABLE, close."""
        with self._idle:
            self.closing = True  # from here on, requests are answered 503
            if self._active and on_waiting:
                on_waiting(self._active)
        self.shutdown()  # takes up to the accept loop's poll interval (0.5 s)
        # Close the listening socket now, not after the grace period: a client connecting
        # meanwhile is refused at once instead of waiting in the backlog to be reset.
        self.socket.close()
        with self._idle:
            self._idle.wait_for(lambda: self._active == 0, grace_s)
            late = list(self._in_flight)
        for handler in late:  # the process exits next: an answer beats an empty reply
            handler.answer_unavailable()
        if late:
            log.warning("REST: %d request(s) still running after the %g s grace period "
                        "answered 503 UNAVAILABLE", len(late), grace_s)
        self.server_close()


class _OncePerClass:
    """Log lines about connections, one per class of event: the first at once, then at
    most one per `period` seconds with the count since, so a flood of refused or broken
    connections costs a few lines, not one (or a traceback) per connection."""

    def __init__(self, period: float = 10.0) -> None:
        self.period = period
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._logged: dict[str, float] = {}

    def note(self, kind: str, line: str) -> None:
        """Count one event of `kind`; `line` has one %d, for the count."""
        now = time.monotonic()
        with self._lock:
            count = self._counts.get(kind, 0) + 1
            if now - self._logged.get(kind, -1e9) < self.period:
                self._counts[kind] = count
                return
            self._counts[kind], self._logged[kind] = 0, now
        log.warning(line, count)
