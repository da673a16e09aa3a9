"""`--auto-cast matmult` when a transformer's residual stream is itself a bf16 value.

A matmul that adds a residual keeps its output float32 in a bf16 compile (the residual
stream, which layer norm reads, keeps its precision: cc/passes/dtypes.py). Where the
stream starts at a matmul instead of at a layer norm (ELECTRA's and ALBERT's embedding
projection, FNet's Fourier matmuls, GPT-NeoX's parallel attention), the residual that
matmul adds is bfloat16, and the verifier refused the typing assign_dtypes gave it
(`matmul outputs are typed float32, inference gives bfloat16`): the whole model was
left on TensorFlow. The residual is now widened to float32 (exact), so the stream stays
float32 from there on.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from neuronish.runtime.executable import from_bytes
from tests.graphs import trace

RNG = np.random.default_rng(11)
W_IN = tf.constant((RNG.standard_normal((16, 32)) / 4).astype(np.float32))
W_OUT = tf.constant((RNG.standard_normal((32, 32)) / 6).astype(np.float32))
BIAS = tf.constant((RNG.standard_normal(32) / 10).astype(np.float32))


def _projection_then_residual(x: tf.Tensor) -> tf.Tensor:
    """An embedding projection (a matmul) whose output is the residual stream the next
    dense layer adds to: h @ W + b + h."""
    h = tf.matmul(x, W_IN)
    return tf.matmul(h, W_OUT) + BIAS + h


@pytest.fixture(scope="module")
def compiled() -> tuple:
    g = trace(_projection_then_residual, tf.TensorSpec([8, 16], tf.float32, name="x"))
    return g, compile_graph(g.graph_def, g.io_config, auto_cast="matmult")


def test_a_bf16_residual_is_widened_and_the_stream_stays_float32(compiled) -> None:
    _, exe = compiled
    e = from_bytes(exe)
    program = [i for p in e.programs for i in p]
    residual = [i for i in program if i.kind == "matmul" and i.attrs.get("residual")]
    assert len(residual) == 1, [i.kind for i in program]
    assert e.values[residual[0].outputs[0]][1] == "float32"
    assert e.values[residual[0].inputs[-1]][1] == "float32"


@pytest.mark.parametrize("engine", ["numpy", "native"])
def test_both_engines_match_tf_within_bf16_error(compiled, engine: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    g, exe = compiled
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    with load(exe) as model:
        got = model.run({"x:0": x})
    for key, want in g.reference({"x:0": x}).items():
        err = np.max(np.abs(got[key] - want)) / np.max(np.abs(want))
        assert 0 < err < 1e-2, err  # rounded to bf16 somewhere, and no more than that
