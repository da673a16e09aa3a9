"""EfficientNet's squeeze-excite product, and a trained BatchNorm with its ReLU on
DenseNet's concat, are quantized by the element-wise instruction itself
(cc/passes/binary_quantize.py).

In an int8 EfficientNet block the project convolution reads depthwise output x sigmoid
gate, so `--quantize int8` put a `quantize` after the multiply; the fusion makes the
pair one `binary_quantize` that writes the int8 product directly. Checked on a Keras
block built like EfficientNet's (expand, depthwise, squeeze-excite, project): the
fusion fires with and without `--auto-cast`, the fused program gives the unfused one's
outputs bit for bit on the numpy engine, the native engine under Python and the C
runtime, and both stay within int8's error of TensorFlow.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc import compiler
from neuronish.runtime.executable import Executable, to_bytes
from tests.graphs import TracedGraph, trace
from tests.helpers import one_output_on_every_engine

BATCH, SIDE, CHANNELS = 4, 8, 16
SHAPE = (BATCH, SIDE, SIDE, CHANNELS)


def _efficientnet_block(seed: int = 0) -> TracedGraph:
    """expand 1x1 + swish, depthwise 3x3 + swish, squeeze-excite (mean, 1x1 + swish,
    1x1 + sigmoid, multiply), project 1x1: an MBConv block as keras.applications builds
    it (without batch norm), biases random so that the gate is not a constant 0.5."""
    tf.keras.utils.set_random_seed(seed)
    biases = tf.keras.initializers.RandomNormal(stddev=0.5, seed=seed)
    layers = tf.keras.layers
    x = inputs = tf.keras.Input(SHAPE[1:])
    x = layers.Conv2D(4 * CHANNELS, 1, activation="swish", bias_initializer=biases)(x)
    x = layers.DepthwiseConv2D(3, padding="same", activation="swish",
                               bias_initializer=biases)(x)
    s = layers.GlobalAveragePooling2D(keepdims=True)(x)
    s = layers.Conv2D(4, 1, activation="swish", bias_initializer=biases)(s)
    s = layers.Conv2D(4 * CHANNELS, 1, activation="sigmoid", bias_initializer=biases)(s)
    x = layers.Multiply()([x, s])
    outputs = layers.Conv2D(CHANNELS, 1, bias_initializer=biases)(x)
    model = tf.keras.Model(inputs, outputs)
    return trace(model, tf.TensorSpec([None, *SHAPE[1:]], tf.float32, name="x"), batch=BATCH)


@pytest.fixture(scope="module")
def block() -> TracedGraph:
    return _efficientnet_block()


def _calibration(count: int = 3) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(1)
    return [[rng.standard_normal(SHAPE).astype(np.float32)] for _ in range(count)]


def _compile(graph: TracedGraph, auto_cast: str, fused: bool = True) -> Executable:
    return compiler.compile_executable(
        graph.graph_def, graph.io_config, calibration=_calibration(), auto_cast=auto_cast,
        auto_cast_type="bf16", disabled_passes=None if fused else ["fuse_binary_quantize"])


@pytest.mark.parametrize("auto_cast", ["matmult", "none"])
def test_the_excitation_product_is_written_in_int8_by_one_instruction(
        block: TracedGraph, auto_cast: str) -> None:
    program = _compile(block, auto_cast).programs[0]
    kinds = [i.kind for i in program]
    # only the input is quantized on its own; the product is the multiply's to quantize
    assert kinds.count("quantize") == 1 and "binary" not in kinds, kinds
    [fused] = [i for i in program if i.kind == "binary_quantize"]
    assert fused.attrs["fn"] == "mul" and fused.attrs["to"] in ("int8", "uint8")
    producers = {v: i for i in program for v in i.outputs}
    image, gate = (producers[v] for v in fused.inputs)
    assert image.kind == "conv2d_int8" and image.attrs["depthwise"]
    assert gate.kind == "conv2d" and gate.attrs["activation"] == "sigmoid"
    assert [i.kind for i in program if fused.outputs[0] in i.inputs] == ["conv2d_int8"]
    # without the pass, the program is the pair it replaces
    unfused = [i.kind for i in _compile(block, auto_cast, fused=False).programs[0]]
    assert unfused.count("quantize") == 2 and "binary" in unfused


def _assert_fused_equals_the_pair(graph: TracedGraph, auto_cast: str, x: np.ndarray,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused program's outputs are the unfused pair's, bit for bit, on every engine,
    and TensorFlow's within what int8 costs (the other int8 tests' bound)."""
    want = next(iter(graph.reference({"x:0": x}).values()))
    results = {}
    for name, fused in (("fused", True), ("pair", False)):
        exe = _compile(graph, auto_cast, fused)
        assert ("binary_quantize" in {i.kind for i in exe.programs[0]}) == fused
        results[name] = one_output_on_every_engine(to_bytes(exe), {"x:0": x}, monkeypatch)
    for engine, got in results["fused"].items():
        np.testing.assert_array_equal(got, results["pair"][engine], err_msg=engine)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 0.05, (engine, err)


