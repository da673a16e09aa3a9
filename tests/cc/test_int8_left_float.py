"""What `--quantize int8` leaves in float, and that the report says so (cc/passes/quantize.py).

A squeeze-excite block (EfficientNet's: global mean, 1x1 conv + swish, 1x1 conv +
sigmoid, multiply) has two convolutions writing one pixel per image; `stays_float`
keeps them in float (bf16 with `--auto-cast`). They are quantizable all the same, so
`stats["quantization"]` lists them beside the int8 ones, with the reason and the error
int8 would have given them: `neuronish-cc inspect` then counts every convolution, and
"which convolutions run in bf16, and why" has its answer in the executable.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from neuronish.cc import compiler
from neuronish.cc.passes import quantize
from neuronish.runtime import load
from neuronish.runtime.executable import to_bytes
from tests.graphs import TracedGraph, trace


def _squeeze_excite(batch: int = 4, side: int = 6, channels: int = 16, squeezed: int = 4,
                    seed: int = 0) -> TracedGraph:
    """expand 1x1 + swish -> squeeze-excite -> project 1x1, weights at He scale (so the
    excitation is not stuck at sigmoid(0) = 0.5, as in a random-weight keras model)."""
    rng = np.random.default_rng(seed)

    def he(*shape: int) -> tf.Tensor:
        fan_in = int(np.prod(shape[:-1]))
        return tf.constant((rng.standard_normal(shape) * np.sqrt(2 / fan_in)).astype(np.float32))

    w_expand, w_reduce = he(1, 1, channels, channels), he(1, 1, channels, squeezed)
    w_excite, w_project = he(1, 1, squeezed, channels), he(1, 1, channels, 8)
    b_reduce = tf.constant(rng.normal(0, 0.1, squeezed).astype(np.float32))
    b_excite = tf.constant(rng.normal(0, 0.5, channels).astype(np.float32))

    def fn(x: tf.Tensor) -> tf.Tensor:
        y = tf.nn.silu(tf.nn.conv2d(x, w_expand, 1, "VALID"))
        s = tf.reduce_mean(y, axis=[1, 2], keepdims=True)
        s = tf.nn.silu(tf.nn.bias_add(tf.nn.conv2d(s, w_reduce, 1, "VALID"), b_reduce))
        s = tf.sigmoid(tf.nn.bias_add(tf.nn.conv2d(s, w_excite, 1, "VALID"), b_excite))
        return tf.nn.conv2d(y * s, w_project, 1, "VALID")

    return trace(fn, tf.TensorSpec([None, side, side, channels], tf.float32, name="x"),
                 batch=batch)


def test_one_pixel_convolutions_stay_float_and_the_report_says_why() -> None:
    g = _squeeze_excite()
    rng = np.random.default_rng(1)
    calib = [[rng.standard_normal((4, 6, 6, 16)).astype(np.float32)] for _ in range(3)]
    exe = compiler.compile_executable(g.graph_def, g.io_config, calibration=calib,
                                      auto_cast="matmult", auto_cast_type="bf16")

    # The program: expand and project in int8, the squeeze-excite pair in bf16.
    program = exe.programs[0]
    assert [i.kind for i in program].count("conv2d_int8") == 2
    floats = [i for i in program if i.kind == "conv2d"]
    assert len(floats) == 2 and all(i.attrs["compute"] == "bfloat16" for i in floats)

    # The report: all four convolutions in graph order, the two left in float with the
    # reason and the error int8 would have added to their own output.
    rows = exe.stats["quantization"]["instructions"]
    assert [r["precision"] for r in rows] == ["int8", "bfloat16", "bfloat16", "int8"], rows
    for r in rows[1:3]:
        assert r["why"] == quantize.ONE_PIXEL
        assert 0 < r["error"] < 0.1, r
    assert "why" not in rows[0] and "why" not in rows[3]

    # ...and the numbers are TensorFlow's, within int8's error.
    x = rng.standard_normal((4, 6, 6, 16)).astype(np.float32)
    want = next(iter(g.reference({"x:0": x}).values()))
    with load(to_bytes(exe)) as model:
        got = next(iter(model.run({"x:0": x}).values()))
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert err < 0.05, err


def test_only_one_pixel_outputs_stay_float() -> None:
    """A 1x1 convolution on a 2x2 image is quantized; the one on the pooled pixel is not,
    in float32 (no auto-cast) too."""
    rng = np.random.default_rng(2)
    w = tf.constant(rng.standard_normal((1, 1, 8, 8)).astype(np.float32))

    def fn(x: tf.Tensor) -> tf.Tensor:
        y = tf.nn.relu(tf.nn.conv2d(x, w, 1, "VALID"))
        return tf.nn.conv2d(tf.reduce_mean(y, axis=[1, 2], keepdims=True), w, 1, "VALID")

    g = trace(fn, tf.TensorSpec([None, 2, 2, 8], tf.float32, name="x"), batch=2)
    calib = [[rng.standard_normal((2, 2, 2, 8)).astype(np.float32)] for _ in range(2)]
    exe = compiler.compile_executable(g.graph_def, g.io_config, calibration=calib)
    rows = exe.stats["quantization"]["instructions"]
    assert [(r["precision"], r.get("why")) for r in rows] == \
        [("int8", None), ("float32", quantize.ONE_PIXEL)]
    assert [i.kind for i in exe.programs[0] if i.kind.startswith("conv2d")] == \
        ["conv2d_int8", "conv2d"]
