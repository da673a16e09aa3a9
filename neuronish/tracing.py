"""`neuronish.trace`: compile a function or a Keras model for the device from Python.

    traced = neuronish.trace(model, example_inputs)      # Keras model, tf.function,
    y = traced(x)                                         # concrete function, callable
    traced.on_neuron_ratio                                # = traced.report["OnNeuronRatio"]
    traced.save("model_neuron/")                          # loads and serves like compile's

(tensorflow-neuron's `tfn.trace`.) The function is traced at the example
inputs' shapes and compiled at them (their batch is the compiled batch; other
batch sizes are split and padded like any compiled SavedModel's). It reuses
the whole SavedModel pipeline, partition, compile cache, recovery, report, by
writing the function to a private temporary SavedModel and compiling that; the
compiled copy is loaded back, and its directory is removed when the returned
object is garbage-collected (executables stored outside the graph are read
from it on first call). This module is the `module` in the name module (not
`trace.py`) because `neuronish.trace` is the function.

Inputs: `example_inputs` is one tensor/array, a tuple or list of them (one per
positional argument), or a dict of them (one argument, as Keras models with
named inputs take). Outputs keep the function's structure (tensor, tuple,
list, dict). A dict's keys name the saved signature's inputs (`token_ids`, not
`input_0`), and a dict of outputs names its outputs.

The non-batch dimensions are the examples' (the device compiles static shapes,
as `compile` does with `model_feed_dict`); a call with another size is refused
naming the input, the traced shape and what to do.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from .errors import SavedModelError


class TraceError(SavedModelError):
    """What was given to `neuronish.trace` cannot be traced or compiled."""


class TracedModel(tf.Module):
    """The compiled function: call it like the original; save it with tf.saved_model.save.

    `serve` is its flat form (inputs named by the example dict's keys, else `input_0`,
    ...; a dynamic batch; outputs a dict named by the function's output dict, else
    `output_0`, ...), which a saved copy offers as its `serving_default` signature."""

    def __init__(self, loaded: Any, args_structure: Any, out_structure: Any,
                 specs: list[tf.TensorSpec], out_names: list[str], report: dict,
                 workdir: str):
        super().__init__(name="neuronish_traced")
        self._loaded = loaded  # tracked: saving this object saves the compiled graph
        signature_fn = loaded.signatures["serving_default"]
        names = [s.name for s in specs]

        @tf.function(input_signature=specs)
        def serve(*flat: tf.Tensor) -> dict[str, tf.Tensor]:
            return signature_fn(**dict(zip(names, flat, strict=True)))

        self.serve = serve
        # Plain JSON, not containers: tf.Module would wrap those for tracking.
        self._report_json = json.dumps(report)
        self._args_json = json.dumps(args_structure)
        self._outs_json = json.dumps(out_structure)
        self._out_names_json = json.dumps(out_names)
        self._specs_json = json.dumps([[s.name, s.shape.as_list()] for s in specs])
        self._cleanup = weakref.finalize(self, shutil.rmtree, workdir, True)

    @property
    def report(self) -> dict:
        """The compile report (as `neuronish.saved_model.compile` returns it)."""
        return json.loads(self._report_json)

    @property
    def on_neuron_ratio(self) -> float:
        """The share of the function's TensorFlow operations that run on the device."""
        return float(self.report["OnNeuronRatio"])

    def save(self, path: str, **options: Any) -> None:
        """Save as a SavedModel whose `serving_default` is `serve` (tensorflow-neuronx's
        `traced.save`); it loads and serves like a compiled SavedModel."""
        tf.saved_model.save(self, path, signatures={"serving_default": self.serve},
                            **options)

    def __call__(self, *args: Any) -> Any:
        structure = _from_json(json.loads(self._args_json))
        if isinstance(structure, dict):
            args = args[0]
        flat = tf.nest.flatten(tf.nest.map_structure(tf.convert_to_tensor, args))
        self._check_shapes(flat)
        results = self.serve(*flat)
        outs = _from_json(json.loads(self._outs_json))
        return tf.nest.pack_sequence_as(outs, [results[k] for k in
                                               json.loads(self._out_names_json)])

    def _check_shapes(self, flat: list[tf.Tensor]) -> None:
        specs = json.loads(self._specs_json)
        if len(flat) != len(specs):
            raise TraceError(f"the traced function takes {len(specs)} input tensor(s), got "
                             f"{len(flat)}")
        for t, (name, shape) in zip(flat, specs):
            got = t.shape.as_list()
            if len(got) != len(shape) or any(w is not None and g != w
                                              for g, w in zip(got, shape)):
                raise TraceError(
                    f"input {name!r} has shape {got}; it was traced and compiled at "
                    f"{['batch' if d is None else d for d in shape]} (the device compiles "
                    "static shapes; the batch is free). Trace again with example inputs "
                    "of this size, one traced model per size you serve")


def _to_json(structure: Any) -> Any:
    """A structure of leaves as JSON (tuples tagged, leaves 0) for pack_sequence_as."""
    if isinstance(structure, dict):
        return {"dict": {str(k): _to_json(v) for k, v in structure.items()}}
    if isinstance(structure, (tuple, list)):
        return {"tuple" if isinstance(structure, tuple) else "list":
                [_to_json(v) for v in structure]}
    return 0


def _from_json(value: Any) -> Any:
    if not isinstance(value, dict):
        return 0
    if "dict" in value:
        return {k: _from_json(v) for k, v in value["dict"].items()}
    if "tuple" in value:
        return tuple(_from_json(v) for v in value["tuple"])
    return [_from_json(v) for v in value["list"]]


