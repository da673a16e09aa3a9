"""int8 of a model that reads a lookup table: the calibration set's subgraph inputs are
computed by TensorFlow in the frozen graph, where the table is a placeholder for the
original object's handle; they are computed as the compiled model's serving function
computes them, with the handle mapped in (it was an unfed placeholder: the compile failed
with "You must feed a value for placeholder tensor ... with dtype resource")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

import neuronish.saved_model

WORDS = ["cat", "dog", "fish", "owl", "bee", "ant"]


class _Tagger(tf.Module):
    """Words -> ids (a StaticHashTable) -> embedding -> dense: the dense layers quantize."""

    def __init__(self) -> None:
        rng = np.random.default_rng(5)
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(WORDS, np.arange(len(WORDS), dtype=np.int64)),
            default_value=len(WORDS))
        self.embedding = tf.Variable(rng.standard_normal((len(WORDS) + 1, 32)).astype("f4"))
        self.w1 = tf.Variable(rng.standard_normal((32, 64)).astype("f4") / 6)
        self.w2 = tf.Variable(rng.standard_normal((64, 8)).astype("f4") / 8)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.string, name="words")])
    def __call__(self, words: tf.Tensor) -> dict[str, tf.Tensor]:
        x = tf.reduce_mean(tf.gather(self.embedding, self.table.lookup(words)), axis=1)
        return {"y": tf.matmul(tf.nn.relu(tf.matmul(x, self.w1)), self.w2)}


def _words(rng: np.random.Generator, batch: int) -> np.ndarray:
    return rng.choice(np.array([w.encode() for w in WORDS + ["yak"]]), (batch, 4))


def test_int8_calibrates_a_model_that_reads_a_lookup_table(tmp_path: Path) -> None:
    module = _Tagger()
    src, out = tmp_path / "src", tmp_path / "int8"
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    rng = np.random.default_rng(0)
    calibration = [{"words": _words(rng, 4)} for _ in range(16)]
    report = neuronish.saved_model.compile(str(src), str(out), batch_size=4, quantize="int8",
                                           calibration_data=calibration)
    assert [op["outcome"] for op in report["NeuronOps"]] == ["compiled"]
    words = _words(np.random.default_rng(9), 4)
    want = module(tf.constant(words))["y"].numpy()
    got = tf.saved_model.load(str(out)).signatures["serving_default"](
        words=tf.constant(words))["y"].numpy()
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert 0 < err < 0.05, f"int8 error {err:.2e}"  # quantized (not exact), and close
