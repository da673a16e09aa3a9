"""Calls from many threads (TensorFlow's inter-op threads, a server's request threads)
run the native engine on a few persistent engine threads, so libgomp keeps one pool of
workers per call in flight instead of one per calling thread (runtime/native/
engine_program.py, _EngineThreads): with more pools than CPUs it stops spinning."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from neuronish.runtime.native import library
from tests.graphs import trace

RNG = np.random.default_rng(3)
W = tf.constant(RNG.standard_normal((3, 3, 64, 64)).astype(np.float32) * 0.05)


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def test_calls_from_many_threads_share_one_openmp_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip(f"needs 2 CPUs for a multi-threaded team, this machine has {cpus}")
    monkeypatch.setenv("NEURONISH_ENGINE", "native")
    assert library.load() is not None, library.why_not()
    g = trace(lambda x: tf.nn.relu(tf.nn.conv2d(x, W, 1, "SAME")),  # 75 MFLOP: a full team
              tf.TensorSpec([1, 32, 32, 64], tf.float32, name="x"))
    x = RNG.standard_normal((1, 32, 32, 64)).astype(np.float32)
    want = g.reference({"x:0": x})
    callers, release, got = 3, threading.Event(), []

    def call() -> None:
        got.append(model.run({"x:0": x}))
        release.wait()  # alive: a pool of its own would stay

    with load(compile_graph(g.graph_def, g.io_config), runtime="python") as model:
        program = model._idle.get()
        model._idle.put(program)
        assert max(st.native.widest for st in program.stages if st.native) > 1
        threads = [threading.Thread(target=call) for _ in range(callers)]
        before = _tasks() + callers
        for t in threads:
            t.start()
            while len(got) < threads.index(t) + 1:
                release.wait(0.01)
        grown = _tasks() - before
        release.set()
        for t in threads:
            t.join()
    # One engine thread and one pool of (team - 1) workers; a pool per caller was
    # callers x (team - 1).
    assert grown <= cpus, grown
    for out in got:
        for key, w in want.items():
            np.testing.assert_allclose(out[key], w, rtol=1e-4, atol=1e-4)
