"""A transpose of a matmul's last two axes becomes the matmul's own operand order.

Keras' MultiHeadAttention computes its scores as einsum("aecd,abcd->acbe", key, query),
which lowers to a batched matmul and then a transpose of its last two axes: a copy of
the whole [batch, heads, seq, seq] score tensor, the largest tensor of the layer.
(a·b)ᵀ = bᵀ·aᵀ, so the same values come from the matmul with its operands swapped and
both transpose flags flipped, which the matrix unit reads for free.

Any other transpose next to a matmul (attention's head split before it, the head merge
after it) becomes the matmul's perm_a / perm_b / perm_y: the engine reads and writes it
through strides (absorb_operand_transposes).
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


def _compose(inner: list[int], outer: list[int]) -> list[int]:
    """transpose(transpose(x, inner), outer) is transpose(x, result) ([]: identity)."""
    return [inner[p] for p in outer] if outer else list(inner)


def absorb_operand_transposes(graph: Graph) -> Graph:
    """A transpose feeding a matmul operand becomes the matmul's perm_a / perm_b, and a
    transpose that is a matmul's sole reader becomes its perm_y: the product reads (and
    writes) through strides instead of a copy. Attention's head split ([B, S, H, D] ->
    [B, H, S, D] for queries, keys and values) and head merge (back, after the context
    matmul) are four full copies per layer otherwise. A transpose with other readers
    stays for them (the matmul still reads around it)."""
    outputs = {v.id for v in graph.outputs}
    changed = False
    for m in list(graph.nodes):
        if m.kind != "matmul":
            continue
        for k, name in ((0, "perm_a"), (1, "perm_b")):
            t = m.inputs[k].producer
            if t is None or t.kind != "transpose" or m.inputs[k].is_const:
                continue
            m.attrs = {**m.attrs, name: _compose(list(t.attrs["perm"]), m.attrs.get(name, []))}
            m.inputs = [*m.inputs[:k], t.inputs[0], *m.inputs[k + 1:]]
            m.origin = m.origin + tuple(o for o in t.origin if o not in m.origin)
            changed = True
    if changed:
        uses = graph.consumers()
        graph.nodes = [n for n in graph.nodes if n.kind != "transpose"
                       or uses.get(n.outputs[0].id) or n.outputs[0].id in outputs]
    uses = graph.consumers()
    for t in list(graph.nodes):
        if t.kind != "transpose":
            continue
        m = t.inputs[0].producer
        if m is None or m.kind != "matmul" or m.attrs.get("residual") or m.attrs.get("perm_y") \
                or len(uses.get(m.outputs[0].id, [])) != 1 or m.outputs[0].id in outputs:
            continue
        m.attrs = {**m.attrs, "perm_y": list(t.attrs["perm"])}
        m.outputs[0].type = t.outputs[0].type
        m.origin = m.origin + tuple(o for o in t.origin if o not in m.origin)
        graph.replace_uses(t.outputs[0], m.outputs[0])
        graph.remove(t)
        uses = graph.consumers()
    return graph
