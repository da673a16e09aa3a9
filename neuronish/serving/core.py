"""The four inference APIs and metadata, independent of the wire protocol.

gRPC and REST both come here, so a request means the same thing and fails
the same way on both. Each call resolves its ModelSpec to one servable
version and holds it until the answer is built: the REST handler decodes its
JSON against the signature of the very version that then runs it, and an
unload never pulls a model from under a request.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    input_pb2,
    model_pb2,
    regression_pb2,
)

from . import signatures
from .batching import BatchScheduler
from .cancellation import Cancellation
from .codec import REQUEST_MEMORY_MULTIPLE, serialized_examples
from .manager import ModelManager
from .servable import Servable
from .signatures import Signature
from .status import DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ServingError, invalid_argument

SIGNATURE_DEF_FIELD = "signature_def"
Decoder = Callable[[Signature], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Target:
    """What a ModelSpec asks for."""

    name: str
    version: int | None = None
    label: str | None = None
    signature_name: str = ""

    @staticmethod
    def from_spec(spec: model_pb2.ModelSpec) -> Target:
        choice = spec.WhichOneof("version_choice")
        return Target(spec.name,
                      spec.version.value if choice == "version" else None,
                      spec.version_label if choice == "version_label" else None,
                      spec.signature_name)


def _model_spec(servable: Servable, signature_name: str) -> model_pb2.ModelSpec:
    """The response's ModelSpec: the version and signature that actually ran (TF
    Serving's MakeModelSpec names `serving_default` when the request left it empty)."""
    spec = model_pb2.ModelSpec(name=servable.name, signature_name=signature_name)
    spec.version.value = servable.version
    return spec


def check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise ServingError(DEADLINE_EXCEEDED, "Deadline exceeded before the model ran")


class MemoryBudget:
    """Request memory in flight, server-wide (`--request_memory_budget_bytes`).

    A gRPC Predict holds about `REQUEST_MEMORY_MULTIPLE` times its tensors' bytes
    while it is answered (codec.py lists the copies; benchmarks/serving_memory.py
    measured 7.7x), so it reserves that much before it is decoded; a JSON REST
    request reserves `codec.rest_request_bytes(body)` before it is parsed. A request that
    alone needs more than the budget is RESOURCE_EXHAUSTED at once; one that does
    not fit beside the requests in flight waits for them, until its deadline
    (then RESOURCE_EXHAUSTED). 0 = no budget."""

    def __init__(self, total: int):
        self.total = total
        self.used = 0
        self._free = threading.Condition()

    @contextlib.contextmanager
    def hold(self, nbytes: int, deadline: float | None,
             counted: str = f"{REQUEST_MEMORY_MULTIPLE}x its tensors") -> Iterator[None]:
        if self.total <= 0 or nbytes <= 0:
            yield
            return
        if nbytes > self.total:
            raise ServingError(RESOURCE_EXHAUSTED, f"the request needs about {nbytes} bytes of "
                               f"server memory ({counted}), more "
                               f"than the server's budget for requests in flight ({self.total}, "
                               "--request_memory_budget_bytes); split it into smaller requests")
        with self._free:
            while self.used + nbytes > self.total:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise ServingError(RESOURCE_EXHAUSTED, f"the request needs about {nbytes} "
                                       f"bytes of server memory and {self.used} of the "
                                       f"{self.total} budgeted (--request_memory_budget_bytes) "
                                       "are held by requests in flight until its deadline; "
                                       "retry later")
                self._free.wait(wait)
            self.used += nbytes
        try:
            yield
        finally:
            with self._free:
                self.used -= nbytes
                self._free.notify_all()


