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
from dataclasses import dataclass, fields
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


@dataclass(frozen=True, kw_only=True)
class StatedSignature:
    """The compiled signature a caller states for a `NeuronOp` (tensor names inside the
    subgraph, dtypes, static shapes, batch axes with -1 for none). Each field left None
    is read from the executable; each one given must match it."""

    input_names: Sequence[str] | None = None
    input_dtypes: Sequence[DTypeLike] | None = None
    input_shapes: Sequence[Sequence[int]] | None = None
    input_batch_axis: Sequence[int] | None = None
    output_names: Sequence[str] | None = None
    output_dtypes: Sequence[DTypeLike] | None = None
    output_shapes: Sequence[Sequence[int]] | None = None
    output_batch_axis: Sequence[int] | None = None

    def resolve(self, node: str, exe: Executable) -> dict[str, list]:
        """Each field's values, checked against `exe` (ValueError naming the field)."""
        def dtype(d: DTypeLike) -> str:
            return tf.as_dtype(d).name

        def shape(s: Sequence[int]) -> tuple[int, ...]:
            return tuple(int(d) for d in s)

        # field suffix -> (the TensorSig attribute it states, how values compare)
        how: dict[str, tuple[str, Callable[[Any], Any]]] = {
            "names": ("name", str), "dtypes": ("dtype", dtype), "shapes": ("shape", shape),
            "batch_axis": ("batch_axis", int)}
        resolved = {}
        for f in fields(self):
            side, _, what = f.name.partition("_")
            attribute, normalize = how[what]
            sigs = exe.inputs if side == "input" else exe.outputs
            resolved[f.name] = _resolve(node, f.name, getattr(self, f.name), sigs, attribute,
                                        normalize)
        return resolved


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
    model_config: Sequence[int] = UNBOUND_MODEL_CONFIG,
    device: str = "",
    **stated: Sequence | None,
) -> node_def_pb2.NodeDef:
    """A `NeuronOp` NodeDef running `executable` on the tensors `inputs`.

    name: the node's name; its outputs are `name:0`, `name:1`, ... in the order of
        `output_names` (the executable's output order).
    inputs: the outer graph's tensors feeding the op, in the order of `input_names`
        (e.g. `"dense/BiasAdd:0"`; written `"dense/BiasAdd"` as NodeDefs do).
    executable: the compiler's output for the subgraph.
    graph_def: the subgraph the executable was compiled from (kept for debugging
        and fallback), serialized or as a GraphDef.
    model_config: `[global_opt_num_cores, this_opt_num_cores, max_num_duplicates,
        timeout_s, core_group_index]`, -1 = unbound (see kernel_bridge.ModelConfig);
        shorter lists are padded with -1.
    device: the node's device string; empty lets TensorFlow place it (CPU).
    stated: `input_names` ... `output_batch_axis`, the fields of `StatedSignature`:
        the compiled signature, each one left out read from the executable.

    Raises ValueError when a given argument disagrees with the executable, and
    neuronish.runtime.ExecutableError when the executable is corrupt.
    """
    unknown = sorted(set(stated) - {f.name for f in fields(StatedSignature)})
    if unknown:
        raise TypeError(f"neuron_op_node_def: unknown argument(s) {unknown}; the signature's "
                        f"are {[f.name for f in fields(StatedSignature)]}")
    node = neuron_op_shell(name, inputs, from_bytes(executable), StatedSignature(**stated),
                           model_config=model_config, device=device)
    if isinstance(graph_def, graph_pb2.GraphDef):
        graph_def = graph_def.SerializeToString()
    node.attr["graph_def"].s = bytes(graph_def)
    node.attr["executable"].s = bytes(executable)
    return node


def neuron_op_shell(
    name: str,
    inputs: Sequence[str],
    exe: Executable,
    stated: StatedSignature = StatedSignature(),
    *,
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
    sig = stated.resolve(name, exe)

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
    attr["Tin"].CopyFrom(types(sig["input_dtypes"]))
    attr["input_names"].CopyFrom(strings(sig["input_names"]))
    attr["input_shapes"].CopyFrom(shapes(sig["input_shapes"]))
    attr["input_batch_axis"].CopyFrom(ints(sig["input_batch_axis"]))
    attr["output_names"].CopyFrom(strings(sig["output_names"]))
    attr["output_dtypes"].CopyFrom(types(sig["output_dtypes"]))
    attr["output_shapes"].CopyFrom(shapes(sig["output_shapes"]))
    attr["output_batch_axis"].CopyFrom(ints(sig["output_batch_axis"]))
    attr["model_config"].CopyFrom(ints([*model_config, *[-1] * (5 - len(model_config))]))
    return node
