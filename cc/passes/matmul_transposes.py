"""A transpose of a matmul's last two axes becomes the matmul's own operand order.

Keras' MultiHeadAttention computes its scores as einsum("aecd,abcd->acbe", key, query),
which lowers to a batched matmul and then a transpose of its last two axes: a copy of
the whole [batch, heads, seq, seq] score tensor, the largest tensor of the layer.
(a·b)ᵀ = bᵀ·aᵀ, so the same values come from the matmul with its operands swapped and
both transpose flags flipped, which the matrix unit reads for free.
"""

from __future__ import annotations

from ..ir import Graph


def _swaps_last_two(perm: list[int]) -> bool:
    r = len(perm)
    return r >= 2 and list(perm) == [*range(r - 2), r - 1, r - 2]


def fold_output_transposes(graph: Graph) -> Graph:
    """matmul (no bias, residual or activation) → transpose of its last two axes, the
    transpose its sole reader, becomes one matmul(b, a) with flipped flags."""
    outputs = {v.id for v in graph.outputs}
    for t in list(graph.nodes):
        if t.kind != "transpose" or not _swaps_last_two(t.attrs["perm"]):
            continue
        m = t.inputs[0].producer
        if m is None or m.kind != "matmul" or len(m.inputs) != 2 \
                or m.attrs.get("activation", "none") != "none" \
                or graph.use_count(m.outputs[0]) != 1 or m.outputs[0].id in outputs:
            continue
        a, b = m.inputs
        m.inputs = [b, a]
        m.attrs = {**m.attrs, "transpose_a": not m.attrs.get("transpose_b", False),
                   "transpose_b": not m.attrs.get("transpose_a", False)}
        m.outputs[0].type = t.outputs[0].type
        m.origin = m.origin + tuple(o for o in t.origin if o not in m.origin)
        graph.replace_uses(t.outputs[0], m.outputs[0])
        graph.remove(t)
    return graph
