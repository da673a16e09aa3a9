"""nr_model_copy: each copy's core group, device memory and run counters (what device
telemetry publishes for models on the C runtime), through the ctypes binding."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from neuronish.runtime.capi import binding
from tests.runtime.test_capi_execute import compile_graph

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ is needed to build the C runtime library")


def test_copies_say_their_cores_memory_and_runs(tmp_path: Path, monkeypatch) -> None:
    from tests import graphs

    monkeypatch.setenv("NEURONISH_NUM_CORES", "2")  # read when the device opens
    graph = graphs.dense_relu(batch=3)
    data = compile_graph(tmp_path, "dense", graph.graph_def, graph.io_config)
    device = binding.Device(binding.load_library())
    model = binding.Model(device, data, duplicates=2)
    try:
        copies = model.copies()
        assert [c[0] for c in copies] == [[0], [1]] or [c[0] for c in copies] == [[1], [0]]
        used = device.memory()
        for cores, size, runs, busy in copies:
            assert runs == 0 and busy == 0 and size[0] > 0
            assert used[cores[0]][0] == size[0]  # its memory is what the core has in use
        x = np.ones((3 * 4 + 1, 16), np.float32)  # five runs of the compiled batch
        model.run([x])
        copies = model.copies()
        assert sum(c[2] for c in copies) == 5 and all(c[3] > 0 for c in copies if c[2])
        with pytest.raises(binding.CRuntimeError, match=r"invalid argument \(1\)"):
            binding._check(model.lib, model.lib.nr_model_copy(model.handle, 2,
                                                              binding.CopyInfo()), None)
    finally:
        model.unload()
        device.close()
