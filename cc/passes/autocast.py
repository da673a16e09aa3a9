"""`--auto-cast`: round operands to bf16/fp16 the way the device's matrix units do.

The device computes in float32 but its matmul/conv units (or, with `all`, every
float unit) read operands rounded to 16 bits. We model that by rounding the
operands (weights once at compile time, activations with a `unary round_*`
instruction) and accumulating in float32. Error: bf16 keeps 8 significant bits,
so each operand carries a relative error up to 2^-9 (~0.2%); fp16 keeps 11 bits
(2^-12, ~0.024%) but overflows above 65504. Sums of many such products partly
cancel the error; see docs/auto-cast.md for measured figures.
"""

from __future__ import annotations

from neuronish.runtime import isa

from ..interpret import fold_node
from ..ir import Graph, Node, TensorType, Value

_MATMULS = isa.MATMUL_LIKE
_NO_ROUND = isa.NO_FLOAT_MATH


def auto_cast(graph: Graph, mode: str, cast_type: str) -> Graph:
    """Round float32 operands of matmul-like nodes (mode `matmult`) or of every
    arithmetic node (mode `all`) to `cast_type` (bf16 or fp16)."""
    if mode == "none":
        return graph
    fn = {"bf16": "round_bf16", "fp16": "round_fp16"}[cast_type]
    rounded: dict[int, Value] = {}
    out: list[Node] = []

    def round_value(v: Value, origin: tuple[str, ...]) -> Value:
        if v.dtype != "float32":
            return v
        if v.id not in rounded:
            node = Node("unary", [v], [], {"fn": fn}, origin)
            node.outputs = [Value(TensorType(v.shape, v.dtype), producer=node)]
            if v.is_const:
                rounded[v.id] = fold_node(node)[0]
            else:
                out.append(node)
                rounded[v.id] = node.outputs[0]
        return rounded[v.id]

    for node in graph.nodes:
        wants = node.kind in _MATMULS or (mode == "all" and node.kind not in _NO_ROUND
                                          and not (node.kind == "unary"
                                                   and node.attrs["fn"].startswith("round_")))
        if wants:
            n_operands = 2 if node.kind in _MATMULS else len(node.inputs)  # never the bias
            node.inputs = [round_value(v, node.origin) if i < n_operands else v
                           for i, v in enumerate(node.inputs)]
        out.append(node)
    graph.nodes = out
    return graph
