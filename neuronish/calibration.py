"""Calibration sets for `compile(..., quantize="int8", calibration_data=...)` (docs/int8.md).

The compiler calibrates (it runs each subgraph on the numpy reference kernels and
records the ranges of the values it will quantize), so what it needs from this side is
each subgraph's *inputs* on the calibration samples. A subgraph's inputs are tensors of
the frozen graph (often the signature's inputs, but after a part left on TensorFlow
they are that part's outputs), so TensorFlow computes them here, once per sample, in
one session. Each is cut into the subgraph's compiled batch and written as the
compiler's `--calibration FILE.npz`: per io-config input name, [samples, *shape].
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .errors import SavedModelError

if TYPE_CHECKING:  # (TensorFlow is imported only when calibration runs)
    from .freeze import CapturedResource


def collect(calibration_data: Iterable[Mapping[str, object]], input_keys: Sequence[str]
            ) -> list[dict[str, np.ndarray]]:
    """The samples as arrays, checked: each a feed dict keyed by signature input key."""
    samples = []
    for k, feed in enumerate(calibration_data):
        if not isinstance(feed, Mapping):
            raise SavedModelError(f"calibration_data item {k} is a {type(feed).__name__}; "
                                  "each item must be a feed dict like model_feed_dict "
                                  f"(keys: {list(input_keys)})")
        missing = [key for key in input_keys if key not in feed]
        if missing:
            raise SavedModelError(f"calibration_data item {k} has no value for input(s) "
                                  f"{missing} (it has {sorted(feed)})")
        samples.append({key: np.asarray(feed[key]) for key in input_keys})
    if not samples:
        raise SavedModelError("quantize='int8' needs calibration_data with at least one "
                              "feed dict")
    return samples


def fingerprint(samples: Sequence[Mapping[str, np.ndarray]]) -> str:
    """A hash of the calibration set (part of each subgraph's compile key)."""
    h = hashlib.sha256()
    for sample in samples:
        for key in sorted(sample):
            a = np.ascontiguousarray(sample[key])
            h.update(f"{key}{a.dtype}{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()[:16]


def boundary_values(graph_def: bytes, feeds: Sequence[Mapping[str, np.ndarray]],
                    fetches: Sequence[str], resources: Sequence[CapturedResource] = ()
                    ) -> list[dict[str, np.ndarray]]:
    """`fetches` computed by TensorFlow in the frozen graph, once per feed (one session);
    a graph that reads captured resources (lookup tables: placeholders in the frozen
    graph) is run as the compiled model's serving function runs it, with the original
    objects' handles mapped in."""
    import tensorflow as tf

    from .graph import producer

    gd = tf.compat.v1.GraphDef()
    gd.ParseFromString(graph_def)
    present = {n.name for n in gd.node}
    resources = [r for r in resources if producer(r.tensor) in present]
    if resources:
        return _boundary_values_with_resources(gd, feeds, fetches, resources)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    out = []
    with tf.compat.v1.Session(graph=graph) as session:
        for feed in feeds:
            values = session.run(list(fetches), dict(feed))
            out.append(dict(zip(fetches, values, strict=True)))
    return out


def _boundary_values_with_resources(gd: object, feeds: Sequence[Mapping[str, np.ndarray]],
                                    fetches: Sequence[str],
                                    resources: Sequence[CapturedResource]
                                    ) -> list[dict[str, np.ndarray]]:
    import tensorflow as tf

    names = sorted(feeds[0]) if feeds else []
    computed = [f for f in fetches if f not in names]  # (a fed tensor is its feed)

    @tf.function
    def compute(*args: tf.Tensor) -> list[tf.Tensor]:
        input_map = dict(zip(names, args, strict=True))
        input_map.update({r.tensor: tf.identity(r.owner.resource_handle) for r in resources})
        return tf.graph_util.import_graph_def(gd, input_map=input_map,
                                              return_elements=computed, name="calibration")

    out = []
    for feed in feeds:
        values = compute(*[tf.constant(feed[n]) for n in names]) if computed else []
        got = dict(zip(computed, (v.numpy() for v in values), strict=True))
        out.append({f: got[f] if f in got else np.asarray(feed[f]) for f in fetches})
    return out


def _batches(values: list[np.ndarray], axis: int, shape: Sequence[int]) -> list[np.ndarray]:
    """The samples' values of one tensor cut into the compiled shape: joined along the
    batch axis and split into compiled batches (a short tail is dropped; a set smaller
    than one batch is repeated to fill it)."""
    if axis < 0:
        return [np.broadcast_to(v, shape) for v in values]
    joined = np.concatenate(values, axis=axis)
    b = shape[axis]
    if joined.shape[axis] < b:
        joined = np.take(joined, np.arange(b) % joined.shape[axis], axis=axis)
    n = joined.shape[axis] // b
    return [np.take(joined, np.arange(k * b, (k + 1) * b), axis=axis) for k in range(n)]


def write_files(graph_def: bytes, samples: Sequence[Mapping[str, np.ndarray]],
                tensor_of_key: Mapping[str, str], subgraphs: Sequence[object],
                directory: str, resources: Sequence[CapturedResource] = ()) -> dict[str, str]:
    """One `--calibration` file per subgraph; subgraph name -> its path."""
    if not subgraphs:
        return {}
    feeds = [{tensor_of_key[k]: v for k, v in s.items()} for s in samples]
    fetches = sorted({_tensor(t) for sg in subgraphs for t in sg.inputs})  # type: ignore
    values = boundary_values(graph_def, feeds, fetches, resources)
    paths = {}
    for sg in subgraphs:
        arrays = {}
        for t, name, shape, axis, dtype in zip(sg.inputs, sg.input_names,  # type: ignore
                                               sg.input_shapes, sg.input_batch_axes,
                                               sg.input_dtypes):
            per_sample = [np.asarray(v[_tensor(t)]) for v in values]
            try:
                arrays[name] = np.stack(_batches(per_sample, axis, shape)).astype(dtype)
            except ValueError as e:
                raise SavedModelError(f"calibration: subgraph {sg.name} input {t} "  # type: ignore
                                      f"has shapes {[v.shape for v in per_sample]} on the "
                                      f"calibration set; it was compiled for {list(shape)} "
                                      f"({e})") from None
        count = min(a.shape[0] for a in arrays.values()) if arrays else 0
        path = Path(directory) / f"{sg.name.replace('/', '_')}.calibration.npz"  # type: ignore
        np.savez(path, **{k: a[:count] for k, a in arrays.items()})
        paths[sg.name] = str(path)  # type: ignore[attr-defined]
    return paths


def _tensor(name: str) -> str:
    return name if ":" in name else f"{name}:0"
