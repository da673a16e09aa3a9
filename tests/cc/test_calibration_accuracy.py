"""How int8 calibration picks its ranges and corrects biases (cc/passes/quantize.py):

- bias correction (on by default): the int8 convolution's output mean per channel on the
  calibration set is the float32 one's, where without it weight rounding shifts it;
- activation ranges: the extremes over the calibration set (the default), or with
  `mean_ranges` the mean over images of each image's min and max (NNCF's default), so
  one outlying image does not widen every image's step.

Both are checked on programs compiled by the compiler and run on the numpy engine (the
int8 definition), against TensorFlow's float32 numbers.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc import compiler
from neuronish.cc.passes import quantize
from neuronish.runtime import load
from neuronish.runtime.executable import to_bytes
from tests.graphs import trace


def _compile(monkeypatch: pytest.MonkeyPatch, g, calib: list, **choices: bool):  # noqa: ANN001, ANN202
    """compile_executable with quantize_int8's `mean_ranges` / `bias_correction` set."""
    monkeypatch.setattr(compiler, "quantize_int8",
                        functools.partial(quantize.quantize_int8, **choices))
    return compiler.compile_executable(g.graph_def, g.io_config, calibration=calib)


def _lumpy_conv():  # noqa: ANN202
    """A 1x1 convolution with a bias and no activation whose weights quantize coarsely:
    one large weight per output channel sets its step (max |w| / 127), so the small ones
    round by up to half a step each, all in the same direction for a channel where they
    sit near the same value; a positive input mean turns that into a shift of the mean."""
    rng = np.random.default_rng(1)
    w = np.full((1, 1, 32, 8), 0.0, np.float32)
    w[..., :] = rng.uniform(0.3, 0.7, (1, 1, 1, 8)).astype(np.float32) / 127  # ~0.5 step
    w[0, 0, 0, :] = 1.0
    w += rng.standard_normal(w.shape).astype(np.float32) * 1e-4
    b = rng.standard_normal(8).astype(np.float32) * 0.1
    wt, bt = tf.constant(w), tf.constant(b)

    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.bias_add(tf.nn.conv2d(x, wt, 1, "VALID"), bt)

    return trace(fn, tf.TensorSpec([None, 6, 6, 32], tf.float32, name="x"), batch=4)


def _channel_mean_error(monkeypatch: pytest.MonkeyPatch, g, calib: list, exe) -> float:  # noqa: ANN001
    """max over channels of |mean int8 output - mean TF float32 output| on `calib`, in
    units of the float32 output's standard deviation."""
    monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
    got, want = [], []
    with load(to_bytes(exe), runtime="python") as model:
        for (x,) in calib:
            got.append(next(iter(model.run({"x:0": x}).values())))
            want.append(next(iter(g.reference({"x:0": x}).values())))
    got, want = np.stack(got), np.stack(want)
    axes = tuple(range(got.ndim - 1))
    return float(np.max(np.abs(got.mean(axes) - want.mean(axes))) / want.std())


