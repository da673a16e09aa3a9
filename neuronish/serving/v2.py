"""The Open Inference Protocol (KServe v2), independent of the wire.

    live / ready / model_ready     health: the server answers; every configured model
                                   has a version loaded (and warmed up); one model does
    server_metadata                {"name", "version", "extensions"}
    model_metadata                 {"name", "versions", "platform", "inputs", "outputs"}
    infer                          typed tensors in, typed tensors out

REST (v2_rest.py) and gRPC (v2_grpc.py) both come here, so a request means the same
thing and fails the same way on both, and both go through `ServingCore.predict`:
the same size limit, deadline, batching and checks against the signature as TF
Serving's Predict. A v2 model has no signatures: it is the SavedModel's
`serving_default`, or the one a request names in its `signature_name` parameter.

Tensor data is untrusted: a declared shape is checked against the data that came
(element count, byte count) before any array is made, and nothing is allocated by a
shape alone.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import get_model_status_pb2

from neuronish.runtime.signature import TensorSignature

from .codec import MAX_RANK
from .core import ServingCore, Target
from .signatures import DEFAULT_SIGNATURE, Signature
from .status import INTERNAL, ServingError, invalid_argument

PLATFORM = "tensorflow_savedmodel"
SERVER_NAME = "neuronish-model-server"
AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE

# v2 datatype <-> TensorFlow dtype: every dtype a SavedModel signature of ours takes.
DATATYPES: dict[str, tf.dtypes.DType] = {
    "BOOL": tf.bool, "UINT8": tf.uint8, "UINT16": tf.uint16, "UINT32": tf.uint32,
    "UINT64": tf.uint64, "INT8": tf.int8, "INT16": tf.int16, "INT32": tf.int32,
    "INT64": tf.int64, "FP16": tf.float16, "FP32": tf.float32, "FP64": tf.float64,
    "BF16": tf.bfloat16, "BYTES": tf.string,
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}


def datatype_of(dtype: tf.dtypes.DType) -> str:
    """The v2 datatype of a TensorFlow dtype; INTERNAL for one the protocol has no name for."""
    name = _NAMES.get(tf.dtypes.as_dtype(dtype))
    if name is None:
        raise ServingError(INTERNAL, f"dtype {tf.dtypes.as_dtype(dtype).name} has no Open "
                                     "Inference Protocol datatype")
    return name


def _numpy_dtype(datatype: str) -> np.dtype:
    return np.dtype(DATATYPES[datatype].as_numpy_dtype).newbyteorder("<")


@dataclass(frozen=True)
class InputTensor:
    """One request input as it came: its declared name, datatype and shape, and its data
    (a flat list from JSON/typed contents, or raw little-endian bytes)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Sequence[object] | bytes | None = None

    def to_array(self) -> np.ndarray:
        if self.datatype not in DATATYPES:
            raise invalid_argument(f"input '{self.name}': datatype {self.datatype!r} is not one "
                                   f"of the protocol's ({', '.join(DATATYPES)})")
        if len(self.shape) > MAX_RANK:
            raise invalid_argument(f"input '{self.name}': shape has {len(self.shape)} "
                                   f"dimensions; a tensor has at most {MAX_RANK}")
        if any(d < 0 for d in self.shape):
            raise invalid_argument(f"input '{self.name}': shape {list(self.shape)} has a "
                                   "negative dimension")
        count = math.prod(self.shape)
        if self.data is None:
            raise invalid_argument(f"input '{self.name}' has no data")
        if isinstance(self.data, (bytes, bytearray, memoryview)):
            return self._from_raw(bytes(self.data), count)
        flat = self.data
        if len(flat) != count:
            raise invalid_argument(f"input '{self.name}': shape {list(self.shape)} holds "
                                   f"{count} elements, but {len(flat)} came")
        if self.datatype == "BYTES":
            values = np.empty(count, dtype=object)
            values[:] = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in flat]
            return values.reshape(self.shape)
        try:
            array = np.asarray(flat, dtype=DATATYPES[self.datatype].as_numpy_dtype)
        except (TypeError, ValueError, OverflowError):
            raise invalid_argument(f"input '{self.name}': its data is not {self.datatype} "
                                   "(a value of another type, a nested list or a number out "
                                   "of range)") from None
        return array.reshape(self.shape)

    def _from_raw(self, raw: bytes, count: int) -> np.ndarray:
        if self.datatype == "BYTES":
            elements = split_bytes(raw, count, self.name)  # checked before any allocation
            values = np.empty(count, dtype=object)
            values[:] = elements
            return values.reshape(self.shape)
        dtype = _numpy_dtype(self.datatype)
        if len(raw) != count * dtype.itemsize:
            raise invalid_argument(f"input '{self.name}': shape {list(self.shape)} of "
                                   f"{self.datatype} needs {count * dtype.itemsize} bytes, but "
                                   f"{len(raw)} came")
        return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="),
                                                      copy=False).reshape(self.shape)


def split_bytes(raw: bytes, count: int, name: str) -> list[bytes]:
    """The protocol's serialized BYTES tensor: each element a 4-byte little-endian length
    and that many bytes, `count` of them and nothing after."""
    values, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise invalid_argument(f"input '{name}': BYTES data ends inside a length prefix")
        (size,) = struct.unpack_from("<I", raw, at)
        at += 4
        if at + size > len(raw):
            raise invalid_argument(f"input '{name}': a BYTES element of {size} bytes runs past "
                                   "the end of the data")
        values.append(raw[at:at + size])
        at += size
        if len(values) > count:
            break
    if len(values) != count:
        more = " or more" if at < len(raw) else ""
        raise invalid_argument(f"input '{name}': its shape holds {count} elements, but the "
                               f"BYTES data holds {len(values)}{more}")
    return values


