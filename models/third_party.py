"""Models nobody on the project wrote, as a new user would export them.

Every `keras.applications` model with random weights (`weights=None`) and
keras_hub text backbones in tiny configurations, each exported with Keras'
own `model.export(dir)`: the SavedModels the zoo benchmark (`benchmarks/zoo.py`)
and the whole-model tests compile. Seeds are fixed, so a model builds to the
same weights every time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

# Every application `keras.applications` offers (names of its model functions).
APPLICATIONS = tuple(sorted(
    n for n in dir(keras.applications) if n[:1].isupper() and callable(getattr(
        keras.applications, n))))

SEQ_LEN = 16
VOCAB = 500
_TINY = dict(num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64)


@dataclass(frozen=True)
class HubModel:
    """A keras_hub backbone: its class name, constructor arguments and integer inputs."""

    backbone: str
    kwargs: dict
    inputs: dict[str, int]  # input key -> exclusive upper bound of its values (1: all ones)


HUB_MODELS = {
    "bert_tiny": HubModel("BertBackbone", dict(vocabulary_size=VOCAB, max_sequence_length=64,
                                               **_TINY),
                          {"token_ids": VOCAB, "segment_ids": 2, "padding_mask": 2}),
    "distil_bert_tiny": HubModel("DistilBertBackbone", dict(vocabulary_size=VOCAB,
                                                            max_sequence_length=64, **_TINY),
                                 {"token_ids": VOCAB, "padding_mask": 2}),
    "roberta_tiny": HubModel("RobertaBackbone", dict(vocabulary_size=VOCAB,
                                                     max_sequence_length=64, **_TINY),
                             {"token_ids": VOCAB, "padding_mask": 2}),
    "albert_tiny": HubModel("AlbertBackbone", dict(vocabulary_size=VOCAB, embedding_dim=16,
                                                   num_groups=1, num_inner_repetitions=1,
                                                   max_sequence_length=64, **_TINY),
                            {"token_ids": VOCAB, "segment_ids": 2, "padding_mask": 2}),
    "gpt2_tiny": HubModel("GPT2Backbone", dict(vocabulary_size=VOCAB, max_sequence_length=64,
                                               **_TINY),
                          {"token_ids": VOCAB, "padding_mask": 2}),
}

ALL = (*APPLICATIONS, *HUB_MODELS)


def build(name: str, target: str) -> None:
    """Build model `name` (an application or a `HUB_MODELS` key) and export it to `target`."""
    keras.utils.set_random_seed(0)
    if name in HUB_MODELS:
        _build_hub(HUB_MODELS[name], target)
    elif name in APPLICATIONS:
        _application(name).export(target, verbose=False)
    else:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(ALL)}")


def _application(name: str) -> keras.Model:
    """`keras.applications.<name>(weights=None)`, returning logits: with random weights the
    features of most of these networks shrink to ~1e-11 by the last layer, so a softmax
    output is exactly uniform and would match anything; the logits still carry every
    layer's numbers. A model whose default input size is free (MobileNetV3) gets 224x224."""
    build = getattr(keras.applications, name)
    model = build(weights=None, classifier_activation=None)
    if any(d is None for d in model.input_shape[1:]):
        model = build(weights=None, classifier_activation=None, input_shape=(224, 224, 3))
    return model


def _build_hub(spec: HubModel, target: str) -> None:
    import keras_hub
    import tensorflow as tf

    model = getattr(keras_hub.models, spec.backbone)(**spec.kwargs)
    # A fixed sequence length: the device compiles static shapes (the batch stays free).
    signature = [{k: tf.TensorSpec([None, SEQ_LEN], "int32", name=k) for k in spec.inputs}]
    model.export(target, verbose=False, input_signature=signature)


def example_inputs(name: str, signature: Callable, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Valid random inputs for `signature` (a loaded SavedModel signature) at `batch`:
    floats ~N(0, 1); token ids within the vocabulary; padding masks mostly ones."""
    rng = np.random.default_rng(seed)
    _, specs = signature.structured_input_signature
    highs = HUB_MODELS[name].inputs if name in HUB_MODELS else {}
    feeds = {}
    for key, spec in sorted(specs.items()):
        shape = [batch if d is None else d for d in spec.shape.as_list()]
        dtype = spec.dtype.as_numpy_dtype
        if spec.dtype.is_floating:
            feeds[key] = rng.standard_normal(shape).astype(dtype)
        elif key == "padding_mask":  # leading ones, then a random tail of padding
            keep = rng.integers(SEQ_LEN // 2, SEQ_LEN + 1, size=(shape[0], 1))
            feeds[key] = (np.arange(shape[1])[None, :] < keep).astype(dtype)
        else:
            feeds[key] = rng.integers(0, highs.get(key, 2), shape).astype(dtype)
    return feeds
