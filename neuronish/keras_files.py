"""A Keras model file (`.keras`, `.h5`) as a SavedModel, for `neuronish compile`.

The compiler takes SavedModels, and a Keras user often has the model file instead.
The file is loaded with `keras.models.load_model` and exported with `model.export`
(the serving signature Keras itself writes) to a temporary directory, which is
removed once the compile is done.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence

from .errors import SavedModelError

SUFFIXES = (".keras", ".h5", ".hdf5")


def is_keras_file(path: str) -> bool:
    return os.path.isfile(path) and path.lower().endswith(SUFFIXES)


@contextlib.contextmanager
def as_saved_model(path: str, input_shapes: Mapping[str, Sequence[int]] | None = None
                   ) -> Iterator[str]:
    """The Keras model at `path`, exported as a SavedModel (a temporary directory).
    `input_shapes` (input name -> shape, -1 or None for a free dimension) replace the
    shapes the model declares, so a model whose layers need a fixed length exports."""
    import keras

    tmp = tempfile.mkdtemp(prefix="neuronish-keras-")
    try:
        try:
            model = keras.models.load_model(path, compile=False)
        except Exception as e:  # Keras raises many kinds: all mean "cannot read it"
            raise SavedModelError(
                f"cannot load the Keras model {path}: {type(e).__name__}: {e}. A model with "
                "custom layers needs them registered (keras.saving.register_keras_serializable)"
                "; or export it yourself with model.export(dir) and compile that") from None
        exported = os.path.join(tmp, "saved_model")
        signature = _input_signature(model, input_shapes) if input_shapes else None
        try:
            model.export(exported, verbose=False, input_signature=signature)
        except Exception as e:  # noqa: BLE001 (a layer failing to trace, in any way)
            raise SavedModelError(_export_failure(path, e, input_shapes)) from None
        yield exported
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _input_signature(model: object, shapes: Mapping[str, Sequence[int]]) -> list:
    """The model's inputs as TensorSpecs, with the given shapes (keyed by input name)."""
    import tensorflow as tf

    inputs = list(getattr(model, "inputs", None) or [])
    names = [str(getattr(t, "name", "")).split(":")[0] for t in inputs]
    unknown = sorted(set(shapes) - set(names))
    if not inputs or unknown:
        raise SavedModelError(
            f"--input-shape names {unknown or sorted(shapes)}, but the Keras model's inputs "
            f"are {names or 'not declared (a subclassed model)'}; use those names")

    def spec(tensor: object, name: str) -> object:
        shape = shapes.get(name, tensor.shape)  # type: ignore[attr-defined]
        dims = [None if d is None or int(d) < 0 else int(d) for d in shape]
        return tf.TensorSpec(dims, tensor.dtype, name=name)  # type: ignore[attr-defined]

    # `call` takes one argument shaped like the model's inputs: a tensor, a list, or a
    # dict of named inputs (keras_hub backbones).
    by_name = {n: spec(t, n) for t, n in zip(inputs, names, strict=True)}
    struct = getattr(model, "_inputs_struct", None)
    if isinstance(struct, dict):
        return [{key: by_name[str(getattr(t, "name", key)).split(":")[0]]
                 for key, t in struct.items()}]
    specs = list(by_name.values())
    return [specs[0] if len(specs) == 1 else specs]


def _export_failure(path: str, error: Exception, shapes: object) -> str:
    """One message for a failure inside Keras or TensorFlow while exporting: the layer,
    what it said, and what to try."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # Keras colours its messages
    layer = re.search(r"when calling (\w+)\.call\(\)", text)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()
                  and not ln.strip().startswith("Exception encountered")), type(error).__name__)
    where = f" in layer {layer.group(1)}" if layer else ""
    hint = ("give every input's shape with --input-shape NAME=-1,D1,... (layers that "
            "need a fixed length or size often cannot trace free dimensions)"
            if not shapes else "check the --input-shape values against what the layer "
            "expects")
    return (f"cannot export the Keras model {path}{where}: {type(error).__name__}: "
            f"{first[:300]}. Try: {hint}; or export it yourself with "
            "model.export(dir, input_signature=...) and compile that directory")
