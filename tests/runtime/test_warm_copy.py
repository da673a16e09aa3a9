"""A model's calls, one after another, run on the copy that ran last (its arena and
weights are the ones still in the CPU's caches), on both runtimes; calls in flight at
once still hold different copies.

A NeuronOp loads up to four copies of its model (kernel_bridge.DEFAULT_MAX_DUPLICATES).
Handed out first in, first out, back-to-back calls went round all four, so every call
found its arena (MobileNetV2 bf16 batch 8: 64.6 MB) and reordered weights last touched
three calls, a few hundred MB of traffic, ago (docs/performance.md, "MobileNetV2
through TensorFlow").
"""

from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest

from neuronish.runtime import Device, load
from neuronish.runtime.capi import binding
from neuronish.runtime.config import DeviceConfig
from tests.graphs import dense_relu
from tests.runtime.test_capi_execute import compile_graph


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    g = dense_relu(batch=4)
    return compile_graph(tmp_path_factory.mktemp("warm"), "dense", g.graph_def, g.io_config)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is needed to build the C runtime")
def test_c_runtime_calls_in_a_row_reuse_one_copy(dense: bytes, monkeypatch) -> None:
    monkeypatch.setenv("NEURONISH_NUM_CORES", "4")  # read when the device opens
    device = binding.Device(binding.load_library())
    model = binding.Model(device, dense, duplicates=4)
    try:
        x = np.ones((4, 16), np.float32)
        for _ in range(6):
            model.run([x])
        runs = sorted(c[2] for c in model.copies())
        assert runs == [0, 0, 0, 6], runs  # first in, first out gave [1, 1, 2, 2]
    finally:
        model.unload()
        device.close()


def test_python_runtime_calls_in_a_row_reuse_one_copy(dense: bytes) -> None:
    device = Device(DeviceConfig.from_env({"NEURONISH_NUM_CORES": "4"}))
    with load(dense, duplicates=4, device=device) as model:
        ran: list[int] = []
        for k, (program, _) in enumerate(model._copies):
            execute = program.execute
            program.execute = lambda *a, k=k, execute=execute, **kw: (ran.append(k),
                                                                      execute(*a, **kw))
        x = np.ones((4, 16), np.float32)
        for _ in range(6):
            model.run_list([x])
        assert len(ran) == 6 and len(set(ran)) == 1, ran


def test_python_runtime_overlapping_calls_take_different_copies(dense: bytes) -> None:
    """Two calls in flight at once hold two copies (polled with a generous deadline, so
    the machine's load cannot make it flaky)."""
    device = Device(DeviceConfig.from_env({"NEURONISH_NUM_CORES": "4"}))
    with load(dense, duplicates=4, device=device) as model:
        inside = threading.Semaphore(0)
        release = threading.Event()
        ran: list[int] = []
        for k, (program, _) in enumerate(model._copies):
            execute = program.execute

            def held(*a, k=k, execute=execute, **kw):
                ran.append(k)
                inside.release()
                assert release.wait(60)
                return execute(*a, **kw)
            program.execute = held
        x = np.ones((4, 16), np.float32)
        threads = [threading.Thread(target=model.run_list, args=([x],)) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        for _ in threads:
            assert inside.acquire(timeout=max(0.0, deadline - time.monotonic()))
        release.set()
        for t in threads:
            t.join(60)
        assert len(set(ran)) == 2, ran
