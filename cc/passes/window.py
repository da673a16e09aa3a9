"""Fold explicit zero padding into the windowed instruction that reads it.

Keras writes `ZeroPadding2D` before strided convolutions and pools (ResNet's stem and
its first max pool, every strided block of MobileNetV2). As separate instructions
these copy the whole activation into a larger buffer; a convolution's own `pads`
mean exactly the same zeros and cost nothing. A max pool's padding is "ignored"
(-inf) rather than zero, which is the same thing only when no value is negative and
every window holds at least one real value: the pool's own rule (pads smaller than
the window) guarantees the latter, and the pad's input is known non-negative when
its producer ends in relu or relu6. Average pools count padded zeros differently and
are left alone.
"""

from __future__ import annotations

from ..ir import Graph, Node, Value
from ..rewrite import Pat, Rule, rewrite

_NON_NEGATIVE = ("relu", "relu6")


def _spatial_zero_pads(node: Node) -> list[int] | None:
    """[top, bottom, left, right] if `node` zero-pads only H and W of an NHWC value."""
    a = node.attrs
    if node.kind != "pad" or a.get("mode", "constant") != "constant" or a.get("value", 0) != 0:
        return None
    p = a["paddings"]
    if len(p) != 4 or any(p[0]) or any(p[3]):
        return None
    return [p[1][0], p[1][1], p[2][0], p[2][1]]


def _non_negative(v: Value) -> bool:
    n = v.producer
    if n is None:
        return False
    if n.kind == "unary":
        return n.attrs["fn"] in _NON_NEGATIVE
    return n.attrs.get("activation", "none") in _NON_NEGATIVE


def _takes(reader: Node, v: Value, pads: list[int]) -> bool:
    """Can `reader` take `pads` of zeros around its image `v` into its own pads?"""
    if reader.inputs[0] is not v or any(u is v for u in reader.inputs[1:]):
        return False
    if reader.kind in ("conv2d", "depthwise_conv2d"):
        return True
    if reader.kind == "pool" and reader.attrs["mode"] == "max" and _non_negative(
            v.producer.inputs[0]):
        kh, kw = reader.attrs["ksize"]
        total = [a + b for a, b in zip(reader.attrs["pads"], pads)]
        return max(total[:2]) < kh and max(total[2:]) < kw  # every window sees a real value
    return False


def _fold_pad(graph: Graph, node: Node, bound: dict) -> bool:
    pads = _spatial_zero_pads(node)
    y = node.outputs[0]
    readers = graph.uses(y)
    if pads is None or graph.is_output(y) or not readers or not all(
            _takes(r, y, pads) for r in readers):
        return False
    for r in readers:
        r.inputs = [node.inputs[0], *r.inputs[1:]]
        r.attrs = {**r.attrs, "pads": [a + b for a, b in zip(r.attrs["pads"], pads)]}
        r.origin = r.origin + tuple(o for o in node.origin if o not in r.origin)
    graph.remove(node)
    return True


PAD_INTO_WINDOW = [Rule("pad_into_window", Pat("pad"), _fold_pad)]


def fold_pad_into_window(graph: Graph) -> Graph:
    """pad (zeros, H/W only) → conv2d / depthwise_conv2d / max pool of a non-negative
    value becomes that instruction with larger `pads`."""
    return rewrite(graph, PAD_INTO_WINDOW)
