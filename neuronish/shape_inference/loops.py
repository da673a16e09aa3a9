"""Static shapes through functional loops (`While`, `StatelessWhile`).

TensorFlow gives a loop's outputs the shapes in its `output_shapes` attribute,
the shape invariants fixed when the loop was traced: with a dynamic batch that
is `[None, ...]`, even once the inputs are static. Everything after the loop
then looks unknown and stays on TensorFlow. A loop whose body maps the input
shapes onto themselves (a fixed point) keeps those shapes on every iteration,
so its outputs have its inputs' shapes; `refine` writes that into the loop's
`output_shapes`, in the copy of the graph used for shape inference only.
Anything this cannot prove (a body that changes a shape, calls a function this
cannot build, fails to import) leaves the loop as TensorFlow types it. A conditional
(`If`) whose two branches return the same static shapes is given those likewise.
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2, node_def_pb2
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

from neuronish.graph import canonical, data_refs, is_control

LOOP_OPS = frozenset({"While", "StatelessWhile"})
COND_OPS = frozenset({"If", "StatelessIf"})

Shape = tuple[int | None, ...] | None


def refine(graph_def: graph_pb2.GraphDef, shapes: Mapping[str, Shape]) -> bool:
    """Set `output_shapes` of every loop in `graph_def` (in place) that is a shape fixed
    point at its inputs' `shapes` (keyed by tensor name) and whose outputs are known
    less well than its inputs. True if any loop changed."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    changed = False
    for node in graph_def.node:
        if node.op in COND_OPS:
            changed = _refine_cond(node, functions, shapes) or changed
            continue
        if node.op not in LOOP_OPS or node.attr["body"].func.name not in functions:
            continue
        inputs = [canonical(ref) for ref in data_refs(node)]
        in_shapes = [shapes.get(t) for t in inputs]
        out_shapes = [shapes.get(f"{node.name}:{i}") for i in range(len(inputs))]
        if any(s is None or None in s for s in in_shapes) or in_shapes == out_shapes:
            continue  # nothing known to propagate, or nothing to gain
        body = functions[node.attr["body"].func.name]
        if _body_shapes(body, in_shapes) != in_shapes:  # (also when it returns fewer)
            continue
        del node.attr["output_shapes"].list.shape[:]
        for shape in in_shapes:
            node.attr["output_shapes"].list.shape.add().CopyFrom(
                tf.TensorShape(shape).as_proto())
        changed = True
    return changed


def _refine_cond(node: node_def_pb2.NodeDef, functions: Mapping[str, function_pb2.FunctionDef],
                 shapes: Mapping[str, Shape]) -> bool:
    """Set the `output_shapes` of an `If` whose two branches return the same static
    shapes at its inputs' `shapes` (TensorFlow leaves them unknown when the branches were
    traced with a dynamic batch). True if it changed."""
    branches = [functions.get(node.attr[b].func.name) for b in ("then_branch", "else_branch")]
    inputs = [canonical(ref) for ref in node.input[1:] if not is_control(ref)]
    in_shapes = [shapes.get(t) for t in inputs]
    if None in branches or any(s is None or None in s for s in in_shapes):
        return False
    outs = [_body_shapes(b, in_shapes) for b in branches]  # type: ignore[arg-type]
    if outs[0] is None or outs[0] != outs[1] or any(s is None or None in s for s in outs[0]):
        return False
    if [shapes.get(f"{node.name}:{i}") for i in range(len(outs[0]))] == outs[0]:
        return False
    del node.attr["output_shapes"].list.shape[:]
    for shape in outs[0]:
        node.attr["output_shapes"].list.shape.add().CopyFrom(tf.TensorShape(shape).as_proto())
    return True


def _body_shapes(body: function_pb2.FunctionDef,
                 in_shapes: list[tuple[int, ...]]) -> list[Shape] | None:
    """The shapes a function (a loop body, a branch) returns for inputs of `in_shapes`;
    None if it cannot be told."""
    fdef = function_pb2.FunctionDef()
    fdef.CopyFrom(body)
    # Recorded argument shapes (the traced `[None, ...]`) would override ours.
    for attrs in fdef.arg_attr.values():
        attrs.attr.pop("_output_shapes", None)
    try:
        graph = function_def_to_graph(fdef, input_shapes=[tf.TensorShape(s) for s in in_shapes])
    except (ValueError, TypeError, KeyError, tf.errors.OpError):
        return None  # e.g. a call to a function of the library: not provable here
    return [None if t.shape.rank is None else tuple(t.shape.as_list()) for t in graph.outputs]
