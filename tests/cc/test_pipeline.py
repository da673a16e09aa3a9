"""Pipeline cores: stages on their own cores, successive calls flowing through them."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph, split_stages
from neuronish.runtime import Device, load
from neuronish.runtime.config import DeviceConfig
from neuronish.runtime.executable import from_bytes
from neuronish.runtime.program import LoadedProgram
from tests.graphs import trace

RNG = np.random.default_rng(5)


def conv_tower(depth: int = 6):  # noqa: ANN201
    ws = [tf.constant(RNG.standard_normal((3, 3, 16, 16)).astype(np.float32) * 0.1)
          for _ in range(depth)]

    def fn(x: tf.Tensor) -> tf.Tensor:
        for w in ws:
            x = tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME"))
        return tf.reduce_mean(x, axis=[1, 2])

    return trace(fn, tf.TensorSpec([None, 16, 16, 16], tf.float32, name="x"), batch=2)


def _device(**env: str) -> Device:
    return Device(DeviceConfig.from_env({"NEURONISH_NUM_CORES": "2", **env}))


def test_split_stages_balances_time_and_never_leaves_a_stage_empty() -> None:
    assert split_stages([1.0] * 6, 2) == [[0, 1, 2], [3, 4, 5]]
    assert split_stages([10.0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2)[0] == [0]  # by time, not count
    assert split_stages([1.0, 1.0, 100.0], 3) == [[0], [1], [2]]
    assert split_stages([1.0, 2.0], 1000) == [[0], [1]]  # clamped to the work there is
    # the slowest stage as fast as it can be: 3, where a cut at the first half gives 3.5
    assert split_stages([1.0, 2.0, 1.5], 2) == [[0, 1], [2]]
    assert max(map(len, split_stages([1.0] * 9, 3))) == 3


def test_too_many_pipeline_cores_are_clamped_and_said_so() -> None:
    g = conv_tower(depth=2)
    notes: list[str] = []
    exe = from_bytes(compile_graph(g.graph_def, g.io_config, pipeline_cores=50, notes=notes))
    assert exe.num_cores == len([i for p in exe.programs for i in p]) < 50
    assert all(exe.programs)
    assert notes and "asks for more stages than" in notes[0]
    assert exe.stats["pipeline"]["requested_cores"] == 50


@pytest.mark.parametrize("engine", ["numpy", "native"])
def test_pipelined_calls_overlap_and_give_the_one_core_results(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    g = conv_tower()
    one = compile_graph(g.graph_def, g.io_config)
    two = compile_graph(g.graph_def, g.io_config, pipeline_cores=2)
    xs = [RNG.standard_normal((2, 16, 16, 16)).astype(np.float32) for _ in range(8)]

    running: set[int] = set()
    overlapped = threading.Event()
    lock = threading.Lock()
    real_run_stage = LoadedProgram._run_stage

    def run_stage(self: LoadedProgram, stage: object, *args: object) -> None:
        with lock:
            running.add(stage.index)
            if len(running) > 1:  # two stages computing at the same moment
                overlapped.set()
        time.sleep(0.02)  # long enough for the next call to reach stage 0
        try:
            real_run_stage(self, stage, *args)
        finally:
            with lock:
                running.discard(stage.index)

    with load(one, device=_device(NEURONISH_CORE_GROUP_SIZES="1,1",
                                  NEURONISH_CORE_THREADS="1")) as model:
        want = [model.run({"x:0": x})["Identity:0"] for x in xs]
    monkeypatch.setattr(LoadedProgram, "_run_stage", run_stage)
    with load(two, device=_device(NEURONISH_CORE_GROUP_SIZES="2",
                                  NEURONISH_CORE_THREADS="1")) as model:
        assert model.exe.num_cores == 2
        got: list = [None] * len(xs)

        def call(k: int) -> None:
            got[k] = model.run({"x:0": xs[k]})["Identity:0"]

        threads = [threading.Thread(target=call, args=(k,)) for k in range(len(xs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert overlapped.is_set(), "the two stages never computed at the same time"
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)  # same kernels, same numbers, bit for bit
    ref = g.reference({"x:0": xs[0]})["Identity:0"]
    np.testing.assert_allclose(got[0], ref, rtol=1e-4, atol=1e-5)
