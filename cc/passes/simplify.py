"""Generic clean-up passes: constant folding, identity and dead-code elimination."""

from __future__ import annotations

import numpy as np

from neuronish.runtime import isa

from ..interpret import fold_fits, fold_node
from ..ir import Graph, Node, Value
from ..rewrite import Pat, Rule, rewrite


def fold_constants(graph: Graph) -> Graph:
    """Evaluate every node whose inputs are all constants (with the device's own
    kernels, so the folded numbers are the ones the device would compute), unless
    its result is too large to fold (`fold_fits`): the device computes that one.

    One sweep in schedule order is already a fixed point (a node's inputs are folded
    before it is visited), and `replace_uses` costs only the value's uses."""
    kept: list[Node] = []
    for node in graph.nodes:
        if node.inputs and all(v.is_const for v in node.inputs) and fold_fits(node):
            for old, new in zip(node.outputs, fold_node(node)):
                new.name = old.name
                graph.replace_uses(old, new)
        else:
            kept.append(node)
    graph.nodes = kept
    return graph


def _is_identity(node: Node) -> Value | None:
    """The input a node merely passes through, or None."""
    x = node.inputs[0] if node.inputs else None
    if x is None or len(node.outputs) != 1:
        return None
    a = node.attrs
    kind = node.kind
    if kind == "binary":
        # Tested before the types: most binaries are no identity, and a constant that is
        # not the neutral one is told by its first element (100k Muls by a weight).
        c = node.inputs[1]
        neutral = _NEUTRAL.get(a["fn"]) if c.is_const else None
        if neutral is None or not x.dtype.startswith("float"):
            return None
        data = c.data
        if data.size and data.flat[0] != neutral:
            return None
        if not np.all(data == neutral):
            return None
    elif kind in isa.SAME_TYPE_IS_IDENTITY:
        pass
    elif kind == "transpose":
        if list(a["perm"]) != sorted(a["perm"]):
            return None
    elif kind == "strided_slice":
        if not (all(s == 1 for s in a["strides"]) and all(b in (0, None) for b in a["begin"])
                and all(e is None or e >= d for e, d in zip(a["end"], x.shape))):
            return None
    elif kind == "pad":
        if any(b or e for b, e in a["paddings"]):
            return None
    elif kind == "tile":
        if not all(m == 1 for m in a["multiples"]):
            return None
    elif kind == "concat":  # one operand with elements, the rest empty
        full = [v for v in node.inputs if 0 not in v.shape]
        if len(full) != 1:
            return None
        x = full[0]
    else:
        return None
    out_type = node.outputs[0].type
    return x if out_type is x.type or out_type == x.type else None


_NEUTRAL = {"add": 0, "sub": 0, "mul": 1, "div": 1}


def _drop_identity(graph: Graph, node: Node, bound: dict) -> bool:
    x = _is_identity(node)
    if x is None:
        return False
    out = node.outputs[0]
    if graph.is_output(out) and (any(v is x for v in graph.inputs) or graph.is_output(x)):
        if node.kind == "copy":
            return False  # already the copy it must stay as
        copy = Node("copy", [x], node.outputs, {}, node.origin)  # must stay distinct
        graph.replace(node, copy)
        out.producer = copy
        return True
    graph.replace_uses(out, x)
    graph.remove(node)
    return True


def _drop_empty_operands(graph: Graph, node: Node, bound: dict) -> bool:
    """A concat's empty operands add nothing to its result: left out (no native kernel
    reads one, so they left the whole concat to the numpy engine)."""
    full = [v for v in node.inputs if 0 not in v.shape]
    if len(full) < 2 or len(full) == len(node.inputs):
        return False  # (one operand left: an identity; none: an empty result)
    concat = Node("concat", full, node.outputs, node.attrs, node.origin)
    graph.replace(node, concat)
    node.outputs[0].producer = concat
    return True


IDENTITIES = [Rule("identity", Pat(), _drop_identity),
              Rule("empty_concat_operands", Pat(("concat",)), _drop_empty_operands)]


def eliminate_identities(graph: Graph) -> Graph:
    """Drop nodes that return their input unchanged (same type, same values), and the
    empty operands of a concat."""
    return rewrite(graph, IDENTITIES)


def eliminate_dead_code(graph: Graph) -> Graph:
    """Remove nodes none of whose outputs reach a graph output."""
    live = {v.id for v in graph.outputs}
    kept: list[Node] = []
    add = live.add
    for node in reversed(graph.nodes):  # (loops, not generators: 200,000 nodes, twice)
        for o in node._outputs:
            if o.id in live:
                kept.append(node)
                for v in node._inputs:
                    add(v.id)
                break
    graph.nodes = kept[::-1]
    return graph
