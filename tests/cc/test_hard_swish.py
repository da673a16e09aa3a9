"""recognize_hard_swish: MobileNetV3's activation and its squeeze-excite gate are one
instruction each, or a convolution's epilogue, with TensorFlow's numbers.

Hard swish arrives as x * (relu6(x + 3) / 6) (Keras 3's `hard_swish` on TensorFlow) or
x * (relu6(x + 3) * (1/6)) (MobileNetV3's own layers), three or four instructions; hard
sigmoid, the gate, as the inner part. Here a MobileNetV3 block written both ways compiles
to convolutions carrying `hard_swish` / `hard_sigmoid` epilogues (oneDNN's hardswish and
hardsigmoid post-ops on the native engines) and matches TensorFlow on the numpy engine,
the native engine and the C runtime; near spellings stay as they are.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc import compiler
from neuronish.runtime.executable import to_bytes
from tests.graphs import TracedGraph, trace
from tests.helpers import one_output_on_every_engine

SHAPE = (2, 8, 8, 8)
L = tf.keras.layers


def _own_hard_sigmoid(x: tf.Tensor) -> tf.Tensor:  # keras.applications' MobileNetV3
    return L.ReLU(6.0)(x + 3.0) * (1.0 / 6.0)


def _block(seed: int = 0) -> TracedGraph:
    """expand 1x1 + hard_swish (Keras'), depthwise 3x3 + hard_swish (MobileNetV3's
    spelling), squeeze-excite gated by hard_sigmoid, project 1x1: MobileNetV3's block."""
    tf.keras.utils.set_random_seed(seed)
    biases = tf.keras.initializers.RandomNormal(stddev=1.0, seed=seed)
    x = inputs = tf.keras.Input(SHAPE[1:])
    x = L.Conv2D(16, 1, bias_initializer=biases)(x)
    x = L.Activation("hard_swish")(x)
    x = L.DepthwiseConv2D(3, padding="same", bias_initializer=biases)(x)
    x = L.Multiply()([x, _own_hard_sigmoid(x)])
    s = L.GlobalAveragePooling2D(keepdims=True)(x)
    s = L.Conv2D(4, 1, activation="relu", bias_initializer=biases)(s)
    s = _own_hard_sigmoid(L.Conv2D(16, 1, bias_initializer=biases)(s))
    x = L.Multiply()([x, s])
    outputs = L.Conv2D(8, 1, bias_initializer=biases)(x)
    model = tf.keras.Model(inputs, outputs)
    return trace(model, tf.TensorSpec([None, *SHAPE[1:]], tf.float32, name="x"),
                 batch=SHAPE[0])


@pytest.fixture(scope="module")
def block() -> TracedGraph:
    return _block()


def test_the_activations_are_convolution_epilogues(block: TracedGraph) -> None:
    program = compiler.compile_executable(block.graph_def, block.io_config).programs[0]
    epilogues = [(i.kind, i.attrs.get("activation")) for i in program
                 if i.kind in ("conv2d", "depthwise_conv2d")]
    assert epilogues == [("conv2d", "hard_swish"), ("depthwise_conv2d", "hard_swish"),
                         ("conv2d", "relu"), ("conv2d", "hard_sigmoid"), ("conv2d", "none")]
    # what is left: the mean and the gate's multiply, no relu6, add or divide of the formula
    assert sorted(i.kind for i in program if i.kind not in ("conv2d", "depthwise_conv2d")) \
        == ["binary", "reduce"], [i.kind for i in program]


@pytest.mark.skipif(shutil.which("g++") is None,
                    reason="g++ is needed to build the C runtime library")
@pytest.mark.parametrize("auto_cast", ["none", "matmult"])
def test_every_engine_gives_tensorflows_numbers(block: TracedGraph, auto_cast: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    exe = compiler.compile_executable(block.graph_def, block.io_config, auto_cast=auto_cast,
                                      auto_cast_type="bf16")
    data = to_bytes(exe)
    # inputs around the kinks at -3 and 3 as well as beyond them
    x = (np.random.default_rng(4).standard_normal(SHAPE) * 4).astype(np.float32)
    want = next(iter(block.reference({"x:0": x}).values()))
    bound = 2e-6 if auto_cast == "none" else 3e-2  # float32's rounding; bfloat16's
    for engine, got in one_output_on_every_engine(data, {"x:0": x}, monkeypatch).items():
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < bound, (engine, err)


def test_near_spellings_stay_as_written() -> None:
    """x + 2, a divide by 5, and a relu6 also read elsewhere are not hard sigmoid; a
    product with another tensor than the gate's input is not hard swish."""
    def plus_two(x: tf.Tensor) -> tf.Tensor:
        return x * (tf.nn.relu6(x + 2.0) / 6.0)

    def by_five(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu6(x + 3.0) / 5.0

    def shared_relu6(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        r = tf.nn.relu6(x + 3.0)
        return r / 6.0, r

    def other_input(x: tf.Tensor) -> tf.Tensor:
        return (x * 2.0) * (tf.nn.relu6(x + 3.0) / 6.0)

    for fn, hard in ((plus_two, set()), (by_five, set()), (shared_relu6, set()),
                     (other_input, {"hard_sigmoid"})):
        g = trace(fn, tf.TensorSpec([4, 16], tf.float32, name="x"))
        program = compiler.compile_executable(g.graph_def, g.io_config).programs[0]
        fns = {i.attrs.get("fn") for i in program} | {i.attrs.get("activation") for i in program}
        assert fns & {"hard_sigmoid", "hard_swish"} == hard, (fn.__name__, fns)
