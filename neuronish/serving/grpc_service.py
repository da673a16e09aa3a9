"""gRPC: TF Serving's PredictionService and ModelService, on the generated stubs.

The servicers subclass the ones generated in `tensorflow-serving-api`, so the
method names, message types and service names are TF Serving's by
construction; `MultiInference` keeps the generated UNIMPLEMENTED answer.
A client's deadline becomes the request's deadline, as in TF Serving.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import grpc
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from .codec import check_request_size, to_ndarray, to_tensor_proto
from .core import ServingCore, Target
from .metrics import Metrics
from .signatures import Signature
from .status import INTERNAL, OK, ServingError, grpc_status, internal_error

log = logging.getLogger("neuronish.serving")
T = TypeVar("T")
ENTRYPOINT = "GRPC"


def _deadline(context: grpc.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    # grpc reports "no deadline" as a huge number of seconds.
    return None if remaining is None or remaining > 1e8 else time.monotonic() + remaining


def _call(metrics: Metrics, api: str, model: str, context: grpc.ServicerContext,
          fn: Callable[[], T]) -> T:
    """Run `fn`, turning a ServingError into the gRPC status, and count it."""
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


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, core: ServingCore, metrics: Metrics):
        self.core = core
        self.metrics = metrics

    def Predict(self, request: predict_pb2.PredictRequest,  # noqa: N802 (generated name)
                context: grpc.ServicerContext) -> predict_pb2.PredictResponse:
        def run() -> predict_pb2.PredictResponse:
            # Bounded before any work: shapes against the values carried, the total
            # against --request_max_elements, the memory against the server's budget.
            # The memory it will hold, reserved from the server's budget first.
            nbytes = check_request_size(dict(request.inputs), self.core.max_elements)
            deadline = self.core.deadline(_deadline(context))

            def decode(signature: Signature) -> dict:
                return {k: to_ndarray(k, v) for k, v in request.inputs.items()}

            with self.core.memory.hold(nbytes, deadline):
                spec, outputs = self.core.predict(
                    Target.from_spec(request.model_spec), decode, request.output_filter,
                    deadline)
                response = predict_pb2.PredictResponse(model_spec=spec)
                for key, array in outputs.items():
                    to_tensor_proto(array, into=response.outputs[key])
                return response
        return _call(self.metrics, "predict", request.model_spec.name, context, run)

    def GetModelMetadata(self, request: get_model_metadata_pb2.GetModelMetadataRequest,  # noqa: N802
                         context: grpc.ServicerContext
                         ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        return _call(self.metrics, "get_model_metadata", request.model_spec.name, context,
                     lambda: self.core.metadata(Target.from_spec(request.model_spec),
                                                request.metadata_field))

    def Classify(self, request: classification_pb2.ClassificationRequest,  # noqa: N802
                 context: grpc.ServicerContext) -> classification_pb2.ClassificationResponse:
        return _call(self.metrics, "classify", request.model_spec.name, context,
                     lambda: self.core.classify(Target.from_spec(request.model_spec),
                                                request.input,
                                                self.core.deadline(_deadline(context))))

    def Regress(self, request: regression_pb2.RegressionRequest,  # noqa: N802
                context: grpc.ServicerContext) -> regression_pb2.RegressionResponse:
        return _call(self.metrics, "regress", request.model_spec.name, context,
                     lambda: self.core.regress(Target.from_spec(request.model_spec),
                                               request.input,
                                               self.core.deadline(_deadline(context))))


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, core: ServingCore, metrics: Metrics,
                 reload_config: Callable[[object], None]):
        self.core = core
        self.metrics = metrics
        self.reload_config = reload_config

    def GetModelStatus(self, request: get_model_status_pb2.GetModelStatusRequest,  # noqa: N802
                       context: grpc.ServicerContext
                       ) -> get_model_status_pb2.GetModelStatusResponse:
        return _call(self.metrics, "get_model_status", request.model_spec.name, context,
                     lambda: self.core.status(Target.from_spec(request.model_spec)))

    def HandleReloadConfigRequest(  # noqa: N802
            self, request: model_management_pb2.ReloadConfigRequest,
            context: grpc.ServicerContext) -> model_management_pb2.ReloadConfigResponse:
        # TF Serving answers OK at the RPC level and puts the outcome in `status`.
        response = model_management_pb2.ReloadConfigResponse()
        try:
            self.reload_config(request.config)
        except ServingError as e:
            response.status.error_code = e.code
            response.status.error_message = e.message
        return response
