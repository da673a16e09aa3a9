"""compile(..., verify=True) / `neuronish compile --verify`: every compiled subgraph is run
on TensorFlow and on the device; one beyond its tolerance stays on TensorFlow and the
report says why, with the measured error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish.errors import CompileWarning
from neuronish.verification import relative_error, tolerance
from tests.neuronish.test_compile_recovery import _save, small_model
from tests.neuronish.test_saved_model_compile import assert_matches_original

NEURONISH = str(Path(sys.executable).parent / "neuronish")


def overflow_model(path: Path) -> str:
    """x * 1e5 before a MatMul, scaled back after: fine in float32, but 1e5 is past fp16's
    largest value (65504), so with `--auto-cast all --auto-cast-type fp16` the device's
    result is not finite."""
    module = tf.Module()
    module.w = tf.Variable(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.matmul(tf.nn.relu(x * 1e5), module.w) * 1e-5}

    return _save(module, serve, path)


def test_verified_model_keeps_every_subgraph(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    report = neuronish.saved_model.compile(src, str(tmp_path / "out"), batch_size=2,
                                           verify=True)
    (verdict,) = report["verification"]
    assert verdict["passed"] and verdict["auto_cast"] == "none"
    (out,) = verdict["outputs"].values()
    assert out["dtype"] == "float32" and 0 <= out["error"] <= out["tolerance"] == 1e-4
    assert report["OnNeuronRatio"] == 1.0
    assert_matches_original(src, tmp_path / "out", tmp_path)


def test_a_subgraph_beyond_tolerance_goes_back_to_tensorflow(tmp_path: Path) -> None:
    src = overflow_model(tmp_path / "src")
    args = ["--auto-cast", "all", "--auto-cast-type", "fp16"]
    # Without verification the broken subgraph is kept...
    unverified = neuronish.saved_model.compile(src, str(tmp_path / "a"), compiler_args=args)
    assert unverified["OnNeuronRatio"] > 0
    with pytest.warns(CompileWarning, match="failed verification"):
        report = neuronish.saved_model.compile(src, str(tmp_path / "b"), compiler_args=args,
                                               verify=True)
    (verdict,) = report["verification"]
    assert not verdict["passed"] and verdict["auto_cast"] == "all fp16"
    (out,) = verdict["outputs"].values()
    assert out["error"] == float("inf") and out["tolerance"] == 1e-2
    assert report["NeuronOps"] == [] and report["OnNeuronRatio"] == 0.0
    reasons = [r for t in report["OnTensorFlow"].values() for r in t["reasons"]]
    assert any("relative error inf > 0.01" in r and "auto-cast all fp16" in r for r in reasons)
    # ...and the model left on TensorFlow computes what the original does.
    x = tf.constant(np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32))
    want = tf.saved_model.load(src).signatures["serving_default"](x=x)["y"].numpy()
    got = tf.saved_model.load(str(tmp_path / "b")).signatures["serving_default"](x=x)["y"]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_cli_verify(tmp_path: Path) -> None:
    src = overflow_model(tmp_path / "src")
    r = subprocess.run([NEURONISH, "compile", src, str(tmp_path / "out"), "--verify", "--json",
                        "--compiler-args", "--auto-cast all --auto-cast-type fp16"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert [v["passed"] for v in report["verification"]] == [False]
    assert "failed verification" in r.stderr


def test_error_measure_and_tolerances() -> None:
    want = np.array([1.0, -2.0, 4.0], np.float32)
    assert relative_error(want + np.float32(4e-4), want) == pytest.approx(1e-4, rel=1e-3)
    assert relative_error(np.array([1.0, np.inf, 4.0]), want) == float("inf")
    assert relative_error(np.array([1, 2]), np.array([1, 3])) == float("inf")
    assert relative_error(np.array([1, 2]), np.array([1, 2])) == 0.0
    assert tolerance("int32", "all", "bf16") == 0.0
    assert tolerance("float32", "none", "bf16") == 1e-4
    assert tolerance("float32", "matmult", "bf16") == 5e-2
    assert tolerance("float16", "none", "bf16") == 1e-2
