"""TF Serving's REST JSON: request bodies to arrays, results back to JSON text.

The rules (and the error messages, which clients match on) are those of
tensorflow_serving/util/json_tensor.cc:

* predict: `{"signature_name": ..., "instances": [...]}` (row format: one item
  per batch row, an object per row when the signature has several inputs) or
  `{"inputs": ...}` (columnar: one value, or an object of named tensors).
  Answers are `{"predictions": [...]}` for rows, `{"outputs": ...}` for columns.
* values must already have the signature's type: a float input takes numbers
  (an integer too, if exact as a float32), integers take integers, bool takes
  true/false, strings take strings or `{"b64": "..."}`; lists must be
  rectangular. Output strings whose key ends in `_bytes` come back as
  `{"b64": ...}`.
* classify/regress: `{"signature_name", "context"?, "examples": [...]}` with
  each example an object of feature -> value or list; answers are
  `{"results": ...}`.

One deliberate difference: in the columnar format TF Serving silently ignores
keys of "inputs" that the signature does not have; here they are an error,
like they are in the row format, because a typo'd input name is a bug the
client wants to hear about.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.example import example_pb2, feature_pb2
from tensorflow_serving.apis import classification_pb2, input_pb2, regression_pb2

from neuronish.runtime.signature import TensorSignature, shape_text

from .codec import MAX_RANK
from .signatures import dtype_name
from .status import UNIMPLEMENTED, ServingError, invalid_argument

ROW = "row"
COLUMNAR = "columnar"
_MAX_ECHO = 200  # characters of a bad JSON value quoted back in an error


# ------------------------------------------------------------------ helpers


def _echo(value: object) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + "..."


def _json_type(value: object) -> str:
    if value is None:
        return "Null"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"


def _type_error(value: object, dtype: tf.dtypes.DType) -> ServingError:
    return invalid_argument(f"JSON Value: {_echo(value)} Type: {_json_type(value)} is not of "
                            f"expected type: {dtype.name}")


def is_b64(value: object) -> bool:
    """`{"b64": "<string>"}` and nothing else."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def decode_b64(value: dict) -> bytes:
    text = value["b64"]
    try:
        # Standard alphabet, padding optional (as absl::Base64Unescape).
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid_argument(f"Unable to base64 decode the value of {_echo(value)}") from None


def parse_body(body: bytes) -> dict:
    """The request document; it must be a JSON object."""
    if not body.strip():
        raise invalid_argument("JSON Parse error: The document is empty")
    try:
        doc = json.loads(body)
    except UnicodeDecodeError as e:
        raise invalid_argument(f"JSON Parse error: invalid UTF-8 at offset: {e.start}") from None
    except json.JSONDecodeError as e:
        raise invalid_argument(f"JSON Parse error: {e.msg} at offset: {e.pos}") from None
    except RecursionError:
        raise invalid_argument("JSON Parse error: the document is nested too deeply") from None
    except ValueError:  # an integer with more digits than Python converts (4300)
        raise invalid_argument("JSON Parse error: a number has more digits than any "
                               "tensor type holds") from None
    if not isinstance(doc, dict):
        raise invalid_argument(f"JSON Value: {_echo(doc)} Is not object")
    if b"\\ud" in body or b"\\uD" in body:  # a \u escape of a surrogate: is it paired?
        try:
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise invalid_argument(f"JSON Parse error: a lone UTF-16 surrogate "
                                   f"({e.object[e.start]!r}) is not a Unicode character"
                                   ) from None
    return doc


def signature_name(doc: dict) -> str:
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid_argument(f"JSON Value: {_echo(doc)} not formatted correctly. "
                               "'signature_name' key must be a string value.")
    return name


# ------------------------------------------------------------------ values -> arrays


def _float_leaf(dtype: tf.dtypes.DType) -> Callable[[object], object]:
    info = np.finfo(dtype.as_numpy_dtype)
    max_int = (1 << (info.nmant + 1)) - 1  # largest integer every smaller one is exact below

    def convert(v: object) -> object:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _type_error(v, dtype)
        lossy = abs(v) > max_int if isinstance(v, int) else (
            np.isfinite(v) and abs(v) > float(info.max))
        if lossy:
            raise invalid_argument(f"Cannot convert JSON value: {_echo(v)} to {dtype.name} "
                                   "without loss of precision.")
        return v
    return convert


def _int_leaf(dtype: tf.dtypes.DType) -> Callable[[object], object]:
    lo, hi = dtype.min, dtype.max

    def convert(v: object) -> object:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _type_error(v, dtype)
        return v
    return convert


