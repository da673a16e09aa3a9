"""Build the `NeuronOp` NodeDef that replaces a compiled cluster.

    node = neuron_op_node_def("neuron_op_0", ["dense/input"], executable, subgraph_def)
    graph_def.node.append(node)        # its outputs are neuron_op_0:0, neuron_op_0:1, ...

Every signature attribute (names, dtypes, shapes, batch axes) may be given, and
is then checked against the executable, or left out, and is then read from it;
either way the node agrees with its executable, which the kernel checks again
when it loads. The attribute contract is docs/contracts.md's `NeuronOp` table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, tensor_shape_pb2

from neuronish.runtime.executable import Executable, TensorSig, from_bytes

DTypeLike = tf.dtypes.DType | str | type
"""Anything `tf.as_dtype` takes: tf.float32, "float32", np.float32."""

UNBOUND_MODEL_CONFIG = (-1, -1, -1, -1, -1)
"""`[global_opt_num_cores, this_opt_num_cores, max_num_duplicates, timeout_s,
core_group_index]`, every entry unbound: the kernel loads up to
`kernel_bridge.DEFAULT_MAX_DUPLICATES` copies, as many as fit."""


def _tensor_ref(name: str) -> str:
    """NodeDef inputs name output 0 as `node`, others as `node:k`."""
    node, sep, index = name.rpartition(":")
    return node if sep and index == "0" else name


def _shape_proto(shape: Sequence[int]) -> tensor_shape_pb2.TensorShapeProto:
    return tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=int(d)) for d in shape])


def _resolve(node: str, what: str, given: Sequence | None, sigs: list[TensorSig],
             field: str, normalize: Callable[[Any], Any]) -> list:
    """`given` if it matches the executable's signature, the signature's values if None."""
    want = [getattr(s, field) for s in sigs]
    if given is None:
        return want
    got = [normalize(v) for v in given]
    if [normalize(w) for w in want] != got:
        raise ValueError(f"NeuronOp '{node}': {what} {got} do not match the executable's "
                         f"{[normalize(w) for w in want]}; pass the values the subgraph was "
                         "compiled with, or leave the argument out to take them from it")
    return want


def neuron_op_node_def(
    name: str,
    inputs: Sequence[str],
    executable: bytes,
    graph_def: bytes | graph_pb2.GraphDef,
    *,
    input_names: Sequence[str] | None = None,
    input_dtypes: Sequence[DTypeLike] | None = None,
    input_shapes: Sequence[Sequence[int]] | None = None,
    input_batch_axis: Sequence[int] | None = None,
    output_names: Sequence[str] | None = None,
    output_dtypes: Sequence[DTypeLike] | None = None,
    output_shapes: Sequence[Sequence[int]] | None = None,
    output_batch_axis: Sequence[int] | None = None,
    model_config: Sequence[int] = UNBOUND_MODEL_CONFIG,
    device: str = "",
) -> node_def_pb2.NodeDef:
    """A `NeuronOp` NodeDef running `executable` on the tensors `inputs`.

    name: the node's name; its outputs are `name:0`, `name:1`, ... in the order of
        `output_names` (the executable's output order).
    inputs: the outer graph's tensors feeding the op, in the order of `input_names`
        (e.g. `"dense/BiasAdd:0"`; written `"dense/BiasAdd"` as NodeDefs do).
    executable: the compiler's output for the subgraph.
    graph_def: the subgraph the executable was compiled from (kept for debugging
        and fallback), serialized or as a GraphDef.
    input_names ... output_batch_axis: the compiled signature (tensor names inside
        the subgraph, dtypes, static shapes, batch axes with -1 for none). Each one
        left as None is read from the executable; each one given must match it.
    model_config: `[global_opt_num_cores, this_opt_num_cores, max_num_duplicates,
        timeout_s, core_group_index]`, -1 = unbound (see kernel_bridge.ModelConfig);
        shorter lists are padded with -1.
    device: the node's device string; empty lets TensorFlow place it (CPU).

    Raises ValueError when a given argument disagrees with the executable, and
    neuronish.runtime.ExecutableError when the executable is corrupt.
    """
    node = neuron_op_shell(
        name, inputs, from_bytes(executable), input_names=input_names,
        input_dtypes=input_dtypes, input_shapes=input_shapes, input_batch_axis=input_batch_axis,
        output_names=output_names, output_dtypes=output_dtypes, output_shapes=output_shapes,
        output_batch_axis=output_batch_axis, model_config=model_config, device=device)
    if isinstance(graph_def, graph_pb2.GraphDef):
        graph_def = graph_def.SerializeToString()
    node.attr["graph_def"].s = bytes(graph_def)
    node.attr["executable"].s = bytes(executable)
    return node


def neuron_op_shell(
    name: str,
    inputs: Sequence[str],
    exe: Executable,
    *,
    input_names: Sequence[str] | None = None,
    input_dtypes: Sequence[DTypeLike] | None = None,
    input_shapes: Sequence[Sequence[int]] | None = None,
    input_batch_axis: Sequence[int] | None = None,
    output_names: Sequence[str] | None = None,
    output_dtypes: Sequence[DTypeLike] | None = None,
    output_shapes: Sequence[Sequence[int]] | None = None,
    output_batch_axis: Sequence[int] | None = None,
    model_config: Sequence[int] = UNBOUND_MODEL_CONFIG,
    device: str = "",
) -> node_def_pb2.NodeDef:
    """`neuron_op_node_def` for the parsed executable `exe`, without the two large
    attributes (`executable`, `graph_def`): for a caller that stores them itself, as
    `saved_model.compile` does through `export.write_saved_model(blobs=...)`. Every
    copy of them costs (VGG16's are 553 MB each), and so does parsing the executable
    twice."""
    if len(inputs) != len(exe.inputs):
        raise ValueError(f"NeuronOp '{name}': {len(inputs)} input tensor(s) {list(inputs)} for "
                         f"an executable with {len(exe.inputs)} input(s) "
                         f"{[s.name for s in exe.inputs]}")
    if len(model_config) > 5:
        raise ValueError(f"NeuronOp '{name}': model_config has {len(model_config)} entries; "
                         "expected at most 5")

    def dtype(d: DTypeLike) -> str:
        return tf.as_dtype(d).name

    def shape(s: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(d) for d in s)

    in_names = _resolve(name, "input_names", input_names, exe.inputs, "name", str)
    in_dtypes = _resolve(name, "input_dtypes", input_dtypes, exe.inputs, "dtype", dtype)
    in_shapes = _resolve(name, "input_shapes", input_shapes, exe.inputs, "shape", shape)
    in_axes = _resolve(name, "input_batch_axis", input_batch_axis, exe.inputs, "batch_axis", int)
    out_names = _resolve(name, "output_names", output_names, exe.outputs, "name", str)
    out_dtypes = _resolve(name, "output_dtypes", output_dtypes, exe.outputs, "dtype", dtype)
    out_shapes = _resolve(name, "output_shapes", output_shapes, exe.outputs, "shape", shape)
    out_axes = _resolve(name, "output_batch_axis", output_batch_axis, exe.outputs, "batch_axis",
                        int)

    def types(dtypes: list[str]) -> attr_value_pb2.AttrValue:
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            type=[tf.as_dtype(d).as_datatype_enum for d in dtypes]))

    def strings(items: list[str]) -> attr_value_pb2.AttrValue:
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            s=[s.encode() for s in items]))

    def ints(items: Sequence[int]) -> attr_value_pb2.AttrValue:
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            i=[int(i) for i in items]))

    def shapes(items: list[tuple[int, ...]]) -> attr_value_pb2.AttrValue:
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            shape=[_shape_proto(s) for s in items]))

    node = node_def_pb2.NodeDef(name=name, op="NeuronOp", device=device,
                                input=[_tensor_ref(t) for t in inputs])
    attr = node.attr
    attr["Tin"].CopyFrom(types(in_dtypes))
    attr["input_names"].CopyFrom(strings(in_names))
    attr["input_shapes"].CopyFrom(shapes(in_shapes))
    attr["input_batch_axis"].CopyFrom(ints(in_axes))
    attr["output_names"].CopyFrom(strings(out_names))
    attr["output_dtypes"].CopyFrom(types(out_dtypes))
    attr["output_shapes"].CopyFrom(shapes(out_shapes))
    attr["output_batch_axis"].CopyFrom(ints(out_axes))
    attr["model_config"].CopyFrom(ints([*model_config, *[-1] * (5 - len(model_config))]))
    return node
