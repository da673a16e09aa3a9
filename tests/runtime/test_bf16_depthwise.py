"""A bf16 depthwise convolution writing bf16 (MobileNet's blocks under `--auto-cast`) runs
on oneDNN's brdgmm kernel: 3.2 takes it only with a bf16 bias, so the native engine rounds
a constant float32 bias to bf16 at load (runtime/native/engine.cc, add_conv). The result
stays within bf16's error of TensorFlow's float32 and agrees with the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from neuronish.runtime.executable import from_bytes
from neuronish.runtime.native import library
from tests.graphs import trace

RNG = np.random.default_rng(11)


def _w(*shape: int, scale: float = 1.0) -> tf.Tensor:
    he = (2 / np.prod(shape[:-1])) ** 0.5
    return tf.constant((RNG.standard_normal(shape) * he * scale).astype(np.float32))


W1, DW, W2 = _w(1, 1, 16, 32), _w(3, 3, 32, 1), _w(1, 1, 32, 16)
# A bias of the activations' size, so that rounding it would show if it went wrong.
BIAS = tf.constant((RNG.standard_normal(32) * 0.5).astype(np.float32))


def _block(x: tf.Tensor) -> tf.Tensor:
    h = tf.nn.relu6(tf.nn.conv2d(x, W1, 1, "SAME"))
    h = tf.nn.relu6(tf.nn.depthwise_conv2d(h, DW, [1, 1, 1, 1], "SAME") + BIAS)
    return tf.reduce_mean(tf.nn.conv2d(h, W2, 1, "SAME"), axis=[1, 2])


@pytest.fixture(scope="module")
def compiled() -> tuple:
    g = trace(_block, tf.TensorSpec([4, 14, 14, 16], tf.float32, name="x"))
    return g, compile_graph(g.graph_def, g.io_config, auto_cast="matmult")


def test_the_depthwise_runs_on_brdgmm_and_matches_tf(compiled,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    g, exe = compiled
    program_ins = [i for p in from_bytes(exe).programs for i in p]
    e = from_bytes(exe)
    dw = [k for k, i in enumerate(program_ins) if i.kind == "depthwise_conv2d"]
    assert len(dw) == 1 and len(program_ins[dw[0]].inputs) == 3  # the bias was fused
    assert e.values[program_ins[dw[0]].outputs[0]][1] == "bfloat16"
    assert library.load() is not None, library.why_not()
    monkeypatch.setenv("NEURONISH_ENGINE", "native")
    x = RNG.standard_normal((4, 14, 14, 16)).astype(np.float32)
    with load(exe, runtime="python") as model:
        program = model._idle.get()
        model._idle.put(program)
        impl = program.implementations()[dw[0]]
        assert impl.startswith("brdgmm"), impl  # (jit_dw with a float32 bias)
        got = model.run({"x:0": x})
    monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
    with load(exe) as model:
        reference = model.run({"x:0": x})
    for key, want in g.reference({"x:0": x}).items():
        err = np.max(np.abs(got[key] - want)) / np.max(np.abs(want))
        assert 0 < err < 2e-2, err
        np.testing.assert_allclose(got[key], reference[key], rtol=1e-2, atol=2e-3)
