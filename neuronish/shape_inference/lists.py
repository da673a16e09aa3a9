"""Static shapes of lists stacked after a loop (`tf.map_fn`, a TensorArray in a loop).

`tf.map_fn(fn, x)` reserves a list of `len(x)` items, sets item i to fn's result for
row i inside a functional loop, and stacks the list afterwards. TensorFlow types the
stacked tensor `[None, ...]` at best (a list's length and item shape do not cross a
loop's boundary), so everything after it — in the usual serving signature, the whole
network behind a `map_fn` that decodes images — looks unknown and stays on TensorFlow.

The shape is known all the same: a list the loop body only sets items of keeps the
length it was reserved with, and every item has the shape the body gives it. `pin`
writes that in, in the copy of the graph used for shape inference only: the stack
becomes `Fill(Pack(num_elements, *item_shape), 0)`, so TensorFlow's own constant
evaluation turns the reserved length (`StridedSlice(Shape(x))`, the batch) into a
dimension that follows the batch. Anything this cannot prove is left as it was.
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf
from tensorflow.core.framework import function_pb2, node_def_pb2
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

from neuronish.graph import (
    Graph,
    PartitionError,
    canonical,
    data_refs,
    function_body,
    parse_input,
    producer,
)
from neuronish.shape_inference.loops import LOOP_OPS
from neuronish.shape_inference.stand_ins import const, replace_with_fill

Shape = tuple[int | None, ...] | None

# Ops a list may pass through in the body between the loop's argument and its result.
_PASS = frozenset({"Identity", "IdentityN"})


def pin(graph: Graph, shapes: Mapping[str, Shape]) -> bool:
    """Rewrite (in place) every `TensorListStack` of a loop's list whose shape can be
    proved and is not already known (`shapes`: tensor name -> static shape). True if
    any changed."""
    functions = {f.signature.name: f for f in graph.graph_def.library.function}
    changed = False
    for node in list(graph.graph_def.node):
        if node.op != "TensorListStack" or _known(shapes.get(f"{node.name}:0")):
            continue
        found = _reserved_list(node, graph.nodes, functions, shapes)
        if found is None:
            continue
        num_elements, item_shape = found
        _stack_stand_in(graph, node, num_elements, item_shape)
        changed = True
    return changed


def _known(shape: Shape) -> bool:
    return shape is not None and None not in shape


def _reserved_list(stack: node_def_pb2.NodeDef, nodes: Mapping[str, node_def_pb2.NodeDef],
                   functions: Mapping[str, function_pb2.FunctionDef],
                   shapes: Mapping[str, Shape]) -> tuple[str, tuple[int, ...]] | None:
    """(the reserved length's tensor, the item shape) of the list `stack` stacks, when it
    is loop output k of a loop whose input k is a TensorListReserve and whose body only
    sets items of it; else None."""
    loop_name, k = parse_input(stack.input[0])
    loop = nodes.get(loop_name)
    if loop is None or loop.op not in LOOP_OPS:
        return None
    loop_inputs = data_refs(loop)
    if k >= len(loop_inputs):
        return None
    reserve_name = producer(loop_inputs[k])
    reserve = nodes.get(reserve_name)
    body = functions.get(loop.attr["body"].func.name)
    if reserve is None or reserve.op != "TensorListReserve" or body is None:
        return None
    item = _item_shape(body, k, [shapes.get(canonical(ref)) for ref in loop_inputs])
    if item is None or _item_dtype(stack) != reserve.attr["element_dtype"].type:
        return None
    return reserve.input[1], item


def _item_dtype(stack: node_def_pb2.NodeDef) -> int:
    return stack.attr["element_dtype"].type


def _item_shape(body: function_pb2.FunctionDef, k: int,
                in_shapes: list[Shape]) -> tuple[int, ...] | None:
    """The static shape of the items the body sets in its list argument k, if the body
    does nothing else with it (reads of other lists are fine) and the shape is known."""
    args = [a.name for a in body.signature.input_arg]
    if k >= len(args) or k >= len(body.signature.output_arg):
        return None
    try:
        body_graph, results = function_body(body)
    except (ValueError, TypeError, KeyError, tf.errors.OpError, PartitionError):
        return None  # (then function_def_to_graph below could not read it either)
    nodes = body_graph.nodes

    def through(ref: str) -> node_def_pb2.NodeDef | str | None:
        """The node (or argument name) `ref` comes from, past pass-through ops."""
        name = producer(ref)
        while name in nodes and nodes[name].op in _PASS:
            name = producer(nodes[name].input[0])
        return name if name in args else nodes.get(name)

    setter = through(results[k])
    if not isinstance(setter, node_def_pb2.NodeDef) or setter.op != "TensorListSetItem":
        return None
    if setter.attr["resize_if_index_out_of_bounds"].b:  # (a dynamic_size TensorArray)
        return None
    if through(setter.input[0]) != args[k]:
        return None
    fdef = function_pb2.FunctionDef()
    fdef.CopyFrom(body)
    for attrs in fdef.arg_attr.values():
        attrs.attr.pop("_output_shapes", None)
    shapes = [None if s is None else tf.TensorShape(s) for s in in_shapes]
    try:
        graph = function_def_to_graph(fdef, input_shapes=shapes if len(shapes) == len(args)
                                      else None)
        item = graph.get_operation_by_name(setter.name).inputs[2].shape
    except (ValueError, TypeError, KeyError, tf.errors.OpError):
        return None  # e.g. a call to a function of the library: not provable here
    if not item.is_fully_defined():
        return None
    return tuple(item.as_list())


def _stack_stand_in(graph: Graph, stack: node_def_pb2.NodeDef, num_elements: str,
                    item_shape: tuple[int, ...]) -> None:
    dims = graph.add_node(f"{stack.name}/neuronish_dims", "Pack")
    graph.set_inputs(dims.name, [num_elements, *(
        const(graph, f"{stack.name}/neuronish_dim_{i}", d, tf.int32)
        for i, d in enumerate(item_shape))])
    dims.attr["N"].i = 1 + len(item_shape)
    dims.attr["T"].type = tf.int32.as_datatype_enum
    dims.attr["axis"].i = 0
    replace_with_fill(graph, stack, dims.name, tf.as_dtype(_item_dtype(stack)))
