"""Rewrites of a frozen graph, before partitioning, into ops the device runs.

`rewrite_for_device` applies each in turn to one `Graph`, editing it in place; each
returns whether it changed anything:

- `fold.fold_constants`: values computed from constants alone (a mel filter bank, DFT
  twiddles) computed once, as Consts.
- `unroll.unroll_loops`: loops whose trip count the shapes fix, unrolled.
- `complex_pairs.complex_as_pairs`: complex values computed from real tensors and read
  back as real ones (spectrograms, MFCCs, FNet's Fourier mixing) as pairs of real
  tensors; transforms become products with constant cosine and sine matrices. The
  device holds no complex numbers.
- `sorted_segments_as_unsorted`: SegmentSum and SegmentMean over constant segment ids as
  UnsortedSegmentSum with num_segments = last id + 1 (divided by each segment's constant
  count for the mean): TensorFlow's shape inference cannot size a SegmentSum's output
  even when its ids are constants, so nothing after it could be compiled.
- `folded_layer_norms_as_moments`: Keras 2's LayerNormalization, which reshapes x to
  `[1, rows, width, 1]` (the batch folded into the channels), normalizes it with a
  training-mode `FusedBatchNormV3` (NCHW, scale 1, offset 0) and reshapes it back, as
  the same normalization over x's trailing axes: mean, variance, rsqrt. The fold mixed
  samples as far as shapes tell, so it, and the layer norm, stayed on TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

from neuronish.graph import Graph, canonical, control_refs, producer
from neuronish.rewrites.complex_pairs import complex_as_pairs
from neuronish.rewrites.fold import fold_constants
from neuronish.rewrites.unroll import unroll_loops
from neuronish.shape_inference.shapes import PartitionError, TensorInfo, infer_once


def rewrite_for_device(graph: Graph, input_shapes: Mapping[str, Sequence[int]],
                       fetches: Sequence[str]) -> None:
    """Every rewrite of this module applied to `graph`, in place, in turn."""
    fold_constants(graph, fetches)
    unroll_loops(graph, input_shapes, fetches)
    complex_as_pairs(graph, input_shapes, fetches)
    folded_layer_norms_as_moments(graph, input_shapes, fetches)
    sorted_segments_as_unsorted(graph, input_shapes)


_FUSED_BN = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")


def folded_layer_norms_as_moments(graph: Graph, input_shapes: Mapping[str, Sequence[int]],
                                  fetches: Sequence[str]) -> bool:
    """Rewrite each Reshape(FusedBatchNorm(Reshape(x, [1, rows, width, 1]), ones, zeros,
    is_training, NCHW), Shape(x)) whose width is the size of x's trailing axes as the
    normalization of x over those axes; whether there was one."""
    by_name = graph.nodes
    found = []
    for bn in graph.graph_def.node:
        if bn.op not in _FUSED_BN or not bn.attr["is_training"].b or \
                bn.attr["data_format"].s != b"NCHW" or len(bn.input) < 3:
            continue
        fold = by_name.get(producer(bn.input[0]))
        back = graph.readers(f"{bn.name}:0")
        used = [t for t in _outputs_read(graph, bn.name) if t != f"{bn.name}:0"]
        if fold is None or fold.op != "Reshape" or used or len(back) != 1 or \
                by_name[back[0]].op != "Reshape" or not _filled(by_name, bn.input[1], 1.0) or \
                not _filled(by_name, bn.input[2], 0.0):
            continue
        x = canonical(fold.input[0])
        shape_of = by_name.get(producer(by_name[back[0]].input[1]))
        if shape_of is None or shape_of.op != "Shape" or canonical(shape_of.input[0]) != x:
            continue
        found.append((bn.name, back[0], x))
    infos = _shapes(graph, input_shapes) if found else None
    if infos is None:
        return False
    changed = False
    for bn_name, back_name, x in found:
        bn = by_name[bn_name]
        x_info, folded = infos.get(x), infos.get(canonical(bn.input[0]))
        if x_info is None or folded is None or not x_info.fully_known or \
                not folded.fully_known or len(folded.shape) != 4:
            continue
        width = folded.shape[2] * folded.shape[3]
        sizes = list(x_info.shape)
        axes = next((list(range(k, len(sizes))) for k in range(len(sizes) - 1, 0, -1)
                     if int(np.prod(sizes[k:])) == width), None)
        if axes is None or folded.shape[0] != 1:
            continue
        normed = _layer_norm(graph, bn_name, x, axes, bn.attr["epsilon"].f, bn.attr["T"].type)
        back = by_name[back_name]  # its readers now read the normalization itself
        back.op = "Identity"
        for key in list(back.attr):
            del back.attr[key]
        back.attr["T"].type = bn.attr["T"].type
        graph.set_inputs(back_name, [normed])
        changed = True
    if changed:
        graph.drop_dead(fetches)
    return changed


def _outputs_read(graph: Graph, name: str) -> list[str]:
    """The outputs of node `name` some node reads."""
    return sorted({t for reader in graph.data_consumers(name)
                   for t in graph.data_inputs[reader] if producer(t) == name})


def _filled(by_name: Mapping[str, node_def_pb2.NodeDef], ref: str, value: float) -> bool:
    """Whether `ref` is `value` everywhere: a Const, or a Fill of a Const scalar."""
    node = by_name.get(producer(ref))
    if node is not None and node.op == "Fill":
        node = by_name.get(producer(node.input[1]))
    if node is None or node.op != "Const":
        return False
    return bool(np.all(tf.make_ndarray(node.attr["value"].tensor) == value))


def _layer_norm(graph: Graph, name: str, x: str, axes: list[int],
                epsilon: float, dtype: int) -> str:
    """(x - mean) * rsqrt(variance + epsilon) over `axes`, as nodes `name/...`."""
    np_dtype = tf.as_dtype(dtype).as_numpy_dtype
    axes_ref = _const(graph, f"{name}/moments/axes", np.asarray(axes, np.int32))
    eps_ref = _const(graph, f"{name}/moments/epsilon", np.asarray(epsilon, np_dtype))

    def add(op: str, suffix: str, inputs: list[str], **attrs: object) -> str:
        node = graph.add_node(f"{name}/{suffix}", op, inputs)
        node.attr["T"].type = dtype
        for key, value in attrs.items():
            if isinstance(value, bool):
                node.attr[key].b = value
            else:
                node.attr[key].type = value
        return f"{node.name}:0"

    int32 = tf.int32.as_datatype_enum
    mean = add("Mean", "moments/mean", [x, axes_ref], keep_dims=True, Tidx=int32)
    squares = add("SquaredDifference", "moments/squares", [x, mean])
    variance = add("Mean", "moments/variance", [squares, axes_ref], keep_dims=True, Tidx=int32)
    scale = add("Rsqrt", "rsqrt", [add("AddV2", "add_epsilon", [variance, eps_ref])])
    return add("Mul", "normalized", [add("Sub", "centered", [x, mean]), scale])


def _shapes(graph: Graph, input_shapes: Mapping[str, Sequence[int]]
            ) -> dict[str, TensorInfo] | None:
    """The static shapes of `graph`'s tensors; None when shape inference fails (then
    nothing is rewritten)."""
    try:
        return infer_once(graph, input_shapes)
    except PartitionError:
        return None


def _const(graph: Graph, name: str, value: np.ndarray) -> str:
    node = graph.add_node(name, "Const")
    node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    return f"{name}:0"


def sorted_segments_as_unsorted(graph: Graph,
                                input_shapes: Mapping[str, Sequence[int]]) -> bool:
    """Rewrite each SegmentSum / SegmentMean whose segment ids are a sorted, non-negative
    1-D Const as UnsortedSegmentSum (and a division by the constant counts); whether
    there was one."""
    nodes = graph.nodes
    found = []
    for node in graph.graph_def.node:
        if node.op not in ("SegmentSum", "SegmentMean") or len(node.input) < 2:
            continue
        ids_node = nodes.get(producer(node.input[1]))
        if ids_node is None or ids_node.op != "Const":
            continue
        ids = tf.make_ndarray(ids_node.attr["value"].tensor)
        if ids.ndim == 1 and ids.size and (ids >= 0).all() and (np.diff(ids) >= 0).all():
            found.append((node.name, ids))
    infos = _shapes(graph, input_shapes) if found else None
    if infos is None:
        return False
    changed = False
    for name, ids in found:
        data_info = infos.get(canonical(nodes[name].input[0]))
        if data_info is None or data_info.shape is None or not data_info.shape:
            continue
        node = nodes[name]
        segments = int(ids[-1]) + 1
        dtype = node.attr["T"].type
        count = _const(graph, f"{name}/num_segments", np.int64(segments))
        data, ids_ref = node.input[0], node.input[1]
        controls = control_refs(node)
        mean = node.op == "SegmentMean"
        summed = node if not mean else graph.add_node(f"{name}/sum", "UnsortedSegmentSum")
        summed.op = "UnsortedSegmentSum"
        for key in list(summed.attr):
            del summed.attr[key]
        summed.attr["T"].type = dtype
        summed.attr["Tindices"].type = nodes[producer(ids_ref)].attr["dtype"].type
        summed.attr["Tnumsegments"].type = tf.int64.as_datatype_enum
        graph.set_inputs(summed.name, [data, ids_ref, count, *controls])
        if mean:  # empty segments: 0 / 1 = 0, as TensorFlow's SegmentMean gives
            sizes = np.maximum(np.bincount(ids, minlength=segments), 1)
            shape = [segments] + [1] * (len(data_info.shape) - 1)
            divisor = _const(graph, f"{name}/sizes", sizes.reshape(shape).astype(
                tf.as_dtype(dtype).as_numpy_dtype))
            node.op = "RealDiv" if tf.as_dtype(dtype).is_floating else "Div"
            for key in list(node.attr):
                del node.attr[key]
            node.attr["T"].type = dtype
            graph.set_inputs(name, [f"{name}/sum:0", divisor])
        changed = True
    return changed
