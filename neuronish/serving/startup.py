"""A compiled model version is on the device before it is served.

The `NeuronOp` kernel loads its executable onto the device when it first runs, so
without this the first client paid for the load, the model was reported available
before it was, and `neuronish ls` right after start-up saw no process using the
device. After the version's recorded warm-up requests (servable.warm_up), a version
whose graph holds NeuronOps and that no record ran runs each of its signatures on
synthetic inputs (zeros, empty strings; batch 1, or the fixed batch), which loads
every NeuronOp, once per copy the device holds of a model (sequential calls take the
copies in turn, and each copy's first run is slow); the version is made available
only afterwards. The device models it
loaded are labelled with the served name and version, which is what `neuronish ls`
and `top` show.

A signature with a free dimension other than the batch cannot be given synthetic
inputs; a signature that fails on them (a parser that refuses an empty string) is
logged, not fatal: its NeuronOps then load on the first request, as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from .servable import Servable
from .signatures import Signature

log = logging.getLogger("neuronish.serving")
NEURON_OP = "NeuronOp"
# One version's device loads at a time, so the models each one loaded are told apart.
_LOADING = threading.Lock()


def has_neuron_ops(meta_graph: meta_graph_pb2.MetaGraphDef) -> bool:
    graph = meta_graph.graph_def
    return any(n.op == NEURON_OP for n in graph.node) or any(
        n.op == NEURON_OP for f in graph.library.function for n in f.node_def)


def synthetic_inputs(signature: Signature) -> dict[str, np.ndarray] | None:
    """Zeros (empty strings) of the signature's shapes, batch 1; None when a dimension
    other than the first is free."""
    arrays = {}
    for key, spec in signature.inputs.items():
        if spec.shape is None or any(d < 0 for d in spec.shape[1:]):
            return None
        shape = [1 if i == 0 and d < 0 else d for i, d in enumerate(spec.shape)]
        if spec.dtype == "string":
            arrays[key] = np.full(shape, b"", dtype=object)
        else:
            arrays[key] = np.zeros(shape, dtype=tf.as_dtype(spec.dtype).as_numpy_dtype)
    return arrays


@contextlib.contextmanager
def labelled_device_loads(servable: Servable, meta_graph: meta_graph_pb2.MetaGraphDef
                          ) -> Iterator[bool]:
    """Inside: the version's warm-up. Yields whether it is a compiled model; afterwards,
    labels the device models loaded meanwhile `name:version node`."""
    if not has_neuron_ops(meta_graph):
        yield False
        return
    from neuronish.runtime import get_device
    from neuronish.runtime.capi import native_model

    device = get_device()

    def loaded() -> list[object]:  # on the Python runtime or on the C runtime
        return [*device.loaded_models(), *native_model.loaded_models()]

    with _LOADING:
        before = {id(m) for m in loaded()}
        yield True
        for model in loaded():
            if id(model) not in before:
                node = getattr(model, "label", None) or ""
                model.label = f"{servable.name}:{servable.version} {node.rsplit('/', 1)[-1]}"
        # The version is reported available next: `neuronish ls` must see the labels.
        from neuronish.runtime.telemetry import publish_now

        publish_now()


def _most_copies() -> int:
    from neuronish.runtime import get_device

    return max((int(getattr(m, "duplicates", 1)) for m in get_device().loaded_models()),
               default=1)


def load_on_device(servable: Servable) -> int:
    """Run each signature once on synthetic inputs; the number that ran."""
    ran = 0
    start = time.perf_counter()
    for name, signature in servable.signatures.items():
        inputs = synthetic_inputs(signature)
        if inputs is None:
            log.info("%s version %d: signature %r has a free dimension besides the batch; "
                     "its device models load on its first request", servable.name,
                     servable.version, name)
            continue
        try:
            servable.run(name, inputs, sorted(signature.outputs))
            # A model's copies on other core groups take calls in turn, and each copy's
            # first run is slow too (its kernels' first use): one call per copy.
            for _ in range(_most_copies() - 1):
                servable.run(name, inputs, sorted(signature.outputs))
            ran += 1
        except Exception as e:  # noqa: BLE001 (any model error; the load still succeeds)
            log.warning("%s version %d: signature %r did not run on synthetic inputs (%s); "
                        "its device models load on its first request", servable.name,
                        servable.version, name, e)
    log.info("%s version %d: loaded onto the device by %d signature call(s) in %.2f s",
             servable.name, servable.version, ran, time.perf_counter() - start)
    return ran