def _bool_leaf(v: object) -> object:
    if not isinstance(v, bool):
        raise _type_error(v, tf.bool)
    return v


def _string_leaf(v: object) -> object:
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, dict):
        if not is_b64(v):
            raise invalid_argument(f"JSON Value: {_echo(v)} not formatted correctly for base64 "
                                   "data")
        return decode_b64(v)
    raise _type_error(v, tf.string)


def _leaf_converter(dtype: tf.dtypes.DType) -> Callable[[object], object]:
    if dtype in (tf.float32, tf.float64):
        return _float_leaf(dtype)
    if dtype in (tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32,
                 tf.uint64):
        return _int_leaf(dtype)
    if dtype == tf.bool:
        return _bool_leaf
    if dtype == tf.string:
        return _string_leaf
    raise ServingError(UNIMPLEMENTED, f"Conversion of JSON values to type {dtype_name(dtype)} "
                                      "is not supported")


def _too_deep() -> ServingError:
    return invalid_argument(f"JSON Value: a list nested more than {MAX_RANK} deep; a tensor "
                            f"has at most {MAX_RANK} dimensions")


def value_to_array(value: object, dtype: tf.dtypes.DType | str) -> np.ndarray:
    """A JSON value (scalar or rectangular nested lists) as an array of `dtype` (a
    TensorFlow dtype or its name, as a `TensorSignature` holds it).
    The shape is read off the first element at every level, then every list
    must match it and every leaf must sit at the innermost level."""
    dtype = tf.dtypes.as_dtype(dtype)
    shape: list[int] = []
    probe = value
    while isinstance(probe, list):
        if len(shape) == MAX_RANK:
            raise _too_deep()
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    convert = _leaf_converter(dtype)
    flat: list[object] = []
    _fill(value, 0, shape, convert, flat)
    if dtype == tf.string:
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(shape)
    return np.array(flat, dtype=dtype.as_numpy_dtype).reshape(shape)


def _fill(value: object, level: int, shape: list[int], convert: Callable[[object], object],
          out: list[object]) -> None:
    rank = len(shape)
    if not isinstance(value, list):
        if level != rank:
            raise invalid_argument(f"JSON Value: {_echo(value)} found at incorrect level: "
                                   f"{level + 1} in the JSON DOM. Expected at level: {rank}")
        out.append(convert(value))
        return
    if level >= rank:
        raise invalid_argument(f"Encountered list at unexpected level: {level} expected < {rank}")
    if len(value) != shape[level]:
        raise invalid_argument(f"Encountered list at unexpected size: {len(value)} at level: "
                               f"{level} expected size: {shape[level]}")
    if level == rank - 1:  # the innermost list: the hot loop
        for item in value:
            if isinstance(item, list):
                raise invalid_argument(f"Encountered list at unexpected level: {level + 1} "
                                       f"expected < {rank}")
            out.append(convert(item))
        return
    for item in value:
        _fill(item, level + 1, shape, convert, out)


# ------------------------------------------------------------------ predict requests


def decode_predict(doc: dict, inputs: Mapping[str, TensorSignature]
                   ) -> tuple[dict[str, np.ndarray], str]:
    """Arrays for the signature's `inputs` from a predict document, and its format."""
    if not inputs:
        raise invalid_argument("Failed to get input map for signature")
    if "instances" in doc and "inputs" in doc:
        raise invalid_argument("Not formatted correctly expecting only one of 'inputs' or "
                               "'instances' keys to exist")
    if "instances" in doc:
        return _decode_instances(doc["instances"], inputs), ROW
    if "inputs" in doc:
        return _decode_columns(doc["inputs"], inputs), COLUMNAR
    raise invalid_argument("Missing 'inputs' or 'instances' key")


def _is_named(value: object) -> bool:
    return isinstance(value, dict) and not is_b64(value)


