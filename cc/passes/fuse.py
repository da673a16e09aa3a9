"""Fold constant scale/shift chains into conv/matmul weights, then fuse epilogues.

Keras emits inference BatchNorm as `x * a + b` on constants after a convolution
(or FusedBatchNormV3, which the lowering turns into the same two ops). Folding
those into the producer's weights and bias removes two full passes over the
activation per layer; fusing a residual add (ResNet's shortcut) and the
activation removes up to two more. The fused epilogue computes exactly what the
separate instructions did, in the same order: ((conv + bias) + residual), then
the activation.
"""

from __future__ import annotations

import numpy as np

from neuronish.runtime import isa

from ..ir import Graph, Node, TensorType, Value, constant
from ..rewrite import Pat, Rule, rewrite

_PRODUCERS = isa.MATMUL_LIKE
_ACTIVATIONS = isa.ACTIVATIONS


def _sole_consumer(graph: Graph, v: Value) -> Node | None:
    """The node reading `v`, if one operand reads it and it is not a graph output."""
    if graph.use_count(v) != 1 or graph.is_output(v):
        return None
    return graph.readers(v)[0]


def _no_activation(v: Value) -> bool:
    return v.producer.attrs.get("activation", "none") == "none"


def _channel_vector(c: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray | None:
    """`c` as a vector over the last (channel) axis, if it only varies along it
    and broadcasting it does not change the producer's shape."""
    channels = out_shape[-1]
    if c.ndim > len(out_shape) or any(d != 1 for d in c.shape[:-1]):
        return None
    if c.size == 1:
        return np.full(channels, c.reshape(()), dtype=c.dtype)
    if c.shape[-1] != channels:
        return None
    return c.reshape(channels)


def _scale_weights(node: Node, scale: np.ndarray) -> np.ndarray:
    w = node.inputs[1].data
    if node.kind == "conv2d":
        return w * scale
    if node.kind == "depthwise_conv2d":
        return w * scale.reshape(w.shape[2], w.shape[3])
    if node.attrs.get("transpose_b"):  # matmul weights [.., N, K]
        return w * scale[:, None]
    return w * scale


def _fold_one(graph: Graph, producer: Node, user: Node) -> bool:
    """Fold `user` (binary mul/div/add/sub by a constant) into `producer`."""
    if user.kind != "binary" or producer.attrs.get("activation", "none") != "none":
        return False
    if user.attrs.get("activation", "none") != "none" or len(user.inputs) != 2:
        return False  # (its activation or addend comes after the scale or shift)
    out = producer.outputs[0]
    fn = user.attrs["fn"]
    a, b = user.inputs
    other = b if a is out else a
    if not other.is_const or fn not in ("mul", "add", "sub", "div"):
        return False
    if fn in ("sub", "div") and other is a:  # c - x and c / x are not affine in x's weights
        return False
    if user.outputs[0].type != out.type:
        return False
    vec = _channel_vector(other.data, out.shape)
    if vec is None:
        return False
    has_bias = len(producer.inputs) == 3
    bias = producer.inputs[2].data if has_bias else np.zeros(out.shape[-1], dtype=out.dtype)
    if has_bias and not producer.inputs[2].is_const:
        return False
    weights = producer.inputs[1]
    if fn in ("mul", "div"):
        if not weights.is_const:
            return False
        scale = vec if fn == "mul" else (1 / vec).astype(vec.dtype)
        weights = constant(_scale_weights(producer, scale).astype(weights.dtype), owned=True)
        bias = bias * scale
    else:
        bias = bias + vec if fn == "add" else bias - vec
    producer.inputs = [producer.inputs[0], weights, constant(bias.astype(out.dtype), owned=True)]
    producer.origin = producer.origin + tuple(o for o in user.origin if o not in producer.origin)
    graph.replace_uses(user.outputs[0], out)
    graph.remove(user)
    return True


def _fold_into(graph: Graph, producer: Node, bound: dict) -> bool:
    user = _sole_consumer(graph, producer.outputs[0])
    return user is not None and _fold_one(graph, producer, user)


# The producer is the root: once a fold changed it, the driver visits it again for the
# next op of the chain.
SCALE_SHIFT = [Rule("fold_scale_shift", Pat(tuple(_PRODUCERS)), _fold_into)]


def fold_scale_shift(graph: Graph) -> Graph:
    """conv/matmul → (mul|div|add|sub by a per-channel constant)* becomes one
    conv/matmul with scaled weights and a bias."""
    return rewrite(graph, SCALE_SHIFT)


def _absorb(graph: Graph, node: Node, bound: dict) -> bool:
    if node.attrs.get("transpose_a") or len(node.inputs) != 2 or len(node.inputs[1].shape) != 2:
        return False
    first = node.inputs[0].producer
    after = _sole_consumer(graph, node.outputs[0])
    if first is None or first.kind != "reshape" or after is None or after.kind != "reshape":
        return False
    x, y, k = first.inputs[0], after.outputs[0], node.inputs[0].shape[-1]
    if len(y.shape) < 3 or graph.is_output(y) or y.shape[-1] != node.outputs[0].shape[-1]:
        return False  # (the rows keep their order: only the leading dims are regrouped)
    reshaped = first.outputs[0]
    unshared = graph.use_count(reshaped) <= 1 and not graph.is_output(reshaped)
    if tuple(y.shape[:-1]) == tuple(x.shape[:-1]) and x.shape[-1] == k:
        a = x  # both reshapes go
    else:
        # x is regrouped differently (attention's heads merged back): one reshape of
        # it straight to [..., K] with y's leading dims, and no reshape after.
        regroup = Node("reshape", [x], [], {"shape": [*y.shape[:-1], k]}, first.origin)
        regroup.outputs = [Value(TensorType((*y.shape[:-1], k), x.dtype), producer=regroup)]
        graph.insert_before(node, regroup)
        a = regroup.outputs[0]
    node.inputs = [a, node.inputs[1]]
    if unshared:
        graph.remove(first)  # (read by this matmul alone)
    node.outputs[0].type = y.type
    node.origin = node.origin + tuple(o for o in after.origin if o not in node.origin)
    graph.replace_uses(y, node.outputs[0])
    graph.remove(after)
    return True


DENSE_RESHAPES = [Rule("absorb_dense_reshapes", Pat("matmul"), _absorb)]


def absorb_dense_reshapes(graph: Graph) -> Graph:
    """reshape [..., K] → [M, K], matmul by a 2-D weight, reshape [M, N] → [..., N]
    (a Dense or `tensordot` on a [batch, seq, features] tensor) becomes one matmul of
    the [..., K] tensor: the same products (the weight broadcasts over the leading
    dims), without the two copies, and with the bias add and residual add that follow
    the second reshape directly after the matmul, where the fusions see them."""
    return rewrite(graph, DENSE_RESHAPES)


def _take_residual(graph: Graph, node: Node, bound: dict) -> bool:
    out = node.outputs[0]
    user = _sole_consumer(graph, out)
    if user is None or user.kind != "binary" or user.attrs["fn"] != "add" \
            or user.attrs.get("activation", "none") != "none" or len(user.inputs) != 2:
        return False
    a, b = user.inputs
    other = b if a is out else a
    if other is out or other.type != out.type or user.outputs[0].type != out.type:
        return False  # x + x, or a broadcast add: not a plain residual
    node.inputs = [*node.inputs, other]
    node.attrs = {**node.attrs, "residual": True}
    node.origin = node.origin + tuple(o for o in user.origin if o not in node.origin)
    graph.move_before(user, node)
    graph.replace_uses(user.outputs[0], out)
    graph.remove(user)
    return True


RESIDUAL_ADD = [Rule("fuse_residual_add", Pat(("conv2d", "matmul"), where=lambda v: (
    _no_activation(v) and not v.producer.attrs.get("residual"))), _take_residual)]


def fuse_residual_add(graph: Graph) -> Graph:
    """conv2d or matmul → add of another tensor of the same type becomes one
    instruction whose last input is that tensor (`residual`). The producer moves to
    the add's place in the schedule, where both operands are ready."""
    return rewrite(graph, RESIDUAL_ADD)


def _take_activation(graph: Graph, node: Node, bound: dict) -> bool:
    user = _sole_consumer(graph, node.outputs[0])
    if user is None or user.kind != "unary" or user.attrs["fn"] not in _ACTIVATIONS:
        return False
    if not node.outputs[0].dtype.startswith("float"):
        return False
    node.attrs = {**node.attrs, "activation": user.attrs["fn"],
                  "alpha": float(user.attrs.get("alpha", 0.0))}
    node.origin = node.origin + tuple(o for o in user.origin if o not in node.origin)
    graph.replace_uses(user.outputs[0], node.outputs[0])
    graph.remove(user)
    return True


def _streamed_binary(v: Value) -> bool:
    """A float32 binary that may carry an activation and an addend (isa.py's binary)."""
    a, b = v.producer.inputs[:2]
    return (_no_activation(v) and a.dtype == b.dtype == v.dtype == "float32"
            and isa.one_pass_binary(v.producer.attrs["fn"], a.shape, b.shape, v.shape)
            and len(v.shape) <= 6)


def _unshifted(v: Value) -> bool:
    return _streamed_binary(v) and len(v.producer.inputs) == 2


def _take_shift(graph: Graph, add: Node, bound: dict) -> bool:
    """fn(a, b) + c, the add's operand c broadcasting into fn's result: fn's binary takes
    c as its addend, and the add's activation if it has one, at the add's place in the
    schedule (where c is ready)."""
    scaled, shift = bound["scaled"], bound["shift"]
    y = add.outputs[0]
    if len(add.inputs) != 2 or y.type != scaled.type or shift.dtype != y.dtype:
        return False  # (an add that broadcasts fn's result up is two passes' work)
    node = scaled.producer
    node.inputs = [*node.inputs, shift]
    node.attrs = {**node.attrs, "activation": add.attrs.get("activation", "none"),
                  "alpha": float(add.attrs.get("alpha", 0.2))}
    node.origin = node.origin + tuple(o for o in add.origin if o not in node.origin)
    graph.move_before(add, node)
    graph.replace_uses(y, scaled)
    graph.remove(add)
    return True


ACTIVATION = [Rule("fuse_activation", Pat(tuple(_PRODUCERS), where=_no_activation),
                   _take_activation),
              # A pre-activation BatchNorm's scale (x * a after a concat or a pool, which
              # no weights take), its shift and its ReLU: DenseNet's 58 blocks, ResNetV2's.
              Rule("fuse_activation", Pat("binary", where=_streamed_binary), _take_activation),
              Rule("fuse_shift", Pat("binary", fn="add", commutative=True, inputs=(
                  Pat("binary", private=True, where=_unshifted, name="scaled"),
                  Pat(name="shift"))), _take_shift)]


def fuse_activation(graph: Graph) -> Graph:
    """conv/matmul → unary activation, and a one-pass binary (add, mul, ... with one
    operand of the output's shape) → unary activation, each become one instruction
    with `activation`; such a binary → add of a tensor broadcasting into its result
    becomes one binary with that addend."""
    return rewrite(graph, ACTIVATION)
