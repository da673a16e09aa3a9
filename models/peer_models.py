"""Models of the peer benchmark (`benchmarks/peers.py`) that the zoo has no size for.

The zoo's keras_hub backbones are tiny (2 layers, hidden 32, sequence 16: they test
coverage, not speed). The peer benchmark compares speed with TensorFlow and OpenVINO on
a BERT backbone of a size people serve: keras_hub's `BertBackbone` in the shape of
`bert_small_en_uncased` (4 layers, 8 heads, hidden 512, feed-forward 2048, the full
30522-token vocabulary), random weights with a fixed seed, exported with Keras'
`model.export` at sequence length 128. Its feed-forward activation is keras_hub's
`gelu_approximate` (the tanh form, whose x**3 is a `Pow`).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

SEQ_LEN = 128
VOCAB = 30522
_BERT_SMALL = dict(vocabulary_size=VOCAB, num_layers=4, num_heads=8, hidden_dim=512,
                   intermediate_dim=2048, max_sequence_length=512)
# input key -> exclusive upper bound of its integer values
BERT_INPUTS = {"token_ids": VOCAB, "segment_ids": 2, "padding_mask": 2}


def build_bert_small(target: str) -> None:
    """Export the BERT-small backbone to `target` (batch free, sequence SEQ_LEN)."""
    import keras
    import keras_hub
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras_hub.models.BertBackbone(**_BERT_SMALL)
    specs = {k: tf.TensorSpec([None, SEQ_LEN], "int32", name=k) for k in BERT_INPUTS}
    model.export(target, verbose=False, input_signature=[specs])


def bert_inputs(batch: int, seed: int) -> dict[str, np.ndarray]:
    """Random token ids, segment ids and padding masks (leading ones, then padding)."""
    rng = np.random.default_rng(seed)
    keep = rng.integers(SEQ_LEN // 2, SEQ_LEN + 1, size=(batch, 1))
    return {
        "token_ids": rng.integers(0, VOCAB, (batch, SEQ_LEN)).astype("int32"),
        "segment_ids": (np.arange(SEQ_LEN)[None, :] >= keep // 2).astype("int32")
        * np.ones((batch, 1), "int32"),
        "padding_mask": (np.arange(SEQ_LEN)[None, :] < keep).astype("int32"),
    }


BUILDERS = {"bert_small_s128": build_bert_small}
