"""Multi-instruction idioms that are one device instruction.

TensorFlow's exact GELU (`tf.nn.gelu(approximate=False)`, Keras' `gelu`) arrives as five
ops: 0.5 * x * erfc(-x * 1/sqrt(2)). As separate instructions that is four passes over the
activation and an erfc the device's vector unit has no fast path for; as one `unary gelu`
it is one pass (oneDNN's gelu_erf), and a producing matmul can take it as its epilogue.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir import Graph, Node, TensorType, Value

_RSQRT2 = 1 / math.sqrt(2)


def _scalar(v: Value, want: float) -> bool:
    """`v` is a constant holding `want` (any shape of ones, e.g. () or [1, 1])."""
    if not v.is_const or v.data.size != 1 or v.dtype not in ("float32", "float64", "float16"):
        return False
    got = float(np.asarray(v.data).reshape(()))
    return abs(got - want) <= 1e-6 * abs(want)


def _other(node: Node, v: Value) -> Value | None:
    """The operand of binary `node` that is not `v` (None if `v` is not one of them)."""
    a, b = node.inputs
    return b if a is v else a if b is v else None


def _scaled_by(node: Node | None, factor: float) -> Value | None:
    """x if `node` computes x * factor (either operand order), else None."""
    if node is None or node.kind != "binary" or node.attrs["fn"] != "mul":
        return None
    a, b = node.inputs
    if _scalar(b, factor):
        return a
    if _scalar(a, factor):
        return b
    return None


def _erfc_argument_source(t: Value) -> Value | None:
    """x if `t` is -x / sqrt(2), written as x * -1/sqrt(2) or neg(x) * 1/sqrt(2)."""
    x = _scaled_by(t.producer, -_RSQRT2)
    if x is not None:
        return x
    y = _scaled_by(t.producer, _RSQRT2)
    if y is not None and y.producer is not None and y.producer.kind == "unary" \
            and y.producer.attrs["fn"] == "neg":
        return y.producer.inputs[0]
    return None


def recognize_gelu(graph: Graph) -> Graph:
    """(0.5 * x) * erfc(-x / sqrt(2)) becomes `unary gelu(x)`."""
    uses = graph.consumers()
    outputs = {v.id for v in graph.outputs}

    def private(v: Value) -> bool:  # read once, and not a graph output
        return len(uses.get(v.id, [])) == 1 and v.id not in outputs

    for node in list(graph.nodes):
        if node.kind != "unary" or node.attrs["fn"] != "erfc" or not private(node.outputs[0]):
            continue
        x = _erfc_argument_source(node.inputs[0])
        final = uses[node.outputs[0].id][0]
        if x is None or final.kind != "binary" or final.attrs["fn"] != "mul":
            continue
        half = _other(final, node.outputs[0])
        if half is None or not private(half) or _scaled_by(half.producer, 0.5) is not x:
            continue
        if final.outputs[0].type != x.type:
            continue  # (a broadcasting multiply is not this idiom)
        gelu = Node("unary", [x], [], {"fn": "gelu"}, tuple(dict.fromkeys(
            (*final.origin, *node.origin, *half.producer.origin))))
        gelu.outputs = [Value(TensorType(x.shape, x.dtype), producer=gelu)]
        graph.nodes[graph.nodes.index(final)] = gelu
        graph.replace_uses(final.outputs[0], gelu.outputs[0])
        uses = graph.consumers()
    return graph  # the dead pieces go in eliminate_dead_code
