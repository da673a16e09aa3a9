"""The C runtime runs wide stages called from many threads on a few persistent engine
threads (runtime/capi/engine_threads.h), as the Python runtime does: libgomp keeps one
worker pool per call in flight instead of one per calling thread, which would stop its
spinning and make every primitive wait for a wake-up."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from neuronish.runtime.capi import binding
from tests.graphs import trace
from tests.runtime.test_capi_execute import compile_graph

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ is needed to build the C runtime library")

RNG = np.random.default_rng(5)
W = tf.constant(RNG.standard_normal((3, 3, 64, 64)).astype(np.float32) * 0.05)


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def test_calls_from_many_threads_share_one_openmp_pool(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip(f"needs 2 CPUs for a multi-threaded team, this machine has {cpus}")
    monkeypatch.setenv("NEURONISH_NUM_CORES", "1")
    g = trace(lambda x: tf.nn.relu(tf.nn.conv2d(x, W, 1, "SAME")),  # 75 MFLOP: a full team
              tf.TensorSpec([1, 32, 32, 64], tf.float32, name="x"))
    x = RNG.standard_normal((1, 32, 32, 64)).astype(np.float32)
    (want,) = g.reference({"x:0": x}).values()
    data = compile_graph(tmp_path, "conv", g.graph_def, g.io_config)
    device = binding.Device(binding.load_library())
    model = binding.Model(device, data)
    callers, release, got = 3, threading.Event(), []

    def call() -> None:
        got.append(model.run([x])[0])
        release.wait()  # alive: a pool of its own would stay

    try:
        threads = [threading.Thread(target=call) for _ in range(callers)]
        before = _tasks() + callers
        for k, t in enumerate(threads):
            t.start()
            while len(got) < k + 1:
                release.wait(0.01)
        grown = _tasks() - before
        release.set()
        for t in threads:
            t.join()
    finally:
        model.unload()
        device.close()
    # One engine thread and one pool of (team - 1) workers; a pool per caller was
    # callers x (team - 1).
    assert grown <= cpus, grown
    for out in got:
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_a_load_from_another_thread_opens_no_pool_there(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a model reorders its weights in parallel regions: a load from a thread other
    than the main one runs on the engine threads, as its calls do. A NeuronOp loads on the
    TensorFlow thread of its first call; the pool that thread kept was one more than the
    CPUs, so libgomp stopped spinning and every primitive of every later call waited for a
    woken worker."""
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip(f"needs 2 CPUs for a multi-threaded team, this machine has {cpus}")
    monkeypatch.setenv("NEURONISH_NUM_CORES", "1")
    g = trace(lambda x: tf.nn.relu(tf.nn.conv2d(x, W, 1, "SAME")),
              tf.TensorSpec([1, 32, 32, 64], tf.float32, name="x"))
    x = RNG.standard_normal((1, 32, 32, 64)).astype(np.float32)
    (want,) = g.reference({"x:0": x}).values()
    data = compile_graph(tmp_path, "conv", g.graph_def, g.io_config)
    device = binding.Device(binding.load_library())
    release = threading.Event()
    models: list[binding.Model] = []
    got: list[np.ndarray] = []

    def on_a_thread(work) -> threading.Thread:  # the thread stays alive, as TF's do
        done = threading.Event()

        def body() -> None:
            work()
            done.set()
            release.wait()

        t = threading.Thread(target=body)
        t.start()
        done.wait()
        return t

    try:
        # A first load and call from threads start the engine threads and their pool.
        threads = [on_a_thread(lambda: models.append(binding.Model(device, data)))]
        threads.append(on_a_thread(lambda: got.append(models[0].run([x])[0])))
        before = _tasks()
        threads.append(on_a_thread(lambda: models.append(binding.Model(device, data))))
        threads.append(on_a_thread(lambda: got.append(models[1].run([x])[0])))
        grown = _tasks() - before - 2  # (less the loading and the calling thread)
        release.set()
        for t in threads:
            t.join()
    finally:
        for m in models:
            m.unload()
        device.close()
    assert grown == 0, f"{grown} thread(s) besides the caller's: the load left a pool"
    assert len(got) == 2
    for out in got:
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
