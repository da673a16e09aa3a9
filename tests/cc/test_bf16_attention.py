"""Attention under `--auto-cast matmult`: the scores stay bfloat16 from their matmul through
the masked softmax (mask, softmax, mask: one instruction) to the context matmul (no
conversions of the largest tensor of the layer), both engines agree, and the error against
TensorFlow's float32 stays at bf16's scale, a fully masked row included."""

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
S, H, D = 16, 2, 8
F = H * D
WQ, WK, WV, WO = (tf.constant(RNG.standard_normal((F, F)).astype(np.float32) * 0.3)
                  for _ in range(4))


def _heads(x: tf.Tensor) -> tf.Tensor:
    return tf.transpose(tf.reshape(x, [-1, S, H, D]), [0, 2, 1, 3])


def masked_attention(x: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """Keras' masked softmax: masked scores set to -1e9, masked probabilities to 0."""
    q, k, v = (_heads(tf.tensordot(x, w, 1)) for w in (WQ, WK, WV))
    keep = tf.cast(mask, tf.bool)[:, None, None, :]
    scores = tf.where(keep, tf.matmul(q, k, transpose_b=True), -1e9)
    probs = tf.where(keep, tf.nn.softmax(scores), 0.0)
    context = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])
    return tf.tensordot(tf.reshape(context, [-1, S, F]), WO, 1) + x


@pytest.fixture(scope="module")
def compiled() -> tuple:
    g = trace(masked_attention, tf.TensorSpec([3, S, F], tf.float32, name="x"),
              tf.TensorSpec([3, S], tf.int32, name="mask"))
    return g, compile_graph(g.graph_def, g.io_config, auto_cast="matmult")


def test_scores_stay_bf16_through_mask_and_softmax(compiled: tuple) -> None:
    _, exe = compiled
    e = from_bytes(exe)
    program = [i for p in e.programs for i in p]
    dtype = {i.outputs[0]: e.values[i.outputs[0]][1] for i in program}
    assert [i.kind for i in program].count("masked_softmax") == 1
    for i in program:
        if i.kind in ("softmax", "select", "masked_softmax") \
                and len(e.values[i.outputs[0]][0]) == 4:
            assert dtype[i.outputs[0]] == "bfloat16", (i.kind, i.source)
    scores_casts = [i for i in program if i.kind == "cast" and e.values[i.outputs[0]][0]
                    == (3, H, S, S)]
    assert not scores_casts, [i.source for i in scores_casts]


def test_both_engines_agree_and_stay_near_tensorflow(
        compiled: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    assert library.load() is not None, library.why_not()
    g, exe = compiled
    x = RNG.standard_normal((3, S, F)).astype(np.float32)
    mask = (RNG.uniform(size=(3, S)) < 0.7).astype(np.int32)
    mask[1] = 0  # a fully masked row: the softmax of -1e9s is uniform, the select zeroes it
    feeds = {"x:0": x, "mask:0": mask}
    got = {}
    for engine in ("numpy", "native"):
        monkeypatch.setenv("NEURONISH_ENGINE", engine)
        with load(exe) as model:
            got[engine] = model.run(feeds)
    for key, want in g.reference(feeds).items():
        scale = np.max(np.abs(want))
        np.testing.assert_allclose(got["native"][key], got["numpy"][key], atol=2e-2 * scale)
        err = np.max(np.abs(got["native"][key] - want)) / scale
        assert err < 2e-2, err
