"""A text model compiled with free sequence lengths, served: the metadata shows the
lengths it accepts (-1 named by its bounds, "1..32"), calls at two lengths through the
official TF Serving gRPC client give TensorFlow's numbers, and a request outside the
bounds is refused naming the input, the dimension and the bounds. A length's first
request runs on TensorFlow while it compiles (the server's fallback counter says so),
except the lengths of the warm-up file, compiled before the version is served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2

import neuronish.saved_model
from neuronish.warmup_file import WARMUP_FILE, warmup_records
from tests.neuronish.test_free_dims import MAX_LENGTH, _free_text_model, _text
from tests.serving.harness import (
    Server,
    copy_version,
    predict_request,
    run_clients,
    running_server,
    write_text,
)


@pytest.fixture(scope="module")
def text_model(serving_dir: Path) -> tuple[str, str]:
    src = _free_text_model(serving_dir / "free_text")
    out = serving_dir / "free_text_neuron"
    report = neuronish.saved_model.compile(src, str(out))
    assert report["OnNeuronRatio"] == 1.0, report
    return src, str(out)


@pytest.fixture(scope="module")
def server(serving_dir: Path, text_model: tuple[str, str]) -> Iterator[Server]:
    root = serving_dir / "free_dims"
    copy_version(text_model[1], root / "models" / "text", 1)
    # Batching on, with TF Serving's pad_variable_length_inputs: requests of different
    # lengths never meet in one batch (the queues are per row shape), so nothing is
    # padded and each length runs on its own executable.
    batching = write_text(root / "batching.config", "max_batch_size { value: 8 }\n"
                          "batch_timeout_micros { value: 5000 }\n"
                          "num_batch_threads { value: 2 }\n"
                          "pad_variable_length_inputs: true\n")
    args = ["--model_name=text", f"--model_base_path={root / 'models' / 'text'}",
            "--enable_batching", f"--batching_parameters_file={batching}"]
    with running_server(args, root, {"text": [1]}) as server:
        yield server


def test_metadata_shows_the_bounds(server: Server) -> None:
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "text"
    response = server.predictions.GetModelMetadata(request, timeout=30)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signature_map)
    inputs = signature_map.signature_def["serving_default"].inputs
    for key in ("token_ids", "segment_ids", "padding_mask"):
        assert [(d.size, d.name) for d in inputs[key].tensor_shape.dim] == [
            (-1, ""), (-1, f"1..{MAX_LENGTH}")]


def test_two_lengths_and_one_too_long(server: Server, text_model: tuple[str, str]) -> None:
    original = tf.saved_model.load(text_model[0]).signatures["serving_default"]
    for batch, length in ((2, 7), (1, 16)):
        feeds = _text(batch, length, seed=length)
        response = server.predictions.Predict(
            predict_request("text", {k: v.numpy() for k, v in feeds.items()}), timeout=120)
        np.testing.assert_allclose(tf.make_ndarray(response.outputs["output_0"]),
                                   original(**feeds)["output_0"], rtol=1e-5, atol=1e-5)
    # Clients at two lengths at once: batched by length, each row TensorFlow's.
    want = {length: original(**_text(1, length, seed=length))["output_0"].numpy()
            for length in (7, 16)}

    def call(client: int, _: int) -> None:
        length = (7, 16)[client % 2]
        request = predict_request("text", {k: v.numpy() for k, v in
                                           _text(1, length, seed=length).items()})
        got = tf.make_ndarray(server.predictions.Predict(request, timeout=120).outputs[
            "output_0"])
        np.testing.assert_allclose(got, want[length], rtol=1e-5, atol=1e-5)

    calls, errors = run_clients(4, 2.0, call)
    assert calls > 0 and not errors, errors[:3]
    too_long = {k: v.numpy() for k, v in _text(1, MAX_LENGTH + 8, seed=0).items()}
    with pytest.raises(grpc.RpcError) as e:
        server.predictions.Predict(predict_request("text", too_long), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"takes sizes 1 to {MAX_LENGTH} in dimension 1" in e.value.details()


FALLBACK_CALLS = ":neuronish:neuron_op:fallback_calls"


def _fallback_calls(server: Server) -> float:
    """The server's fallback counter, over its ops."""
    status, text = server.http("GET", "/monitoring/prometheus/metrics")
    assert status == 200 and isinstance(text, str), text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith(FALLBACK_CALLS + "{"))


def test_warm_up_compiles_its_lengths_before_serving(serving_dir: Path,
                                                     text_model: tuple[str, str]) -> None:
    root = serving_dir / "free_dims_warm"
    version = copy_version(text_model[1], root / "models" / "text", 1)
    warm = _text(1, 9, seed=9)
    (version / WARMUP_FILE).parent.mkdir(exist_ok=True)
    (version / WARMUP_FILE).write_bytes(warmup_records(
        "serving_default", {k: v.numpy() for k, v in warm.items()}))
    monitoring = write_text(root / "monitoring.config", "prometheus_config { enable: true }\n")
    args = ["--model_name=text", f"--model_base_path={root / 'models' / 'text'}",
            f"--monitoring_config_file={monitoring}"]
    original = tf.saved_model.load(text_model[0]).signatures["serving_default"]
    with running_server(args, root, {"text": [1]}) as server:
        # the warm-up's call ran on TensorFlow while length 9 compiled (once per op)
        warmed = _fallback_calls(server)
        assert warmed >= 1
        for feeds, fell_back in ((warm, 0), (_text(2, 11, seed=11), 1)):
            response = server.predictions.Predict(
                predict_request("text", {k: v.numpy() for k, v in feeds.items()}), timeout=120)
            np.testing.assert_allclose(tf.make_ndarray(response.outputs["output_0"]),
                                       original(**feeds)["output_0"], rtol=1e-5, atol=1e-5)
            # length 9 on the device; length 11, new, on TensorFlow while it compiles
            assert _fallback_calls(server) == warmed * (1 + fell_back)
