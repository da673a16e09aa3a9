"""A Keras model file (`.keras`, `.h5`) as a SavedModel, for `neuronish compile`.

The compiler takes SavedModels, and a Keras user often has the model file instead.
The file is loaded with `keras.models.load_model` and exported with `model.export`
(the serving signature Keras itself writes) to a temporary directory, which is
removed once the compile is done.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from .errors import SavedModelError

SUFFIXES = (".keras", ".h5", ".hdf5")


def is_keras_file(path: str) -> bool:
    return os.path.isfile(path) and path.lower().endswith(SUFFIXES)


@contextlib.contextmanager
def as_saved_model(path: str) -> Iterator[str]:
    """The Keras model at `path`, exported as a SavedModel (a temporary directory)."""
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
        model.export(exported, verbose=False)
        yield exported
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
