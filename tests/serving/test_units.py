"""The server's parts on their own, in-process and fast: REST JSON rules, the
TensorProto codec, the batch scheduler, version policies, config files, flags,
signature checks."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import input_pb2
from tensorflow_serving.config import model_server_config_pb2

from neuronish.runtime.signature import TensorSignature
from neuronish.serving import codec, config, json_codec, server, signatures
from neuronish.serving.batching import BatchScheduler
from neuronish.serving.cancellation import Cancellation
from neuronish.serving.core import ServingCore, Target
from neuronish.serving.manager import ModelManager, aspired_versions
from neuronish.serving.metrics import Metrics
from neuronish.serving.servable import Servable
from neuronish.serving.status import (
    DEADLINE_EXCEEDED,
    INTERNAL,
    INVALID_ARGUMENT,
    NOT_FOUND,
    UNAVAILABLE,
    ServingError,
)
from tests.serving.harness import wait_for

F32 = {"x": TensorSignature("x", "float32", (-1, 2))}
TWO = {"a": TensorSignature("a", "float32", (-1, 2)), "b": TensorSignature("b", "int64", (-1,))}


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


def _submit(scheduler: BatchScheduler, run, x: np.ndarray,  # noqa: ANN001
            results: dict[float, dict]) -> threading.Thread:
    """Run `x` through the scheduler in a thread; its answer lands in results[x[0, 0]]."""
    def call() -> None:
        results[float(x[0, 0])] = scheduler.run("key", "m", run, {"x": x}, None)
    thread = threading.Thread(target=call)
    thread.start()
    return thread


def test_scheduler_merges_pads_and_splits() -> None:
    # A long timeout: batches run only when closed by a later batch, or at stop().
    scheduler, metrics = _scheduler(max_batch_size=8, batch_timeout_micros=60_000_000,
                                    num_batch_threads=1, allowed_batch_sizes=(4, 8))
    seen: list[int] = []

    def run(batch, cancellation=None):  # noqa: ANN001, ANN202
        seen.append(len(batch["x"]))
        return {"y": batch["x"] * 2}

    results: dict[float, dict] = {}
    enqueued = metrics.enqueued_tasks
    a = _submit(scheduler, run, np.full((2, 3), 1.0, np.float32), results)
    wait_for(lambda: enqueued.value("m") == 1, "the first request to be queued")
    b = _submit(scheduler, run, np.full((1, 3), 2.0, np.float32), results)
    wait_for(lambda: enqueued.value("m") == 2, "the second request to join its batch")
    # 3 + 6 rows exceed 8: a second batch opens, which closes the first (3 rows).
    c = _submit(scheduler, run, np.full((6, 3), 3.0, np.float32), results)
    a.join(10)
    b.join(10)
    assert seen == [4]  # the first two requests, merged, padded from 3 rows to 4
    scheduler.stop()  # runs the open batch: 6 rows padded to 8
    c.join(10)
    assert seen == [4, 8]
    for value, rows in ((1.0, 2), (2.0, 1), (3.0, 6)):
        np.testing.assert_array_equal(results[value]["y"], np.full((rows, 3), 2 * value))
    assert metrics.batch_size.count("m") == 2
    assert enqueued.value("m") == 0


def test_scheduler_splits_large_requests() -> None:
    # TF Serving's large batch splitting: requests up to 8 rows, batches of up to 4.
    scheduler, metrics = _scheduler(max_batch_size=8, batch_timeout_micros=60_000_000,
                                    num_batch_threads=1, enable_large_batch_splitting=True,
                                    max_execution_batch_size=4, allowed_batch_sizes=(2, 4))
    seen: list[np.ndarray] = []

    def run(batch, cancellation=None):  # noqa: ANN001, ANN202
        seen.append(batch["x"][:, 0].copy())
        return {"y": batch["x"] + 100}

    results: dict[float, dict] = {}
    a = _submit(scheduler, run, np.full((1, 2), 1.0, np.float32), results)
    wait_for(lambda: metrics.enqueued_tasks.value("m") == 1, "the first request to be queued")
    # 6 rows: 3 fill the open batch (which is then full and runs), 3 open another.
    x = np.arange(12, dtype=np.float32).reshape(6, 2) + 10
    b = _submit(scheduler, run, x, results)
    a.join(10)
    assert [s.tolist() for s in seen] == [[1, 10, 12, 14]]
    scheduler.stop()
    b.join(10)
    assert [s.tolist() for s in seen[1:]] == [[16, 18, 20, 16]]  # 3 rows padded to 4
    np.testing.assert_array_equal(results[10.0]["y"], x + 100)  # joined back in order
    np.testing.assert_array_equal(results[1.0]["y"], np.full((1, 2), 101.0))
    with pytest.raises(ServingError, match="Task size 9 is larger than maximum input batch"):
        scheduler.run("key", "m", run, {"x": np.zeros((9, 2), np.float32)}, None)


def test_scheduler_refuses_when_full_and_times_out() -> None:
    scheduler, metrics = _scheduler(max_batch_size=3, batch_timeout_micros=300_000,
                                    max_enqueued_batches=1, num_batch_threads=1)
    run = lambda b, c=None: {"y": b["x"]}  # noqa: E731
    waiter = threading.Thread(target=scheduler.run,
                              args=("k", "m", run, {"x": np.zeros((1, 1))}, None))
    waiter.start()
    wait_for(lambda: metrics.enqueued_tasks.value("m") == 1, "the waiter to be queued")
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


def test_scheduler_serves_a_max_size_request_split_over_many_batches() -> None:
    # 64 rows in batches of 4 need 16 batches: an idle queue must take them all.
    scheduler, metrics = _scheduler(max_batch_size=64, batch_timeout_micros=60_000_000,
                                    num_batch_threads=1, enable_large_batch_splitting=True,
                                    max_execution_batch_size=4, max_enqueued_batches=16)
    seen: list[int] = []

    def run(batch, cancellation=None):  # noqa: ANN001, ANN202
        seen.append(len(batch["x"]))
        return {"y": batch["x"] * 2}

    x = np.arange(128, dtype=np.float32).reshape(64, 2)
    result = scheduler.run("k", "m", run, {"x": x}, None)
    np.testing.assert_array_equal(result["y"], x * 2)
    assert seen == [4] * 16 and metrics.queue_full.value("m") == 0
    scheduler.stop()


def test_a_running_batch_is_cancelled_once_all_its_requests_gave_up() -> None:
    """A batch computes for every request in it: one request past its deadline leaves
    it running for the others; when the last one gives up, the batch is cancelled."""
    scheduler, _ = _scheduler(max_batch_size=8, batch_timeout_micros=300_000,
                              num_batch_threads=1)
    running: list[Cancellation] = []
    release = threading.Event()

    def run(batch, cancellation):  # noqa: ANN001, ANN202
        running.append(cancellation)
        while not (cancellation.cancelled or release.is_set()):
            time.sleep(0.005)
        return {"y": batch["x"] + 1}

    outcome: dict[str, object] = {}

    def request(name: str, value: float, deadline: float | None) -> None:
        try:
            x = np.full((1, 1), value, np.float32)
            outcome[name] = scheduler.run("k", "m", run, {"x": x}, deadline)["y"][0, 0]
        except ServingError as e:
            outcome[name] = e.code

    # Round 1: both requests join one batch (0.3 s window); only one of them gives up.
    soon = time.monotonic() + 0.6
    threads = [threading.Thread(target=request, args=("impatient", 1.0, soon)),
               threading.Thread(target=request, args=("patient", 2.0, None))]
    for t in threads:
        t.start()
    threads[0].join(10)
    assert outcome == {"impatient": DEADLINE_EXCEEDED}
    assert len(running) == 1 and not running[0].cancelled  # still computing for "patient"
    release.set()
    threads[1].join(10)
    assert outcome["patient"] == 3.0
    release.clear()
    # Round 2: both give up: the batch is cancelled.
    soon = time.monotonic() + 0.6
    threads = [threading.Thread(target=request, args=(name, 1.0, soon)) for name in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert outcome["a"] == outcome["b"] == DEADLINE_EXCEEDED
    wait_for(lambda: running[-1].cancelled, "the abandoned batch to be cancelled")
    assert len(running) == 2
    scheduler.stop()


def test_scheduler_refusal_leaves_no_queue_behind() -> None:
    scheduler, metrics = _scheduler(max_batch_size=64, batch_timeout_micros=60_000_000,
                                    num_batch_threads=1, enable_large_batch_splitting=True,
                                    max_execution_batch_size=4, max_enqueued_batches=16)
    # Options this tight are refused when built (see test_newer_batching_fields);
    # forced here so that an idle queue refuses, to see that the refusal leaves
    # no empty queue in the scheduler, where it would stay for good.
    object.__setattr__(scheduler.options, "max_enqueued_batches", 2)
    run = lambda b, c=None: {"y": b["x"]}  # noqa: E731
    with pytest.raises(ServingError) as raised:
        scheduler.run("k", "m", run, {"x": np.zeros((64, 1))}, None)
    assert raised.value.code == UNAVAILABLE and metrics.queue_full.value("m") == 1
    assert "0 batch(es) of up to 4 rows are waiting, the task needs 16 more" in \
        raised.value.message
    assert scheduler._queues == {} and metrics.enqueued_tasks.value("m") == 0
    scheduler.stop()


def test_scheduler_drops_the_other_parts_of_a_failed_split_request() -> None:
    scheduler, metrics = _scheduler(max_batch_size=8, batch_timeout_micros=60_000_000,
                                    num_batch_threads=1, enable_large_batch_splitting=True,
                                    max_execution_batch_size=4)
    seen: list[list[float]] = []

    def run(batch, cancellation=None):  # noqa: ANN001, ANN202
        seen.append(batch["x"][:, 0].tolist())
        if (batch["x"] < 0).any():
            raise ServingError(INVALID_ARGUMENT, "model says no")
        return {"y": batch["x"]}

    # 6 rows: a full batch of 4 (which runs at once, and fails) and 2 rows that
    # open a second batch, which waits (60 s) for company.
    failing = np.array([[-1.0], [-2.0], [-3.0], [-4.0], [5.0], [6.0]], np.float32)
    with pytest.raises(ServingError, match="model says no"):
        scheduler.run("k", "m", run, {"x": failing}, None)
    # Two more rows fill that second batch, which runs them alone: the failed
    # request's leftover rows (5, 6) are not run.
    result = scheduler.run("k", "m", run, {"x": np.array([[7.0], [8.0]], np.float32)}, None)
    assert result["y"][:, 0].tolist() == [7.0, 8.0]
    assert seen == [[-1.0, -2.0, -3.0, -4.0], [7.0, 8.0]]
    assert metrics.enqueued_tasks.value("m") == 0
    scheduler.stop()


def test_scheduler_passes_model_errors_to_every_task() -> None:
    scheduler, _ = _scheduler(max_batch_size=4, num_batch_threads=1)

    def run(batch, cancellation=None):  # noqa: ANN001, ANN202
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
    options = server.parse_flags(["--rest_api_enable_cors_support",
                                  "--enable_signature_method_name_check=true"])
    assert options.rest_api_enable_cors_support and options.enable_signature_method_name_check
    # gflags' other spellings: a value after a space, one dash, a bool set false.
    options = server.parse_flags(["--model_base_path", "/m", "-port=7", "--enable_model_warmup=0"])
    assert (options.model_base_path, options.port, options.enable_model_warmup) == ("/m", 7, False)
    # Each error names the flag and what it takes.
    for bad, message in ((["--port"], "--port needs a value: --port=..."),
                         (["--port=x"], "--port takes an integer, got 'x'"),
                         (["--enable_batching=yes"], "--enable_batching takes true or false"),
                         (["--nope=1"], "unknown command line flag 'nope'"),
                         (["--ssl_config"], "unknown command line flag 'ssl_config'"),
                         (["--use_tflite_model=true"], "--use_tflite_model is not supported")):
        with pytest.raises(server.FlagError, match=re.escape(message)):
            server.parse_flags(bad)


def test_flag_defaults_are_tf_servings() -> None:
    # tensorflow_serving/model_servers/main.cc
    options = server.parse_flags([])
    assert (options.port, options.rest_api_port, options.rest_api_timeout_in_ms,
            options.model_name, options.enable_batching,
            options.file_system_poll_wait_seconds) == (8500, 0, 30000, "default", False, 1)
    assert (options.max_num_load_retries, options.load_retry_interval_micros,
            options.saved_model_tags, options.enable_model_warmup,
            options.rest_api_enable_cors_support,
            options.enable_signature_method_name_check) == (5, 60_000_000, "serve", True,
                                                            False, False)
    assert options.rest_api_num_threads == 4 * (os.cpu_count() or 1)


def test_batching_defaults_are_tf_servings(tmp_path: Path) -> None:
    # SharedBatchScheduler's QueueOptions and Options, for every field left out.
    empty = tmp_path / "batching.config"
    empty.write_text("")
    for options in (config.BatchingOptions(), config.read_batching_parameters(str(empty))):
        assert (options.max_batch_size, options.batch_timeout_micros,
                options.max_enqueued_batches, options.num_batch_threads,
                options.allowed_batch_sizes, options.enable_large_batch_splitting,
                options.batch_limit) == (1000, 0, 10, os.cpu_count() or 1, (), False, 1000)


def test_newer_batching_fields(tmp_path: Path) -> None:
    batching = tmp_path / "batching.config"
    batching.write_text("max_batch_size { value: 64 }\n"
                        "enable_large_batch_splitting { value: true }\n"
                        "max_execution_batch_size { value: 16 }\n"
                        "allowed_batch_sizes: 8\nallowed_batch_sizes: 16\n"
                        'thread_pool_name { value: "batch" }\n')
    options = config.read_batching_parameters(str(batching))
    assert (options.enable_large_batch_splitting, options.max_execution_batch_size,
            options.batch_limit) == (True, 16, 16)
    batching.write_text("max_batch_size { value: 64 }\n"
                        "enable_large_batch_splitting { value: true }\n")
    assert config.read_batching_parameters(str(batching)).batch_limit == 64
    batching.write_text("max_batch_size { value: 64 }\n"
                        "enable_large_batch_splitting { value: true }\n"
                        "max_execution_batch_size { value: 16 }\nallowed_batch_sizes: 64\n")
    with pytest.raises(config.ConfigError, match="must equal max_execution_batch_size"):
        config.read_batching_parameters(str(batching))
    # Without splitting TF Serving never reads max_execution_batch_size, so even
    # a value it would refuse with splitting on is ignored (with a warning).
    batching.write_text("max_batch_size { value: 8 }\nmax_execution_batch_size { value: 9 }\n")
    options = config.read_batching_parameters(str(batching))
    assert (options.enable_large_batch_splitting, options.batch_limit) == (False, 8)
    batching.write_text("max_batch_size { value: 8 }\nmax_execution_batch_size { value: 9 }\n"
                        "enable_large_batch_splitting { value: true }\n")
    with pytest.raises(config.ConfigError, match="max_execution_batch_size must be between"):
        config.read_batching_parameters(str(batching))
    batching.write_text("max_batch_size { value: 8 }\nenable_priority_queue { value: true }\n")
    with pytest.raises(config.ConfigError, match='no field named "enable_priority_queue"'):
        config.read_batching_parameters(str(batching))


def test_splitting_needs_room_for_a_max_size_request(tmp_path: Path) -> None:
    # 64 rows in batches of 4 need 16 batches; the default 10 could never hold them.
    batching = tmp_path / "batching.config"
    splitting = ("max_batch_size { value: 64 }\nenable_large_batch_splitting { value: true }\n"
                 "max_execution_batch_size { value: 4 }\n")
    batching.write_text(splitting)
    with pytest.raises(config.ConfigError) as raised:
        config.read_batching_parameters(str(batching))
    assert str(raised.value) == (
        "max_enqueued_batches (10) cannot hold one request of max_batch_size (64) rows split "
        "into batches of max_execution_batch_size (4): it needs 16; raise "
        "max_enqueued_batches to at least 16, or lower max_batch_size to at most 40")
    batching.write_text(splitting + "max_enqueued_batches { value: 16 }\n")
    assert config.read_batching_parameters(str(batching)).max_enqueued_batches == 16
    # Rounded up: 65 rows need 17 batches of 4.
    with pytest.raises(config.ConfigError, match="it needs 17"):
        config.BatchingOptions(max_batch_size=65, max_enqueued_batches=16,
                               enable_large_batch_splitting=True, max_execution_batch_size=4)
    # Without splitting a request is one task in one batch: any depth holds it.
    assert config.BatchingOptions(max_batch_size=64, max_enqueued_batches=1,
                                  max_execution_batch_size=4).batch_limit == 64


# ---------------------------------------------------------------- signatures and core


def _signature_def(method: str, inputs: dict, outputs: dict) -> meta_graph_pb2.SignatureDef:
    sd = meta_graph_pb2.SignatureDef(method_name=method)
    for target, specs in ((sd.inputs, inputs), (sd.outputs, outputs)):
        for key, (dtype, shape) in specs.items():
            target[key].dtype = dtype.as_datatype_enum
            for size in shape:
                target[key].tensor_shape.dim.add(size=size)
    return sd


class _OneServable:
    """A ModelManager stand-in serving one servable."""

    def __init__(self, servable: Servable):
        self.servable = servable

    @contextlib.contextmanager
    def acquire(self, name: str, version: int | None = None,
                label: str | None = None) -> Iterator[Servable]:
        yield self.servable


def _example_core(method_check: bool = False) -> ServingCore:
    """serving_default classifies, `regress` regresses; both as TF1 exports mark them."""
    examples = {"inputs": (tf.string, [-1])}
    defs = {"serving_default": _signature_def(
                signatures.CLASSIFY_METHOD, examples, {"scores": (tf.float32, [-1, 2])}),
            "regress": _signature_def(
                signatures.REGRESS_METHOD, examples, {"outputs": (tf.float32, [-1])}),
            "predict": _signature_def("custom/method", examples,
                                      {"outputs": (tf.float32, [-1])})}
    functions = {
        "serving_default": lambda inputs: {"scores": tf.fill([tf.size(inputs), 2], 0.5)},
        "regress": lambda inputs: {"outputs": tf.fill([tf.size(inputs)], 1.5)},
        "predict": lambda inputs: {"outputs": tf.fill([tf.size(inputs)], 1.5)}}
    servable = Servable("m", 3, "/nowhere", defs, functions, None)
    return ServingCore(_OneServable(servable), None, method_check)  # type: ignore[arg-type]


def _examples(n: int) -> input_pb2.Input:
    request_input = input_pb2.Input()
    for _ in range(n):
        request_input.example_list.examples.add()
    return request_input


def test_classify_and_regress_name_the_signature_that_ran() -> None:
    core = _example_core()
    # TF Serving's MakeModelSpec: an empty signature_name comes back as serving_default.
    response = core.classify(Target("m"), _examples(2))
    assert response.model_spec.signature_name == "serving_default"
    assert response.model_spec.version.value == 3
    assert [c.score for c in response.result.classifications[1].classes] == [0.5, 0.5]
    response = core.regress(Target("m", signature_name="regress"), _examples(1))
    assert response.model_spec.signature_name == "regress"
    assert [r.value for r in response.result.regressions] == [1.5]


def test_signature_method_name_check() -> None:
    checked, unchecked = _example_core(method_check=True), _example_core()
    # `predict` is marked with a custom method: only the check refuses it.
    assert len(unchecked.regress(Target("m", signature_name="predict"),
                                 _examples(1)).result.regressions) == 1
    with pytest.raises(ServingError) as raised:
        checked.regress(Target("m", signature_name="predict"), _examples(1))
    assert raised.value.code == INVALID_ARGUMENT
    assert raised.value.message == ("Expected regression signature method_name to be "
                                    "tensorflow/serving/regress. Was: custom/method")
    with pytest.raises(ServingError, match="Expected classification signature method_name"):
        checked.classify(Target("m", signature_name="regress"), _examples(1))
    with pytest.raises(ServingError) as raised:
        checked.predict(Target("m", signature_name="predict"), lambda sig: {})
    assert raised.value.code == INTERNAL
    assert "Expected prediction signature method_name to be one of {tensorflow/serving/" \
           "predict, tensorflow/serving/classify, tensorflow/serving/regress}. Was: " \
           "custom/method" == raised.value.message
    assert len(checked.regress(Target("m", signature_name="regress"),
                               _examples(1)).result.regressions) == 1


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


def test_ssl_config_is_tf_servings(tmp_path: Path) -> None:
    # tensorflow_serving/config/ssl_config.proto (not in tensorflow-serving-api's wheel)
    fields = {f.name: (f.number, f.type) for f in config.SSLConfig.DESCRIPTOR.fields}
    string, boolean = 9, 8  # FieldDescriptor.TYPE_STRING, TYPE_BOOL
    assert fields == {"server_key": (1, string), "server_cert": (2, string),
                      "custom_ca": (3, string), "client_verify": (4, boolean)}
    assert config.SSLConfig.DESCRIPTOR.full_name == "tensorflow.serving.SSLConfig"
    for text, message in [
            ("server_key: 'k'\nserver_cert: 'c'\nclient_verify: true\n",
             "client_verify needs custom_ca"),
            ("server_key: 'k'\nserver_certificate: 'c'\n", "server_certificate"),
            ("server_key: 'k'\ncustom_ca: 'ca'\n", "server_key and server_cert")]:
        path = tmp_path / "ssl.config"
        path.write_text(text)
        with pytest.raises(config.ConfigError, match=message):
            server.read_ssl_config(str(path))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8,
                                   np.float16, np.bool_])
def test_encoding_a_response_costs_a_small_multiple_of_the_tensor(dtype: type) -> None:
    """`array.tolist()` made a Python object per value (32 bytes each), 8x a
    float32 output at once; now float/double go in as one packed block and the rest in
    chunks. Python-side allocations (tracemalloc) stay under 3x the tensor."""
    import tracemalloc

    rng = np.random.default_rng(1)
    wide_int = np.dtype(dtype).kind == "i" and np.dtype(dtype).itemsize >= 4
    array = (rng.random(1 << 20) * (1e6 if wide_int else 100)).astype(dtype)  # uncached ints
    tracemalloc.start()
    try:
        proto = codec.to_tensor_proto(array)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * max(array.nbytes, 1 << 20), (peak, array.nbytes)
    assert np.array_equal(tf.make_ndarray(proto), array)


def test_encoding_into_a_response_field() -> None:
    from tensorflow_serving.apis import predict_pb2

    response = predict_pb2.PredictResponse()
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert codec.to_tensor_proto(array, into=response.outputs["y"]) is response.outputs["y"]
    assert np.array_equal(tf.make_ndarray(response.outputs["y"]), array)
    assert list(response.outputs["y"].float_val) == list(range(6))  # typed field, as TF Serving
