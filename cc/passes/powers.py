"""Powers with a constant exponent become the instructions TensorFlow itself runs.

`x ** 3` (Keras' approximate GELU), `x ** 2`, `x ** 0.5` arrive as TF's `Pow` with a
constant exponent. A general power is exp(y * log(x)) per element; TensorFlow's graph
optimizer (grappler's arithmetic optimizer, ConvertPowStage) never runs it for these
exponents but rewrites them first, and this pass does the same rewrite so the device
computes the same numbers with one cheap vector pass each:

| exponent | becomes |
|---|---|
| 2 | `square(x)` |
| 3 | `x * square(x)` |
| 1 | `copy(x)` (dropped by eliminate_identities) |
| 0.5 | `sqrt(x)` |
| -0.5 | `rsqrt(x)` |
| -1 | `reciprocal(x)` |

Only float powers whose exponent is one constant value that does not change the
output's shape by broadcasting; other powers stay `binary pow`.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, TensorType, Value
from ..rewrite import Pat, Rule, rewrite

# exponent -> the unary functions applied in turn, then whether x multiplies the result
_RULES: dict[float, tuple[str, bool]] = {
    2.0: ("square", False),
    3.0: ("square", True),
    0.5: ("sqrt", False),
    -0.5: ("rsqrt", False),
    -1.0: ("reciprocal", False),
}


def _exponent(node: Node) -> float | None:
    """The constant exponent of a float `binary pow` node that keeps x's type, or None."""
    if node.kind != "binary" or node.attrs["fn"] != "pow":
        return None
    x, e = node.inputs
    if not x.dtype.startswith("float") or not e.is_const or e.data.size != 1 \
            or node.outputs[0].type != x.type:
        return None
    return float(np.asarray(e.data).reshape(()))


def _emit(kind: str, inputs: list[Value], attrs: dict, like: Value, origin: tuple[str, ...]
          ) -> Node:
    node = Node(kind, inputs, [], attrs, origin)
    node.outputs = [Value(TensorType(like.shape, like.dtype), producer=node)]
    return node


def _expand(graph: Graph, node: Node, bound: dict) -> bool:
    e = _exponent(node)
    if e is None or (e != 1.0 and e not in _RULES):
        return False
    x = node.inputs[0]
    if e == 1.0:
        new = [Node("copy", [x], node.outputs, {}, node.origin)]
    else:
        fn, times_x = _RULES[e]
        if not times_x:
            new = [Node("unary", [x], node.outputs, {"fn": fn}, node.origin)]
        else:
            inner = _emit("unary", [x], {"fn": fn}, x, node.origin)
            new = [inner, Node("binary", [x, inner.outputs[0]], node.outputs, {"fn": "mul"},
                               node.origin)]
    for n in new:
        graph.insert_before(node, n)
    graph.remove(node)
    for v in new[-1].outputs:
        v.producer = new[-1]
    return True


POWERS = [Rule("constant_power", Pat("binary", fn="pow"), _expand)]


def expand_constant_powers(graph: Graph) -> Graph:
    """Rewrite `binary pow` by a constant 1, 2, 3, 0.5, -0.5 or -1 as the table above."""
    return rewrite(graph, POWERS)