def test_bias_correction_puts_the_int8_mean_on_the_float_mean(monkeypatch) -> None:  # noqa: ANN001
    g = _lumpy_conv()
    rng = np.random.default_rng(2)
    calib = [[(2.0 + rng.standard_normal((4, 6, 6, 32))).astype(np.float32)]
             for _ in range(4)]
    plain = _compile(monkeypatch, g, calib, bias_correction=False)
    corrected = _compile(monkeypatch, g, calib, bias_correction=True)
    before = _channel_mean_error(monkeypatch, g, calib, plain)
    after = _channel_mean_error(monkeypatch, g, calib, corrected)
    # Weight rounding shifts the uncorrected mean by a visible part of the spread; the
    # correction takes (nearly) all of it out: what is left is the input's rounding noise.
    assert before > 0.02, before
    assert after < before / 10, (before, after)
    # (on by default: a plain compile gives the corrected program)
    monkeypatch.setattr(compiler, "quantize_int8", quantize.quantize_int8)
    default = compiler.compile_executable(g.graph_def, g.io_config, calibration=calib)
    assert _channel_mean_error(monkeypatch, g, calib, default) == after
    # ...and it holds beyond the calibration set (a systematic shift, not a fit to noise)
    fresh = [[(2.0 + rng.standard_normal((4, 6, 6, 32))).astype(np.float32)]
             for _ in range(4)]
    assert _channel_mean_error(monkeypatch, g, fresh, corrected) < \
        _channel_mean_error(monkeypatch, g, fresh, plain) / 5
    stats = corrected.stats["quantization"]["bias_correction"]
    assert stats["kept"] and stats["corrected"] == 1 and stats["error"] < stats["error_without"]
    # The correction is in the bias only: weights and steps are those of the uncorrected.
    [q_plain] = [i for i in plain.programs[0] if i.kind == "conv2d_int8"]
    [q_corr] = [i for i in corrected.programs[0] if i.kind == "conv2d_int8"]
    assert q_plain.attrs == q_corr.attrs


def test_activation_range_is_the_mean_of_each_images_range(monkeypatch) -> None:  # noqa: ANN001
    g = _lumpy_conv()
    rng = np.random.default_rng(3)
    images = np.abs(rng.standard_normal((8, 6, 6, 32))).astype(np.float32)
    images[5] *= 10  # one outlying image
    calib = [[images[:4]], [images[4:]]]
    peaks = images.reshape(8, -1).max(axis=1)

    def input_step(exe) -> float:  # noqa: ANN001
        [q] = [i for i in exe.programs[0] if i.kind == "quantize"]
        assert q.attrs["to"] == "uint8"  # non-negative on every image
        return q.attrs["scale"]

    mean = input_step(_compile(monkeypatch, g, calib, mean_ranges=True))
    extreme = input_step(_compile(monkeypatch, g, calib, mean_ranges=False))
    np.testing.assert_allclose(mean, peaks.mean() / 255, rtol=1e-6)
    np.testing.assert_allclose(extreme, peaks.max() / 255, rtol=1e-6)
    # a value that goes negative on any image is signed, even when its mean minimum is not
    images[:7] = np.abs(images[:7]) + 0.5
    images[7] = -np.abs(images[7])
    calib = [[images[:4]], [images[4:]]]
    exe = _compile(monkeypatch, g, calib, mean_ranges=True)
    [q] = [i for i in exe.programs[0] if i.kind == "quantize"]
    assert q.attrs["to"] == "int8"


def test_a_correction_that_raises_the_calibration_error_is_dropped(monkeypatch) -> None:  # noqa: ANN001
    """The pass keeps corrected biases only where they lower the all-int8 error on the
    calibration set; a correction that would raise it (here a wrong one, +1 on every
    bias) leaves the program as it is without correction."""
    g = _lumpy_conv()
    rng = np.random.default_rng(4)
    calib = [[(2.0 + rng.standard_normal((4, 6, 6, 32))).astype(np.float32)]
             for _ in range(2)]
    plain = _compile(monkeypatch, g, calib, bias_correction=False)
    right = quantize._BiasShift.biases
    monkeypatch.setattr(quantize._BiasShift, "biases",
                        lambda self, graph: {i: b + 1 for i, b in right(self, graph).items()})
    wrong = _compile(monkeypatch, g, calib, bias_correction=True)
    stats = wrong.stats["quantization"]["bias_correction"]
    assert not stats["kept"] and stats["error"] > stats["error_without"], stats
    assert wrong.stats["quantization"]["all_int8_error"] == stats["error_without"]
    x = calib[0][0]
    monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
    with load(to_bytes(plain), runtime="python") as a, load(to_bytes(wrong), runtime="python") as b:
        np.testing.assert_array_equal(a.run({"x:0": x})[g.io_config["outputs"][0]],
                                      b.run({"x:0": x})[g.io_config["outputs"][0]])
