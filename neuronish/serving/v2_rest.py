"""The Open Inference Protocol's HTTP/REST endpoints, on the REST port beside TF Serving's.

    GET  /v2                                                   server metadata
    GET  /v2/health/live | /v2/health/ready                    200 yes, 400 no (empty body)
    GET  /v2/models/{name}[/versions/{v}]                      model metadata
    GET  /v2/models/{name}[/versions/{v}]/ready                200 yes, 400 no
    POST /v2/models/{name}[/versions/{v}]/infer                inference

Binary tensor data (the protocol's extension): with an
`Inference-Header-Content-Length: N` header, the first N bytes of the body are the
JSON request and the rest are the inputs' data, each input whose parameters give a
`binary_data_size` taking that many bytes in turn. Outputs asked for with
`"binary_data": true` (or all, with the request parameter `binary_data_output`) come
back the same way. Errors are `{"error": "..."}` with the status TF Serving's REST API
gives the same error.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from .codec import REST_COUNTED, rest_request_bytes
from .json_codec import parse_body
from .metrics import Metrics
from .status import INTERNAL, OK, ServingError, http_status, internal_error, invalid_argument
from .v2 import InferResult, InputTensor, V2Service, to_list, to_raw

log = logging.getLogger("neuronish.serving")
ENTRYPOINT = "REST"
HEADER_LENGTH = "Inference-Header-Content-Length"
_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer)?")
Answer = tuple[int, bytes, list[tuple[str, str]]]


def _json(doc: object, status: int = 200) -> Answer:
    return status, json.dumps(doc).encode("utf-8"), [("Content-Type", "application/json")]


def _flatten(data: Any) -> list:
    """The protocol lets `data` be flat or nested (row-major): the flat list."""
    if not isinstance(data, list):
        return [data]
    flat: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _parameters(doc: Mapping, where: str) -> dict:
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise invalid_argument(f"{where}: 'parameters' must be an object")
    return parameters


def parse_inputs(doc: Any, binary: bytes) -> list[InputTensor]:
    """The request's inputs, binary data cut from `binary` in input order."""
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise invalid_argument("the inference request must be a JSON object with an 'inputs' "
                               "list")
    inputs, at = [], 0
    for i, item in enumerate(doc["inputs"]):
        if not isinstance(item, dict):
            raise invalid_argument(f"inputs[{i}] must be an object")
        name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise invalid_argument(f"inputs[{i}] needs a string 'name' and 'datatype'")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                  for d in shape):
            raise invalid_argument(f"input '{name}': 'shape' must be a list of integers")
        size = _parameters(item, f"input '{name}'").get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or at + size > len(binary):
                raise invalid_argument(f"input '{name}': binary_data_size {size!r} does not fit "
                                       f"the {len(binary) - at} bytes of binary data left")
            if "data" in item:
                raise invalid_argument(f"input '{name}' has both 'data' and binary_data_size")
            data: Any = binary[at:at + size]
            at += size
        elif "data" in item:
            data = _flatten(item["data"])
        else:
            raise invalid_argument(f"input '{name}' has neither 'data' nor binary_data_size")
        inputs.append(InputTensor(name, datatype, tuple(shape), data))
    if at != len(binary):
        raise invalid_argument(f"{len(binary) - at} bytes of binary data after the JSON header "
                               "belong to no input (binary_data_size)")
    return inputs


def encode_response(result: InferResult, request_id: str, binary: Mapping[str, bool],
                    binary_default: bool) -> Answer:
    outputs, chunks = [], []
    for name, array in result.outputs.items():
        datatype = result.datatypes[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype,
                                 "shape": [int(d) for d in array.shape]}
        if binary.get(name, binary_default):
            raw = to_raw(array, datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = to_list(array, datatype)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": result.model_name,
                           "model_version": result.model_version, "outputs": outputs}
    if request_id:
        doc["id"] = request_id
    header = json.dumps(doc).encode("utf-8")
    if not chunks:
        return 200, header, [("Content-Type", "application/json")]
    return 200, header + b"".join(chunks), [("Content-Type", "application/octet-stream"),
                                            (HEADER_LENGTH, str(len(header)))]


