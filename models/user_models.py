"""Small models as users write them: Keras layers and `tf.function`s over common ops.

Each builder returns a Keras model (exported with `model.export`) or a `tf.Module` with
a `serve` function (saved with `tf.saved_model.save`), batch free, weights random with a
fixed seed. They cover what the keras.applications and keras_hub zoo does not: 1-D and
3-D convolutions, transposed and separable convolutions, resizes, recurrent layers
(unrolled and as `tf.while_loop`), embeddings, masks, gathers, cumulative sums, top-k,
segment sums, mirror padding, group and RMS normalization, rotary embeddings,
spectrograms and MFCCs.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

VOCAB = 100


def _keras(inputs: list, outputs: object) -> keras.Model:
    return keras.Model(inputs, outputs)


def conv1d() -> keras.Model:
    x = keras.Input((32, 8))
    y = keras.layers.Conv1D(16, 3, padding="causal", dilation_rate=2, activation="gelu")(x)
    y = keras.layers.SeparableConv1D(16, 5, padding="same", activation="silu")(y)
    y = keras.layers.MaxPooling1D(2)(y)
    y = keras.layers.Conv1D(8, 3, strides=2)(y)
    y = keras.layers.AveragePooling1D(2, padding="same")(y)
    return _keras([x], keras.layers.GlobalAveragePooling1D()(y))


def conv3d() -> keras.Model:
    x = keras.Input((8, 8, 8, 2))
    y = keras.layers.Conv3D(4, 3, padding="same", activation="relu")(x)
    y = keras.layers.MaxPooling3D(2)(y)
    y = keras.layers.Conv3D(8, 2, strides=2)(y)
    y = keras.layers.AveragePooling3D(1)(y)
    y = keras.layers.GlobalAveragePooling3D()(y)
    return _keras([x], keras.layers.Dense(3)(y))


def conv_transpose() -> keras.Model:
    x = keras.Input((8, 8, 4))
    y = keras.layers.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu")(x)
    y = keras.layers.SeparableConv2D(8, 3, padding="same", depth_multiplier=2)(y)
    y = keras.layers.Conv2DTranspose(4, 4, strides=2, padding="valid")(y)
    y = keras.layers.Conv1DTranspose(4, 3, strides=2)(keras.layers.Reshape((-1, 4))(y))
    return _keras([x], y)


def resize() -> keras.Model:
    x = keras.Input((12, 16, 3))
    a = keras.layers.Resizing(24, 20, interpolation="bilinear")(x)
    b = keras.layers.Resizing(24, 20, interpolation="nearest")(x)
    c = keras.layers.UpSampling2D(2, interpolation="bilinear")(x)
    c = keras.layers.Resizing(24, 20, interpolation="bilinear", crop_to_aspect_ratio=True)(c)
    y = keras.layers.Concatenate()([a, b, c])
    y = keras.layers.Conv2D(4, 3, padding="same")(y)
    y = keras.layers.UpSampling2D(2)(y)
    y = keras.layers.ZeroPadding2D(((1, 2), (3, 0)))(y)
    y = keras.layers.Cropping2D(((2, 1), (0, 3)))(y)
    return _keras([x], y)


def rnn_unrolled() -> keras.Model:
    x = keras.Input((10, 8))
    y = keras.layers.LSTM(16, unroll=True, return_sequences=True)(x)
    y = keras.layers.GRU(8, unroll=True)(y)
    return _keras([x], y)


def rnn_loop() -> keras.Model:
    x = keras.Input((10, 8))
    y = keras.layers.Bidirectional(keras.layers.LSTM(8, return_sequences=True))(x)
    y = keras.layers.GRU(8)(y)
    return _keras([x], y)


def simple_rnn() -> keras.Model:
    x = keras.Input((10, 8))
    y = keras.layers.SimpleRNN(8, return_sequences=True)(x)
    y = keras.layers.LSTM(8)(y)
    return _keras([x], y)


def text_classifier() -> keras.Model:
    ids = keras.Input((16,), dtype="int32", name="ids")
    emb = keras.layers.Embedding(VOCAB, 16, mask_zero=True)(ids)
    att = keras.layers.MultiHeadAttention(2, 8)(emb, emb, use_causal_mask=True)
    y = keras.layers.LayerNormalization()(emb + att)
    y = keras.layers.GlobalAveragePooling1D()(y)
    return _keras([ids], keras.layers.Dense(4, activation="softmax")(y))


def norms() -> keras.Model:
    x = keras.Input((8, 8, 16))
    y = keras.layers.GroupNormalization(4)(x)
    y = keras.layers.Conv2D(16, 1)(y)
    y = keras.layers.UnitNormalization()(y)
    y = keras.layers.BatchNormalization()(y)
    y = keras.layers.LayerNormalization(axis=[1, 2, 3])(y)
    y = keras.layers.RMSNormalization()(y) if hasattr(keras.layers, "RMSNormalization") else y
    y = keras.layers.Activation("hard_silu")(y)
    y = keras.layers.Activation("mish")(y)
    return _keras([x], keras.layers.Activation("softsign")(y))


def lstm_text() -> keras.Model:
    ids = keras.Input((12,), dtype="int32", name="ids")
    y = keras.layers.Embedding(VOCAB, 8, mask_zero=True)(ids)
    y = keras.layers.LSTM(8, return_sequences=True)(y)
    y = keras.layers.GRU(8)(y)
    return _keras([ids], keras.layers.Dense(3)(y))


def attention_layers() -> keras.Model:
    q, v = keras.Input((6, 8)), keras.Input((10, 8))
    a = keras.layers.Attention(use_scale=True)([q, v])
    b = keras.layers.AdditiveAttention()([q, v])
    return _keras([q, v], keras.layers.Concatenate()([a, b]))


def tabular() -> keras.Model:
    x = keras.Input((6,))
    norm = keras.layers.Normalization(mean=0.5, variance=2.0)(x)
    bins = keras.layers.Discretization(bin_boundaries=[-1.0, 0.0, 1.0])(x[:, :2])
    onehot = keras.layers.CategoryEncoding(4, output_mode="multi_hot")(bins)
    y = keras.layers.Concatenate()([norm, onehot])
    return _keras([x], keras.layers.Dense(2)(keras.layers.Dense(16, activation="relu")(y)))


def string_lookup() -> keras.Model:
    words = keras.Input((3,), dtype="string", name="words")
    ids = keras.layers.StringLookup(vocabulary=["cat", "dog", "fish"])(words)
    y = keras.layers.Embedding(5, 4)(ids)
    return _keras([words], keras.layers.Dense(2)(keras.layers.Flatten()(y)))


def mixed_precision() -> keras.Model:
    """A CNN under Keras' mixed_float16 policy: float16 compute, float32 variables."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x = keras.Input((16, 16, 3))
        y = keras.layers.Conv2D(8, 3, activation="relu")(x)
        y = keras.layers.BatchNormalization()(y)
        y = keras.layers.GlobalAveragePooling2D()(y)
        y = keras.layers.Dense(4, dtype="float32")(y)
        return _keras([x], y)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def text_vectorization_lstm() -> keras.Model:
    """The Keras text tutorial's shape: raw strings -> TextVectorization -> Embedding ->
    LSTM -> Dense."""
    text = keras.Input((1,), dtype="string", name="text")
    ids = keras.layers.TextVectorization(vocabulary=["cat", "dog", "fish"],
                                         output_sequence_length=8)(text)
    y = keras.layers.Embedding(6, 8, mask_zero=True)(ids)
    y = keras.layers.LSTM(8)(y)
    return _keras([text], keras.layers.Dense(2)(y))


