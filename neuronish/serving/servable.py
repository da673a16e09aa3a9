"""One loaded model version: its signatures, its callable functions, its users.

The signatures shown to clients are the SavedModel's own `SignatureDef`s read
from `saved_model.pb`, byte for byte what TF Serving's GetModelMetadata
returns; the functions that run them come from `tf.saved_model.load`, which
works the same for plain and compiled models (`NeuronOp` is registered by
`import neuronish`, done by the server before any load).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf
from google.protobuf import message, text_format
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from .cancellation import Cancellation
from .signatures import DEFAULT_SIGNATURE, Signature, with_accepted_shapes
from .status import (
    DATA_LOSS,
    INVALID_ARGUMENT,
    NOT_FOUND,
    UNKNOWN,
    ServingError,
    failed_precondition,
)


class Servable:
    def __init__(self, name: str, version: int, path: str,
                 signature_defs: Mapping[str, meta_graph_pb2.SignatureDef],
                 functions: Mapping[str, object], owner: object):
        self.name = name
        self.version = version
        self.path = path
        self.signature_defs = dict(signature_defs)
        # Only signatures with a function can run (not e.g. __saved_model_init_op,
        # whose "output" is an op with no dtype); metadata still lists them all.
        self.signatures = {k: Signature.from_signature_def(k, sd)
                           for k, sd in signature_defs.items() if k in functions}
        self._functions = dict(functions)
        self._owner = owner  # the loaded object; keeps the functions' variables alive
        self._users = 0
        self._idle = threading.Condition()

    # -- lifetime: requests hold the servable while they use it ------------------
    def hold(self) -> None:
        with self._idle:
            self._users += 1

    def unhold(self) -> None:
        with self._idle:
            self._users -= 1
            if self._users == 0:
                self._idle.notify_all()

    def wait_idle(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._users == 0)

    def release(self) -> None:
        self._functions.clear()
        self._owner = None

    # -- calls ---------------------------------------------------------------------
    def run(self, signature_name: str, inputs: Mapping[str, np.ndarray],
            output_keys: Sequence[str], cancellation: Cancellation | None = None
            ) -> dict[str, np.ndarray]:
        """Run a signature; with `cancellation`, another thread can stop the call."""
        function = self._functions.get(signature_name)
        if function is None:
            raise failed_precondition(f"signature '{signature_name}' of model {self.name} "
                                      f"version {self.version} has no function to run")

        def call() -> Mapping[str, tf.Tensor]:
            return function(**{k: tf.convert_to_tensor(v) for k, v in inputs.items()})

        try:
            outputs = call() if cancellation is None else cancellation.run(call)
        except tf.errors.OpError as e:
            raise ServingError(e.error_code, op_error_message(e.message)) from None
        return {k: outputs[k].numpy() for k in output_keys}

    def __repr__(self) -> str:
        return f"<Servable {self.name} version {self.version}>"


def read_meta_graph(path: str, tags: Sequence[str]) -> meta_graph_pb2.MetaGraphDef:
    """The MetaGraphDef of the SavedModel at `path` whose tag set is `tags`."""
    saved_model = saved_model_pb2.SavedModel()
    pb, pbtxt = os.path.join(path, "saved_model.pb"), os.path.join(path, "saved_model.pbtxt")
    try:
        if os.path.exists(pb):
            with open(pb, "rb") as handle:
                saved_model.ParseFromString(handle.read())
        elif os.path.exists(pbtxt):
            with open(pbtxt, encoding="utf-8") as handle:
                text_format.Parse(handle.read(), saved_model)
        else:
            raise ServingError(NOT_FOUND, "Could not find SavedModel .pb or .pbtxt at supplied "
                                          f"export directory path: {path}")
    except (message.DecodeError, text_format.ParseError) as e:
        raise ServingError(DATA_LOSS, f"Can't parse the SavedModel proto in {path}: "
                                      f"{e}") from None
    except OSError as e:
        raise ServingError(NOT_FOUND, f"Cannot read the SavedModel in {path}: "
                                      f"{e.strerror}") from None
    for meta_graph in saved_model.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == set(tags):
            return meta_graph
    found = [sorted(m.meta_info_def.tags) for m in saved_model.meta_graphs]
    raise ServingError(NOT_FOUND, f"Could not find meta graph def matching supplied tags: "
                                  f"{{ {' '.join(tags)} }} in {path}; it has {found}. To "
                                  "inspect available tag-sets in the SavedModel, please use "
                                  "the SavedModel CLI: `saved_model_cli`")


_EAGER_HEADER = re.compile(r"\AGraph execution error:\s*Detected at node \S+ defined at "
                           r"\(most recent call last\):\n")
_OP_SUFFIX = re.compile(r"\s*\[Op:__inference_[^\]]*\]\s*\Z")


def op_error_message(message: str) -> str:
    """A TensorFlow error as TF Serving reports it: what the kernel said and the node.
    Python's eager wrapper adds a header, the Python stack where the node was defined
    (file paths of the server's machine, when TensorFlow has them) and the traced
    function's internal name; none of that is the client's business."""
    match = _EAGER_HEADER.match(message)
    if match:
        lines = message[match.end():].split("\n")
        while lines and (not lines[0].strip() or lines[0].startswith(" ")
                         or lines[0] == "<stack traces unavailable>"):
            lines.pop(0)  # the stack: `  File "...", line N, in f` and its source lines
        message = "\n".join(lines)
    return _OP_SUFFIX.sub("", message)


def load_servable(name: str, version: int, path: str, tags: Sequence[str],
                  warmup: bool = True) -> Servable:
    meta_graph = read_meta_graph(path, tags)
    try:
        loaded = tf.saved_model.load(path, tags=list(tags))
    except tf.errors.OpError as e:
        hint = ""
        if "NeuronOp" in e.message:
            hint = (" (a compiled model needs the NeuronOp kernel: the server imports "
                    "neuronish for it; check that the op library builds)")
        raise ServingError(e.error_code, e.message + hint) from None
    except Exception as e:  # a broken SavedModel fails in many ways
        raise ServingError(UNKNOWN, f"{type(e).__name__}: {e}") from None
    available = getattr(loaded, "signatures", {})
    functions = {k: available[k] for k in meta_graph.signature_def if k in available}
    servable = Servable(name, version, path,
                        with_accepted_shapes(meta_graph.signature_def, path), functions, loaded)
    if warmup:
        from .startup import labelled_device_loads, load_on_device

        # A compiled version goes onto the device before it is served (startup.py).
        with labelled_device_loads(servable, meta_graph) as compiled:
            if warm_up(servable) == 0 and compiled:
                load_on_device(servable)
    return servable


WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_WARMUP_RECORDS = 1000  # TF Serving's limit


def warm_up(servable: Servable) -> int:
    """Replay the version's recorded requests (TF Serving's model warm-up) before it
    is served, so the first real request does not pay for first-call work (tracing,
    the NeuronOp loading its executable onto the device). A failing record fails
    the load, as in TF Serving. Returns the number of requests replayed."""
    from tensorflow_serving.apis import prediction_log_pb2

    from .codec import serialized_examples, to_ndarray

    path = os.path.join(servable.path, WARMUP_FILE)
    if not os.path.exists(path):
        return 0
    count = 0
    try:
        for record in tf.data.TFRecordDataset(path).take(MAX_WARMUP_RECORDS + 1):
            count += 1
            if count > MAX_WARMUP_RECORDS:
                raise ServingError(INVALID_ARGUMENT, f"more than {MAX_WARMUP_RECORDS} warmup "
                                                     "records")
            log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
            kind = log.WhichOneof("log_type")
            if kind == "predict_log":
                request = log.predict_log.request
                signature = servable.signatures.get(request.model_spec.signature_name
                                                    or DEFAULT_SIGNATURE)
                inputs = {k: to_ndarray(k, v) for k, v in request.inputs.items()}
            elif kind in ("classify_log", "regress_log"):
                request = getattr(log, kind).request
                signature = servable.signatures.get(request.model_spec.signature_name
                                                    or DEFAULT_SIGNATURE)
                inputs = {next(iter(signature.inputs)): serialized_examples(request.input)} \
                    if signature is not None else {}
            else:
                raise ServingError(INVALID_ARGUMENT, f"unsupported warmup record type {kind}")
            if signature is None:
                raise ServingError(INVALID_ARGUMENT, "a warmup record names an unknown "
                                                     "signature")
            signature.check_inputs(inputs)
            servable.run(signature.name, inputs, sorted(signature.outputs))
    except ServingError as e:
        raise ServingError(e.code, f"Model warmup failed at record {count} of {path}: "
                                   f"{e.message}") from None
    except tf.errors.OpError as e:
        raise ServingError(e.error_code, f"Cannot read warmup file {path}: {e.message}") from None
    # A shape first seen here compiles in the background (its record ran on TensorFlow,
    # neuronish/shape_specialize.py): wait, so the version serves it on the device.
    from neuronish.shape_specialize import wait_for_compiles

    wait_for_compiles()
    return count
