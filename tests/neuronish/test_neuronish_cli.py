"""The `neuronish` command as users run it: `compile` then `benchmark` on the result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from models.cache import cached_saved_model

NEURONISH = str(Path(sys.executable).parent / "neuronish")


def neuronish(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NEURONISH, *args], capture_output=True, text=True, timeout=600)


def test_compile_prints_the_report_then_benchmark_compares(tmp_path: Path) -> None:
    src, out = cached_saved_model("cnn_cumsum"), tmp_path / "compiled"
    r = neuronish("compile", src, str(out), "--batch-size", "2")
    assert r.returncode == 0, r.stderr
    assert "OnNeuronRatio:" in r.stdout and "neuron_op_0" in r.stdout and "neuron_op_1" in r.stdout
    assert "left on TensorFlow:" in r.stdout and "CumulativeLogsumexp" in r.stdout
    assert "compiling subgraphs 2/2 100%" in r.stderr
    assert (out / "saved_model.pb").exists()

    again = neuronish("compile", src, str(out))
    assert again.returncode == 1 and "already exists" in again.stderr

    r = neuronish("benchmark", src, "--compare", str(out), "--batch-size", "3",
                  "--requests", "4", "--warmup", "1", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    rows = {row["path"]: row for row in report["results"]}
    assert set(rows) == {src, str(out)} and all(r["throughput"] > 0 for r in rows.values())
    assert rows[str(out)]["ratio"] > 0
    # The compiled model computes what the original does.
    assert report["output_max_relative_difference"]["3"] <= 1e-4


def test_compile_json_report_and_bad_model_dir(tmp_path: Path) -> None:
    r = neuronish("compile", cached_saved_model("mlp"), str(tmp_path / "c"), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["OnNeuronRatio"] == 1.0 and report["batch_size"] == 1
    r = neuronish("compile", str(tmp_path / "missing"), str(tmp_path / "d"))
    assert r.returncode == 1 and "missing is not a directory" in r.stderr


def test_version_and_python_dash_m() -> None:
    from neuronish import __version__

    r = neuronish("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"neuronish {__version__}", r
    r = subprocess.run([sys.executable, "-m", "neuronish", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"neuronish {__version__}", r
    r = subprocess.run([sys.executable, "-m", "neuronish", "no-such-command"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_compile_takes_a_keras_model_file(tmp_path: Path) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.save(tmp_path / "model.keras")
    r = neuronish("compile", str(tmp_path / "model.keras"), str(tmp_path / "out"), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["OnNeuronRatio"] == 1.0 and report["model_dir"].endswith("model.keras")
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    (got,) = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"](
        tf.constant(x)).values()
    np.testing.assert_allclose(got.numpy(), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    (tmp_path / "broken.keras").write_bytes(b"not a zip")
    r = neuronish("compile", str(tmp_path / "broken.keras"), str(tmp_path / "out2"))
    assert r.returncode == 1 and "cannot load the Keras model" in r.stderr, r.stderr
    assert not (tmp_path / "out2").exists()
