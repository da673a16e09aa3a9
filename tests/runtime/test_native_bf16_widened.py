"""Where the CPU has no bfloat16 kernels, the bfloat16 values inside a one-stage program
stay in float32 (runtime/native/engine.cc `widened_slot`; the loaders' `_widenable`):
no instruction widens its operands or narrows its result, and the values are not rounded
to bfloat16 between instructions, as OpenVINO's bf16 runs in float32 on such a CPU.

Held on a small CNN (3x3 conv, 1x1 conv with a residual, global mean, dense) compiled
with `--auto-cast matmult`, its weights already bfloat16 values, against the same graph
compiled in fp32:
- on the native engine under the Python host and on the C runtime, the bf16 program
  gives the fp32 program's numbers (to float32 accumulation order), while the numpy
  reference, which rounds every value, is a bfloat16 error away from them: so a value
  rounded anywhere would fail the test;
- both runtimes give the same bits;
- a two-stage (pipelined) program hands values between stages through the arena, so
  none is kept in float32 and its numbers are the rounded ones.

The engines run in a subprocess under NEURONISH_NATIVE_BF16=float32, which makes a CPU
with bfloat16 kernels compute bfloat16 in float32 too, so every host runs this.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from tests.graphs import trace
from tests.helpers import onednn_exec_lines

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(5)


def _bf16_values(shape: tuple[int, ...], scale: float) -> tf.Tensor:
    """Weights that bfloat16 holds exactly: the fp32 and bf16 programs share them."""
    w = (RNG.standard_normal(shape) * scale).astype(ml_dtypes.bfloat16).astype(np.float32)
    return tf.constant(w)


W1, B1 = _bf16_values((3, 3, 8, 16), 0.2), _bf16_values((16,), 0.1)
W2, B2 = _bf16_values((1, 1, 16, 16), 0.25), _bf16_values((16,), 0.1)
W3 = _bf16_values((16, 10), 0.3)


def _cnn(x: tf.Tensor) -> tf.Tensor:
    h = tf.nn.relu(tf.nn.conv2d(x, W1, 1, "SAME") + B1)
    h = tf.nn.relu(tf.nn.conv2d(h, W2, 1, "SAME") + B2 + h)
    return tf.matmul(tf.reduce_mean(h, axis=[1, 2]), W3)


_PROBE = """
import json, sys
import numpy as np
from neuronish.runtime import load
paths, x = json.loads(sys.argv[1]), np.load(sys.argv[2])
out = {}
for name, path in paths.items():
    for runtime in ("python", "c"):
        with load(path, runtime=runtime) as model:
            [y] = model.run({"x:0": x}).values()
            if runtime == "python":
                program = model._idle.get()
                model._idle.put(program)
                out[name + ":widened"] = np.array(len(program.widenable))
        out[f"{name}:{runtime}"] = y
np.savez(sys.argv[3], **out)
"""


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """Each program's output on both runtimes (native engine, bf16 computed in float32),
    how many values the Python host kept in float32, and the numpy reference's."""
    tmp = tmp_path_factory.mktemp("widened")
    g = trace(_cnn, tf.TensorSpec([4, 12, 12, 8], tf.float32, name="x"))
    builds = {"fp32": {}, "bf16": {"auto_cast": "matmult"},
              "bf16_two_stages": {"auto_cast": "matmult", "pipeline_cores": 2}}
    paths = {}
    for name, options in builds.items():
        paths[name] = str(tmp / f"{name}.neff")
        Path(paths[name]).write_bytes(compile_graph(g.graph_def, g.io_config, **options))
    x = RNG.standard_normal((4, 12, 12, 8)).astype(np.float32)
    np.save(tmp / "x.npy", x)
    env = dict(os.environ, NEURONISH_ENGINE="native", NEURONISH_NATIVE_BF16="float32")
    run = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(paths), str(tmp / "x.npy"),
                          str(tmp / "out.npz")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = dict(np.load(tmp / "out.npz"))
    with pytest.MonkeyPatch.context() as env_patch:  # (a module fixture: no monkeypatch)
        env_patch.setenv("NEURONISH_ENGINE", "numpy")
        for name in ("bf16", "bf16_two_stages"):
            with load(paths[name], runtime="python") as model:
                [out[name + ":numpy"]] = model.run({"x:0": x}).values()
    return out


def _off(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_a_one_stage_bf16_program_gives_the_fp32_numbers(ran: dict) -> None:
    fp32 = ran["fp32:python"]
    assert _off(ran["bf16:numpy"], fp32) > 1e-4  # the reference rounds: the test can fail
    for runtime in ("python", "c"):
        assert _off(ran[f"bf16:{runtime}"], fp32) < 1e-5, runtime
    assert int(ran["bf16:widened"]) >= 4  # the casts' and the convolutions' outputs, ...


def test_both_runtimes_give_the_same_bits(ran: dict) -> None:
    for name in ("bf16", "bf16_two_stages"):
        assert ran[f"{name}:python"].tobytes() == ran[f"{name}:c"].tobytes(), name


def test_a_pipelines_values_are_rounded_as_the_reference_rounds_them(ran: dict) -> None:
    assert int(ran["bf16_two_stages:widened"]) == 0
    got, fp32 = ran["bf16_two_stages:python"], ran["fp32:python"]
    assert _off(got, fp32) > 1e-4
    assert _off(got, ran["bf16_two_stages:numpy"]) < 1e-2


_LOAD_PROBE = """
import sys
import numpy as np
from neuronish.runtime import load
with load(sys.argv[1], runtime=sys.argv[2]) as model:
    model.run({"x:0": np.ones((4, 12, 12, 8), np.float32)})
"""


@pytest.mark.parametrize("runtime", ["python", "c"])
def test_bf16_weights_are_widened_before_their_reorder(runtime: str, tmp_path: Path) -> None:
    """oneDNN 3.2 reorders bfloat16 into a blocked float32 layout with its reference code
    (half of ResNet50 bf16's first call on AVX2): the engine widens a bfloat16 weight by
    its own loop, so the only weight reorders left are float32 to float32."""
    g = trace(_cnn, tf.TensorSpec([4, 12, 12, 8], tf.float32, name="x"))
    path = tmp_path / "bf16.neff"
    path.write_bytes(compile_graph(g.graph_def, g.io_config, auto_cast="matmult"))
    reorders = [fields[6] for fields in onednn_exec_lines(_LOAD_PROBE, str(path), runtime,
                                                          NEURONISH_NATIVE_BF16="float32")
                if fields[3] == "reorder"]
    assert any("src_f32" in r and "dst_f32" in r for r in reorders), reorders
    assert not any("src_bf16" in r and "dst_f32" in r for r in reorders), reorders
