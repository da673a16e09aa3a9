"""Build the `NeuronOp` NodeDef that replaces a compiled cluster.

    node = neuron_op_node_def("neuron_op_0", ["dense/input"], executable, subgraph_def)
    graph_def.node.append(node)        # its outputs are neuron_op_0:0, neuron_op_0:1, ...

The signature attributes (names, dtypes, shapes, batch axes) are written from
`TensorSignature` records (`neuronish/runtime/signature.py`, the one record of a
tensor's signature) and read back into them by `read_signature`. A caller may state
the signature it expects, which is then checked against the executable's, or leave
it out, and it is read from the executable; either way the node agrees with its
executable, which the kernel checks again when it loads. The attribute contract is
docs/contracts.md's `NeuronOp` table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, tensor_shape_pb2

from neuronish.runtime.executable import Executable, from_bytes
from neuronish.runtime.signature import TensorSignature, first_difference

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


def _checked(node: str, side: str, stated: Sequence[TensorSignature] | None,
             actual: list[TensorSignature]) -> list[TensorSignature]:
    """`actual` (the executable's), after checking `stated` says the same; a stated dtype
    may be anything `tf.as_dtype` takes (tf.float32, np.float32, "float32")."""
    if stated is None:
        return actual
    stated = [replace(s, dtype=tf.as_dtype(s.dtype).name,
                      shape=None if s.shape is None else tuple(int(d) for d in s.shape))
              for s in stated]
    found = first_difference(stated, actual)
    if found is None:
        return actual
    index, field = found
    hint = ("; pass the signature the subgraph was compiled with, or leave it out to take it "
            "from the executable")
    if index < 0:
        raise ValueError(f"NeuronOp '{node}': {len(stated)} {side}s stated "
                         f"{[s.name for s in stated]} for an executable with {len(actual)}: "
                         f"{[s.name for s in actual]}{hint}")
    raise ValueError(f"NeuronOp '{node}': {side} {index} is stated as "
                     f"{stated[index].describe()} but the executable's is "
                     f"{actual[index].describe()} (its {field} differs){hint}")


def neuron_op_node_def(
    name: str,
    inputs: Sequence[str],
    executable: bytes,
    graph_def: bytes | graph_pb2.GraphDef,
    *,
    input_signature: Sequence[TensorSignature] | None = None,
    output_signature: Sequence[TensorSignature] | None = None,
    model_config: Sequence[int] = UNBOUND_MODEL_CONFIG,
    device: str = "",
) -> node_def_pb2.NodeDef:
    """A `NeuronOp` NodeDef running `executable` on the tensors `inputs`.

    name: the node's name; its outputs are `name:0`, `name:1`, ... in the order of
        the executable's outputs.
    inputs: the outer graph's tensors feeding the op, in the order of the executable's
        inputs (e.g. `"dense/BiasAdd:0"`; written `"dense/BiasAdd"` as NodeDefs do).
    executable: the compiler's output for the subgraph.
    graph_def: the subgraph the executable was compiled from (kept for debugging
        and fallback), serialized or as a GraphDef.
    input_signature, output_signature: the compiled signature as the caller knows it
        (tensor names inside the subgraph, dtypes, static shapes, batch axes), checked
        against the executable's; left out, it is read from the executable.
    model_config: `[global_opt_num_cores, this_opt_num_cores, max_num_duplicates,
        timeout_s, core_group_index]`, -1 = unbound (see kernel_bridge.ModelConfig);
        shorter lists are padded with -1.
    device: the node's device string; empty lets TensorFlow place it (CPU).

    Raises ValueError when a stated signature disagrees with the executable, and
    neuronish.runtime.ExecutableError when the executable is corrupt.
    """
    node = neuron_op_shell(name, inputs, from_bytes(executable),
                           input_signature=input_signature, output_signature=output_signature,
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
    *,
    input_signature: Sequence[TensorSignature] | None = None,
    output_signature: Sequence[TensorSignature] | None = None,
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
    ins = _checked(name, "input", input_signature, exe.inputs)
    outs = _checked(name, "output", output_signature, exe.outputs)

    def types(sigs: list[TensorSignature]) -> attr_value_pb2.AttrValue:
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            type=[tf.as_dtype(s.dtype).as_datatype_enum for s in sigs]))

    def names(sigs: list[TensorSignature]) -> attr_value_pb2.AttrValue:
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            s=[s.name.encode() for s in sigs]))

    def ints(items: Sequence[int]) -> attr_value_pb2.AttrValue:
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            i=[int(i) for i in items]))

    def shapes(sigs: list[TensorSignature]) -> attr_value_pb2.AttrValue:
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            shape=[_shape_proto(s.shape) for s in sigs]))

    node = node_def_pb2.NodeDef(name=name, op="NeuronOp", device=device,
                                input=[_tensor_ref(t) for t in inputs])
    attr = node.attr
    # (in the order these were always written, so a NodeDef's bytes do not change)
    attr["Tin"].CopyFrom(types(ins))
    attr["input_names"].CopyFrom(names(ins))
    attr["input_shapes"].CopyFrom(shapes(ins))
    attr["input_batch_axis"].CopyFrom(ints([s.batch_axis for s in ins]))
    attr["output_names"].CopyFrom(names(outs))
    attr["output_dtypes"].CopyFrom(types(outs))
    attr["output_shapes"].CopyFrom(shapes(outs))
    attr["output_batch_axis"].CopyFrom(ints([s.batch_axis for s in outs]))
    attr["model_config"].CopyFrom(ints([*model_config, *[-1] * (5 - len(model_config))]))
    return node


def read_signature(node: node_def_pb2.NodeDef
                   ) -> tuple[list[TensorSignature], list[TensorSignature]]:
    """A `NeuronOp` node's inputs and outputs as its attributes state them: -1 at a free
    dimension, whose bounds come from the `dynamic_shapes` attribute."""
    from neuronish.shape_specialize import DynamicSpec

    attr = node.attr

    def side(prefix: str, dtypes: list[int]) -> list[TensorSignature]:
        return [TensorSignature(n.decode(), tf.as_dtype(d).name,
                                tuple(dim.size for dim in shape.dim), axis)
                for n, d, shape, axis in zip(attr[f"{prefix}_names"].list.s, dtypes,
                                             attr[f"{prefix}_shapes"].list.shape,
                                             attr[f"{prefix}_batch_axis"].list.i, strict=True)]

    ins = side("input", list(attr["Tin"].list.type))
    outs = side("output", list(attr["output_dtypes"].list.type))
    text = attr["dynamic_shapes"].s.decode() if "dynamic_shapes" in attr else ""
    if text:
        spec = DynamicSpec.parse(text, node.name, len(ins))
        ins = [replace(s, bounds=tuple(free[a][:2] if a in free else None
                                       for a in range(len(s.shape))))
               if free else s for s, free in zip(ins, spec.bounds)]
    return ins, outs