def _flat_examples(example_inputs: Any) -> tuple[Any, list[np.ndarray], bool]:
    """(structure of the positional args, flat arrays, whether the args are one dict)."""
    if isinstance(example_inputs, dict):
        args: Any = example_inputs
    elif isinstance(example_inputs, (tuple, list)):
        args = tuple(example_inputs)
    else:
        args = (example_inputs,)
    try:
        flat = [np.asarray(t) for t in tf.nest.flatten(args)]
    except (TypeError, ValueError) as e:
        raise TraceError(f"example_inputs must be tensors or arrays (one, a tuple/list, or a "
                         f"dict of them): {e}") from None
    if not flat:
        raise TraceError("example_inputs is empty: give one example tensor per input")
    for i, a in enumerate(flat):
        if a.dtype.kind in "OSU" and not _all_strings(a):
            raise TraceError(f"example input {i} has dtype {a.dtype} and is not all strings: "
                             "pass numeric or string tensors or numpy arrays")
    return args, flat, isinstance(example_inputs, dict)


_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-/]*")


def _input_names(args: dict, count: int) -> list[str]:
    """The signature's input names for a dict of examples: its keys, when it is flat and
    they are names TensorFlow takes; else input_0, input_1, ..."""
    keys = sorted(args)  # tf.nest.flatten's order
    if len(keys) == count and all(isinstance(k, str) and _NAME.fullmatch(k) for k in keys):
        return keys
    return [f"input_{i}" for i in range(count)]


def _all_strings(a: np.ndarray) -> bool:
    return a.dtype.kind in "SU" or all(isinstance(v, (bytes, str)) for v in a.flat)


def _tf_dtype(a: np.ndarray) -> tf.DType:
    return tf.string if a.dtype.kind in "OSU" else tf.as_dtype(a.dtype)


def _callable(fn: Any) -> Callable[..., Any]:
    if isinstance(fn, tf.types.experimental.ConcreteFunction):
        return fn
    if callable(fn):
        return fn
    raise TraceError(f"trace takes a tf.function, a concrete function, a Keras model or a "
                     f"callable; got {type(fn).__name__}")


def trace(fn_or_keras_model: Any, example_inputs: Any, **compile_kwargs: Any) -> TracedModel:
    """Compile `fn_or_keras_model` for the device at the shapes of `example_inputs`.

    Returns a `TracedModel`: callable like the original (any batch size), with the
    compile report in `.report`, saveable with `tf.saved_model.save`. Keyword
    arguments go to `neuronish.saved_model.compile` (`compiler_args`, `verify`,
    `no_fuse_ops`, ...; not `model_feed_dict`, which the examples are).
    """
    from .saved_model import compile as compile_saved_model

    if "model_feed_dict" in compile_kwargs or "model_shape_feed_dict" in compile_kwargs:
        raise TraceError("trace takes its shapes from example_inputs; do not pass "
                         "model_feed_dict/model_shape_feed_dict")
    fn = _callable(fn_or_keras_model)
    args, flat, is_dict = _flat_examples(example_inputs)
    # Dynamic batch in the signature, so the result takes any batch size.
    names = _input_names(args, len(flat)) if is_dict else [f"input_{i}" for i in
                                                           range(len(flat))]
    specs = [tf.TensorSpec([None, *a.shape[1:]] if a.ndim else [], _tf_dtype(a),
                           name=name) for name, a in zip(names, flat)]
    out_structure: list[Any] = []
    out_names: list[str] = []

    # A Keras model of several inputs takes them as one list: model([a, b]).
    as_one = is_dict or (len(args) > 1 and len(getattr(fn_or_keras_model, "inputs", None)
                                                or ()) == len(args))

    def serve(*flat_args: tf.Tensor) -> dict[str, tf.Tensor]:
        packed = tf.nest.pack_sequence_as(args, list(flat_args))
        result = fn(packed if is_dict else list(packed)) if as_one else fn(*packed)
        out_structure.append(result)
        flat_out = tf.nest.flatten(result)
        # A flat dict of outputs keeps its keys (flatten orders them sorted, as does
        # pack_sequence_as); anything else is output_0, output_1, ...
        keys = sorted(result) if isinstance(result, dict) and all(
            isinstance(k, str) and _NAME.fullmatch(k) for k in result) and len(
            flat_out) == len(result) else [f"output_{i}" for i in range(len(flat_out))]
        out_names[:] = keys
        return dict(zip(keys, flat_out, strict=True))

    module = tf.Module()
    try:
        concrete = tf.function(serve, input_signature=specs).get_concrete_function()
    except Exception as e:  # noqa: BLE001 (TF raises many types for a bad trace)
        raise TraceError(f"tracing {type(fn_or_keras_model).__name__} with example inputs of "
                         f"shapes {[list(a.shape) for a in flat]} failed: "
                         f"{type(e).__name__}: {e}") from e
    # The variables it reads must be reachable from the saved object, and so must its
    # other resources (a Keras StringLookup's table): a trackable model is kept whole.
    module.variables_used = list(concrete.variables)
    if isinstance(fn_or_keras_model, tf.__internal__.tracking.Trackable):
        module.source = fn_or_keras_model
    workdir = tempfile.mkdtemp(prefix="neuronish-trace-")
    try:
        src, out = str(Path(workdir) / "src"), str(Path(workdir) / "compiled")
        tf.saved_model.save(module, src, signatures={"serving_default": concrete})
        feeds = dict(zip(names, flat, strict=True))
        report = compile_saved_model(src, out, model_feed_dict=feeds, **compile_kwargs)
        shutil.rmtree(src, ignore_errors=True)
        loaded = tf.saved_model.load(out)
        traced = TracedModel(loaded, _to_json(args), _to_json(out_structure[-1]), specs,
                             list(out_names), report, workdir)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return traced


__all__ = ["TraceError", "TracedModel", "trace"]