def to_raw(array: np.ndarray, datatype: str) -> bytes:
    """An output's data as the protocol's raw bytes (little-endian; BYTES length-prefixed)."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in (_as_bytes(x) for x in
                                                                 array.reshape(-1)))
    return np.ascontiguousarray(array, dtype=_numpy_dtype(datatype)).tobytes()


def to_list(array: np.ndarray, datatype: str) -> list:
    """An output's data as a flat JSON list (BYTES as UTF-8 text)."""
    if datatype == "BYTES":
        try:
            return [_as_bytes(v).decode("utf-8") for v in array.reshape(-1)]
        except UnicodeDecodeError:
            raise invalid_argument("an output holds bytes that are not UTF-8 text; ask for it "
                                   "with binary_data") from None
    if datatype in ("FP16", "BF16"):
        array = array.astype(np.float32)
    return array.reshape(-1).tolist()


def _as_bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def version_number(version: str) -> int | None:
    """A v2 version string ("" = the newest loaded) as the manager's number."""
    if not version:
        return None
    # (ASCII: '²'.isdigit() and int() refuses it; 18 digits: int() refuses 4301)
    if not (version.isascii() and version.isdigit() and len(version) <= 18):
        raise invalid_argument(f"model version {version!r} is not a version number")
    return int(version)


def tensor_metadata(spec: TensorSignature) -> dict:
    shape = [-1] if spec.shape is None else [int(d) for d in spec.shape]
    return {"name": spec.name, "datatype": datatype_of(spec.dtype), "shape": shape}


@dataclass
class InferResult:
    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray]  # in the order asked for (else the signature's)
    datatypes: dict[str, str]


class V2Service:
    """The protocol's calls on the server's models."""

    def __init__(self, core: ServingCore, version: str):
        self.core = core
        self.version = version

    # -- health -------------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Every configured model has a version available: loaded and warmed up, so a
        readiness probe never sends traffic to a server still loading."""
        names = self.core.manager.model_names()
        return bool(names) and all(self.model_ready(n, "") for n in names)

    def model_ready(self, name: str, version: str) -> bool:
        return bool(self._available_versions(name, version_number(version)))

    def _available_versions(self, name: str, version: int | None = None) -> list[int]:
        try:
            status = self.core.manager.status(name, version)
        except ServingError:
            return []
        return sorted((s.version for s in status.model_version_status
                       if s.state == AVAILABLE), reverse=True)

    # -- metadata -----------------------------------------------------------------
    def server_metadata(self) -> dict:
        return {"name": SERVER_NAME, "version": self.version, "extensions": ["binary_tensor_data"]}

    def model_metadata(self, name: str, version: str) -> dict:
        number = version_number(version)
        with self.core.manager.acquire(name, number) as servable:
            signature = self._signature(servable.signatures, "")
            return {"name": servable.name,
                    "versions": [str(v) for v in self._available_versions(name)] if number is None
                    else [str(servable.version)],
                    "platform": PLATFORM,
                    "inputs": [tensor_metadata(s) for s in signature.inputs.values()],
                    "outputs": [tensor_metadata(s) for s in signature.outputs.values()]}

    @staticmethod
    def _signature(signatures: Mapping[str, Signature], name: str) -> Signature:
        key = name or DEFAULT_SIGNATURE
        if key not in signatures:
            known = ", ".join(sorted(k for k in signatures if not k.startswith("__")))
            raise invalid_argument(f"the model has no signature {key!r} (signature_name "
                                   f"parameter); it has: {known}")
        return signatures[key]

    # -- infer ----------------------------------------------------------------------
    def infer(self, name: str, version: str, inputs: Sequence[InputTensor],
              outputs: Iterable[str] = (), signature_name: str = "",
              deadline: float | None = None) -> InferResult:
        """Run the model on `inputs`; `outputs` names the outputs wanted (all if empty)."""
        if not name:
            raise invalid_argument("the request names no model")
        seen: set[str] = set()
        for tensor in inputs:
            if tensor.name in seen:
                raise invalid_argument(f"input '{tensor.name}' is given twice")
            seen.add(tensor.name)
        wanted = list(outputs)
        datatypes: dict[str, str] = {}

        def decode(signature: Signature) -> dict[str, np.ndarray]:
            arrays = {}
            for tensor in inputs:
                spec = signature.inputs.get(tensor.name)
                if spec is not None and tensor.datatype != datatype_of(spec.dtype):
                    raise invalid_argument(
                        f"input '{tensor.name}' of model {name!r} takes "
                        f"{datatype_of(spec.dtype)}, but the request sent {tensor.datatype}")
                arrays[tensor.name] = tensor.to_array()
            keys = wanted or list(signature.outputs)
            datatypes.update({k: datatype_of(signature.outputs[k].dtype)
                              for k in keys if k in signature.outputs})
            return arrays

        spec, arrays = self.core.predict(Target(name, version_number(version), None,
                                                signature_name), decode, wanted, deadline)
        order = wanted or list(arrays)
        return InferResult(spec.name, str(spec.version.value), {k: arrays[k] for k in order},
                           datatypes)


__all__ = ["DATATYPES", "InferResult", "InputTensor", "V2Service", "datatype_of",
           "split_bytes", "to_list", "to_raw", "version_number"]
