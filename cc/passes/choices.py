"""Scores a discrete choice reads stay float32 under `--auto-cast` and `--quantize int8`.

A mixture-of-experts layer routes each token by `top_k` of softmax(x @ W_router); a
classifier's `argmax` picks a class from its logits. Such a choice does not degrade
with the error of its scores, it flips: two experts whose probabilities differ by
less than bf16's step (2^-9 relative) become a tie that `top_k` breaks by index, or an
int8 step reorders them, and the token's output is another expert's (Mixtral's
keras_hub backbone: relative error 0.9 on one of five inputs in bf16 and on two in
int8, against ~1e-2 elsewhere). So the matmul-like instructions whose output reaches a choice only
through order-keeping steps (softmax, reshape, a constant scale or shift, ...) compute
in float32, and those steps write float32; the rest of the model keeps its precision.
Each one is listed with the reason in the executable's stats (`auto_cast` and
`quantization`).
"""

from __future__ import annotations

from neuronish.runtime import isa

from ..ir import Graph, Node

CHOICES = frozenset({"top_k", "argminmax"})
WHY = ("its output decides a top_k / argmax (a routing or a class): a rounding there "
       "flips the choice instead of adding a small error, so it stays float32")
# What lies between the scores and the choice: each keeps the order of (or just moves)
# what it reads. A binary step is walked through only with a constant other operand
# (a scale or a shift): through a residual add the walk would reach the whole network.
_THROUGH = frozenset({"softmax", "masked_softmax", "reshape", "transpose", "copy", "cast",
                      "strided_slice", "unary", "select"})


def deciding(graph: Graph) -> tuple[list[Node], set[int]]:
    """The matmul-like instructions whose output a choice reads through order-keeping
    steps, in program order, and the ids of the values on those paths (the steps'
    outputs and the matmuls' own)."""
    matmuls: dict[int, Node] = {}
    values: set[int] = set()
    stack = [n.inputs[0] for n in graph.nodes if n.kind in CHOICES and n.inputs]
    while stack:
        v = stack.pop()
        p = v.producer
        if v.id in values or p is None or v.is_const:
            continue
        if p.kind in isa.MATMUL_LIKE:
            values.add(v.id)
            matmuls[id(p)] = p
        elif p.kind in _THROUGH or (p.kind == "binary" and any(w.is_const for w in p.inputs)):
            values.add(v.id)
            stack.extend(w for w in p.inputs if not w.is_const and w.dtype in
                         ("float32", "bfloat16", "float16"))
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    return sorted(matmuls.values(), key=lambda n: order[id(n)]), values


def kept_float32(graph: Graph) -> list[dict]:
    """For the stats: each deciding matmul-like instruction, its TF nodes and why."""
    return [{"instruction": n.kind, "tf": list(n.origin[:3]), "why": WHY}
            for n in deciding(graph)[0]]
