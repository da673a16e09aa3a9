"""Fold chains of constant scales and shifts on one tensor into one `x * s + o`.

A model's input preprocessing is written as several element-wise ops by constants:
Keras' Rescaling (x / 255), then Normalization ((x - mean) / sqrt(variance)), and
EfficientNet's third Rescaling by 1 / std on top. No weights can absorb them (the
convolution after them pads with zeros, which would then be in the wrong units), so
each is a pass over the image: on 8x224x224x3, three passes of ~0.5 ms. As one binary
with an addend (isa.py's `binary`: y = fn(a, b) + c) they are one pass.

Each op by a constant v is an affine map, and so is the chain:
    x + v, x - v, v - x, x * v, x / v  ->  x * s + o
    (x * s + o) + v = x * s + (o + v)      (x * s + o) * v = x * (s v) + o v
    (x * s + o) - v = x * s + (o - v)      (x * s + o) / v = x * (s / v) + o / v
    v - (x * s + o) = x * (-s) + (v - o)   (v / (x * s + o) is not affine)
The folded constants are computed in float64 and rounded once to the tensor's dtype, so
the result differs from the chain by a few ulps (as folding a BatchNorm into weights
does). A division by a constant holding a zero stays as written (x / 0 is TF's infinity
or NaN, which a multiply by 1/0 does not reproduce for x = 0).
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Value, constant
from ..rewrite import Pat, Rule, rewrite

_AFFINE_FNS = ("add", "sub", "mul", "div")


def _sole_reader(graph: Graph, v: Value) -> Node | None:
    if graph.use_count(v) != 1 or graph.is_output(v):
        return None
    return graph.readers(v)[0]


def _fits(v: Value, shape: tuple[int, ...]) -> bool:
    """A float constant that broadcasts into `shape` without growing it."""
    if not v.is_const or v.dtype != "float32" or len(v.shape) > len(shape):
        return False
    return all(d in (1, s) for d, s in zip(reversed(v.shape), reversed(shape)))


def _as_affine(node: Node) -> tuple[Value, np.ndarray, np.ndarray] | None:
    """(x, s, o) with node = x * s + o, s and o float64 constants broadcasting into x, for
    a float32 binary without an activation of one tensor x and constants."""
    if node.kind != "binary" or node.attrs.get("activation", "none") != "none":
        return None
    fn, y = node.attrs["fn"], node.outputs[0]
    if fn not in _AFFINE_FNS or y.dtype != "float32":
        return None
    if len(node.inputs) == 3:  # fn(a, b) + c: only a scale with its shift is affine here
        a, b, c = node.inputs
        if fn != "mul" or a.is_const or a.type != y.type or not (_fits(b, y.shape)
                                                               and _fits(c, y.shape)):
            return None
        return a, b.data.astype(np.float64), c.data.astype(np.float64)
    a, b = node.inputs
    x, v = (a, b) if not a.is_const else (b, a)
    if x.is_const or x.type != y.type or not _fits(v, y.shape):
        return None
    value = v.data.astype(np.float64)
    one, zero = np.ones((), np.float64), np.zeros((), np.float64)
    if fn == "add":
        return x, one, value
    if fn == "mul":
        return x, value, zero
    if fn == "sub":
        return (x, one, -value) if x is a else (x, -one, value)
    if x is a and np.all(value != 0):  # x / v; v / x is not affine
        return x, 1 / value, zero
    return None


def _then(s: np.ndarray, o: np.ndarray, fn: str, value: np.ndarray, affine_first: bool
          ) -> tuple[np.ndarray, np.ndarray] | None:
    """(x * s + o) fn value (or value fn (x * s + o), when not `affine_first`), as
    x * s' + o'."""
    if fn == "add":
        return s, o + value
    if fn == "sub":
        return (s, o - value) if affine_first else (-s, value - o)
    if fn == "mul":
        return s * value, o * value
    if fn == "div" and np.all(value != 0):
        return s / value, o / value
    return None


def _fold_next(graph: Graph, node: Node, bound: dict) -> bool:
    """`node` (affine in x) and its sole reader (a constant applied to node's result, the
    result in front for a div) become one binary x * s + o at node's place."""
    affine = _as_affine(node)
    user = _sole_reader(graph, node.outputs[0])
    if affine is None or user is None or user.kind != "binary" or len(user.inputs) != 2:
        return False
    y = node.outputs[0]
    fn = user.attrs["fn"]
    a, b = user.inputs
    if user.attrs.get("activation", "none") != "none" or user.outputs[0].type != y.type:
        return False
    if fn == "div" and a is not y:
        return False
    other = b if a is y else a
    if other is y or not _fits(other, y.shape):
        return False
    x, s, o = affine
    folded = _then(s, o, fn, other.data.astype(np.float64), affine_first=a is y)
    if folded is None:
        return False
    s, o = folded
    scale = constant(np.asarray(s, np.float32), owned=True)
    shift = constant(np.asarray(o, np.float32), owned=True)
    if np.all(s == 1):
        node.inputs, node.attrs = [x, shift], {**node.attrs, "fn": "add"}
    elif np.all(o == 0):
        node.inputs, node.attrs = [x, scale], {**node.attrs, "fn": "mul"}
    else:
        node.inputs, node.attrs = [x, scale, shift], {**node.attrs, "fn": "mul"}
    node.origin = node.origin + tuple(n for n in user.origin if n not in node.origin)
    graph.replace_uses(user.outputs[0], y)
    graph.remove(user)
    return True


# The chain's first op is the root: once a fold changed it, the driver visits it again
# for the next op.
AFFINE_CHAIN = [Rule("fold_affine_chain", Pat("binary", fn=_AFFINE_FNS), _fold_next)]


def fold_affine_chains(graph: Graph) -> Graph:
    """Binaries of one tensor by constants (add, sub, mul, div), one after another, become
    one binary x * s + o."""
    return rewrite(graph, AFFINE_CHAIN)
