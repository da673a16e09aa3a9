"""A compiled model (NeuronOp) and its uncompiled original, side by side in one
server with batching on: same protocol, the compiled model's own results, and
merged batches reaching the device (seen by a probe on the NeuronOp itself)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

import neuronish
from tests.serving import device_probe
from tests.serving.harness import (
    Server,
    batching_and_metrics_flags,
    copy_version,
    metric_value,
    predict_request,
    run_clients,
    running_server,
    wait_for,
    write_text,
)

REPO = Path(__file__).resolve().parents[2]

COMPILED_BATCH = 4


@pytest.fixture(scope="module")
def compiled_mlp(serving_dir: Path, mlp_model: str) -> str:
    target = serving_dir / "compiled" / "mlp_neuron"
    report = neuronish.saved_model.compile(mlp_model, str(target), batch_size=COMPILED_BATCH)
    assert report["OnNeuronRatio"] > 0, report
    return str(target)


@pytest.fixture(scope="module")
def compiled_reference(compiled_mlp: str):  # noqa: ANN201 (a ConcreteFunction)
    return tf.saved_model.load(compiled_mlp).signatures["serving_default"]


@pytest.fixture(scope="module")
def server(serving_dir: Path, mlp_model: str, compiled_mlp: str) -> Iterator[Server]:
    root = serving_dir / "compiled"
    copy_version(mlp_model, root / "models" / "mlp", 1)
    copy_version(compiled_mlp, root / "models" / "mlp_neuron", 1)
    config = write_text(root / "models.config", "model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{root / "models" / name}" '
        'model_platform: "tensorflow" }\n' for name in ("mlp", "mlp_neuron")) + "}\n")
    args = [f"--model_config_file={config}", *batching_and_metrics_flags(root)]
    probe = {device_probe.PROBE_ENV: str(root / "neuron_op_calls.txt"), "PYTHONPATH": str(REPO)}
    with running_server(args, root, {"mlp": [1], "mlp_neuron": [1]},
                        command=[sys.executable, "-m", "tests.serving.device_probe"],
                        env=probe) as server:
        yield server


def _neuron_op_calls(server: Server) -> list[tuple[int, int]]:
    return device_probe.calls(str(server.log_path.parent / "neuron_op_calls.txt"))


def test_compiled_and_plain_predictions(server: Server, compiled_reference,
                                        mlp_reference) -> None:
    # A batch of exactly the allowed (and compiled) size: nothing is padded, so
    # the server's call is the in-process call.
    x = np.random.default_rng(2).standard_normal((COMPILED_BATCH, 32)).astype(np.float32)
    want_compiled = compiled_reference(x=tf.constant(x))["probs"].numpy()
    want_plain = mlp_reference(x=tf.constant(x))["probs"].numpy()
    for model, want in (("mlp_neuron", want_compiled), ("mlp", want_plain)):
        response = server.predictions.Predict(predict_request(model, {"x": x}), timeout=60)
        np.testing.assert_array_equal(tf.make_ndarray(response.outputs["probs"]), want)
        status, body = server.http("POST", f"/v1/models/{model}:predict",
                                   {"instances": x.tolist()})
        assert status == 200, body
        np.testing.assert_array_equal(np.array(body["predictions"], np.float32), want)
    # The device computes what TensorFlow computes.
    np.testing.assert_allclose(want_compiled, want_plain, rtol=1e-4, atol=1e-6)


def test_compiled_metadata_and_status(server: Server) -> None:
    signatures = {}
    for model in ("mlp", "mlp_neuron"):
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = model
        response = server.predictions.GetModelMetadata(request, timeout=30)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)
        sd = signature_map.signature_def["serving_default"]
        signatures[model] = ({k: (v.dtype, [d.size for d in v.tensor_shape.dim])
                              for k, v in sd.inputs.items()},
                             {k: v.dtype for k, v in sd.outputs.items()})
        assert server.available_versions(model) == [1]
    # Clients written for the original model work unchanged with the compiled one.
    assert signatures["mlp_neuron"] == signatures["mlp"]


def test_device_sees_merged_batches(server: Server, compiled_reference) -> None:
    rng = np.random.default_rng(3)
    pool = [rng.standard_normal((1, 32)).astype(np.float32) for _ in range(8)]
    want = [compiled_reference(x=tf.constant(x))["probs"].numpy() for x in pool]
    channels = [grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") for _ in range(8)]

    def call(client: int, i: int) -> None:
        k = (client + i) % len(pool)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channels[client % 8])
        response = stub.Predict(predict_request("mlp_neuron", {"x": pool[k]}), timeout=60)
        np.testing.assert_allclose(tf.make_ndarray(response.outputs["probs"]), want[k],
                                   rtol=1e-5, atol=1e-6)

    before = len(_neuron_op_calls(server))
    try:
        calls, errors = run_clients(64, 3.0, call)
    finally:
        for channel in channels:
            channel.close()
    assert not errors, errors[:5]
    device = _neuron_op_calls(server)[before:]
    # Every request had one row; batching pads with copies of a request's first
    # row. So a NeuronOp call holding several distinct rows ran several requests
    # at once: that, and fewer calls than requests, is what proves merging.
    merged = [rows for rows, distinct in device if distinct > 1]
    assert merged, device[:20]
    assert 0 < len(device) < calls
    # Padding (not merging) makes every call an allowed batch size.
    assert {rows for rows, _ in device} <= {4, 8, 16}, device[:20]


def test_prometheus_exports_device_cores_and_memory(server: Server) -> None:
    x = np.zeros((COMPILED_BATCH, 32), np.float32)
    server.predictions.Predict(predict_request("mlp_neuron", {"x": x}), timeout=60)
    status, text = server.http("GET", "/monitoring/prometheus/metrics")
    assert status == 200
    cores = [line for line in text.splitlines()
             if line.startswith(":neuronish:device:memory_total_bytes{")]
    assert cores, text[-2000:]
    names = [line.split('"')[1] for line in cores]
    used = {c: metric_value(text, ":neuronish:device:memory_used_bytes", core=c) for c in names}
    busy = {c: metric_value(text, ":neuronish:device:core_busy_seconds_total", core=c)
            for c in names}
    # The compiled model is loaded (its weights take device memory) and has run.
    assert max(used.values()) > 0 and max(busy.values()) > 0
    for c in names:
        util = metric_value(text, ":neuronish:device:core_utilization", core=c)
        assert 0.0 <= util <= 1.0


def test_a_request_past_its_deadline_is_cancelled_on_the_device(server: Server) -> None:
    """The server answers DEADLINE_EXCEEDED at the deadline and cancels the call: the
    NeuronOp's device call is abandoned (Cancelled), not computed for nobody."""
    x = np.full((1, 32), device_probe.HOLD, np.float32)  # held by the probe until cancelled
    before = len(device_probe.outcomes(str(server.log_path.parent / "neuron_op_calls.txt")))
    with pytest.raises(grpc.RpcError) as raised:
        server.predictions.Predict(predict_request("mlp_neuron", {"x": x}), timeout=1.0)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    def ended() -> list[tuple[int, int, str]]:
        path = str(server.log_path.parent / "neuron_op_calls.txt")
        return [o for o in device_probe.outcomes(path)[before:] if o[1] == 1]

    wait_for(lambda: any(o[2] != "ok" for o in ended()), "the held call to end", timeout=30)
    assert [o[2] for o in ended()] == ["Cancelled"]
    # The server, the model and the device go on serving.
    y = np.zeros((COMPILED_BATCH, 32), np.float32)
    response = server.predictions.Predict(predict_request("mlp_neuron", {"x": y}), timeout=60)
    assert tf.make_ndarray(response.outputs["probs"]).shape[0] == COMPILED_BATCH
