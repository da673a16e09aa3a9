"""Rewrites before partitioning (neuronish/partition/rewrite.py): the real part of a
Fourier transform of a real tensor (FNet) becomes products with DFT matrices, the same
numbers as TensorFlow's FFT; a transform of complex data is left alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

import neuronish.saved_model
from neuronish.partition.rewrite import real_fft_as_matmuls, sorted_segments_as_unsorted
from tests.test_unroll import _frozen, _run

COMPLEX_OPS = {"Complex", "FFT", "FFT2D", "Real"}


def _fnet_mixing(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """FNet's token mixing (2-D) and a 1-D transform, on [b, 6, 4]."""
    two = tf.math.real(tf.signal.fft2d(tf.complex(x, tf.zeros_like(x))))
    one = tf.math.real(tf.signal.fft(tf.complex(x, tf.zeros_like(x))))
    return tf.matmul(two + one, module.w)


def _complex_data(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    return tf.math.real(tf.signal.fft2d(tf.complex(x, x * 0.5)))


def test_real_fft_of_real_data_becomes_matmuls_with_tf_numbers(tmp_path: Path) -> None:
    frozen = _frozen(tmp_path, _fnet_mixing, [None, 6, 4])
    fetches = list(frozen.outputs.values())
    rewritten = real_fft_as_matmuls(frozen.graph_def, {"x:0": [2, 6, 4]}, fetches)
    assert not COMPLEX_OPS & {n.op for n in rewritten.node}
    for batch in (2, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 6, 4)).astype("float32")
        (want,), (got,) = _run(frozen.graph_def, fetches, x), _run(rewritten, fetches, x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fft_of_complex_data_is_left_alone(tmp_path: Path) -> None:
    frozen = _frozen(tmp_path, _complex_data, [None, 6, 4])
    out = real_fft_as_matmuls(frozen.graph_def, {"x:0": [2, 6, 4]},
                              list(frozen.outputs.values()))
    assert out is frozen.graph_def


def test_fnet_style_model_compiles_whole(tmp_path: Path) -> None:
    _frozen(tmp_path, _fnet_mixing, [None, 6, 4])
    report = neuronish.saved_model.compile(str(tmp_path / "src"), str(tmp_path / "out"),
                                           batch_size=1)
    assert report["OnNeuronRatio"] == 1.0 and not report["OnTensorFlow"], report["OnTensorFlow"]


def _segments(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """Sorted segments over constant ids (segment 2 empty), on [b, 6] -> [6, b]."""
    ids = tf.constant([0, 0, 1, 3, 3, 3])
    rows = tf.transpose(x)
    return tf.concat([tf.math.segment_sum(rows, ids), tf.math.segment_mean(rows, ids)], 0)


def test_sorted_segments_over_constant_ids_compile_with_tf_numbers(tmp_path: Path) -> None:
    src = tmp_path / "segments"
    frozen = _frozen(src, _segments, [None, 6])
    fetches = list(frozen.outputs.values())
    rewritten = sorted_segments_as_unsorted(frozen.graph_def, {"x:0": [2, 6]})
    ops = {n.op for n in rewritten.node}
    assert "UnsortedSegmentSum" in ops and not {"SegmentSum", "SegmentMean"} & ops
    for batch in (2, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 6)).astype("float32")
        (want,), (got,) = _run(frozen.graph_def, fetches, x), _run(rewritten, fetches, x)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    report = neuronish.saved_model.compile(str(src / "src"), str(tmp_path / "out"),
                                           batch_size=1)
    assert report["OnNeuronRatio"] == 1.0, report["OnTensorFlow"]