@pytest.mark.skipif(shutil.which("g++") is None,
                    reason="g++ is needed to build the C runtime library")
@pytest.mark.parametrize("auto_cast", ["matmult", "none"])
def test_fused_and_unfused_programs_agree_bit_for_bit_on_every_engine(
        block: TracedGraph, auto_cast: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(7).standard_normal(SHAPE).astype(np.float32)
    _assert_fused_equals_the_pair(block, auto_cast, x, monkeypatch)


def _densenet_block(seed: int = 0, activation: type = tf.keras.layers.ReLU) -> TracedGraph:
    """A DenseNet layer on trained weights: concat of the input and a 3x3 convolution's
    features, then BatchNorm (statistics drawn at random, so its shift does not vanish),
    ReLU, and the 1x1 bottleneck convolution that reads them."""
    tf.keras.utils.set_random_seed(seed)
    layers = tf.keras.layers
    x = inputs = tf.keras.Input(SHAPE[1:])
    grown = layers.Conv2D(8, 3, padding="same", use_bias=False)(x)
    x = layers.Concatenate()([x, grown])
    norm = layers.BatchNormalization()
    x = activation()(norm(x))
    outputs = layers.Conv2D(CHANNELS, 1, use_bias=False)(x)
    model = tf.keras.Model(inputs, outputs)
    rng = np.random.default_rng(seed)
    c = CHANNELS + 8
    norm.set_weights([rng.uniform(0.5, 1.5, c), rng.normal(0, 0.5, c),
                      rng.normal(0, 0.5, c), rng.uniform(0.5, 2.0, c)])
    return trace(model, tf.TensorSpec([None, *SHAPE[1:]], tf.float32, name="x"), batch=BATCH)


@pytest.mark.skipif(shutil.which("g++") is None,
                    reason="g++ is needed to build the C runtime library")
@pytest.mark.parametrize("auto_cast", ["matmult", "none"])
def test_a_trained_batchnorm_and_relu_are_quantized_in_the_same_pass(
        auto_cast: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """scale, shift and ReLU on the concat (one `binary` since fuse_shift) and the quantize
    the int8 bottleneck reads become one binary_quantize with the addend and the ReLU,
    giving the pair's 8-bit values on every engine."""
    graph = _densenet_block()
    program = _compile(graph, auto_cast).programs[0]
    [fused] = [i for i in program if i.kind == "binary_quantize"]
    assert "binary" not in [i.kind for i in program]
    assert len(fused.inputs) == 3 and fused.attrs["fn"] == "mul", fused
    assert fused.attrs["activation"] == "relu" and fused.attrs["to"] == "uint8", fused.attrs
    assert [i.kind for i in program if fused.outputs[0] in i.inputs] == ["conv2d_int8"]
    x = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    _assert_fused_equals_the_pair(graph, auto_cast, x, monkeypatch)


def test_an_activation_other_than_relu_keeps_the_pair() -> None:
    """binary_quantize clamps at 0 for the ReLU and takes no other activation: a leaky
    ReLU stays on the binary, and the quantize after it."""
    program = _compile(_densenet_block(activation=tf.keras.layers.LeakyReLU), "none").programs[0]
    [binary] = [i for i in program if i.kind == "binary"]
    assert binary.attrs["activation"] == "leaky_relu" and len(binary.inputs) == 3
    assert "binary_quantize" not in [i.kind for i in program]
    assert [i.kind for i in program if binary.outputs[0] in i.inputs] == ["quantize"]


def test_a_product_read_elsewhere_too_stays_a_pair() -> None:
    """The fused instruction writes only the 8-bit value: a product that a float
    instruction (here, the graph output) also reads is left to binary + quantize."""
    rng = np.random.default_rng(2)
    w = tf.constant(rng.standard_normal((1, 1, 8, 8)).astype(np.float32))
    g = tf.constant(rng.uniform(0.2, 1.0, (1, 1, 1, 8)).astype(np.float32))

    def fn(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        y = tf.nn.relu(tf.nn.conv2d(x, w, 1, "VALID")) * g
        return y, tf.nn.conv2d(y, w, 1, "VALID")

    graph = trace(fn, tf.TensorSpec([None, 4, 4, 8], tf.float32, name="x"), batch=2)
    calib = [[rng.standard_normal((2, 4, 4, 8)).astype(np.float32)] for _ in range(2)]
    kinds = [i.kind for i in compiler.compile_executable(
        graph.graph_def, graph.io_config, calibration=calib).programs[0]]
    assert "binary_quantize" not in kinds and "binary" in kinds, kinds
