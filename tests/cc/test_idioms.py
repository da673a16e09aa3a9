"""recognize_gelu, recognize_layer_norm and sink_reshapes: fewer instructions, the same
numbers as TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from neuronish.runtime.executable import from_bytes
from tests.graphs import trace

RNG = np.random.default_rng(3)
W = tf.constant(RNG.standard_normal((16, 32)).astype(np.float32) * 0.3)
B = tf.constant(RNG.standard_normal(32).astype(np.float32))


def _kinds(exe: bytes) -> list[tuple[str, dict]]:
    return [(i.kind, i.attrs) for p in from_bytes(exe).programs for i in p]


def _run(g, exe: bytes, x: np.ndarray) -> None:  # noqa: ANN001
    with load(exe) as model:
        got = model.run({"x:0": x})
    for key, want in g.reference({"x:0": x}).items():
        np.testing.assert_allclose(got[key], want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("engine", ["numpy", "native"])
def test_keras_dense_with_gelu_on_a_sequence_is_one_matmul(engine: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras' Dense(activation="gelu") on [batch, seq, features]: tensordot's reshapes,
    the bias add and TF's five-op GELU end up as one matmul with bias and gelu."""
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    dense = tf.keras.layers.Dense(32, activation="gelu")
    dense.build((None, 5, 16))
    g = trace(lambda x: dense(x), tf.TensorSpec([None, 5, 16], tf.float32, name="x"), batch=3)
    exe = compile_graph(g.graph_def, g.io_config)
    kinds = _kinds(exe)
    matmuls = [a for k, a in kinds if k == "matmul"]
    assert len(matmuls) == 1 and matmuls[0]["activation"] == "gelu", kinds
    assert not [k for k, a in kinds if k in ("unary", "binary")], kinds
    _run(g, exe, RNG.standard_normal((3, 5, 16)).astype(np.float32) * 3)


def test_gelu_is_recognized_in_both_spellings_and_nothing_else_is() -> None:
    def erfc_of_neg(x: tf.Tensor) -> tf.Tensor:  # Keras / tf.nn.gelu
        return tf.nn.gelu(x @ W, approximate=False)

    def half_after(x: tf.Tensor) -> tf.Tensor:  # x * -1/sqrt(2), half multiplied last
        y = x @ W
        return (y * 0.5) * tf.math.erfc(y * -0.7071067811865476)

    def not_gelu(x: tf.Tensor) -> tf.Tensor:  # a different constant: must stay as it is
        y = x @ W
        return (y * 0.5) * tf.math.erfc(y * -0.6)

    x = RNG.standard_normal((4, 16)).astype(np.float32) * 2
    for fn, is_gelu in ((erfc_of_neg, True), (half_after, True), (not_gelu, False)):
        g = trace(fn, tf.TensorSpec([None, 16], tf.float32, name="x"), batch=4)
        exe = compile_graph(g.graph_def, g.io_config)
        fused = any(a.get("activation") == "gelu" or a.get("fn") == "gelu"
                    for _, a in _kinds(exe))
        assert fused == is_gelu, (fn.__name__, _kinds(exe))
        assert any(a.get("fn") == "erfc" for _, a in _kinds(exe)) == (not is_gelu)
        _run(g, exe, x)


def test_a_reshape_that_changes_the_last_dim_does_not_move() -> None:
    def fn(x: tf.Tensor) -> tf.Tensor:  # [4, 16] -> [4, 4, 4]: a per-feature bias of 4
        return tf.nn.relu(tf.reshape(x @ W[:, :16], [4, 4, 4]) + tf.constant([1., 2, 3, 4]))

    g = trace(fn, tf.TensorSpec([4, 16], tf.float32, name="x"))
    exe = compile_graph(g.graph_def, g.io_config)
    kinds = [k for k, _ in _kinds(exe)]
    assert kinds.index("reshape") < kinds.index("binary"), kinds
    _run(g, exe, RNG.standard_normal((4, 16)).astype(np.float32))


def _layer_norms(epsilon: float = 1e-3) -> list:
    """Keras' LayerNormalization with and without gamma/beta, and tf.nn.moments with
    tf.nn.batch_normalization: every spelling of a last-axis layer norm."""
    layers = []
    for center, scale in ((True, True), (False, False), (True, False), (False, True)):
        ln = tf.keras.layers.LayerNormalization(epsilon=epsilon, center=center, scale=scale)
        ln.build((None, 5, 16))
        for w in ln.weights:  # not the initial ones and zeros: they would hide a swap
            w.assign(RNG.standard_normal(w.shape).astype(np.float32))
        layers.append(ln)
    gamma, beta = (tf.constant(RNG.standard_normal(16).astype(np.float32)) for _ in range(2))

    def moments(x: tf.Tensor) -> tf.Tensor:
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return tf.nn.batch_normalization(x, mean, var, beta, gamma, 1e-5)
    return [*layers, moments]


