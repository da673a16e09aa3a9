"""Static shapes and dtypes of every tensor, and which axis of each is the batch.

`infer` imports the graph into a `tf.Graph` with the input Placeholders'
shapes set, so TensorFlow's own shape functions (including their partial
constant evaluation of Shape -> StridedSlice -> Pack chains) give each
output's static shape; `loops.refine` carries shapes through functional
loops, `lists.pin` to the lists stacked after them (`tf.map_fn`), and
`tables.stand_in` to the results of table lookups.
`batch_axes` infers twice, at the batch size and at the batch size + 1, and
reads the batch axis off the difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, tensor_pb2

from neuronish.contracts import INPUT_OPS
from neuronish.graph import Graph, PartitionError, canonical
from neuronish.shape_inference import lists, loops, strings, tables


@dataclass(frozen=True)
class TensorInfo:
    """Static shape and dtype of one tensor: the TensorFlow side's one record of them.

    `shape` is None when even the rank is unknown; a None dimension is
    unknown.  `dtype` is TensorFlow's name ("float32", "int64", "string",
    "resource", "variant", "complex64", ...), which for numeric types is
    also numpy's. Shape inference gives one per tensor, keyed by tensor name; a
    signature's input (`freeze.SignatureInput`) is one with its key and placeholder.

    A tensor's *signature* (what a caller feeds or gets back: the io-config, the
    executable's inputs and outputs, the NeuronOp's attributes, the server's
    SignatureDefs) is one other record, `runtime/signature.TensorSignature`, shared by
    every part. This one stays apart because it says something else: what shape
    inference knows of any tensor mid-graph, where a dimension or the rank may be
    unknown (None) and the dtype may be one no signature can carry ("resource",
    "variant"); it has no batch axis (`batch_axes` finds those) and no bounds. The
    partitioner turns a cluster's boundary `TensorInfo`s into an io-config, and so
    into signatures, once they are fully known. `cc/ir.TensorType` and
    `runtime/isa.Type` are the compiler's and the device's value types.
    """

    shape: tuple[int | None, ...] | None
    dtype: str

    @property
    def fully_known(self) -> bool:
        return self.shape is not None and all(d is not None for d in self.shape)


def _input_names(graph_def: graph_pb2.GraphDef) -> set[str]:
    return {n.name for n in graph_def.node if n.op in INPUT_OPS}


# Float Consts with more elements than this are weights: only their shape
# matters to shape inference (shape functions read the values of small
# integer tensors only), so `_light_copy` imports them as Placeholders, which
# saves TensorFlow copying every weight (1 s of 1.1 s for ResNet50).
_WEIGHT_ELEMENTS = 1024
_FLOAT_TYPES = frozenset(
    dt.as_datatype_enum for dt in (tf.float16, tf.bfloat16, tf.float32, tf.float64))


def _light_copy(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """A copy of `graph_def` for shape inference, with weights as Placeholders."""
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        copy = out.node.add()
        tensor = node.attr["value"].tensor if node.op == "Const" and "value" in node.attr \
            else None
        if tensor is not None and tensor.dtype in _FLOAT_TYPES and _elements(tensor) > \
                _WEIGHT_ELEMENTS:
            copy.name, copy.op = node.name, "Placeholder"
            copy.input.extend(node.input)  # control inputs only
            copy.attr["dtype"].type = tensor.dtype
            copy.attr["shape"].shape.CopyFrom(tensor.tensor_shape)
        else:
            copy.CopyFrom(node)
            # A cached shape from another batch size would contradict the new one; a
            # colocation with a node that inlining removed would fail the import.
            for attr in ("_output_shapes", "_class"):
                if attr in copy.attr:
                    del copy.attr[attr]
    return out


def _elements(tensor: tensor_pb2.TensorProto) -> int:
    count = 1
    for dim in tensor.tensor_shape.dim:
        count *= max(dim.size, 0)
    return count


def placeholder_name(key: str) -> str:
    """The Placeholder an `input_shapes` key names: by node ("x") or by its one tensor
    ("x:0"); any other spelling is kept, so that it names no Placeholder and is refused."""
    return key[:-2] if key.endswith(":0") else key


def infer(
    graph_def: graph_pb2.GraphDef, input_shapes: Mapping[str, Sequence[int | None]]
) -> dict[str, TensorInfo]:
    """Shape and dtype of every op output, keyed by tensor name ("node:0").

    `input_shapes` maps Placeholder names ("x" or "x:0") to shapes; -1 or
    None marks an unknown dimension.  Placeholders not named keep the shape
    the GraphDef gives them.  Raises PartitionError for a name that is not a
    Placeholder, or a graph TensorFlow cannot import.
    """
    inputs = _input_names(graph_def)  # not the weights _light_copy made Placeholders
    dims: dict[str, tf.TensorShape] = {}
    for key, shape in input_shapes.items():
        name = placeholder_name(key)
        if name not in inputs:
            raise PartitionError(
                f"input_shapes names {key!r}, but the graph has no Placeholder of that name; "
                f"its Placeholders are {sorted(inputs)}")
        dims[name] = tf.TensorShape([None if d is None or d < 0 else int(d) for d in shape])
    patched = _light_copy(graph_def)
    for node in patched.node:
        if node.name in dims:
            node.attr["shape"].shape.CopyFrom(dims[node.name].as_proto())
    # The stand-ins look nodes up and rewire readers in the copy, another graph than the
    # compile's (weights as Placeholders, stand-ins added): they edit it through a Graph
    # of it, built only when it has an op they stand in for. Most graphs have none, and
    # the index would cost a twelfth of the inference (NASNetMobile: 0.33 of 4.5 s).
    index = Graph(patched) if any(n.op in _STAND_IN_OPS for n in patched.node) else None
    if index is not None:
        tables.stand_in(index)
        strings.stand_in(index)
    infos = _import_shapes(patched, input_shapes)
    # Each round lets the shapes through one more loop of a chain of loops.
    for _ in range(_MAX_LOOP_ROUNDS):
        known = {k: v.shape for k, v in infos.items()}
        refined = loops.refine(patched, known)
        if not ((index is not None and lists.pin(index, known)) or refined):
            break
        infos = _import_shapes(patched, input_shapes)
    return infos


_STAND_IN_OPS = tables.STANDS_IN_FOR | strings.STANDS_IN_FOR | lists.STANDS_IN_FOR


_MAX_LOOP_ROUNDS = 4


def infer_once(graph: Graph, input_shapes: Mapping[str, Sequence[int | None]]
               ) -> dict[str, TensorInfo]:
    """`infer` of `graph` at `input_shapes`, kept in `graph.memo` until the graph is
    edited: each inference imports the whole graph into TensorFlow (ResNet50: a second
    or more), and the rewrites, the partitioner and its recovery rounds ask for the same
    shapes of the same graph. Read the result; do not change it."""
    key = ("infer", tuple(sorted((k, tuple(v)) for k, v in input_shapes.items())))
    if key not in graph.memo:
        graph.memo[key] = infer(graph.graph_def, input_shapes)
    return graph.memo[key]


def _import_shapes(patched: graph_pb2.GraphDef,
                   input_shapes: Mapping[str, Sequence[int | None]]) -> dict[str, TensorInfo]:
    graph = tf.Graph()
    with graph.as_default():
        try:
            tf.graph_util.import_graph_def(patched, name="")
        except (ValueError, tf.errors.OpError) as e:
            raise PartitionError(
                f"TensorFlow could not import the graph with input shapes "
                f"{dict(input_shapes)}: {e}. Check the shapes match the model's inputs") from None
    infos: dict[str, TensorInfo] = {}
    for op in graph.get_operations():
        for tensor in op.outputs:
            shape = tensor.shape
            dims = None if shape.rank is None else tuple(shape.as_list())
            infos[tensor.name] = TensorInfo(dims, tensor.dtype.name)
    return infos


def shapes_at_batch(
    graph_def: graph_pb2.GraphDef, input_shapes: Mapping[str, Sequence[int | None]], batch: int
) -> dict[str, list[int | None]]:
    """Every Placeholder's shape with dim 0 set to `batch` if it is batched (see
    `batched_inputs`).

    Placeholders missing from `input_shapes` take their GraphDef shape.
    """
    given = {placeholder_name(k): list(v) for k, v in input_shapes.items()}
    batched = batched_inputs(graph_def)
    shapes: dict[str, list[int | None]] = {}
    for node in graph_def.node:
        if node.op not in INPUT_OPS:
            continue
        if node.name in given:
            shape = given[node.name]
        else:
            proto = node.attr["shape"].shape
            if "shape" not in node.attr or proto.unknown_rank:
                continue  # rank unknown: nothing to set, its consumers stay unknown
            shape = [d.size for d in proto.dim]
        if shape and node.name in batched:
            shape[0] = batch
        shapes[node.name] = shape
    unknown = sorted(set(given) - {n.name for n in graph_def.node if n.op in INPUT_OPS})
    if unknown:
        raise PartitionError(f"input_shapes names {unknown}, but the graph has no Placeholder of "
                             f"that name")
    return shapes


def batched_inputs(graph_def: graph_pb2.GraphDef) -> set[str]:
    """Placeholders whose dim 0 is the batch: those the graph leaves unknown there (a
    signature's `None`), or whose rank is unknown. A dim 0 the model itself fixes (a
    `[2]` shape vector fed alongside the batch, say) is not a batch."""
    out = set()
    for node in graph_def.node:
        if node.op not in INPUT_OPS:
            continue
        proto = node.attr["shape"].shape if "shape" in node.attr else None
        if proto is None or proto.unknown_rank or (proto.dim and proto.dim[0].size < 0):
            out.add(node.name)
    return out


def _axis(
    at_b: tuple[int | None, ...] | None, at_b1: tuple[int | None, ...] | None, batch: int
) -> int | None:
    if at_b is None or at_b1 is None or len(at_b) != len(at_b1):
        return None
    if any(d is None for d in at_b + at_b1):
        return None
    changed = [i for i, (x, y) in enumerate(zip(at_b, at_b1)) if x != y]
    if not changed:
        return -1
    # Only an axis that *is* the batch can be split into chunks of the
    # compiled batch; a batch folded into another dimension ([b*seq, h]) or
    # spread over several axes cannot be split safely.
    if len(changed) == 1 and at_b[changed[0]] == batch and at_b1[changed[0]] == batch + 1:
        return changed[0]
    return None


class BatchAxes(dict):
    """tensor -> batch axis (see `batch_axes`), and `mixing`: node -> why that node moves
    data between samples although every shape follows the batch."""

    def __init__(self, axes: Mapping[str, int | None], mixing: Mapping[str, str]) -> None:
        super().__init__(axes)
        self.mixing = dict(mixing)


def _batch_stride(at_b: tuple[int | None, ...] | None, at_b1: tuple[int | None, ...] | None,
                  batch: int) -> int | None:
    """How many elements apart consecutive samples lie in the row-major layout: the
    product of the dims after the one axis that grows with the batch, times that axis'
    size per sample (a batch folded in, [b*seq, h], counts seq). None if unclear."""
    if at_b is None or at_b1 is None or len(at_b) != len(at_b1) or None in at_b + at_b1:
        return None
    changed = [i for i, (x, y) in enumerate(zip(at_b, at_b1)) if x != y]
    if len(changed) != 1:
        return None
    k = changed[0]
    per_sample, rest = divmod(at_b[k], batch)
    if rest or at_b1[k] != per_sample * (batch + 1):
        return None
    stride = per_sample
    for d in at_b[k + 1:]:
        stride *= d
    return stride


def _mixing_reshapes(graph_def: graph_pb2.GraphDef, at_b: Mapping[str, TensorInfo],
                     at_b1: Mapping[str, TensorInfo], batch: int) -> dict[str, str]:
    """Reshapes that move the batch to another place in the layout ([seq, b, d] ->
    [b, seq, d]): each output sample then holds pieces of several input samples, so the
    result at one batch size is not the results at smaller ones side by side."""
    mixing = {}
    for node in graph_def.node:
        if node.op != "Reshape" or not node.input:
            continue
        src, out = canonical(node.input[0]), f"{node.name}:0"
        if src not in at_b or out not in at_b or src not in at_b1 or out not in at_b1:
            continue
        before = _batch_stride(at_b[src].shape, at_b1[src].shape, batch)
        after = _batch_stride(at_b[out].shape, at_b1[out].shape, batch)
        if before is not None and after is not None and before != after:
            mixing[node.name] = (
                f"{node.name} (Reshape {list(at_b[src].shape)} -> {list(at_b[out].shape)}) "
                f"moves the batch within the layout, so its samples mix: TensorFlow's result at "
                f"one batch size is not its results at smaller ones side by side; compile at "
                f"the batch size you will run")
    return mixing


def batch_axes(
    graph_def: graph_pb2.GraphDef,
    input_shapes: Mapping[str, Sequence[int | None]],
    batch_size: int,
    infos: Mapping[str, TensorInfo] | None = None,
    graph: Graph | None = None,
) -> BatchAxes:
    """The batch axis of every tensor: an axis, -1 for none, None if it cannot be told.

    Placeholders in `batched_inputs` are batched on axis 0 (their dim 0 is
    replaced by the batch size); others are not.  A
    tensor's batch axis is the one axis whose size is `batch_size` in one
    inference and `batch_size + 1` in the other; -1 if no size changed;
    None if several changed, the changed one is not exactly the batch (a
    batch folded into another dimension), or a shape is unknown. The result's
    `mixing` names the Reshapes that mix samples (`_mixing_reshapes`).

    `infos`, if given, must be `infer` at `batch_size` (saves one inference). With
    `graph` (the Graph of `graph_def`), both inferences are `infer_once`'s.
    """
    if batch_size < 1:
        raise PartitionError(f"batch_size must be >= 1, got {batch_size}")
    def inferred(shapes: Mapping[str, Sequence[int | None]]) -> dict[str, TensorInfo]:
        return infer(graph_def, shapes) if graph is None else infer_once(graph, shapes)

    if infos is None:
        infos = inferred(shapes_at_batch(graph_def, input_shapes, batch_size))
    try:
        bigger = inferred(shapes_at_batch(graph_def, input_shapes, batch_size + 1))
    except PartitionError as e:
        raise PartitionError(
            f"the graph does not accept batch size {batch_size + 1}, so its batch size is baked "
            f"in and batch axes cannot be found; freeze it with a dynamic batch dimension, or "
            f"turn dynamic batch size off ({e})") from None
    axes = {
        name: _axis(info.shape, bigger[name].shape if name in bigger else None, batch_size)
        for name, info in infos.items()
    }
    return BatchAxes(axes, _mixing_reshapes(graph_def, infos, bigger, batch_size))