class ServingCore:
    def __init__(self, manager: ModelManager, scheduler: BatchScheduler | None,
                 method_name_check: bool = False, timeout_s: float = 0,
                 max_elements: int = 0, compute_threads: int = 64, memory_budget: int = 0):
        self.manager = manager
        self.scheduler = scheduler
        # --enable_signature_method_name_check: a signature's method_name must
        # match the API that calls it.
        self.method_name_check = method_name_check
        self.timeout_s = timeout_s  # --request_timeout_in_ms; 0 = the client's deadline only
        self.max_elements = max_elements  # --request_max_elements; 0 = no limit
        self.memory = MemoryBudget(memory_budget)
        # Calls with a deadline run here, so the request thread can stop waiting for
        # one at its deadline, answer, and cancel it.
        self._compute = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, compute_threads), thread_name_prefix="compute")

    def deadline(self, client_deadline: float | None) -> float | None:
        """The earlier of the client's deadline and the server's own timeout."""
        if self.timeout_s <= 0:
            return client_deadline
        own = time.monotonic() + self.timeout_s
        return own if client_deadline is None else min(own, client_deadline)

    def check_size(self, arrays: Mapping[str, np.ndarray]) -> None:
        total = sum(int(a.size) for a in arrays.values())
        if self.max_elements > 0 and total > self.max_elements:
            raise ServingError(RESOURCE_EXHAUSTED,
                               f"the request holds {total} elements, more than this server "
                               f"accepts in one request ({self.max_elements}, "
                               "--request_max_elements); split it into smaller requests")

    def stop(self) -> None:
        self._compute.shutdown(wait=False, cancel_futures=True)

    # -- predict ---------------------------------------------------------------------
    def predict(self, target: Target, decode: Decoder, output_filter: Iterable[str] = (),
                deadline: float | None = None, rest: bool = False
                ) -> tuple[model_pb2.ModelSpec, dict[str, np.ndarray]]:
        """Run a signature. `decode(signature)` turns the request into arrays."""
        with self.manager.acquire(target.name, target.version, target.label) as servable:
            signature = signatures.select(servable.signatures, target.signature_name,
                                          for_rest=rest)
            if self.method_name_check:
                signature.check_predict_method()
            inputs = decode(signature)
            self.check_size(inputs)
            signature.check_inputs(inputs)
            keys = signature.output_keys(output_filter)
            outputs = self._run(servable, signature, keys, inputs, deadline)
            return _model_spec(servable, signature.name), outputs

    def _run(self, servable: Servable, signature: Signature, keys: list[str],
             inputs: Mapping[str, np.ndarray], deadline: float | None
             ) -> dict[str, np.ndarray]:
        check_deadline(deadline)

        def run(batch: Mapping[str, np.ndarray],
                cancellation: Cancellation | None = None) -> dict[str, np.ndarray]:
            return servable.run(signature.name, batch, keys, cancellation)

        if self.scheduler is None:
            if deadline is None:
                return run(inputs)
            cancellation = Cancellation()
            future = self._compute.submit(run, inputs, cancellation)
            try:
                return future.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                future.cancel()  # not started yet: never starts
                cancellation.cancel()  # running: TensorFlow and the device stop computing it
                raise ServingError(DEADLINE_EXCEEDED, "Deadline exceeded while the model ran; "
                                                      "the call was abandoned") from None
        # Requests meet in a queue only if they can be concatenated on dimension 0.
        key = (servable.name, servable.version, signature.name, tuple(keys),
               tuple((k, a.dtype.str, a.shape[1:]) for k, a in sorted(inputs.items())))
        return self.scheduler.run(key, servable.name, run, inputs, deadline)

    # -- classify / regress ------------------------------------------------------------
    def _example_signature(self, servable: Servable, name: str) -> Signature:
        key = name or signatures.DEFAULT_SIGNATURE
        if key not in servable.signatures:
            raise invalid_argument(f"No signature was found with the name: {key}")
        return servable.signatures[key]

    def _run_examples(self, servable: Servable, signature: Signature,
                      request_input: input_pb2.Input, keys: list[str],
                      deadline: float | None) -> tuple[int, dict[str, np.ndarray]]:
        examples = serialized_examples(request_input)
        if self.max_elements > 0 and len(examples) > self.max_elements:
            raise ServingError(RESOURCE_EXHAUSTED,
                               f"the request holds {len(examples)} examples, more than this "
                               f"server accepts in one request ({self.max_elements}, "
                               "--request_max_elements); split it into smaller requests")
        input_key = next(iter(signature.inputs))
        signatures.check_array(signature.inputs[input_key], examples, signature.name)
        outputs = self._run(servable, signature, keys, {input_key: examples}, deadline)
        return len(examples), outputs

    def classify(self, target: Target, request_input: input_pb2.Input,
                 deadline: float | None = None) -> classification_pb2.ClassificationResponse:
        with self.manager.acquire(target.name, target.version, target.label) as servable:
            signature = self._example_signature(servable, target.signature_name)
            signature.check_classify(self.method_name_check)
            keys = [k for k in (signatures.CLASSIFY_OUTPUT_CLASSES,
                                signatures.CLASSIFY_OUTPUT_SCORES) if k in signature.outputs]
            n, outputs = self._run_examples(servable, signature, request_input, keys, deadline)
            response = classification_pb2.ClassificationResponse(
                model_spec=_model_spec(servable, signature.name))
        classes = outputs.get(signatures.CLASSIFY_OUTPUT_CLASSES)
        scores = outputs.get(signatures.CLASSIFY_OUTPUT_SCORES)
        for key, array, dtype in (("classes", classes, tf.string),
                                  ("scores", scores, tf.float32)):
            if array is None:
                continue
            if array.ndim != 2:
                raise invalid_argument(f"Expected Tensor shape: [batch_size num_classes] but "
                                       f"got {list(array.shape)} for {key}")
            if signatures.array_dtype(array) != dtype:
                raise invalid_argument(f"Expected {key} Tensor of "
                                       f"{signatures.dtype_name(dtype)}. Got: "
                                       f"{signatures.dtype_name(signatures.array_dtype(array))}")
            if array.shape[0] != n:
                raise invalid_argument(f"Expected {key} output batch size of {n}. Got: "
                                       f"{array.shape[0]}")
        if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
            raise invalid_argument("Tensors class and score should match in dim_size(1). Got "
                                   f"{classes.shape[1]} vs. {scores.shape[1]}")
        num_classes = (classes if classes is not None else scores).shape[1]
        for i in range(n):
            result = response.result.classifications.add()
            for c in range(num_classes):
                item = result.classes.add()
                if classes is not None:
                    item.label = classes[i, c].decode("utf-8", "replace")
                if scores is not None:
                    item.score = float(scores[i, c])
        return response

    def regress(self, target: Target, request_input: input_pb2.Input,
                deadline: float | None = None) -> regression_pb2.RegressionResponse:
        with self.manager.acquire(target.name, target.version, target.label) as servable:
            signature = self._example_signature(servable, target.signature_name)
            signature.check_regress(self.method_name_check)
            n, outputs = self._run_examples(servable, signature, request_input,
                                            [signatures.REGRESS_OUTPUTS], deadline)
            response = regression_pb2.RegressionResponse(
                model_spec=_model_spec(servable, signature.name))
        values = outputs[signatures.REGRESS_OUTPUTS]
        if not (values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)):
            raise invalid_argument("Expected output Tensor shape to be either [batch_size] or "
                                   f"[batch_size, 1] but got {list(values.shape)}")
        if values.dtype != np.float32:
            raise invalid_argument(f"Expected output Tensor of DT_FLOAT. Got: {values.dtype}")
        if values.shape[0] != n:
            raise invalid_argument(f"Input batch size did not match output batch size: {n} vs. "
                                   f"{values.shape[0]}")
        for value in values.reshape(-1).tolist():
            response.result.regressions.add(value=value)
        return response

    # -- metadata and status -------------------------------------------------------------
    def metadata(self, target: Target, fields: Iterable[str]
                 ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        fields = list(fields)
        if not fields:
            raise invalid_argument("GetModelMetadataRequest must specify at least one "
                                   "metadata_field")
        for field in fields:
            if field != SIGNATURE_DEF_FIELD:
                raise invalid_argument(f"Metadata field {field} is not supported")
        with self.manager.acquire(target.name, target.version, target.label) as servable:
            response = get_model_metadata_pb2.GetModelMetadataResponse(
                model_spec=_model_spec(servable, ""))  # TF Serving names none here
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            for key, sd in servable.signature_defs.items():
                signature_map.signature_def[key].CopyFrom(sd)
        response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_map)
        return response

    def status(self, target: Target) -> get_model_status_pb2.GetModelStatusResponse:
        return self.manager.status(target.name, target.version, target.label)
