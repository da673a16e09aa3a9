"""fold_affine_chains: an image's preprocessing (Keras' Rescaling, Normalization and
EfficientNet's Rescaling by 1/std) is one binary x * s + o, with TensorFlow's numbers on
the numpy engine, the native engine and the C runtime; chains it cannot fold exactly
stay as they are."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc import compiler
from neuronish.runtime import load
from neuronish.runtime.executable import to_bytes
from tests.graphs import TracedGraph, trace
from tests.helpers import one_output_on_every_engine

SHAPE = (2, 16, 16, 3)
L = tf.keras.layers
MEAN, VARIANCE, STD = [0.485, 0.456, 0.406], [0.052, 0.05, 0.051], [0.229, 0.224, 0.225]


def _preprocessed_conv() -> TracedGraph:
    """Rescaling(1/255), Normalization(mean, variance), Rescaling(1/std), then a padded
    convolution (which no scale or shift can enter: it pads with zeros)."""
    tf.keras.utils.set_random_seed(3)
    x = inputs = tf.keras.Input(SHAPE[1:])
    x = L.Rescaling(1 / 255)(x)
    x = L.Normalization(mean=MEAN, variance=VARIANCE)(x)
    x = L.Rescaling([1 / s for s in STD])(x)
    outputs = L.Conv2D(8, 3, padding="same", bias_initializer="random_normal")(x)
    return trace(tf.keras.Model(inputs, outputs),
                 tf.TensorSpec([None, *SHAPE[1:]], tf.float32, name="x"), batch=SHAPE[0])


def _kinds(g: TracedGraph) -> list[tuple]:
    program = compiler.compile_executable(g.graph_def, g.io_config).programs[0]
    return [(i.kind, i.attrs.get("fn"), len(i.inputs)) for i in program]


def test_rescaling_and_normalization_are_one_pass() -> None:
    assert _kinds(_preprocessed_conv()) == [("binary", "mul", 3), ("conv2d", None, 3)]


@pytest.mark.skipif(shutil.which("g++") is None,
                    reason="g++ is needed to build the C runtime library")
def test_every_engine_gives_tensorflows_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _preprocessed_conv()
    x = np.random.default_rng(5).uniform(0, 255, SHAPE).astype(np.float32)
    want = next(iter(g.reference({"x:0": x}).values()))
    got = one_output_on_every_engine(to_bytes(compiler.compile_executable(
        g.graph_def, g.io_config)), {"x:0": x}, monkeypatch)
    for engine, value in got.items():
        error = np.max(np.abs(value - want)) / np.max(np.abs(want))
        assert error < 2e-6, (engine, error)


def _traced(fn: object, shape: tuple[int, ...] = (4, 5, 3)) -> TracedGraph:
    return trace(fn, tf.TensorSpec(shape, tf.float32, name="x"))


V = np.array([0.5, -2.0, 4.0], np.float32)
W = np.array([3.0, 0.25, -1.5], np.float32)

# (the chain, the folded binary's fn and operand count)
FOLDED = {
    "scale_then_shift_then_scale": (lambda x: (x * V + W) * 2.0, ("mul", 3)),
    "shift_then_divide": (lambda x: (x - W) / V, ("mul", 3)),
    "constant_minus_x_then_scale": (lambda x: (W - x) * V, ("mul", 3)),
    "constant_minus_a_scaled_x": (lambda x: W - (x * V + 1.5), ("mul", 3)),
    "constant_minus_a_shifted_x": (lambda x: 2.0 - (x - W), ("mul", 3)),  # -x + (2 + W)
    "two_shifts": (lambda x: x + V - W, ("add", 2)),
    "two_scales": (lambda x: x * V / W, ("mul", 2)),
    "scales_then_shift_constant_first": (lambda x: W + V * x * 3.0, ("mul", 3)),
}


@pytest.mark.parametrize("case", FOLDED)
def test_a_chain_by_constants_is_one_binary_with_tensorflows_numbers(case: str) -> None:
    fn, (want_fn, n_inputs) = FOLDED[case]
    g = _traced(fn)
    assert _kinds(g) == [("binary", want_fn, n_inputs)]
    x = (np.random.default_rng(1).standard_normal((4, 5, 3)) * 10).astype(np.float32)
    want = g.reference({"x:0": x})["Identity:0"]
    with load(to_bytes(compiler.compile_executable(g.graph_def, g.io_config))) as model:
        got = model.run({"x:0": x})["Identity:0"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.max(np.abs(want)))



def _read_twice(y: tf.Tensor) -> tf.Tensor:
    return tf.concat([y, y + W], axis=-1)


# Chains that are not folded: a division by a zero (x / 0 is an infinity or NaN that
# x * (1/0) is not for x = 0), a constant divided by x, a value read twice, a tensor
# operand, an activation between.
KEPT = {
    "divide_by_a_zero": (lambda x: (x + V) / np.array([1.0, 0.0, 2.0], np.float32), 2),
    "constant_over_x": (lambda x: W / (x * V), 2),
    "middle_value_read_twice": (lambda x: _read_twice(x * V), 2),
    "relu_between": (lambda x: tf.nn.relu(x * V) + W, 2),
}


@pytest.mark.parametrize("case", KEPT)
def test_what_cannot_fold_exactly_stays_apart(case: str) -> None:
    fn, binaries = KEPT[case]
    kinds = _kinds(_traced(fn))
    assert sum(k[0] == "binary" for k in kinds) == binaries, kinds


def test_a_tensor_operand_stays_apart() -> None:
    def fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return (x * V) * y + W

    g = trace(fn, tf.TensorSpec((4, 5, 3), tf.float32, name="x"),
              tf.TensorSpec((4, 5, 3), tf.float32, name="y"))
    # x * V stays; the product with y takes W as its addend (fuse_activation's rule)
    assert _kinds(g) == [("binary", "mul", 2), ("binary", "mul", 3)]
