"""A model server on TensorFlow's C API moving between versions of a compiled model, as
TensorFlow Serving does: request threads keep calling while new sessions load and retired
ones are deleted by their last call (tests/neuronish/tf_versions.c). Every call gives the
first call's output, which is TensorFlow's on the original, and once the retired versions
are gone the process's telemetry (what `neuronish ls` reads) holds one model and the
device memory one version holds: deleting a session unloads its NeuronOps."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish import native_op_library
from tests.neuronish.test_op_library_c import _signature
from tests.runtime import c_programs

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to build the C program")


class _Dense(tf.Module):
    def __init__(self) -> None:
        rng = np.random.default_rng(3)
        self.w = tf.Variable(rng.standard_normal((16, 32)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.nn.relu(tf.matmul(x, self.w))}


def _build(out: Path) -> Path:
    return c_programs.build(Path(__file__).with_name("tf_versions.c"), out,
                            cflags=("-pedantic",), tensorflow=True)


def test_versions_replace_each_other_under_load_and_release_the_device(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "compiled"
    module = _Dense()
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    report = neuronish.saved_model.compile(str(src), str(out), batch_size=2)
    assert [op["outcome"] for op in report["NeuronOps"]] == ["compiled"]
    ins, outs = _signature(out)
    run_dir = tmp_path / "run"
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
           "NEURONISH_COMPILE_CACHE": "off", "NEURONISH_FALLBACK": "0",
           "NEURONISH_RUN_DIR": str(run_dir), "OMP_WAIT_POLICY": "passive",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    rows, reloads = 3, 8  # 3 rows: every call is split and padded to the compiled batch 2
    r = subprocess.run([str(_build(tmp_path / "tf_versions")), str(native_op_library.build()),
                        str(out), ins["x"], outs["y"], str(rows), "16", "4", str(reloads)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    got = np.array([float(v) for v in lines[0].split()[1:]], np.float32).reshape(rows, 32)
    x = (np.arange(rows * 16) % 7 - 3).astype(np.float32).reshape(rows, 16) / 4
    want = module(tf.constant(x))["y"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())

    first, last = (json.loads(line.split(" ", 1)[1]) for line in lines
                   if line.startswith("telemetry "))
    assert int(lines[-1].split()[1]) > reloads  # requests kept coming while versions changed
    for record in (first, last):
        assert len(record["models"]) == 1, [m["name"] for m in record["models"]]
    # The retired versions' copies are gone: the device holds what one version holds.
    used = {k: c["used_bytes"] for k, c in last["cores"].items()}
    assert used == {k: c["used_bytes"] for k, c in first["cores"].items()}
    assert sum(used.values()) > 0
    assert last["models"][0]["calls"] >= 1  # the current version served requests