def audio_keyword_spotting() -> keras.Model:
    """A keyword spotter over 0.25 s of 16 kHz audio: Keras' MelSpectrogram layer, and
    MFCCs from `tf.signal` (stft -> mel -> log -> dct), each into a Conv1D."""
    wave = keras.Input((4000,), name="audio")
    mel = keras.layers.MelSpectrogram(fft_length=256, sequence_stride=128, num_mel_bins=32,
                                      sampling_rate=16000)(wave)            # [B, 32, 32]
    mel = keras.layers.Permute((2, 1))(mel)

    def mfcc(x: tf.Tensor) -> tf.Tensor:
        spectrum = tf.abs(tf.signal.stft(x, 256, 128, 256))
        weights = tf.signal.linear_to_mel_weight_matrix(32, 129, 16000, 20.0, 7600.0)
        log_mel = tf.math.log(tf.tensordot(spectrum, weights, 1) + 1e-6)
        return tf.signal.mfccs_from_log_mel_spectrograms(log_mel)[..., :13]

    coefficients = keras.layers.Lambda(mfcc, output_shape=(30, 13))(wave)
    branches = [keras.layers.GlobalAveragePooling1D()(
        keras.layers.Conv1D(16, 3, activation="relu")(y)) for y in (mel, coefficients)]
    return _keras([wave], keras.layers.Dense(4)(keras.layers.Concatenate()(branches)))


