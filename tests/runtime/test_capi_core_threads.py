"""The C runtime runs each core's stages on that core's host thread
(runtime/capi/core_thread.h): a pipelined call goes from core thread to core thread while
its caller waits, never computing on the caller's thread; a single-stage call whose core
is idle runs on its caller's thread (no hand-off); errors and cancellations raised on a
core's thread reach the caller; many callers get TensorFlow's results."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from neuronish.runtime.capi import binding
from tests import graphs
from tests.runtime.test_capi_execute import compile_graph

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ is needed to build the C runtime library")

NR_CANCELLED = 12
RNG = np.random.default_rng(7)


@pytest.fixture()
def two_cores(monkeypatch: pytest.MonkeyPatch) -> binding.Device:
    """A 2-core device, one CPU per program (so stages are one-thread programs)."""
    monkeypatch.setenv("NEURONISH_NUM_CORES", "2")
    monkeypatch.setenv("NEURONISH_CORE_GROUP_SIZES", "2")
    monkeypatch.setenv("NEURONISH_CORE_THREADS", "1")
    device = binding.Device(binding.load_library())
    yield device
    device.close()


def _pipelined(tmp: Path, graph: graphs.TracedGraph, name: str) -> bytes:
    return compile_graph(tmp, name, graph.graph_def, graph.io_config,
                         "--neuroncore-pipeline-cores", "2")


def test_pipelined_stages_run_on_their_cores_threads(tmp_path: Path,
                                                     two_cores: binding.Device) -> None:
    graph = graphs.conv_bn_relu(batch=2)
    model = binding.Model(two_cores, _pipelined(tmp_path, graph, "cnn2"))
    try:
        assert model.stage_thread(0, 0) == 0 and model.stage_thread(0, 2) == -1
        xs = [RNG.standard_normal((2, 8, 8, 3)).astype(np.float32) for _ in range(25)]
        got: dict[int, np.ndarray] = {}
        seen: list[tuple[int, int, int]] = []  # (caller, stage 0's thread, stage 1's)

        def call(k: int) -> None:
            got[k] = model.run([xs[k]])[0]
            seen.append((threading.get_native_id(), model.stage_thread(0, 0),
                         model.stage_thread(0, 1)))

        call(0)  # the main thread
        for batch in range(1, 25, 8):  # 8 callers at once, three times
            threads = [threading.Thread(target=call, args=(k,)) for k in range(batch, batch + 8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        stage_threads = {(s0, s1) for _, s0, s1 in seen}
        assert len(stage_threads) == 1, stage_threads  # each stage always on one thread
        ((s0, s1),) = stage_threads
        assert s0 > 0 and s1 > 0 and s0 != s1
        assert not {caller for caller, _, _ in seen} & {s0, s1}  # never a caller's thread
        for k, x in enumerate(xs):
            (want,) = graph.reference({"x:0": x}).values()
            np.testing.assert_allclose(got[k], want, rtol=1e-4, atol=1e-4)
    finally:
        model.unload()


def test_a_lone_call_on_an_idle_core_runs_on_its_callers_thread(
        tmp_path: Path, two_cores: binding.Device) -> None:
    graph = graphs.dense_relu(batch=4)
    data = compile_graph(tmp_path, "dense", graph.graph_def, graph.io_config)
    model = binding.Model(two_cores, data)
    try:
        x = RNG.standard_normal((4, 16)).astype(np.float32)
        for _ in range(3):
            got = model.run([x])[0]
            assert model.stage_thread(0, 0) == threading.get_native_id()
        (want,) = graph.reference({"x:0": x}).values()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    finally:
        model.unload()


W = tf.constant((RNG.standard_normal((2048, 2048)) / np.sqrt(2048)).astype(np.float32))


def _long_chain() -> graphs.TracedGraph:
    """16 matmuls of [512, 2048] @ [2048, 2048] (one weight): 8 on each core, ~34 GFLOP
    per stage, so a stage computes for long enough to be seen busy."""
    def fn(x: tf.Tensor) -> tf.Tensor:
        for _ in range(16):
            x = tf.matmul(x, W)
        return x

    return graphs.trace(fn, tf.TensorSpec([512, 2048], tf.float32, name="x"))


def _wait_until(condition: object) -> None:
    while not condition():  # type: ignore[operator]
        threading.Event().wait(0.005)


@pytest.mark.slow
def test_cancelled_on_a_cores_thread_or_in_its_queue(tmp_path: Path,
                                                     two_cores: binding.Device) -> None:
    graph = _long_chain()
    data = _pipelined(tmp_path, graph, "chain")
    x = RNG.standard_normal((512, 2048)).astype(np.float32)
    (want,) = graph.reference({"x:0": x}).values()

    def cancelled(model: binding.Model, cancel: bytearray, errors: list) -> threading.Thread:
        def call() -> None:
            with pytest.raises(binding.CRuntimeError) as e:
                model.run([x], cancel=cancel)
            errors.append(e.value)
        caller = threading.Thread(target=call)
        caller.start()
        return caller

    # Cancelled while its first stage computes on core 0's thread: the engine stops there,
    # and the error raised on that thread is the caller's.
    model = binding.Model(two_cores, data)
    try:
        cancel, errors = bytearray(1), []
        caller = cancelled(model, cancel, errors)
        _wait_until(lambda: model.stage_thread(0, 0) > 0)  # (set as the stage starts)
        cancel[0] = 1
        caller.join()
        assert errors[0].status == NR_CANCELLED
        assert "while its instructions ran" in errors[0].message, errors[0].message
    finally:
        model.unload()

    # A call queued behind another on core 0 is taken out of the queue once cancelled,
    # while the one ahead still computes (and gives TensorFlow's result).
    model = binding.Model(two_cores, data)
    try:
        first: list[np.ndarray] = []
        ahead = threading.Thread(target=lambda: first.append(model.run([x])[0]))
        ahead.start()
        _wait_until(lambda: model.stage_thread(0, 0) > 0)
        cancel, errors = bytearray(1), []
        caller = cancelled(model, cancel, errors)
        threading.Event().wait(0.2)  # (time for it to queue: the stage ahead runs ~1 s)
        cancel[0] = 1
        caller.join()
        ahead_done = bool(first)
        ahead.join()
        assert errors[0].status == NR_CANCELLED
        assert "while it waited for a core" in errors[0].message, errors[0].message
        assert not ahead_done  # it returned while the call ahead of it computed
        np.testing.assert_allclose(first[0], want, rtol=1e-3, atol=1e-3)
    finally:
        model.unload()


def test_many_callers_cancelled_at_any_point_get_a_result_or_cancelled(
        tmp_path: Path, two_cores: binding.Device) -> None:
    """Eight callers of a pipelined model, a third of their calls cancelled by another thread
    at whatever point they have reached (waiting for the copy, queued for a core, computing,
    between stages): each call returns TensorFlow's result or NR_CANCELLED, none hangs."""
    graph = graphs.conv_bn_relu(batch=2)
    model = binding.Model(two_cores, _pipelined(tmp_path, graph, "cnn2"))
    x = RNG.standard_normal((2, 8, 8, 3)).astype(np.float32)
    (want,) = graph.reference({"x:0": x}).values()
    flags = [bytearray(1) for _ in range(8 * 40)]
    outcomes: list[str] = []

    def caller(c: int) -> None:
        for k in range(c * 40, (c + 1) * 40):
            try:
                np.testing.assert_allclose(model.run([x], cancel=flags[k])[0], want,
                                           rtol=1e-4, atol=1e-4)
                outcomes.append("ok")
            except binding.CRuntimeError as e:
                assert e.status == NR_CANCELLED, e
                outcomes.append("cancelled")

    for c in range(8):  # (each caller's last call at least: cancelled before it starts)
        flags[c * 40 + 39][0] = 1
    try:
        threads = [threading.Thread(target=caller, args=(c,)) for c in range(8)]
        for t in threads:
            t.start()
        for k in np.random.default_rng(3).permutation(len(flags))[:len(flags) // 3]:
            flags[k][0] = 1
            threading.Event().wait(0.0005)
        for t in threads:
            t.join()
        assert len(outcomes) == len(flags) and "ok" in outcomes and "cancelled" in outcomes
    finally:
        model.unload()
