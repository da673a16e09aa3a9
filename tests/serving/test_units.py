"""The server's parts on their own, in-process and fast: REST JSON rules, the
TensorProto codec, the batch scheduler, version policies, config files, flags."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.config import model_server_config_pb2

from neuronish.serving import codec, config, json_codec, server
from neuronish.serving.batching import BatchScheduler
from neuronish.serving.manager import ModelManager, aspired_versions
from neuronish.serving.metrics import Metrics
from neuronish.serving.servable import Servable
from neuronish.serving.signatures import TensorSpec
from neuronish.serving.status import (
    DEADLINE_EXCEEDED,
    INVALID_ARGUMENT,
    NOT_FOUND,
    UNAVAILABLE,
    ServingError,
)

F32 = {"x": TensorSpec("x", tf.float32, (-1, 2))}
TWO = {"a": TensorSpec("a", tf.float32, (-1, 2)), "b": TensorSpec("b", tf.int64, (-1,))}


# ---------------------------------------------------------------- REST JSON


def test_row_and_columnar_decode() -> None:
    arrays, fmt = json_codec.decode_predict({"instances": [[1, 2.5], [3, 4]]}, F32)
    assert fmt == json_codec.ROW and arrays["x"].dtype == np.float32
    np.testing.assert_array_equal(arrays["x"], [[1, 2.5], [3, 4]])
    arrays, fmt = json_codec.decode_predict(
        {"instances": [{"a": [1, 2], "b": 3}, {"a": [4, 5], "b": 6}]}, TWO)
    assert fmt == json_codec.ROW and arrays["b"].tolist() == [3, 6]
    arrays, fmt = json_codec.decode_predict({"inputs": {"a": [[1, 2]], "b": [7]}}, TWO)
    assert fmt == json_codec.COLUMNAR and arrays["a"].shape == (1, 2)


@pytest.mark.parametrize("value,dtype,message", [
    (True, tf.float32, "Type: True is not of expected type: float"),
    (1.5, tf.int32, "is not of expected type: int32"),
    (300, tf.uint8, "is not of expected type: uint8"),
    (2**24 + 1, tf.float32, "without loss of precision"),
    (1e39, tf.float32, "without loss of precision"),
    ([[1], [1, 2]], tf.float32, "Encountered list at unexpected size"),
    ([[1], 2], tf.float32, "found at incorrect level"),
    ({"b64": "***"}, tf.string, "Unable to base64 decode"),
    ({"b64": "aGk=", "x": 1}, tf.string, "not formatted correctly for base64"),
    (None, tf.bool, "Type: Null is not of expected type: bool"),
])
def test_value_errors(value: object, dtype: tf.dtypes.DType, message: str) -> None:
    with pytest.raises(ServingError) as raised:
        json_codec.value_to_array(value, dtype)
    assert raised.value.code == INVALID_ARGUMENT and message in raised.value.message


def test_values() -> None:
    assert json_codec.value_to_array({"b64": "aGk"}, tf.string).tolist() == b"hi"
    assert json_codec.value_to_array(["a", {"b64": "aGk="}], tf.string).tolist() == [b"a", b"hi"]
    assert json_codec.value_to_array(5, tf.int64).shape == ()
    assert np.isnan(json_codec.value_to_array(float("nan"), tf.float32))
    assert json_codec.value_to_array([[], []], tf.float32).shape == (2, 0)


def test_encode_predict() -> None:
    outputs = {"y": np.array([[0.1, 1.0], [np.nan, -np.inf]], np.float32)}
    assert json_codec.encode_predict(outputs, json_codec.ROW) == \
        '{"predictions": [[0.1,1.0], [NaN,-Infinity]]}'
    assert json_codec.encode_predict(outputs, json_codec.COLUMNAR) == \
        '{"outputs": [[0.1,1.0],[NaN,-Infinity]]}'
    two = {"n": np.array([1, 2], np.int32), "s_bytes": np.array([b"\x00", b"a"], object)}
    assert json_codec.encode_predict(two, json_codec.ROW) == (
        '{"predictions": [{"n": 1, "s_bytes": {"b64": "AA=="}}, '
        '{"n": 2, "s_bytes": {"b64": "YQ=="}}]}')
    with pytest.raises(ServingError, match="inconsistent batch size"):
        json_codec.encode_predict({"a": np.zeros(2), "b": np.zeros(3)}, json_codec.ROW)


def test_examples_json() -> None:
    request_input = json_codec.decode_examples(
        {"context": {"c": "ctx"}, "examples": [{"f": [1.0, 2.5], "i": 3, "b": {"b64": "aGk="}}]},
        "classify")
    example = request_input.example_list_with_context.examples[0]
    assert list(example.features.feature["f"].float_list.value) == [1.0, 2.5]
    assert list(example.features.feature["i"].int64_list.value) == [3]
    assert list(example.features.feature["b"].bytes_list.value) == [b"hi"]
    with pytest.raises(ServingError, match="expecting type: float"):
        json_codec.decode_examples({"examples": [{"f": [1.0, 2]}]}, "regress")


# ---------------------------------------------------------------- TensorProto


def test_tensor_proto_round_trip() -> None:
    for array in (np.arange(6, dtype=np.float32).reshape(2, 3), np.array([True, False]),
                  np.array([[1, 2]], np.int64), np.array([b"a", b"bc"], object),
                  np.array([1.5], np.float16), np.array([1 + 2j], np.complex64)):
        proto = codec.to_tensor_proto(array)
        back = codec.to_ndarray("t", proto)
        assert back.shape == array.shape
        assert back.tolist() == array.tolist()
    assert list(codec.to_tensor_proto(np.array([0.5], np.float32)).float_val) == [0.5]
    broken = tf.make_tensor_proto(np.ones(4, np.float32))
    broken.tensor_content = broken.tensor_content[:3]
    with pytest.raises(ServingError, match="tensor parsing error: t"):
        codec.to_ndarray("t", broken)


# ---------------------------------------------------------------- batching


def _scheduler(**options: object) -> tuple[BatchScheduler, Metrics]:
    metrics = Metrics()
    return BatchScheduler(config.BatchingOptions(**options), metrics), metrics  # type: ignore


def test_scheduler_merges_pads_and_splits() -> None:
    scheduler, metrics = _scheduler(max_batch_size=8, batch_timeout_micros=200_000,
                                    num_batch_threads=1, allowed_batch_sizes=(4, 8))
    seen: list[int] = []

    def run(batch):  # noqa: ANN001, ANN202
        seen.append(len(batch["x"]))
        return {"y": batch["x"] * 2}

    results: dict[int, np.ndarray] = {}

    def submit(i: int) -> None:
        x = np.full((1 + i % 2, 3), float(i), np.float32)
        results[i] = scheduler.run("key", "m", run, {"x": x}, None)["y"]

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    scheduler.stop()
    assert sum(seen) <= 8 * len(seen) and all(s in (4, 8) for s in seen)
    assert len(seen) < 4  # merged
    for i, y in results.items():
        np.testing.assert_array_equal(y, np.full((1 + i % 2, 3), 2.0 * i))
    assert metrics.batch_size.count("m") == len(seen)


def test_scheduler_refuses_when_full_and_times_out() -> None:
    scheduler, metrics = _scheduler(max_batch_size=3, batch_timeout_micros=300_000,
                                    max_enqueued_batches=1, num_batch_threads=1)
    run = lambda b: {"y": b["x"]}  # noqa: E731
    waiter = threading.Thread(target=scheduler.run,
                              args=("k", "m", run, {"x": np.zeros((1, 1))}, None))
    waiter.start()
    time.sleep(0.05)
    with pytest.raises(ServingError) as raised:
        scheduler.run("k", "m", run, {"x": np.zeros((3, 1))}, None)
    assert raised.value.code == UNAVAILABLE and metrics.queue_full.value("m") == 1
    with pytest.raises(ServingError) as raised:
        scheduler.run("k", "m", run, {"x": np.zeros((4, 1))}, None)
    assert raised.value.code == INVALID_ARGUMENT
    with pytest.raises(ServingError) as raised:  # joins the waiting batch, then gives up
        scheduler.run("k", "m", run, {"x": np.zeros((1, 1))}, time.monotonic() + 0.05)
    assert raised.value.code == DEADLINE_EXCEEDED
    waiter.join()
    scheduler.stop()


def test_scheduler_passes_model_errors_to_every_task() -> None:
    scheduler, _ = _scheduler(max_batch_size=4, num_batch_threads=1)

    def run(batch):  # noqa: ANN001, ANN202
        raise ServingError(INVALID_ARGUMENT, "model says no")

    with pytest.raises(ServingError, match="model says no"):
        scheduler.run("k", "m", run, {"x": np.zeros((1, 1))}, None)
    scheduler.stop()


# ---------------------------------------------------------------- versions


def _policy(text: str) -> object:
    from google.protobuf import text_format
    from tensorflow_serving.config import file_system_storage_path_source_pb2 as fs

    return text_format.Parse(text, fs.FileSystemStoragePathSourceConfig.ServableVersionPolicy())


def test_version_policies() -> None:
    assert aspired_versions(_policy(""), [3, 1, 2]) == [3]
    assert aspired_versions(_policy("latest { num_versions: 2 }"), [3, 1, 2]) == [2, 3]
    assert aspired_versions(_policy("all {}"), [3, 1, 2]) == [1, 2, 3]
    assert aspired_versions(_policy("specific { versions: 1 versions: 7 }"), [1, 2]) == [1]


def test_manager_keeps_serving_when_a_new_version_fails(tmp_path: Path) -> None:
    for v in (1, 2):
        (tmp_path / str(v)).mkdir()
        (tmp_path / str(v) / "saved_model.pb").write_bytes(b"")

    def loader(name: str, version: int, path: str) -> Servable:
        if version == 2:
            raise ServingError(NOT_FOUND, "broken on purpose")
        return Servable(name, version, path, {}, {}, None)

    manager = ModelManager(poll_wait_seconds=0, max_num_load_retries=0, loader=loader)
    try:
        (tmp_path / "2").rename(tmp_path / "hidden")
        manager.set_config(config.single_model_config("m", str(tmp_path)))
        with manager.acquire("m") as servable:
            assert servable.version == 1
        (tmp_path / "hidden").rename(tmp_path / "2")
        manager.poll_once()
        assert manager.wait_until(lambda: not manager._models["m"].loading, 10)
        with manager.acquire("m") as servable:
            assert servable.version == 1  # 2 failed: 1 keeps serving
        statuses = {s.version: s for s in manager.status("m").model_version_status}
        assert statuses[2].status.error_code == NOT_FOUND
        assert "broken on purpose" in statuses[2].status.error_message
    finally:
        manager.stop()


def test_unload_waits_for_requests(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "saved_model.pb").write_bytes(b"")
    released = threading.Event()

    class Tracked(Servable):
        def release(self) -> None:
            released.set()

    manager = ModelManager(poll_wait_seconds=0,
                           loader=lambda n, v, p: Tracked(n, v, p, {}, {}, None))
    manager.set_config(config.single_model_config("m", str(tmp_path)))
    with manager.acquire("m"):
        manager.set_config(model_server_config_pb2.ModelServerConfig())  # drop the model
        time.sleep(0.2)
        assert not released.is_set()  # still held by this "request"
    assert released.wait(5)
    manager.stop()


# ---------------------------------------------------------------- config and flags


def test_config_files(tmp_path: Path) -> None:
    batching = tmp_path / "b.config"
    batching.write_text("max_batch_size { value: 8 }\nallowed_batch_sizes: 4\n"
                        "allowed_batch_sizes: 8\nnum_batch_threads { value: 3 }\n")
    options = config.read_batching_parameters(str(batching))
    assert (options.max_batch_size, options.allowed_batch_sizes, options.num_batch_threads,
            options.batch_timeout_micros, options.max_enqueued_batches) == (8, (4, 8), 3, 0, 10)
    batching.write_text("max_batch_size { value: 8 }\nallowed_batch_sizes: 4\n")
    with pytest.raises(config.ConfigError, match="must equal max_batch_size"):
        config.read_batching_parameters(str(batching))
    monitoring = tmp_path / "m.config"
    monitoring.write_text("prometheus_config { enable: true }")
    assert config.read_prometheus_path(str(monitoring)) == "/monitoring/prometheus/metrics"
    models = tmp_path / "models.config"
    models.write_text('model_config_list { config { name: "a" base_path: "/x" } '
                      'config { name: "a" base_path: "/y" } }')
    with pytest.raises(config.ConfigError, match="appears twice"):
        config.read_model_server_config(str(models))
    models.write_text("model_config_list { config { nme: 1 } }")
    with pytest.raises(config.ConfigError, match="Invalid protobuf file"):
        config.read_model_server_config(str(models))


def test_flags() -> None:
    options = server.parse_flags(["--port=9000", "--enable_batching", "--model_name=m",
                                  "--rest_api_timeout_in_ms=5"])
    assert (options.port, options.enable_batching, options.model_name,
            options.rest_api_port, options.file_system_poll_wait_seconds) == (9000, True, "m", 0, 1)
    for bad in (["--nope=1"], ["--port=x"], ["--port"], ["positional"],
                ["--per_process_gpu_memory_fraction=0.5"]):
        with pytest.raises(server.FlagError):
            server.parse_flags(bad)
    assert ("grpc.max_receive_message_length", 10) in server.grpc_server_options(
        "grpc.max_receive_message_length=10")
    assert server.main(["--nope"]) == 2


# ---------------------------------------------------------------- model warm-up


def test_warmup_records_are_replayed_and_a_bad_one_fails_the_load(tmp_path: Path,
                                                                   toy_model_dir: str) -> None:
    import shutil

    from tensorflow_serving.apis import prediction_log_pb2

    from neuronish.serving.servable import WARMUP_FILE, load_servable
    from tests.serving.harness import predict_request

    def with_warmup(name: str, inputs: dict) -> str:
        path = tmp_path / name
        shutil.copytree(toy_model_dir, path)
        (path / WARMUP_FILE).parent.mkdir(exist_ok=True)
        log = prediction_log_pb2.PredictionLog()
        log.predict_log.request.CopyFrom(predict_request("toy", inputs))
        with tf.io.TFRecordWriter(str(path / WARMUP_FILE)) as writer:
            for _ in range(3):
                writer.write(log.SerializeToString())
        return str(path)

    good = {"a": np.ones((2, 2), np.float32), "b": np.ones(2, np.int64)}
    servable = load_servable("toy", 1, with_warmup("good", good), ["serve"])
    assert servable.version == 1
    bad = {"a": np.ones((2, 2), np.float32)}
    with pytest.raises(ServingError) as raised:
        load_servable("toy", 1, with_warmup("bad", bad), ["serve"])
    assert "Model warmup failed at record 1" in raised.value.message
    assert "Missing but required: {b}" in raised.value.message