class _Module(tf.Module):
    def __init__(self, fn: Callable, specs: list, seed: int) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = tf.Variable(rng.standard_normal((16, 16)).astype("float32"))
        self.table = tf.Variable(rng.standard_normal((VOCAB, 16)).astype("float32"))
        self.fn = fn
        self.serve = tf.function(lambda *a: {"y": fn(self, *a)}, input_signature=specs)


def _gathers(m: _Module, x: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    e = tf.gather(m.table, ids)                                   # [B, 8, 16]
    e = e + tf.one_hot(tf.argmax(x, axis=-1), 16)[:, None, :]
    idx = tf.constant([[0, 1], [2, 0], [7, 1]])
    picked = tf.gather_nd(tf.reshape(m.w, (8, 2, 16)), idx)     # [3, 16]
    e = e + tf.reduce_sum(picked, 0)
    rows = tf.gather(e, [3, 0, 1], axis=1, batch_dims=0)
    g = tf.gather(x[:, :8], tf.argsort(x[:, :8], axis=-1), batch_dims=1)
    return tf.concat([tf.reshape(rows, (-1, 48)), g], axis=-1)


def _random(m: _Module, x: tf.Tensor) -> tf.Tensor:
    """Noise drawn at serving time (a stateful random op: cannot be on the device)."""
    return tf.matmul(x, m.w) + tf.random.normal(tf.shape(x), stddev=1e-3)


def _patches(m: _Module, x: tf.Tensor) -> tf.Tensor:
    img = tf.reshape(x, (-1, 4, 4, 1))
    p = tf.image.extract_patches(img, [1, 2, 2, 1], [1, 2, 2, 1], [1, 1, 1, 1], "VALID")
    return tf.reshape(p, (-1, 16)) + tf.nn.local_response_normalization(img)[:, :, :, 0][
        :, 0, :1]


def _math(m: _Module, x: tf.Tensor) -> tf.Tensor:
    y = tf.einsum("bi,ij->bj", x, m.w)
    y = tf.nn.gelu(y, approximate=True) + tf.nn.silu(y) + tf.nn.swish(y)
    y = tf.where(y > 0.5, y, tf.zeros_like(y)) + tf.math.cumsum(y, axis=-1, exclusive=True)
    y = y + tf.math.cumsum(x, axis=-1, reverse=True)
    y = y + tf.math.log1p(tf.abs(y)) + tf.math.expm1(-tf.abs(x)) + tf.math.floormod(x, 0.7)
    y = y + tf.math.floordiv(x, 0.3) + tf.math.round(x) + tf.math.sin(x) * tf.math.cos(x)
    y = y + tf.math.reduce_logsumexp(y, axis=-1, keepdims=True) + tf.math.atan(x)
    y = tf.nn.l2_normalize(y, axis=-1) + tf.math.reduce_std(y, axis=-1, keepdims=True)
    return y + tf.clip_by_value(tf.math.cumprod(tf.sigmoid(x), axis=-1), 0.1, 0.9)


def _topk(m: _Module, x: tf.Tensor) -> tf.Tensor:
    values, indices = tf.math.top_k(x, k=4)
    return tf.concat([values, tf.cast(indices, tf.float32), tf.sort(x, axis=-1)[:, :4],
                      tf.cast(tf.argmin(x, axis=-1), tf.float32)[:, None]], axis=-1)


def _segments(m: _Module, x: tf.Tensor) -> tf.Tensor:
    seg = tf.constant([0, 0, 1, 1, 1, 2, 3, 3])
    t = tf.transpose(tf.reshape(x, (-1, 8, 2)), (1, 0, 2))       # [8, B, 2]
    s = tf.math.segment_sum(t, seg) + tf.math.segment_max(t, seg)
    s = s + tf.math.unsorted_segment_sum(t, seg, 4) + tf.math.segment_mean(t, seg)
    return tf.reshape(tf.transpose(s, (1, 0, 2)), (-1, 8))


def _pads(m: _Module, x: tf.Tensor) -> tf.Tensor:
    img = tf.reshape(x, (-1, 4, 4, 1))
    a = tf.pad(img, [[0, 0], [2, 2], [1, 1], [0, 0]], mode="REFLECT")
    b = tf.pad(img, [[0, 0], [2, 2], [1, 1], [0, 0]], mode="SYMMETRIC")
    c = tf.pad(img, [[0, 0], [2, 2], [1, 1], [0, 0]], constant_values=-1.0)
    d = tf.image.resize(img, (8, 6), method="bilinear") + tf.image.resize(img, (8, 6),
                                                                          "nearest")
    return tf.concat([a, b, c, d], axis=-1)


def _rotary(m: _Module, x: tf.Tensor) -> tf.Tensor:
    q = tf.reshape(x, (-1, 4, 4))                                # [B, seq 4, dim 4]
    pos = tf.cast(tf.range(4), tf.float32)[:, None]
    inv = 1.0 / (10000.0 ** (tf.range(0, 4, 2, dtype=tf.float32) / 4.0))
    freqs = tf.concat([pos * inv, pos * inv], axis=-1)           # [4, 4]
    x1, x2 = tf.split(q, 2, axis=-1)
    rot = q * tf.cos(freqs) + tf.concat([-x2, x1], axis=-1) * tf.sin(freqs)
    scores = tf.einsum("bqd,bkd->bqk", rot, rot) / 2.0
    mask = tf.linalg.band_part(tf.ones((4, 4)), -1, 0)
    scores = tf.where(mask > 0, scores, -1e9)
    rms = rot * tf.math.rsqrt(tf.reduce_mean(tf.square(rot), -1, keepdims=True) + 1e-6)
    return tf.reshape(tf.matmul(tf.nn.softmax(scores), rms), (-1, 16))


_F = tf.TensorSpec([None, 16], tf.float32, name="x")
_IDS = tf.TensorSpec([None, 8], tf.int32, name="ids")

MODULES: dict[str, tuple[Callable, list]] = {
    "ops_gathers": (_gathers, [_F, _IDS]),
    "ops_math": (_math, [_F]),
    "ops_topk_sort": (_topk, [_F]),
    "ops_segments": (_segments, [_F]),
    "ops_pads_resize": (_pads, [_F]),
    "ops_rotary_mask": (_rotary, [_F]),
    "ops_random": (_random, [_F]),
    "ops_patches_lrn": (_patches, [_F]),
}
KERAS: dict[str, Callable[[], keras.Model]] = {
    "keras_conv1d": conv1d, "keras_conv3d": conv3d, "keras_conv_transpose": conv_transpose,
    "keras_resize": resize, "keras_rnn_unrolled": rnn_unrolled, "keras_rnn_loop": rnn_loop,
    "keras_simple_rnn": simple_rnn, "keras_text_classifier": text_classifier,
    "keras_norms": norms, "keras_lstm_text": lstm_text,
    "keras_attention_layers": attention_layers, "keras_tabular": tabular,
    "keras_string_lookup": string_lookup, "keras_mixed_precision": mixed_precision,
    "keras_text_vectorization_lstm": text_vectorization_lstm,
    "keras_audio_keyword_spotting": audio_keyword_spotting,
}
NAMES = (*KERAS, *MODULES)
# Exclusive upper bounds of integer inputs, by input key.
INT_HIGHS = {"ids": VOCAB}


def build(name: str, target: str) -> None:
    """Build user model `name` and save it to `target` (Keras: `export`; tf.Module:
    `tf.saved_model.save` with a serving_default signature)."""
    if name in KERAS:
        KERAS[name]().export(target, verbose=False)
        return
    fn, specs = MODULES[name]
    module = _Module(fn, specs, seed=sum(map(ord, name)))
    tf.saved_model.save(module, target, signatures={"serving_default": module.serve})
