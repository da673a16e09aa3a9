"""A servable's signatures, and checking a request's inputs against one.

Signatures come from the SavedModel's own `SignatureDef`s (what
GetModelMetadata returns verbatim). Requests are checked here, before
TensorFlow sees them, so a wrong request gets a message that names the input,
what the signature expects and what arrived, instead of a kernel error from
deep inside the graph, and so a bad request never reaches a merged batch where
it would fail its neighbours too.

A model compiled with free dimensions other than the batch runs any size within its
bounds (neuronish/shape_specialize.py); `with_accepted_shapes` shows them in the
SignatureDefs the server returns: such a dimension stays -1 and is named by its
bounds (`dim { size: -1 name: "1..128" }`, TensorShapeProto's own name field, which
every client already parses), and requests outside them are refused here, naming the
input, the dimension and the bounds.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from neuronish.runtime.signature import TensorSignature, shape_text
from neuronish.shape_specialize import SHAPES_FILE

from .status import INTERNAL, ServingError, failed_precondition, invalid_argument

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
# Key names of classification/regression signatures (signature_constants.py).
CLASSIFY_INPUTS = "inputs"
CLASSIFY_OUTPUT_CLASSES = "classes"
CLASSIFY_OUTPUT_SCORES = "scores"
REGRESS_INPUTS = "inputs"
REGRESS_OUTPUTS = "outputs"


def tensor_signature(key: str, info: meta_graph_pb2.TensorInfo) -> TensorSignature:
    """One signature input or output, from an exported SignatureDef's TensorInfo proto:
    -1 for a size the SignatureDef leaves open (as TF Serving's metadata and KServe v2
    print it), None for an unknown rank, the bounds compile wrote for a free dimension
    (`with_accepted_shapes`), and no batch axis (a SignatureDef does not say one)."""
    shape = None if info.tensor_shape.unknown_rank else tuple(
        d.size for d in info.tensor_shape.dim)
    bounds = tuple(_bounds_of(d.name) if d.size < 0 else None for d in info.tensor_shape.dim)
    return TensorSignature(key, tf.dtypes.as_dtype(info.dtype).name, shape,
                           bounds=bounds if any(bounds) else ())


_BOUNDS_NAME = re.compile(r"(\d+)\.\.(\d+)")


def _bounds_of(name: str) -> tuple[int, int] | None:
    match = _BOUNDS_NAME.fullmatch(name)
    return (int(match[1]), int(match[2])) if match else None


def with_accepted_shapes(signature_defs: Mapping[str, meta_graph_pb2.SignatureDef],
                         model_path: str) -> dict[str, meta_graph_pb2.SignatureDef]:
    """`signature_defs` with each free dimension the compiled model bounds named by its
    bounds ("1..128"), from the model's `assets.extra/neuronish_shapes.json` (written by
    `neuronish compile`: `{signature: {input: {axis: [low, high]}}}`); unchanged when
    there is no such file."""
    try:
        with open(os.path.join(model_path, SHAPES_FILE)) as f:
            bounds = json.load(f)
    except (OSError, ValueError):
        return dict(signature_defs)
    out = {}
    for key, sd in signature_defs.items():
        copy = meta_graph_pb2.SignatureDef()
        copy.CopyFrom(sd)
        for name, axes in (bounds.get(key) or {}).items() if isinstance(bounds, dict) else ():
            if name not in copy.inputs or not isinstance(axes, dict):
                continue
            dims = copy.inputs[name].tensor_shape.dim
            for axis, pair in axes.items():
                try:
                    axis, low, high = int(axis), int(pair[0]), int(pair[1])
                except (TypeError, ValueError, IndexError):
                    continue
                if 0 <= axis < len(dims) and dims[axis].size < 0:
                    dims[axis].name = f"{low}..{high}"
        out[key] = copy
    return out

def dtype_name(dtype: tf.dtypes.DType | str) -> str:
    """TensorFlow's enum name, `DT_FLOAT`: what SignatureDefs and TF Serving print."""
    enum = tf.dtypes.as_dtype(dtype).as_datatype_enum
    return _DT_NAMES.get(enum, str(dtype))


