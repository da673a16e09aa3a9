"""A compiled model is on the device before the server reports it available: `neuronish
ls` right after start-up shows the server using the device under the served model's
name and version, before any request (neuronish/serving/startup.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

import neuronish
from tests.serving.harness import copy_version, predict_request, running_server


def test_a_compiled_model_is_loaded_on_the_device_at_start_up(
        serving_dir: Path, mlp_model: str, mlp_reference: object) -> None:
    root = serving_dir / "startup"
    compiled = root / "mlp_neuron_src"
    neuronish.saved_model.compile(mlp_model, str(compiled), batch_size=2)
    copy_version(str(compiled), root / "models" / "mlp_neuron", 1)
    run_dir = root / "run"
    env = {"NEURONISH_RUN_DIR": str(run_dir)}
    args = ["--model_name=mlp_neuron", f"--model_base_path={root / 'models' / 'mlp_neuron'}"]
    with running_server(args, root, {"mlp_neuron": [1]}, env=env) as server:
        ls = subprocess.run([sys.executable, "-m", "neuronish.cli", "ls", "--json"],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, **env})
        assert ls.returncode == 0, ls.stderr
        (mine,) = [p for p in json.loads(ls.stdout)["processes"]
                   if p["pid"] == server.proc.pid]
        names = [m["name"] for m in mine["models"]]
        assert names and all(n.startswith("mlp_neuron:1 ") for n in names), names
        assert "loaded onto the device by 1 signature call" in server.log()
        # The first request is answered by the model already on the device.
        fn = mlp_reference
        (key, spec), = fn.structured_input_signature[1].items()
        x = np.random.default_rng(3).standard_normal([3, *spec.shape[1:]]).astype(np.float32)
        response = server.predictions.Predict(predict_request("mlp_neuron", {key: x}),
                                              timeout=30)
        for out, want in fn(**{key: tf.constant(x)}).items():
            np.testing.assert_allclose(tf.make_ndarray(response.outputs[out]), want.numpy(),
                                       rtol=1e-4, atol=1e-4)
        text = subprocess.run([sys.executable, "-m", "neuronish.cli", "ls"],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, **env}).stdout
        assert "mlp_neuron:1" in text and "no process is using the device" not in text
