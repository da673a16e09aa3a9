"""TensorProto <-> numpy, and tf.Example inputs -> a batch of serialized examples.

Requests are decoded with `tf.make_ndarray`, which understands every way a
client may fill a TensorProto (`tensor_content`, the typed `*_val` fields, one
value repeated over the shape).

Responses are written into the typed `*_val` fields (`float_val`, ...), not
`tensor_content`: that is what TensorFlow Serving sends (its default
`kAsProtoField`), and existing clients read `response.outputs["y"].float_val`
directly. `tf.make_tensor_proto` would pack numeric arrays into
`tensor_content`, which such clients would see as empty, so it is only the
fallback for dtypes without a typed field.

A request is bounded before it is decoded: TensorFlow would expand a tensor that
declares a large shape but carries one value (a 34-byte request for [1048576, 16])
and the model would then compute on it. Here a tensor must carry every value its
shape declares, except a splat (0 or 1 value) of at most SPLAT_MAX_ELEMENTS,
and a request may declare at most `max_elements` elements over all its tensors
(`--request_max_elements`). The first is refused INVALID_ARGUMENT (TF Serving's
code for a tensor it cannot parse), the second RESOURCE_EXHAUSTED (gRPC's code for
a message over its size limit), both before anything is allocated.

Memory per request is a small multiple of its tensors: decoding holds the
request message and the array (2x); encoding writes each output straight into
the response's typed field without Python objects per value, float and double
as one packed block parsed by protobuf, other dtypes in chunks of
`ENCODE_CHUNK` values (before, `array.tolist()` made a Python float per value:
32 bytes each, 8x a float32 output at once, and seconds per 2^24 values).
gRPC then holds the serialized response (1x). A Predict of 2^24 float32 values
(64 MiB) through y = 2x peaks at 7.7x the tensor over the server's idle size,
16.0x before (benchmarks/serving_memory.py measures it): the request's bytes, its
message, the array, TensorFlow's input and output, the response field, the packed
block and the serialized response, about one tensor each.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import input_pb2

from .status import RESOURCE_EXHAUSTED, ServingError, invalid_argument

SPLAT_MAX_ELEMENTS = 1 << 16
REQUEST_MEMORY_MULTIPLE = 8  # server memory a Predict holds, per byte of its tensors
# A JSON REST request (TF Serving's or the v2 protocol's) holds its parsed document, the
# Python values, the arrays and the answer's JSON. Measured (tracemalloc, one million
# values): 83 bytes per value for `0,0,...`, 127 for float32 text, 107 in rows of 4;
# a 20 MB string 6.0x the body, a 20 MB b64 value 4.8x. Counted as both, summed.
REST_BODY_MULTIPLE = 6
REST_BYTES_PER_VALUE = 128
REST_COUNTED = f"{REST_BODY_MULTIPLE}x its body + {REST_BYTES_PER_VALUE} bytes per value"
ENCODE_CHUNK = 1 << 16  # values converted to Python objects at once, for typed fields
# Packed fixed-width fields of TensorProto: field number, little-endian dtype.
_PACKED = {"float_val": (5, "<f4"), "double_val": (6, "<f8")}
DEFAULT_MAX_ELEMENTS = 1 << 27  # 512 MiB of float32 per request
# The most dimensions a request tensor may have: numpy's ndarray limit (TensorFlow's own is
# 254), since every request tensor becomes an ndarray; checked before any array is built,
# so a deeper one is INVALID_ARGUMENT with this message, not numpy's ValueError.
MAX_RANK = 64
_VALUE_FIELDS = ("float_val", "double_val", "int_val", "int64_val", "bool_val", "string_val",
                 "half_val", "uint32_val", "uint64_val", "scomplex_val", "dcomplex_val",
                 "resource_handle_val", "variant_val")

# numpy dtype -> (TF DataType enum, TensorProto field, numpy dtype the field stores).
_FIELDS: dict[np.dtype, tuple[int, str]] = {}


def _register(np_dtype: object, tf_dtype: tf.dtypes.DType, field: str) -> None:
    _FIELDS[np.dtype(np_dtype)] = (tf_dtype.as_datatype_enum, field)


_register(np.float32, tf.float32, "float_val")
_register(np.float64, tf.float64, "double_val")
_register(np.int32, tf.int32, "int_val")
_register(np.int16, tf.int16, "int_val")
_register(np.int8, tf.int8, "int_val")
_register(np.uint8, tf.uint8, "int_val")
_register(np.uint16, tf.uint16, "int_val")
_register(np.int64, tf.int64, "int64_val")
_register(np.uint32, tf.uint32, "uint32_val")
_register(np.uint64, tf.uint64, "uint64_val")
_register(np.bool_, tf.bool, "bool_val")
_ITEMSIZE = {enum: dtype.itemsize for dtype, (enum, _) in _FIELDS.items()}
_ITEMSIZE[tf.float16.as_datatype_enum] = 2
_ITEMSIZE[tf.bfloat16.as_datatype_enum] = 2

def declared_elements(key: str, proto: tensor_pb2.TensorProto) -> int:
    """The element count `proto`'s shape declares, checked against the values it
    carries; INVALID_ARGUMENT for a shape TF refuses or a large splat."""
    dims = [d.size for d in proto.tensor_shape.dim]
    if len(dims) > MAX_RANK or any(d < 0 for d in dims):
        raise invalid_argument(f"tensor parsing error: {key}: shape {dims[:8]} is not a valid "
                               f"tensor shape (dims must be >= 0, rank <= {MAX_RANK})")
    count = math.prod(dims)
    if proto.tensor_content:
        return count  # its size is checked against the dtype when decoded
    carried = max(len(getattr(proto, f)) for f in _VALUE_FIELDS)
    if carried < count and not (carried <= 1 and count <= SPLAT_MAX_ELEMENTS):
        raise invalid_argument(
            f"tensor parsing error: {key}: shape {dims} declares {count} elements but the "
            f"request carries {carried} value(s); send every value (a tensor of more than "
            f"{SPLAT_MAX_ELEMENTS} elements cannot be given as one repeated value)")
    return count


def check_request_size(tensors: dict[str, tensor_pb2.TensorProto], max_elements: int) -> int:
    """Every tensor well-formed and carrying its values; the request within the limit.
    Returns the server memory the request will hold (`REQUEST_MEMORY_MULTIPLE` times
    the bytes its tensors declare; 8 bytes per element of a dtype without a size)."""
    counts = {k: declared_elements(k, v) for k, v in tensors.items()}
    total = sum(counts.values())
    if max_elements > 0 and total > max_elements:
        raise ServingError(RESOURCE_EXHAUSTED,
                           f"the request declares {total} elements over its tensors, more than "
                           f"this server accepts in one request ({max_elements}, "
                           "--request_max_elements); split it into smaller requests")
    return REQUEST_MEMORY_MULTIPLE * sum(count * _ITEMSIZE.get(tensors[k].dtype, 8)
                                         for k, count in counts.items())


def rest_request_bytes(body: bytes) -> int:
    """The server memory a JSON REST request with this body is counted as holding
    (`REST_BODY_MULTIPLE` x its bytes + `REST_BYTES_PER_VALUE` per comma-separated
    value), reserved from the server's budget before it is parsed."""
    return REST_BODY_MULTIPLE * len(body) + REST_BYTES_PER_VALUE * (body.count(b",") + 1)