def _decode_instances(instances: object, inputs: Mapping[str, TensorSignature]
                      ) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise invalid_argument("Excepting 'instances' to be an list/array")
    if not instances:
        raise invalid_argument("No values in 'instances' array")
    named = _is_named(instances[0])
    if not named and len(inputs) > 1:
        raise invalid_argument(
            "instances is a plain list, but expecting list of objects as multiple input "
            f"tensors required as per tensorinfo_map (inputs: {','.join(inputs)})")
    rows: dict[str, list[np.ndarray]] = {k: [] for k in inputs}
    for i, item in enumerate(instances):
        if named:
            if not _is_named(item):
                raise invalid_argument(f"Expecting object but got list at item {i} of input "
                                       "list")
            for key, value in item.items():
                if key not in inputs:
                    raise invalid_argument(
                        f"Failed to process element: {i} key: {key} of 'instances' list. "
                        f"Error: JSON object: does not have named input: {key}")
                rows[key].append(_instance_value(value, inputs[key], i, key))
            if set(item) != set(inputs):
                raise invalid_argument(
                    f"Failed to process element: {i} of 'instances' list. JSON object: "
                    f"{_echo(item)} keys must be equal to: {','.join(sorted(inputs))}")
        else:
            if _is_named(item):
                raise invalid_argument(f"Expecting value/list but got object at item {i} of "
                                       "input list")
            key = next(iter(inputs))
            rows[key].append(_instance_value(item, inputs[key], i, None))
    out = {}
    for key, arrays in rows.items():
        first = arrays[0].shape
        if len(first) >= MAX_RANK:  # the batch dimension comes on top of the instance's
            raise _too_deep()
        for i, a in enumerate(arrays):
            if a.shape != first:
                raise invalid_argument(
                    f"Failed to process element: {i} of 'instances' list"
                    + (f" key: {key}" if named else "")
                    + f". Error: Expecting shape {shape_text(first)} but got: "
                    f"{shape_text(a.shape)}")
        out[key] = np.stack(arrays)
    return out


def _instance_value(value: object, spec: TensorSignature, index: int,
                    key: str | None) -> np.ndarray:
    try:
        return value_to_array(value, spec.dtype)
    except ServingError as e:
        where = f"{index}" + (f" key: {key}" if key is not None else "")
        raise ServingError(e.code, f"Failed to process element: {where} of 'instances' list. "
                                   f"Error: {e.message}") from None


def _decode_columns(value: object, inputs: Mapping[str, TensorSignature]) -> dict[str, np.ndarray]:
    if not _is_named(value):
        if len(inputs) > 1:
            raise invalid_argument(
                "inputs is a plain value/list, but expecting an object as multiple input "
                f"tensors required as per tensorinfo_map (inputs: {','.join(inputs)})")
        key, spec = next(iter(inputs.items()))
        return {key: value_to_array(value, spec.dtype)}
    assert isinstance(value, dict)
    for key in inputs:
        if key not in value:
            raise invalid_argument(f"Missing named input: {key} in 'inputs' object.")
    extra = sorted(set(value) - set(inputs))
    if extra:
        raise invalid_argument(f"Unexpected named input(s): {','.join(extra)} in 'inputs' "
                               f"object; the signature's inputs are {{{','.join(inputs)}}}.")
    return {key: value_to_array(value[key], spec.dtype) for key, spec in inputs.items()}


# ------------------------------------------------------------------ predict responses


def _float_token(text: str) -> str:
    # numpy prints the shortest text that reads back as the same float32 ("0.1",
    # not 0.10000000149011612), as TF Serving does; JSON spells nan/inf its own way.
    if text in ("nan", "-nan"):
        return "NaN"
    if text == "inf":
        return "Infinity"
    if text == "-inf":
        return "-Infinity"
    return text


def _tokens(array: np.ndarray, as_bytes: bool) -> list[str]:
    flat = array.ravel()
    kind = array.dtype.kind
    if kind == "f":
        if array.dtype not in (np.float16, np.float32, np.float64):
            flat = flat.astype(np.float32)  # bfloat16 and friends print as float32
        return [_float_token(str(v)) for v in flat]
    if kind == "b":
        return ["true" if v else "false" for v in flat.tolist()]
    if kind in "iu":
        return [str(v) for v in flat.tolist()]
    if array.dtype == object or kind in "SU":
        return [_string_token(v, as_bytes) for v in flat.tolist()]
    raise invalid_argument(f"Failed to write JSON value for tensor type: {array.dtype}")


def _string_token(value: object, as_bytes: bool) -> str:
    raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
    if not as_bytes:
        try:
            return json.dumps(raw.decode("utf-8"))
        except UnicodeDecodeError:
            pass  # not text: b64 is the only faithful JSON for it
    return '{"b64": "' + base64.b64encode(raw).decode("ascii") + '"}'


def _nest(tokens: list[str], shape: tuple[int, ...], stop: int = 0) -> list[str]:
    """Group flat tokens into JSON lists, innermost axis first, down to axis `stop`."""
    items = tokens
    for axis in range(len(shape) - 1, stop - 1, -1):
        size = shape[axis]
        groups = int(np.prod(shape[:axis], dtype=np.int64))
        items = ["[" + ",".join(items[g * size:(g + 1) * size]) + "]" for g in range(groups)]
    return items


