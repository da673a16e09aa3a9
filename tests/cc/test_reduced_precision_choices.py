"""Scores a top_k chooses from stay float32 under `--auto-cast` and `--quantize int8`
(cc/passes/choices.py).

A mixture-of-experts router: softmax(x @ W) and top_k. Its columns here come in nearly
tied pairs, as a trained router's often are for some tokens: in bf16 (probabilities
rounded to 8 bits) or int8 (logits off by a weight step) the pair's order flips or
becomes a tie top_k breaks by index, and the token goes to the other expert (Mixtral's
keras_hub backbone: 0.9 relative error on some inputs). The router stays float32, the
choice matches TensorFlow's, and the executable's stats say why.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_executable
from neuronish.cc.passes.choices import WHY
from neuronish.runtime import load
from neuronish.runtime.executable import to_bytes
from tests.graphs import trace

RNG = np.random.default_rng(3)
_W = RNG.standard_normal((16, 2)).astype(np.float32)
# experts 2k and 2k+1 nearly tied for every token
ROUTER = tf.constant(np.concatenate([_W, _W + 2e-3 * RNG.standard_normal((16, 2)).astype(
    np.float32)], axis=1)[:, [0, 2, 1, 3]])
EXPERTS = tf.constant(RNG.standard_normal((16, 8)).astype(np.float32))


def _route(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    probs = tf.nn.softmax(tf.matmul(x, ROUTER))
    top, chosen = tf.math.top_k(probs, k=1)
    return chosen, tf.matmul(x, EXPERTS) * top  # the expert's weight scales its output


def _inputs(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((64, 16)).astype(np.float32)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("engine", ["numpy", "native"])
def test_the_router_stays_float32_and_chooses_as_tensorflow(
        precision: str, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g = trace(_route, tf.TensorSpec([64, 16], tf.float32, name="x"))
    options = {"auto_cast": "matmult"} if precision == "bf16" else {
        "calibration": [[_inputs(seed)] for seed in (1, 2, 3)]}
    exe = compile_executable(g.graph_def, g.io_config, **options)

    listed = exe.stats["auto_cast"]["float32"] if precision == "bf16" else [
        r for r in exe.stats["quantization"]["instructions"] if r["precision"] == "float32"]
    assert len(listed) == 1 and listed[0]["why"] == WHY, listed
    # the rest keeps its precision: the expert's matmul is int8, or computes in bf16
    program = exe.programs[0]
    assert [i.kind for i in program].count("matmul_int8") == (precision == "int8")
    computes = sorted(i.attrs.get("compute", "float32") for i in program if i.kind == "matmul")
    assert computes == (["bfloat16", "float32"] if precision == "bf16" else ["float32"])

    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    x = _inputs(0)
    with load(to_bytes(exe)) as model:
        got = model.run({"x:0": x})
    chosen, weighted = g.io_config["outputs"]
    want = g.reference({"x:0": x})
    np.testing.assert_array_equal(got[chosen], want[chosen])
    err = np.max(np.abs(got[weighted] - want[weighted])) / np.max(np.abs(want[weighted]))
    assert err < (2e-2 if precision == "bf16" else 5e-2), err