class V2RestApi:
    """Method, path, body and headers -> (HTTP status, body, headers). No sockets here."""

    def __init__(self, service: V2Service, metrics: Metrics, timeout_ms: int):
        self.service = service
        self.metrics = metrics
        self.timeout_ms = timeout_ms

    def handle(self, method: str, path: str, body: bytes,
               headers: Mapping[str, str]) -> Answer:
        start = time.perf_counter()
        api, model, code = "v2", "", OK
        try:
            if method == "GET" and path in ("/v2", "/v2/"):
                api = "v2_server_metadata"
                return _json(self.service.server_metadata())
            if method == "GET" and path == "/v2/health/live":
                return 200 if self.service.live() else 400, b"", []
            if method == "GET" and path == "/v2/health/ready":
                return 200 if self.service.ready() else 400, b"", []
            match = _MODEL.fullmatch(path)
            if match is None:
                return _json({"error": f"Not found: {method} {path}"}, 404)
            model = urllib.parse.unquote(match.group(1))
            version = urllib.parse.unquote(match.group(2) or "")
            what = match.group(3)
            if method == "GET" and what == "/ready":
                return 200 if self.service.model_ready(model, version) else 400, b"", []
            if method == "GET" and what is None:
                api = "v2_model_metadata"
                return _json(self.service.model_metadata(model, version))
            if method == "POST" and what == "/infer":
                api = "v2_infer"
                deadline = self.service.core.deadline(
                    (time.monotonic() + self.timeout_ms / 1000) if self.timeout_ms > 0 else None)
                # Reserved from the server-wide budget (shared with gRPC) before parsing.
                with self.service.core.memory.hold(rest_request_bytes(body), deadline,
                                                   REST_COUNTED):
                    return self._infer(model, version, body, headers, deadline)
            raise invalid_argument(f"Malformed request: {method} {path}")
        except ServingError as e:
            code = e.code
            return _json({"error": e.message}, http_status(e.code))
        except Exception:  # a bug must cost one request, not the connection
            code = INTERNAL
            return _json({"error": internal_error(log, f"REST {method} {path}").message}, 500)
        finally:
            if api != "v2":
                self.metrics.record_request(model, api, ENTRYPOINT,
                                            ServingError(code, "").code_name,
                                            (time.perf_counter() - start) * 1e6)

    def _infer(self, model: str, version: str, body: bytes,
               headers: Mapping[str, str], deadline: float | None) -> Answer:
        length = headers.get(HEADER_LENGTH)
        if length is not None:
            digits = length.strip()
            if not (digits.isascii() and digits.isdigit() and len(digits) <= 18) \
                    or int(digits) > len(body):
                raise invalid_argument(f"{HEADER_LENGTH}: {length!r} is not a length within "
                                       f"the {len(body)}-byte body")
            header, binary = body[:int(length)], body[int(length):]
        else:
            header, binary = body, b""
        try:
            doc = parse_body(header)  # our messages; too deep a nesting is 400, not 500
        except ServingError as e:
            raise invalid_argument(f"the inference request is not JSON: {e.message}") from None
        inputs = parse_inputs(doc, binary)
        parameters = _parameters(doc, "request")
        requested = doc.get("outputs") or []
        if not isinstance(requested, list) or not all(
                isinstance(o, dict) and isinstance(o.get("name"), str) for o in requested):
            raise invalid_argument("'outputs' must be a list of objects with a 'name'")
        binary_out = {o["name"]: bool(_parameters(o, f"output '{o['name']}'")
                                      .get("binary_data", False)) for o in requested}
        signature = parameters.get("signature_name", "")
        if not isinstance(signature, str):
            raise invalid_argument("the signature_name parameter must be a string")
        result = self.service.infer(model, version, inputs, [o["name"] for o in requested],
                                    signature, deadline)
        request_id = doc.get("id", "")
        return encode_response(result, request_id if isinstance(request_id, str) else "",
                               binary_out, bool(parameters.get("binary_data_output", False)))
