"""`--auto-cast`: matmul-like instructions compute from 16-bit operands, as a matrix unit.

Mode `matmult` (and `all`) gives every float32 conv2d / depthwise_conv2d / matmul the
attribute `compute` = bfloat16 or float16: the device reads both operands in that
precision and accumulates in float32 (docs/isa.md). Constant weights are stored in it
(half the bytes in the executable and in device memory), rounded once here; the
activation operand is rounded by the instruction itself (the native engine converts
it on the fly, the numpy reference rounds it). Mode `all` also rounds the operands of
every other float arithmetic instruction with a `unary round_*` instruction.

Error: bf16 keeps 8 significant bits, so each operand carries a relative error up to
2^-9 (~0.2%); fp16 keeps 11 bits (2^-12, ~0.024%) but overflows above 65504. Sums of
many such products partly cancel the error; see docs/auto-cast.md for measured figures.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401 (gives numpy the "bfloat16" dtype)

from neuronish.runtime import isa

from ..interpret import fold_node
from ..ir import Graph, Node, TensorType, Value, constant
from .choices import CHOICES, deciding

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

    storage = {"bf16": "bfloat16", "fp16": "float16"}[cast_type]
    # scores a top_k / argmax chooses from stay float32 (cc/passes/choices.py)
    matmuls, path = deciding(graph)
    choosing = {id(n) for n in matmuls}
    for node in graph.nodes:
        if node.kind in _MATMULS:
            if id(node) not in choosing and node.inputs[0].dtype == "float32" and \
                    node.inputs[1].dtype == "float32":
                node.attrs = {**node.attrs, "compute": storage}
                w = node.inputs[1]
                if w.is_const:
                    node.inputs = [node.inputs[0], constant(w.data.astype(storage)),
                                   *node.inputs[2:]]
        elif mode == "all" and node.kind not in _NO_ROUND and not (
                node.kind == "unary" and node.attrs["fn"].startswith("round_")) and \
                node.kind not in CHOICES and not any(v.id in path for v in node.outputs):
            node.inputs = [round_value(v, node.origin) for v in node.inputs]
        out.append(node)
    graph.nodes = out
    return graph
