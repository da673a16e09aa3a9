"""Rewrites before partitioning (neuronish/rewrites/rewrite.py, complex_pairs.py):
complex values between real tensors (Fourier mixing, spectrograms, MFCCs) become pairs of
real tensors with TensorFlow's numbers, and such models compile whole; a region whose
complex value leaves it some other way is left alone. Sorted segments over constant ids
become unsorted ones."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish.rewrites.complex_pairs import complex_as_pairs
from neuronish.rewrites.rewrite import sorted_segments_as_unsorted
from tests.helpers import rewritten_copy
from tests.neuronish.test_unroll import _frozen, _run


def _is_complex(node: object) -> bool:
    complex_types = {tf.complex64.as_datatype_enum, tf.complex128.as_datatype_enum}
    return any(node.attr[k].type in complex_types for k in ("T", "Tout", "Tcomplex", "dtype",
                                                            "DstT") if k in node.attr)


def _fnet_mixing(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """FNet's token mixing (2-D) and a 1-D transform, on [b, 6, 4]."""
    two = tf.math.real(tf.signal.fft2d(tf.complex(x, tf.zeros_like(x))))
    one = tf.math.real(tf.signal.fft(tf.complex(x, tf.zeros_like(x))))
    return tf.matmul(two + one, module.w)


def _complex_data(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """Transforms of complex data, read back every way: real, imaginary, |z|, angle."""
    z = tf.signal.fft2d(tf.complex(x, x * 0.5))
    w = tf.signal.fft(tf.math.conj(z) * tf.complex(0.3, -1.2) - z)
    return tf.concat([tf.math.real(z), tf.math.imag(w), tf.abs(w), tf.math.angle(z + w)], -1)


def _spectrogram(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """A magnitude spectrogram of 20 samples (tf.signal.stft: frames of 8, hop 4, a
    transform of 8 padded to 10) and its power, on [b, 5, 4] read as [b, 20]."""
    signal = tf.reshape(x, [-1, 20])
    spec = tf.abs(tf.signal.stft(signal, 8, 4, 10))
    cut = tf.abs(tf.signal.rfft(signal, [16]))  # a transform shorter than the signal
    return tf.concat([tf.reshape(spec, [-1, 24]), tf.reshape(tf.square(spec), [-1, 24]), cut],
                     -1)


def _mfcc(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """MFCCs of a log spectrogram (tf.signal.dct: an rfft times complex constants)."""
    spec = tf.abs(tf.signal.stft(tf.reshape(x, [-1, 20]), 8, 4, 8))
    return tf.signal.mfccs_from_log_mel_spectrograms(tf.math.log(spec + 1e-3))


@pytest.mark.parametrize("fn", [_fnet_mixing, _complex_data, _spectrogram, _mfcc],
                         ids=["fnet", "complex_data", "spectrogram", "mfcc"])
def test_complex_values_between_real_ones_become_real_pairs_with_tf_numbers(
        tmp_path: Path, fn: Callable) -> None:
    frozen = _frozen(tmp_path, fn, [None, 5, 4] if fn in (_spectrogram, _mfcc) else [None, 6, 4])
    fetches = list(frozen.outputs.values())
    shape = [2, 5, 4] if fn in (_spectrogram, _mfcc) else [2, 6, 4]
    _, rewritten = rewritten_copy(complex_as_pairs, frozen.graph_def, {"x:0": shape}, fetches)
    assert any(map(_is_complex, frozen.graph_def.node))
    assert not [n.name for n in rewritten.node if _is_complex(n)]
    for batch in (2, 3):
        x = np.random.default_rng(batch).standard_normal([batch, *shape[1:]]).astype("float32")
        (want,), (got,) = _run(frozen.graph_def, fetches, x), _run(rewritten, fetches, x)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def _complex_out(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """A complex value fetched (as a bitcast of its parts) and one the device would need
    the inverse transform for, which the rewrite does not know."""
    z = tf.signal.rfft(x)
    return tf.signal.irfft(z * 2.0) + tf.math.real(tf.signal.fft(tf.complex(x, x)))


def test_a_region_whose_complex_value_leaves_some_other_way_is_left_alone(
        tmp_path: Path) -> None:
    frozen = _frozen(tmp_path, _complex_out, [None, 6, 4])
    fetches = list(frozen.outputs.values())
    _, out = rewritten_copy(complex_as_pairs, frozen.graph_def, {"x:0": [2, 6, 4]}, fetches)
    ops = [n.op for n in out.node]
    assert "IRFFT" in ops and "RFFT" in ops, "the rfft -> irfft region must stay whole"
    assert "FFT" not in ops, "the separate fft region is still rewritten"
    x = np.random.default_rng(0).standard_normal((3, 6, 4)).astype("float32")
    np.testing.assert_allclose(_run(out, fetches, x)[0], _run(frozen.graph_def, fetches, x)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [_fnet_mixing, _mfcc], ids=["fnet", "mfcc"])
def test_fourier_and_audio_front_ends_compile_whole(tmp_path: Path, fn: Callable) -> None:
    _frozen(tmp_path, fn, [None, 6, 4] if fn is _fnet_mixing else [None, 5, 4])
    report = neuronish.saved_model.compile(str(tmp_path / "src"), str(tmp_path / "out"),
                                           batch_size=1)
    assert report["OnNeuronRatio"] == 1.0 and not report["OnTensorFlow"], report["OnTensorFlow"]
    shape = (3, 6, 4) if fn is _fnet_mixing else (3, 5, 4)
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    want = tf.saved_model.load(str(tmp_path / "src")).signatures["serving_default"](
        x=tf.constant(x))["y"].numpy()
    got = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"](
        x=tf.constant(x))["y"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _segments(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """Sorted segments over constant ids (segment 2 empty), on [b, 6] -> [6, b]."""
    ids = tf.constant([0, 0, 1, 3, 3, 3])
    rows = tf.transpose(x)
    return tf.concat([tf.math.segment_sum(rows, ids), tf.math.segment_mean(rows, ids)], 0)


def test_sorted_segments_over_constant_ids_compile_with_tf_numbers(tmp_path: Path) -> None:
    src = tmp_path / "segments"
    frozen = _frozen(src, _segments, [None, 6])
    fetches = list(frozen.outputs.values())
    _, rewritten = rewritten_copy(sorted_segments_as_unsorted, frozen.graph_def, {"x:0": [2, 6]})
    ops = {n.op for n in rewritten.node}
    assert "UnsortedSegmentSum" in ops and not {"SegmentSum", "SegmentMean"} & ops
    for batch in (2, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 6)).astype("float32")
        (want,), (got,) = _run(frozen.graph_def, fetches, x), _run(rewritten, fetches, x)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    report = neuronish.saved_model.compile(str(src / "src"), str(tmp_path / "out"),
                                           batch_size=1)
    assert report["OnNeuronRatio"] == 1.0, report["OnTensorFlow"]
