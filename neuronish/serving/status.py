"""One error type for the whole server, carrying TensorFlow's status code.

Every layer (manager, codec, batching) raises `ServingError(code, message)`
with the code TensorFlow Serving would use; only the edges translate it, gRPC
to its `StatusCode` and REST to an HTTP status with TF Serving's own table
(`tensorflow_serving/model_servers/http_server.cc`), so both protocols always
agree on what went wrong.
"""

from __future__ import annotations

import itertools
import logging

import grpc

# tensorflow/core/protobuf/error_codes.proto (also tensorflow.error.Code, which
# StatusProto.error_code uses); the numbers are gRPC's too.
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16

CODE_NAMES = {
    OK: "OK", CANCELLED: "CANCELLED", UNKNOWN: "UNKNOWN", INVALID_ARGUMENT: "INVALID_ARGUMENT",
    DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED", NOT_FOUND: "NOT_FOUND",
    ALREADY_EXISTS: "ALREADY_EXISTS", PERMISSION_DENIED: "PERMISSION_DENIED",
    RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED", FAILED_PRECONDITION: "FAILED_PRECONDITION",
    ABORTED: "ABORTED", OUT_OF_RANGE: "OUT_OF_RANGE", UNIMPLEMENTED: "UNIMPLEMENTED",
    INTERNAL: "INTERNAL", UNAVAILABLE: "UNAVAILABLE", DATA_LOSS: "DATA_LOSS",
    UNAUTHENTICATED: "UNAUTHENTICATED",
}

# TF Serving's ToHTTPStatusCode. Note FAILED_PRECONDITION and OUT_OF_RANGE are 400
# (not 412/416) and RESOURCE_EXHAUSTED is 429: clients written for TF Serving
# branch on exactly these.
_HTTP = {
    OK: 200, CANCELLED: 499, UNKNOWN: 500, INVALID_ARGUMENT: 400, DEADLINE_EXCEEDED: 504,
    NOT_FOUND: 404, ALREADY_EXISTS: 409, PERMISSION_DENIED: 403, RESOURCE_EXHAUSTED: 429,
    FAILED_PRECONDITION: 400, ABORTED: 409, OUT_OF_RANGE: 400, UNIMPLEMENTED: 501,
    INTERNAL: 500, UNAVAILABLE: 503, DATA_LOSS: 500, UNAUTHENTICATED: 401,
}

_GRPC = {code.value[0]: code for code in grpc.StatusCode}


class ServingError(Exception):
    """A request (or a load) failed with TensorFlow status `code`."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def code_name(self) -> str:
        return CODE_NAMES.get(self.code, "UNKNOWN")

    def __repr__(self) -> str:
        return f"ServingError({self.code_name}, {self.message!r})"


def invalid_argument(message: str) -> ServingError:
    return ServingError(INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    return ServingError(NOT_FOUND, message)


def failed_precondition(message: str) -> ServingError:
    return ServingError(FAILED_PRECONDITION, message)


def unavailable(message: str) -> ServingError:
    return ServingError(UNAVAILABLE, message)


def http_status(code: int) -> int:
    """The HTTP status TF Serving answers for TensorFlow status `code`."""
    return _HTTP.get(code, 500)


def grpc_status(code: int) -> grpc.StatusCode:
    return _GRPC.get(code, grpc.StatusCode.UNKNOWN)


_incidents = itertools.count(1)


def internal_error(log: logging.Logger, what: str) -> ServingError:
    """INTERNAL for the exception being handled (a bug of the server's, not the request's):
    its traceback goes to the log under an incident number, and the client gets only that
    number; a library's message (paths, internals, numpy's words) never reaches it."""
    incident = next(_incidents)
    log.exception("%s failed (incident %d)", what, incident)
    return ServingError(INTERNAL, f"internal error in neuronish-model-server (incident "
                                  f"{incident} in its log)")
