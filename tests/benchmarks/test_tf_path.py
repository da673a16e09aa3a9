"""benchmarks/tf_path.py's empty signature: TensorFlow's own cost of a SavedModel call,
measured beside the compiled model's so "outside the runtime" can be split into what any
signature call pays and what the NeuronOp adds. The empty signature must take the
compiled signature's input and give its outputs' keys, shapes and dtypes, and the
benchmark must print it and the split. Nothing is timed against anything."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import neuronish

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "tf_path.py"
_spec = importlib.util.spec_from_file_location("tf_path", _PATH)
tf_path = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tf_path)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> str:
    base = tmp_path_factory.mktemp("tf_path")
    keras.utils.set_random_seed(5)
    x = keras.Input((16,), name="x")
    h = keras.layers.Dense(32, activation="relu")(x)
    model = keras.Model(x, {"wide": keras.layers.Dense(24)(h),
                            "narrow": keras.layers.Dense(3)(h)})
    model.export(str(base / "src"), verbose=False)
    neuronish.saved_model.compile(str(base / "src"), str(base / "compiled"), batch_size=8)
    return str(base / "compiled")


def test_empty_signature_has_the_compiled_signatures_io(compiled: str, tmp_path: Path) -> None:
    fn = tf.saved_model.load(compiled).signatures["serving_default"]
    empty = tf_path.empty_signature(tf, fn, str(tmp_path / "empty"), 8)
    (name, _), = fn.structured_input_signature[1].items()
    feed = {name: tf.constant(np.full((8, 16), 2.0, np.float32))}
    want = {k: v.numpy() for k, v in fn(**feed).items()}
    got = {k: v.numpy() for k, v in empty(**feed).items()}
    assert set(got) == set(want) == {"wide", "narrow"}
    for key, value in want.items():
        assert got[key].shape == value.shape and got[key].dtype == value.dtype, key
        # (each output reads the input: nothing TensorFlow could fold into a constant)
        np.testing.assert_array_equal(got[key], np.full(value.shape, 2.0, value.dtype))
    # No NeuronOp in it: TensorFlow's call alone.
    ops = {n.op for f in empty.graph.as_graph_def().library.function for n in f.node_def}
    assert "NeuronOp" not in ops and "AddV2" in ops


def test_the_benchmark_prints_the_empty_signature_and_the_split(compiled: str) -> None:
    # (its own process: it expects the compiled model to be the only one loaded)
    out = subprocess.run([sys.executable, str(_PATH), compiled, "--rounds", "1",
                          "--no-one-copy"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith(tf_path.EMPTY) for line in lines), out.stdout
    assert any(line.startswith("outside through TensorFlow: ") and "the NeuronOp's" in line
               for line in lines), out.stdout
    quiet = subprocess.run([sys.executable, str(_PATH), compiled, "--rounds", "1",
                            "--no-one-copy", "--no-empty"], capture_output=True, text=True,
                           timeout=600)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert tf_path.EMPTY not in quiet.stdout and "the NeuronOp's" not in quiet.stdout
