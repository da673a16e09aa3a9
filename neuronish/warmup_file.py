"""TF Serving's warm-up file for a compiled model, from the compile's example inputs.

TF Serving (and neuronish-model-server) replay `assets.extra/tf_serving_warmup_requests`
when a version loads, before it is served: a TFRecord file of `PredictionLog`
records. `neuronish.saved_model.compile(..., model_feed_dict=..., warmup_requests=True)`
writes one record, a Predict of the main signature on the examples, so the server's
first real request does not pay for first-call work.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping

import numpy as np

from .errors import SavedModelError

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


def warmup_records(signature_key: str, model_feed_dict: Mapping[str, object]) -> bytes:
    """The file's bytes: one PredictionLog whose request feeds `model_feed_dict` to
    `signature_key` (the model name is left empty: the server runs it on the version
    being loaded, whatever it is served as)."""
    try:
        from tensorflow_serving.apis import predict_pb2, prediction_log_pb2
    except ImportError:
        raise SavedModelError("warmup_requests needs tensorflow-serving-api (pip install "
                              "'neuronish[serving]')") from None
    import tensorflow as tf

    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = signature_key
    for key, value in model_feed_dict.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(np.asarray(value)))
    record = prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request)).SerializeToString()
    with tempfile.TemporaryDirectory(prefix="neuronish-warmup-") as tmp:
        path = os.path.join(tmp, "records")
        with tf.io.TFRecordWriter(path) as writer:
            writer.write(record)
        with open(path, "rb") as f:
            return f.read()