def tensor_json(array: np.ndarray, key: str = "") -> str:
    return _nest(_tokens(array, key.endswith("_bytes")), array.shape)[0]


def encode_predict(outputs: Mapping[str, np.ndarray], fmt: str) -> str:
    if not outputs:
        raise invalid_argument("Cannot convert empty tensor map to JSON")
    keys = sorted(outputs)
    if fmt == COLUMNAR:
        if len(keys) == 1:
            return '{"outputs": ' + tensor_json(outputs[keys[0]], keys[0]) + "}"
        body = ", ".join(f"{json.dumps(k)}: {tensor_json(outputs[k], k)}" for k in keys)
        return '{"outputs": {' + body + "}}"
    batch = None
    rows: dict[str, list[str]] = {}
    for key in keys:
        array = outputs[key]
        if array.ndim == 0:
            raise invalid_argument(f"Tensor name: {key} has no shape information ")
        if batch is not None and array.shape[0] != batch:
            raise invalid_argument(f"Tensor name: {key} has inconsistent batch size: "
                                   f"{array.shape[0]} expecting: {batch}")
        batch = array.shape[0]
        rows[key] = _nest(_tokens(array, key.endswith("_bytes")), array.shape, stop=1)
    assert batch is not None
    if len(keys) == 1:
        items = rows[keys[0]]
    else:
        items = ["{" + ", ".join(f"{json.dumps(k)}: {rows[k][i]}" for k in keys) + "}"
                 for i in range(batch)]
    return '{"predictions": [' + ", ".join(items) + "]}"


# ------------------------------------------------------------------ classify / regress


def decode_examples(doc: dict, method: str) -> input_pb2.Input:
    """The `Input` of a classify/regress document."""
    request_input = input_pb2.Input()
    context = "context" in doc
    if context:
        _example_from_json(doc["context"],
                           request_input.example_list_with_context.context)
    if "examples" not in doc:
        raise invalid_argument(f"JSON Value: {_echo(doc)} When method is {method}, key "
                               "'examples' is expected and was not found")
    examples = doc["examples"]
    if not isinstance(examples, list):
        raise invalid_argument("Expecting 'examples' value to be an list/array")
    if not examples:
        raise invalid_argument("'examples' value is an empty array")
    for item in examples:
        target = (request_input.example_list_with_context.examples.add() if context
                  else request_input.example_list.examples.add())
        _example_from_json(item, target)
    return request_input


_KIND_NAMES = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


def _example_from_json(value: object, example: example_pb2.Example) -> None:
    if not isinstance(value, dict):
        raise invalid_argument(f"Example must be JSON object but got JSON {_json_type(value)}")
    for name, content in value.items():
        feature = feature_pb2.Feature()
        for item in content if isinstance(content, list) else [content]:
            _add_feature_value(name, item, feature)
        example.features.feature[name].CopyFrom(feature)


def _add_feature_value(name: str, value: object, feature: feature_pb2.Feature) -> None:
    if isinstance(value, bool):
        kind, stored = "int64_list", int(value)
    elif isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 63):
            raise invalid_argument(f"Feature: {name} has uint64 element. Only int64 is "
                                   "supported.")
        kind, stored = "int64_list", value
    elif isinstance(value, float):
        if np.isfinite(value) and abs(value) > float(np.finfo(np.float32).max):
            raise invalid_argument(f"Cannot convert JSON value: {value!r} to float without "
                                   "loss of precision.")
        kind, stored = "float_list", value
    elif isinstance(value, str):
        kind, stored = "bytes_list", value.encode("utf-8")
    elif is_b64(value):
        kind, stored = "bytes_list", decode_b64(value)  # type: ignore[arg-type]
    else:
        raise invalid_argument(f"Feature: {name} has element with unexpected JSON type: "
                               f"{_json_type(value)}")
    current = feature.WhichOneof("kind")
    if current is not None and current != kind:
        raise invalid_argument(f"Unexpected element type in feature: {name} expecting type: "
                               f"{_KIND_NAMES[current]}")
    getattr(feature, kind).value.append(stored)


def encode_classification(result: classification_pb2.ClassificationResult) -> str:
    rows = []
    for classifications in result.classifications:
        pairs = [f"[{json.dumps(c.label)}, {_float_token(str(np.float32(c.score)))}]"
                 for c in classifications.classes]
        rows.append("[" + ", ".join(pairs) + "]")
    return '{"results": [' + ", ".join(rows) + "]}"


def encode_regression(result: regression_pb2.RegressionResult) -> str:
    values = [_float_token(str(np.float32(r.value))) for r in result.regressions]
    return '{"results": [' + ", ".join(values) + "]}"
