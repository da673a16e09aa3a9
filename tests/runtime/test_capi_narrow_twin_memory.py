"""A copy's one-thread twin reorders the weights again and keeps its own buffers
(runtime/capi/model.cc): the device charges them to the copy's core, and a copy whose twin
would not fit in the core's memory loads without one instead of failing to load.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neuronish.runtime.capi import binding
from tests.runtime.test_capi_execute import compile_graph
from tests.runtime.test_capi_narrow_twin import (
    ENV,
    _busy_calls_on_the_team,
    _calls,
    _small_cnn,
    each_matches_tensorflow,
)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ is needed to build the C runtime library")


def _load(data: bytes, monkeypatch: pytest.MonkeyPatch,
          **env: str) -> tuple[binding.Device, binding.Model]:
    for k, v in {**ENV, **env}.items():
        monkeypatch.setenv(k, v)
    device = binding.Device(binding.load_library())
    return device, binding.Model(device, data, duplicates=2)


def _small_cnn_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """The small CNN, its executable, and the device memory a copy of it holds without a
    twin (what a copy with one is compared with)."""
    graph = _small_cnn()
    data = compile_graph(tmp_path, "cnn", graph.graph_def, graph.io_config)
    device, model = _load(data, monkeypatch, NEURONISH_NARROW_TWIN="off")
    alone = model.copies()[0][1][0]
    model.unload()
    device.close()
    return graph, data, alone


def test_the_twin_is_charged_and_dropped_where_it_does_not_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph, data, alone = _small_cnn_alone(tmp_path, monkeypatch)

    device, model = _load(data, monkeypatch)
    try:
        with_twin = model.copies()[0][1][0]
        core = model.copies()[0][0][0]
        assert device.memory()[core][0] == with_twin
    finally:
        model.unload()
        device.close()
    # The twin holds the convolutions' and the dense layer's reordered weights (~0.3 MiB).
    assert with_twin > alone + 64 * 1024, (alone, with_twin)

    # Room for each copy but not for its twin: the model loads, twinless.
    budget = alone + (with_twin - alone) // 2
    device, model = _load(data, monkeypatch, NEURONISH_CORE_MEMORY=str(budget))
    try:
        assert [c[1][0] for c in model.copies()] == [alone, alone]
        x = np.random.default_rng(3).standard_normal((1, 64, 64, 3)).astype(np.float32)
        outs = _busy_calls_on_the_team(model, x)
    finally:
        model.unload()
        device.close()
    each_matches_tensorflow(graph, x, outs)


TWIN_BYTES_CHILD = """
import sys
from neuronish.runtime.capi import binding
device = binding.Device(binding.load_library())
model = binding.Model(device, open(sys.argv[1], "rb").read(), duplicates=2)
print(model.copies()[0][1][0])
"""


def test_a_model_loaded_while_recording_gets_its_twin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recording on demand (profiler.start, `neuronish profile`, nr_profile_start) does
    not withhold the twin of a model loaded meanwhile: its calls run the wide program
    while recording, and the twin once the recording stops (the twin was withheld from
    such a model for good). Under NEURONISH_PROFILE, where every call is timed from start
    to exit, no model gets one."""
    from neuronish.runtime import profiler

    graph, data, alone = _small_cnn_alone(tmp_path, monkeypatch)

    binding.load_library()  # (its recorder joins the profiler's: the C library records too)
    profiler.start()
    try:
        device, model = _load(data, monkeypatch)
        assert model.lib.nr_profile_recording() == 1
    finally:
        profiler.stop()
    try:
        assert [c[1][0] for c in model.copies()][0] > alone + 64 * 1024, alone
        x = np.random.default_rng(4).standard_normal((1, 64, 64, 3)).astype(np.float32)
        outs = _calls(model, [x] * 64, callers=8)
        assert model.narrow_runs(0) + model.narrow_runs(1) > 0
    finally:
        model.unload()
        device.close()
    each_matches_tensorflow(graph, x, outs)

    path = tmp_path / "cnn.neff"
    path.write_bytes(data)
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURONISH_")}
    r = subprocess.run([sys.executable, "-c", TWIN_BYTES_CHILD, str(path)], cwd=root,
                       capture_output=True, text=True, timeout=300,
                       env={**env, **ENV, "NEURONISH_PROFILE": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout) == alone
