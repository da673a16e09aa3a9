"""Runtime fallback (neuronish/fallback.py): a NeuronOp whose executable the device cannot
load runs its own subgraph on TensorFlow, warns once per op and counts it; with
NEURONISH_FALLBACK=0 the device's error reaches the caller. Each case runs the compiled
SavedModel in a fresh process (the device is configured from the environment once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import neuronish.saved_model
from tests.test_compile_recovery import small_model

_RUN = r"""
import json, sys, warnings
import numpy as np
import neuronish
import tensorflow as tf
from neuronish import fallback
model = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
x = np.load(sys.argv[2])
outs = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for batch in (1, 3, 1):  # the compiled batch, a split one, and again
        outs[str(batch)] = model(x=tf.constant(x[:batch]))["y"].numpy().tolist()
print(json.dumps({"outs": outs, "counts": fallback.fallback_counts(),
                  "warnings": [str(w.message) for w in caught
                               if w.category is fallback.FallbackWarning],
                  "metrics": fallback.prometheus_lines()}))
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    tmp = tmp_path_factory.mktemp("fallback")
    src = small_model(tmp / "src")
    report = neuronish.saved_model.compile(src, str(tmp / "compiled"), batch_size=1)
    assert len(report["NeuronOps"]) == 1 and report["OnNeuronRatio"] == 1.0
    return src, tmp / "compiled"


def _run(model_dir: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return subprocess.run([sys.executable, "-c", _RUN, str(model_dir), str(tmp_path / "x.npy")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def _expected(src: str, tmp_path: Path) -> dict[str, np.ndarray]:
    x = np.load(tmp_path / "x.npy")
    fn = tf.saved_model.load(src).signatures["serving_default"]
    return {str(b): fn(x=tf.constant(x[:b]))["y"].numpy() for b in (1, 3)}


def _check_fell_back(r: subprocess.CompletedProcess[str], src: str, tmp_path: Path,
                     reason: str) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    want = _expected(src, tmp_path)
    for batch, w in want.items():
        np.testing.assert_allclose(np.array(got["outs"][batch], np.float32), w, rtol=1e-5,
                                   atol=1e-5)
    ((op, count),) = got["counts"].items()
    assert reason in count["reason"] and count["calls"] == 3, count
    assert len(got["warnings"]) == 1 and op in got["warnings"][0]  # once per op
    assert f':neuronish:neuron_op:fallback_calls{{op="{op}"}} 3' in got["metrics"]


def test_device_too_small_falls_back_to_tensorflow(compiled: tuple[str, Path],
                                                    tmp_path: Path) -> None:
    src, model_dir = compiled
    r = _run(model_dir, tmp_path, NEURONISH_CORE_MEMORY="64B")
    _check_fell_back(r, src, tmp_path, "OutOfDeviceMemory")


def test_fallback_off_is_an_error(compiled: tuple[str, Path], tmp_path: Path) -> None:
    _, model_dir = compiled
    r = _run(model_dir, tmp_path, NEURONISH_CORE_MEMORY="64B", NEURONISH_FALLBACK="0")
    assert r.returncode != 0
    assert "OutOfDeviceMemory" in r.stderr and "NEURONISH_FALLBACK=0" in r.stderr


def _damage_executables(src: Path, dst: Path) -> int:
    """Copy a compiled SavedModel, flipping one byte in the body of every executable."""
    import shutil

    shutil.copytree(src, dst)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((dst / "saved_model.pb").read_bytes())
    damaged = 0
    for graph in (m.graph_def for m in saved.meta_graphs):
        for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]:
            if node.op == "NeuronOp":
                exe = bytearray(node.attr["executable"].s)
                exe[len(exe) // 2] ^= 0x55
                node.attr["executable"].s = bytes(exe)
                damaged += 1
    (dst / "saved_model.pb").write_bytes(saved.SerializeToString())
    return damaged


def test_damaged_executable_falls_back_to_tensorflow(compiled: tuple[str, Path],
                                                     tmp_path: Path) -> None:
    src, model_dir = compiled
    assert _damage_executables(model_dir, tmp_path / "damaged") == 1
    r = _run(tmp_path / "damaged", tmp_path)
    _check_fell_back(r, src, tmp_path, "ExecutableError")