def _datatype_names() -> dict[int, str]:
    from tensorflow.core.framework import types_pb2
    return {v: k for k, v in types_pb2.DataType.items()}


_DT_NAMES = _datatype_names()


@dataclass(frozen=True)
class Signature:
    name: str
    method_name: str
    inputs: Mapping[str, TensorSignature]  # by key, which is each record's name
    outputs: Mapping[str, TensorSignature]

    @staticmethod
    def from_signature_def(name: str, sd: meta_graph_pb2.SignatureDef) -> Signature:
        return Signature(
            name, sd.method_name,
            {k: tensor_signature(k, v) for k, v in sorted(sd.inputs.items())},
            {k: tensor_signature(k, v) for k, v in sorted(sd.outputs.items())})

    # -- predict ---------------------------------------------------------------
    def check_inputs(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Raise INVALID_ARGUMENT unless `arrays` is exactly this signature's inputs,
        with the right dtypes and shapes."""
        if set(arrays) != set(self.inputs):
            sent, want = sorted(arrays), sorted(self.inputs)
            extra = sorted(set(sent) - set(want))
            missing = sorted(set(want) - set(sent))
            if len(sent) == len(want):
                # TF Serving's wording for a same-size set with a wrong name.
                raise invalid_argument(
                    f"input tensor alias not found in signature: {extra[0]}. Inputs expected "
                    f"to be in the set {{{','.join(want)}}}.")
            raise invalid_argument(
                f"input size does not match signature: {len(sent)}!={len(want)} "
                f"len({{{','.join(sent)}}}) != len({{{','.join(want)}}}). "
                f"Sent extra: {{{','.join(extra)}}}. Missing but required: "
                f"{{{','.join(missing)}}}.")
        for key, spec in self.inputs.items():
            check_array(spec, arrays[key], self.name)

    def check_predict_method(self) -> None:
        """--enable_signature_method_name_check for Predict: TF Serving's code
        (INTERNAL) and wording."""
        methods = (PREDICT_METHOD, CLASSIFY_METHOD, REGRESS_METHOD)
        if self.method_name not in methods:
            raise ServingError(INTERNAL, "Expected prediction signature method_name to be one "
                                         f"of {{{', '.join(methods)}}}. Was: {self.method_name}")

    def output_keys(self, output_filter: Iterable[str] = ()) -> list[str]:
        """The outputs to return: `output_filter` (checked) or all of them."""
        keys: list[str] = []
        for alias in output_filter:
            if alias not in self.outputs:
                raise invalid_argument(
                    f"output tensor alias not found in signature: {alias} Outputs expected to "
                    f"be in the set {{{','.join(sorted(self.outputs))}}}.")
            if alias in keys:
                raise invalid_argument(f"duplicate output tensor alias: {alias}")
            keys.append(alias)
        return keys or sorted(self.outputs)

    # -- classify / regress ----------------------------------------------------
    def check_classify(self, check_method: bool = False) -> None:
        """TF Serving's PreProcessClassification. The method-name check is off by
        default there too (--enable_signature_method_name_check), so TF2 models,
        whose signatures all say `predict`, can classify."""
        if check_method and self.method_name != CLASSIFY_METHOD:
            raise invalid_argument(f"Expected classification signature method_name to be "
                                   f"{CLASSIFY_METHOD}. Was: {self.method_name}")
        if len(self.inputs) != 1:
            raise invalid_argument("Expected one input Tensor.")
        if len(self.outputs) not in (1, 2):
            raise invalid_argument(
                f"Expected one or two output Tensors, found {len(self.outputs)}")
        if CLASSIFY_INPUTS not in self.inputs:
            raise invalid_argument(f"No classification inputs found in SignatureDef "
                                   f"{self.name!r}: inputs are {sorted(self.inputs)}")
        if CLASSIFY_OUTPUT_CLASSES not in self.outputs and \
                CLASSIFY_OUTPUT_SCORES not in self.outputs:
            raise invalid_argument(
                f'Expected classification signature outputs to contain at least one of '
                f'"classes" or "scores". Signature {self.name!r} has outputs '
                f'{sorted(self.outputs)}')

    def check_regress(self, check_method: bool = False) -> None:
        if check_method and self.method_name != REGRESS_METHOD:
            raise invalid_argument(f"Expected regression signature method_name to be "
                                   f"{REGRESS_METHOD}. Was: {self.method_name}")
        if len(self.inputs) != 1:
            raise invalid_argument("Expected one input Tensor.")
        if len(self.outputs) != 1:
            raise invalid_argument("Expected one output Tensor.")
        if REGRESS_INPUTS not in self.inputs:
            raise invalid_argument(f"No regression inputs found in SignatureDef "
                                   f"{self.name!r}: inputs are {sorted(self.inputs)}")
        if REGRESS_OUTPUTS not in self.outputs:
            raise invalid_argument(f"No regression outputs found in SignatureDef "
                                   f"{self.name!r}: outputs are {sorted(self.outputs)}")


def accepted_shape_changes(old: Mapping[str, meta_graph_pb2.SignatureDef],
                           new: Mapping[str, meta_graph_pb2.SignatureDef]) -> list[str]:
    """Each input of a signature both versions have whose accepted shape differs (a
    dimension fixed at another size, or other bounds): what a client of the old version
    may send that the new one refuses. As "signature/input: [-1,16] -> [-1,1..128]"."""
    def text(info: meta_graph_pb2.TensorInfo) -> str:
        if info.tensor_shape.unknown_rank:
            return "[?]"
        return "[" + ",".join(d.name if d.size < 0 and d.name else str(d.size)
                              for d in info.tensor_shape.dim) + "]"

    changes = []
    for key in sorted(set(old) & set(new)):
        for name in sorted(set(old[key].inputs) & set(new[key].inputs)):
            before, after = text(old[key].inputs[name]), text(new[key].inputs[name])
            if before != after:
                changes.append(f"{key}/{name}: {before} -> {after}")
    return changes


def check_array(spec: TensorSignature, array: np.ndarray, signature_name: str) -> None:
    got_dtype = array_dtype(array)
    if got_dtype.name != spec.dtype:
        raise invalid_argument(
            f"input '{spec.name}' of signature '{signature_name}' expects dtype "
            f"{dtype_name(spec.dtype)}, but the request sent {dtype_name(got_dtype)}")
    if not spec.accepts_shape(array.shape):
        raise invalid_argument(
            f"input '{spec.name}' of signature '{signature_name}' expects shape "
            f"{spec.shape_text} (-1 = any size), but the request sent "
            f"{shape_text(array.shape)}")
    outside = spec.out_of_bounds(array.shape)
    if outside is not None:
        axis, low, high = outside
        raise invalid_argument(
            f"input '{spec.name}' of signature '{signature_name}' takes sizes {low} to {high} "
            f"in dimension {axis} (the compiled model's bounds, in its metadata), but the "
            f"request sent {shape_text(array.shape)}")


def array_dtype(array: np.ndarray) -> tf.dtypes.DType:
    """The TF dtype of a decoded request array (object arrays hold DT_STRING)."""
    if array.dtype == object or array.dtype.kind in "SU":
        return tf.string
    try:
        return tf.dtypes.as_dtype(array.dtype)
    except TypeError:
        raise invalid_argument(f"unsupported dtype {array.dtype}") from None


def select(signatures: Mapping[str, Signature], name: str,
           *, for_rest: bool = False) -> Signature:
    """The signature called `name` ("" = serving_default), with TF Serving's error."""
    key = name or DEFAULT_SIGNATURE
    if key in signatures:
        return signatures[key]
    known = ", ".join(sorted(k for k in signatures if not k.startswith("__")))
    if for_rest:  # the REST handler's own wording and code (GetInfoMap)
        raise invalid_argument(f'Serving signature name: "{key}" not found in signature def. '
                               f"Known signatures: {known}")
    raise failed_precondition(f'Serving signature key "{key}" not found. '
                              f"Known signatures: {known}")
