"""The Open Inference Protocol's gRPC service, `inference.GRPCInferenceService`, on the
gRPC port beside TF Serving's services.

The servicer subclasses the one generated from proto/grpc_predict_v2.proto, so the
service, method and message names are the protocol's by construction. Inputs come as
`raw_input_contents` (one entry per input, for all inputs) or as typed `contents`;
the answer carries `raw_output_contents` when the request used raw data (as
tritonclient does), else typed `contents`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from .metrics import Metrics
from .proto import grpc_predict_v2_pb2 as pb
from .proto import grpc_predict_v2_pb2_grpc as pb_grpc
from .status import INTERNAL, OK, ServingError, grpc_status, internal_error, invalid_argument
from .v2 import InputTensor, V2Service, to_raw

log = logging.getLogger("neuronish.serving")
T = TypeVar("T")
ENTRYPOINT = "GRPC"


def _deadline(context: grpc.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    # grpc reports "no deadline" as a huge number of seconds.
    return None if remaining is None or remaining > 1e8 else time.monotonic() + remaining


def _call(metrics: Metrics, api: str, model: str, context: grpc.ServicerContext,
          fn: Callable[[], T]) -> T:
    """Run `fn`, turning a ServingError into its gRPC status (TF Serving's mapping, as
    the PredictionService answers), and count it."""
    start = time.perf_counter()
    code = OK
    try:
        return fn()
    except ServingError as e:
        code = e.code
        context.abort(grpc_status(e.code), e.message)
    except Exception:
        code = INTERNAL
        context.abort(grpc.StatusCode.INTERNAL, internal_error(log, api).message)
    finally:
        metrics.record_request(model, api, ENTRYPOINT, ServingError(code, "").code_name,
                               (time.perf_counter() - start) * 1e6)
    raise AssertionError("unreachable: context.abort raises")

# Which typed-contents field holds each datatype (FP16 and BF16 have none: raw only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def _parameter(value: pb.InferParameter) -> object:
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def request_inputs(request: pb.ModelInferRequest) -> list[InputTensor]:
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise invalid_argument(f"raw_input_contents has {len(raw)} entries for "
                               f"{len(request.inputs)} inputs; give one per input, or none")
    inputs = []
    for i, tensor in enumerate(request.inputs):
        if raw:
            if tensor.HasField("contents"):
                raise invalid_argument(f"input '{tensor.name}' has contents while the request "
                                       "uses raw_input_contents")
            data: object = raw[i]
        else:
            field = CONTENTS_FIELD.get(tensor.datatype)
            if field is None:
                raise invalid_argument(f"input '{tensor.name}': {tensor.datatype!r} data must "
                                       "come in raw_input_contents (it has no contents field)")
            data = list(getattr(tensor.contents, field))
        inputs.append(InputTensor(tensor.name, tensor.datatype, tuple(tensor.shape), data))
    return inputs


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, service: V2Service, metrics: Metrics):
        self.service = service
        self.metrics = metrics

    def ServerLive(self, request: pb.ServerLiveRequest,  # noqa: N802 (generated names)
                   context: grpc.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    def ServerReady(self, request: pb.ServerReadyRequest,  # noqa: N802
                    context: grpc.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.ready())

    def ModelReady(self, request: pb.ModelReadyRequest,  # noqa: N802
                   context: grpc.ServicerContext) -> pb.ModelReadyResponse:
        return _call(self.metrics, "v2_model_ready", request.name, context,
                     lambda: pb.ModelReadyResponse(
                         ready=self.service.model_ready(request.name, request.version)))

    def ServerMetadata(self, request: pb.ServerMetadataRequest,  # noqa: N802
                       context: grpc.ServicerContext) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**self.service.server_metadata())

    def ModelMetadata(self, request: pb.ModelMetadataRequest,  # noqa: N802
                      context: grpc.ServicerContext) -> pb.ModelMetadataResponse:
        def run() -> pb.ModelMetadataResponse:
            doc = self.service.model_metadata(request.name, request.version)
            return pb.ModelMetadataResponse(
                name=doc["name"], versions=doc["versions"], platform=doc["platform"],
                inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in doc["inputs"]],
                outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in doc["outputs"]])

        return _call(self.metrics, "v2_model_metadata", request.name, context, run)

    def ModelInfer(self, request: pb.ModelInferRequest,  # noqa: N802
                   context: grpc.ServicerContext) -> pb.ModelInferResponse:
        def run() -> pb.ModelInferResponse:
            signature = _parameter(request.parameters["signature_name"]) \
                if "signature_name" in request.parameters else ""
            if not isinstance(signature, str):
                raise invalid_argument("the signature_name parameter must be a string")
            result = self.service.infer(request.model_name, request.model_version,
                                        request_inputs(request),
                                        [o.name for o in request.outputs], signature,
                                        _deadline(context))
            response = pb.ModelInferResponse(model_name=result.model_name,
                                             model_version=result.model_version,
                                             id=request.id)
            # Raw data for every output or for none (the protocol's rule): raw when the
            # request sent raw, or when an output's datatype has no contents field.
            raw = bool(request.raw_input_contents) or any(
                t not in CONTENTS_FIELD for t in result.datatypes.values())
            for name, array in result.outputs.items():
                datatype = result.datatypes[name]
                out = response.outputs.add(name=name, datatype=datatype, shape=array.shape)
                if raw:
                    response.raw_output_contents.append(to_raw(array, datatype))
                else:
                    values = array.reshape(-1)
                    getattr(out.contents, CONTENTS_FIELD[datatype]).extend(
                        list(values) if datatype == "BYTES" else values.tolist())
            return response

        return _call(self.metrics, "v2_infer", request.model_name, context, run)
