"""Rewrites of a frozen graph, before partitioning, into ops the device runs.

`rewrite_for_device` applies each in turn; each returns its input unchanged when it does
not apply:

- `unroll.unroll_loops`: loops whose trip count the shapes fix, unrolled.
- `real_fft_as_matmuls`: the real part of a Fourier transform of a real tensor
  (`tf.math.real(tf.signal.fft2d(tf.complex(x, 0)))`, FNet's token mixing) as products
  with constant cosine and sine matrices: with F = C - iS the DFT matrix of each axis,
  Re(F_m X F_n) = C_m X C_n - S_m X S_n, and Re(X F_n) = X C_n for `fft`. The device
  holds no complex numbers; these are plain matmuls.
- `sorted_segments_as_unsorted`: SegmentSum and SegmentMean over constant segment ids as
  UnsortedSegmentSum with num_segments = last id + 1 (divided by each segment's constant
  count for the mean): TensorFlow's shape inference cannot size a SegmentSum's output
  even when its ids are constants, so nothing after it could be compiled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from neuronish.partition.shapes import PartitionError, TensorInfo, infer
from neuronish.partition.unroll import drop_dead, unroll_loops

_FLOAT = {tf.float32.as_datatype_enum: np.float32, tf.float64.as_datatype_enum: np.float64}


def rewrite_for_device(graph_def: graph_pb2.GraphDef,
                       input_shapes: Mapping[str, Sequence[int]],
                       fetches: Sequence[str]) -> graph_pb2.GraphDef:
    """`graph_def` with every rewrite of this module applied (a new GraphDef if any did)."""
    graph_def = unroll_loops(graph_def, input_shapes, fetches)
    graph_def = real_fft_as_matmuls(graph_def, input_shapes, fetches)
    return sorted_segments_as_unsorted(graph_def, input_shapes)


def real_fft_as_matmuls(graph_def: graph_pb2.GraphDef,
                        input_shapes: Mapping[str, Sequence[int]],
                        fetches: Sequence[str]) -> graph_pb2.GraphDef:
    """Each Real(FFT2D | FFT(Complex(x, zeros))) of a float x of known shape as matmuls
    with constant DFT matrices; `graph_def` itself when there is none."""
    by_name = {n.name: n for n in graph_def.node}
    found = [n for n in graph_def.node if n.op == "Real" and _real_of_fft(n, by_name)]
    prepared = _copy_with_shapes(graph_def, input_shapes) if found else None
    if prepared is None:
        return graph_def
    out, nodes, infos = prepared
    changed = False
    for real in found:
        fft = by_name[_source(real.input[0])]
        x = _source_tensor(by_name[_source(fft.input[0])].input[0])
        info = infos.get(x)
        if info is None or not info.fully_known or len(info.shape) < (2 if fft.op == "FFT2D"
                                                                     else 1):
            continue
        dtype = _FLOAT[nodes[real.name].attr["Tout"].type]
        _as_matmuls(out, nodes[real.name], fft.op, x, info.shape, dtype)
        changed = True
    if not changed:
        return graph_def
    drop_dead(out, fetches)
    return out


def _copy_with_shapes(graph_def: graph_pb2.GraphDef, input_shapes: Mapping[str, Sequence[int]]
                      ) -> tuple[graph_pb2.GraphDef, dict[str, node_def_pb2.NodeDef],
                                 dict[str, TensorInfo]] | None:
    """A copy of `graph_def` to rewrite, its nodes by name, and the static shapes of the
    tensors; None when shape inference fails (then nothing is rewritten)."""
    try:
        infos = infer(graph_def, input_shapes)
    except PartitionError:
        return None
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    return out, {n.name: n for n in out.node}, infos


def _source(ref: str) -> str:
    return ref.lstrip("^").partition(":")[0]


def _source_tensor(ref: str) -> str:
    return ref if ":" in ref else f"{ref}:0"


def _real_of_fft(real: node_def_pb2.NodeDef, by_name: Mapping[str, node_def_pb2.NodeDef]) -> bool:
    fft = by_name.get(_source(real.input[0]))
    if fft is None or fft.op not in ("FFT", "FFT2D"):
        return False
    complex_ = by_name.get(_source(fft.input[0]))
    if complex_ is None or complex_.op != "Complex" or complex_.attr["T"].type not in _FLOAT:
        return False
    imag = by_name.get(_source(complex_.input[1]))
    return imag is not None and (imag.op == "ZerosLike" or (
        imag.op == "Const" and not tf.make_ndarray(imag.attr["value"].tensor).any()))


def _dft(n: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    angle = 2 * np.pi * np.outer(np.arange(n), np.arange(n)) / n
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


def _const(graph_def: graph_pb2.GraphDef, name: str, value: np.ndarray) -> str:
    node = graph_def.node.add(name=name, op="Const")
    node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    return f"{name}:0"


def _matmul(graph_def: graph_pb2.GraphDef, name: str, a: str, b: str, dtype: type) -> str:
    node = graph_def.node.add(name=name, op="BatchMatMulV2")
    node.input.extend([a, b])
    node.attr["T"].type = tf.as_dtype(dtype).as_datatype_enum
    return f"{name}:0"


def _as_matmuls(graph_def: graph_pb2.GraphDef, real: node_def_pb2.NodeDef, op: str, x: str,
                shape: Sequence[int], dtype: type) -> None:
    """Turn node `real` into the DFT products of `x` (its output name is kept)."""
    name = real.name
    cos_n, sin_n = _dft(shape[-1], dtype)
    controls = [i for i in real.input if i.startswith("^")]
    real.Clear()
    real.name = name
    real.attr["T"].type = tf.as_dtype(dtype).as_datatype_enum
    if op == "FFT":  # Re(X F_n) = X C_n
        real.op = "BatchMatMulV2"
        real.input.extend([x, _const(graph_def, f"{name}/dft_cos", cos_n), *controls])
        return
    cos_m, sin_m = _dft(shape[-2], dtype)
    left_cos = _matmul(graph_def, f"{name}/cos_x", _const(graph_def, f"{name}/dft_cos_m", cos_m),
                       x, dtype)
    left_sin = _matmul(graph_def, f"{name}/sin_x", _const(graph_def, f"{name}/dft_sin_m", sin_m),
                       x, dtype)
    both_cos = _matmul(graph_def, f"{name}/cos_x_cos", left_cos,
                       _const(graph_def, f"{name}/dft_cos_n", cos_n), dtype)
    both_sin = _matmul(graph_def, f"{name}/sin_x_sin", left_sin,
                       _const(graph_def, f"{name}/dft_sin_n", sin_n), dtype)
    real.op = "Sub"
    real.input.extend([both_cos, both_sin, *controls])


def sorted_segments_as_unsorted(graph_def: graph_pb2.GraphDef,
                                input_shapes: Mapping[str, Sequence[int]]
                                ) -> graph_pb2.GraphDef:
    """Each SegmentSum / SegmentMean whose segment ids are a sorted, non-negative 1-D Const
    as UnsortedSegmentSum (and a division by the constant counts); `graph_def` itself
    when there is none."""
    by_name = {n.name: n for n in graph_def.node}
    found = []
    for node in graph_def.node:
        if node.op not in ("SegmentSum", "SegmentMean") or len(node.input) < 2:
            continue
        ids_node = by_name.get(_source(node.input[1]))
        if ids_node is None or ids_node.op != "Const":
            continue
        ids = tf.make_ndarray(ids_node.attr["value"].tensor)
        if ids.ndim == 1 and ids.size and (ids >= 0).all() and (np.diff(ids) >= 0).all():
            found.append((node.name, ids))
    prepared = _copy_with_shapes(graph_def, input_shapes) if found else None
    if prepared is None:
        return graph_def
    out, nodes, infos = prepared
    for name, ids in found:
        data_info = infos.get(_source_tensor(nodes[name].input[0]))
        if data_info is None or data_info.shape is None or not data_info.shape:
            continue
        node = nodes[name]
        segments = int(ids[-1]) + 1
        dtype = node.attr["T"].type
        count = _const(out, f"{name}/num_segments", np.int64(segments))
        data, ids_ref = node.input[0], node.input[1]
        controls = [i for i in node.input if i.startswith("^")]
        mean = node.op == "SegmentMean"
        summed = node if not mean else out.node.add(name=f"{name}/sum")
        summed.op = "UnsortedSegmentSum"
        del summed.input[:]
        summed.input.extend([data, ids_ref, count, *controls])
        for key in list(summed.attr):
            del summed.attr[key]
        summed.attr["T"].type = dtype
        summed.attr["Tindices"].type = nodes[_source(ids_ref)].attr["dtype"].type
        summed.attr["Tnumsegments"].type = tf.int64.as_datatype_enum
        if mean:  # empty segments: 0 / 1 = 0, as TensorFlow's SegmentMean gives
            sizes = np.maximum(np.bincount(ids, minlength=segments), 1)
            shape = [segments] + [1] * (len(data_info.shape) - 1)
            divisor = _const(out, f"{name}/sizes", sizes.reshape(shape).astype(
                tf.as_dtype(dtype).as_numpy_dtype))
            node.op = "RealDiv" if tf.as_dtype(dtype).is_floating else "Div"
            del node.input[:]
            node.input.extend([f"{name}/sum:0", divisor])
            for key in list(node.attr):
                del node.attr[key]
            node.attr["T"].type = dtype
    return out