def to_ndarray(key: str, proto: tensor_pb2.TensorProto) -> np.ndarray:
    """Decode request tensor `key`; a malformed proto is INVALID_ARGUMENT."""
    declared_elements(key, proto)
    try:
        return tf.make_ndarray(proto)
    except Exception:  # make_ndarray raises TypeError/ValueError/… on bad protos
        # Our words, not the library's: its message names its internals, not the request.
        dtype = types_pb2.DataType.Name(proto.dtype) \
            if proto.dtype in types_pb2.DataType.values() else proto.dtype
        raise invalid_argument(f"tensor parsing error: {key}: its content does not fit its "
                               f"dtype {dtype} and shape "
                               f"{[d.size for d in proto.tensor_shape.dim]}") from None


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _fill_field(proto: tensor_pb2.TensorProto, field: str, values: np.ndarray) -> None:
    """`proto.<field>` = the values of the 1-D `values`, never all as Python objects."""
    if field in _PACKED and values.size:
        number, dtype = _PACKED[field]
        data = np.ascontiguousarray(values, dtype=dtype).tobytes()
        # One packed field on the wire: tag (number, wire type 2), length, the values.
        proto.MergeFromString(_varint(number << 3 | 2) + _varint(len(data)) + data)
        return
    target = getattr(proto, field)
    for start in range(0, values.size, ENCODE_CHUNK):
        target.extend(values[start:start + ENCODE_CHUNK].tolist())


def to_tensor_proto(array: np.ndarray, into: tensor_pb2.TensorProto | None = None
                    ) -> tensor_pb2.TensorProto:
    """Encode a response tensor the way TF Serving does (typed value fields), into
    `into` if given (a response's own message: no copy of it is made)."""
    array = np.asarray(array)
    proto = tensor_pb2.TensorProto() if into is None else into
    kind = _FIELDS.get(array.dtype)
    if array.dtype == object or array.dtype.kind in "SU":
        proto.dtype = tf.string.as_datatype_enum
        proto.string_val.extend(_as_bytes(v) for v in array.ravel().tolist())
    elif array.dtype == np.float16:
        proto.dtype = tf.float16.as_datatype_enum
        _fill_field(proto, "half_val", array.ravel().view(np.uint16))
    elif kind is not None:
        proto.dtype = kind[0]
        _fill_field(proto, kind[1], array.ravel())
    else:  # complex, bfloat16, ...: TensorFlow's own encoder
        encoded = tf.make_tensor_proto(array)
        if into is None:
            return encoded
        into.CopyFrom(encoded)
        return into
    proto.tensor_shape.CopyFrom(shape_proto(array.shape))
    return proto


def shape_proto(shape: tuple[int, ...]) -> tensor_shape_pb2.TensorShapeProto:
    return tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=int(d)) for d in shape])


def _as_bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def serialized_examples(request_input: input_pb2.Input) -> np.ndarray:
    """A classify/regress `Input` as the DT_STRING [N] tensor of serialized
    tf.Examples the signature's `inputs` takes.

    With a context, each example is the context's bytes followed by the
    example's: protobuf parses a concatenation as a merge, so the example's
    features are added to (and override) the context's, as TF Serving does."""
    kind = request_input.WhichOneof("kind")
    if kind == "example_list":
        examples = [e.SerializeToString() for e in request_input.example_list.examples]
    elif kind == "example_list_with_context":
        with_context = request_input.example_list_with_context
        context = with_context.context.SerializeToString()
        examples = [context + e.SerializeToString() for e in with_context.examples]
    else:
        examples = []
    if not examples:
        raise invalid_argument("Input is empty.")
    out = np.empty(len(examples), dtype=object)
    out[:] = examples
    return out
