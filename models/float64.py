"""The exact answer a float32 model approximates: the same Keras model built in float64.

Comparing a compiled model only with TensorFlow cannot tell whose rounding an error is:
on a deep network with random weights, TensorFlow's own float32 result can be far from
what its weights and input define (EfficientNetV2B3's logits: 1.5e-3 relative). The
twin built here computes the same function with the same weights in float64, so both
float32 results can be measured against it (`benchmarks/zoo.py --exact`,
`tests/neuronish/test_precision.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np


def float64_twin(build: Callable[[], keras.Model], export_dir: str) -> keras.Model:
    """`build()` run under the float64 dtype policy, holding the variables saved in the
    SavedModel `export_dir` (which `build()`'s float32 model was exported to).

    Variables are matched in order, as Keras exports them; a model whose variables differ
    in number or shape from the export's is refused with the first mismatch named."""
    import tensorflow as tf

    saved = tf.saved_model.load(export_dir).variables
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float64")
    try:
        model = build()
    finally:
        keras.config.set_dtype_policy(previous)
    if len(model.variables) != len(saved):
        raise ValueError(f"{export_dir} holds {len(saved)} variables; the float64 model "
                         f"built for it has {len(model.variables)}")
    for mine, theirs in zip(model.variables, saved):
        if tuple(mine.shape) != tuple(theirs.shape):
            raise ValueError(f"variable {mine.path}: shape {tuple(mine.shape)} in the float64 "
                             f"model, {tuple(theirs.shape)} as {theirs.name} in {export_dir}")
        mine.assign(np.asarray(theirs.numpy(), dtype=mine.dtype))
    return model


def exact_outputs(model: keras.Model, feeds: dict[str, np.ndarray],
                  names: list[str]) -> dict[str, np.ndarray]:
    """The float64 model's outputs for the signature feeds `feeds` (float inputs widened),
    keyed by the signature's output `names`, in the model's output order."""
    wide = {k: v.astype("float64") if v.dtype.kind == "f" else v for k, v in feeds.items()}
    inputs = list(wide.values())[0] if len(wide) == 1 else wide
    outputs = model(inputs, training=False)
    if isinstance(outputs, dict):
        return {k: np.asarray(outputs[k]) for k in names}
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return {k: np.asarray(o) for k, o in zip(names, outputs)}