@pytest.mark.parametrize("engine", ["numpy", "native"])
def test_layer_norm_is_one_instruction_in_every_spelling(engine: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    norms = _layer_norms()

    def fn(x: tf.Tensor) -> tf.Tensor:
        for norm in norms:
            x = norm(x) * 1.5 + 0.25  # (the affine ops between must stay outside)
        return x

    g = trace(fn, tf.TensorSpec([None, 5, 16], tf.float32, name="x"), batch=3)
    exe = compile_graph(g.graph_def, g.io_config)
    kinds = [k for k, _ in _kinds(exe)]
    assert kinds.count("layer_norm") == len(norms), kinds
    assert "reduce" not in kinds and "unary" not in kinds, kinds
    _run(g, exe, RNG.standard_normal((3, 5, 16)).astype(np.float32) * 4 + 3)


def test_near_layer_norms_are_left_alone() -> None:
    """Over another axis, or with a different centre: not a layer norm, and computed as
    written (still matching TensorFlow)."""
    def other_axis(x: tf.Tensor) -> tf.Tensor:
        mean, var = tf.nn.moments(x, axes=[1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-3)

    def other_centre(x: tf.Tensor) -> tf.Tensor:
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        inv = tf.math.rsqrt(var + 1e-3)
        return x * inv - (mean + 1.0) * inv

    x = RNG.standard_normal((3, 5, 16)).astype(np.float32)
    for fn in (other_axis, other_centre):
        g = trace(fn, tf.TensorSpec([3, 5, 16], tf.float32, name="x"))
        exe = compile_graph(g.graph_def, g.io_config)
        assert "layer_norm" not in [k for k, _ in _kinds(exe)], fn.__name__
        _run(g, exe, x)


@pytest.mark.parametrize("engine", ["numpy", "native"])
def test_approximate_gelu_is_one_matmul_epilogue(engine: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """keras_hub's BERT feed-forward: Dense with gelu(approximate=True) on a sequence. TF's
    eight-op approximate GELU (with its x ** 3) ends up as the matmul's gelu_tanh."""
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    dense = tf.keras.layers.Dense(
        32, activation=lambda x: tf.keras.activations.gelu(x, approximate=True))
    dense.build((None, 5, 16))
    g = trace(lambda x: dense(x), tf.TensorSpec([None, 5, 16], tf.float32, name="x"), batch=3)
    exe = compile_graph(g.graph_def, g.io_config)
    kinds = _kinds(exe)
    matmuls = [a for k, a in kinds if k == "matmul"]
    assert len(matmuls) == 1 and matmuls[0]["activation"] == "gelu_tanh", kinds
    assert not [k for k, a in kinds if k in ("unary", "binary")], kinds
    _run(g, exe, RNG.standard_normal((3, 5, 16)).astype(np.float32) * 3)


def test_approximate_gelu_with_other_constants_stays_as_written() -> None:
    def near_gelu(x: tf.Tensor) -> tf.Tensor:  # 0.05 instead of 0.044715
        y = x @ W
        return 0.5 * y * (1.0 + tf.tanh(0.7978845608028654 * (y + 0.05 * tf.pow(y, 3))))

    g = trace(near_gelu, tf.TensorSpec([None, 16], tf.float32, name="x"), batch=4)
    exe = compile_graph(g.graph_def, g.io_config)
    assert not any(a.get("activation") == "gelu_tanh" or a.get("fn") == "gelu_tanh"
                   for _, a in _kinds(exe))
    _run(g, exe, RNG.standard_normal((4, 16)).astype(np.float32) * 2)


@pytest.mark.parametrize("engine", ["numpy", "native"])
@pytest.mark.parametrize("exponent,fns", [(2.0, ["square"]), (3.0, ["square", "mul"]),
                                          (0.5, ["sqrt"]), (-0.5, ["rsqrt"]),
                                          (-1.0, ["reciprocal"]), (1.0, [])])
def test_constant_powers_become_what_grappler_makes_them(
        engine: str, exponent: float, fns: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    g = trace(lambda x: tf.pow(x @ W, exponent) + 1.0,
              tf.TensorSpec([None, 16], tf.float32, name="x"), batch=4)
    exe = compile_graph(g.graph_def, g.io_config)
    got = [a["fn"] for k, a in _kinds(exe) if k in ("unary", "binary") and a["fn"] != "add"]
    assert got == fns, _kinds(exe)
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    if exponent in (0.5, -0.5):
        x = np.abs(x) + 0.1
    with load(exe) as model:
        have = model.run({"x:0": x})
    for key, want in g.reference({"x:0": x}).items():
        # x @ W may be negative for the roots: NaN where TF gives NaN
        np.testing.assert_allclose(have[key], want, rtol=2e-5, atol=2e-6)


def test_a_power_by_another_constant_stays_a_pow() -> None:
    g = trace(lambda x: tf.pow(x, 2.5), tf.TensorSpec([None, 16], tf.float32, name="x"), batch=4)
    exe = compile_graph(g.graph_def, g.io_config)
    assert [a["fn"] for k, a in _kinds(exe) if k == "binary"] == ["pow"]
    _run(g, exe, np.abs(RNG.standard_normal((4, 16))).astype(np.float32))


@pytest.mark.parametrize("engine", ["numpy", "native"])
def test_swish_is_one_conv_epilogue(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """EfficientNet's conv + swish (x * sigmoid(x)) is one conv2d with activation swish."""
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    w = tf.constant(RNG.standard_normal((3, 3, 4, 8)).astype(np.float32) * 0.3)
    g = trace(lambda x: tf.nn.silu(tf.nn.conv2d(x, w, 1, "SAME")),
              tf.TensorSpec([2, 6, 6, 4], tf.float32, name="x"))
    exe = compile_graph(g.graph_def, g.io_config)
    kinds = _kinds(exe)
    assert [(k, a.get("activation")) for k, a in kinds] == [("conv2d", "swish")], kinds
    x = RNG.standard_normal((2, 6, 6, 4)).astype(np.float32) * 3
    with load(exe) as model:
        got = model.run({"x:0": x})
    for key, want in g.reference({"x:0": x}).items():
        np.testing.assert_allclose(got[key], want, rtol=2e-5, atol=2e-6)
