"""Multi-instruction idioms that are one device instruction.

TensorFlow's exact GELU (`tf.nn.gelu(approximate=False)`, Keras' `gelu`) arrives as five
ops: 0.5 * x * erfc(-x * 1/sqrt(2)). As separate instructions that is four passes over the
activation and an erfc the device's vector unit has no fast path for; as one `unary gelu`
it is one pass (oneDNN's gelu_erf), and a producing matmul can take it as its epilogue.

TensorFlow's approximate GELU (`tf.nn.gelu(approximate=True)`, keras_hub's BERT family)
arrives as eight ops once x ** 3 is x * square(x): (0.5 * x) * (1 + tanh(sqrt(2/pi) *
(x + 0.044715 * x ** 3))); as one `unary gelu_tanh` it is oneDNN's gelu_tanh, again an
epilogue a matmul can take.

Swish (Keras' `swish`/`silu`, EfficientNet's activation) arrives as x * sigmoid(x): as
one `unary swish` it is oneDNN's eltwise_swish, again a convolution's epilogue.

Hard swish (Keras' `hard_swish`/`hard_silu`, MobileNetV3's activation) arrives as
x * (relu6(x + 3) / 6), its gate, hard sigmoid, as relu6(x + 3) / 6: as `unary
hard_swish` / `unary hard_sigmoid` they are oneDNN's hardswish / hardsigmoid, again a
convolution's epilogue.

Layer normalization over the last axis (Keras' LayerNormalization, tf.nn.moments with
tf.nn.batch_normalization) arrives as ten to twelve ops: two means, a squared difference,
rsqrt(var + eps), then x * inv + (beta - mean * inv) with inv = rsqrt(...) * gamma. As
one `layer_norm` it is one pass over the rows (oneDNN's layer normalization).

Attention's masked softmax (Keras' Softmax layer with a mask, keras_hub's BERT family)
arrives as three ops over the [batch, heads, query, key] scores: where(mask, x, -1e9),
softmax over the keys, where(mask, p, 0). As one `masked_softmax` it is one pass over
the scores instead of three (the engine's own loop).

Each idiom is a rule for the rewrite driver (cc/rewrite.py): a pattern rooted at the
instruction that is replaced, and an action checking what a pattern cannot say (the
constants of the formula, x's type kept).
"""

from __future__ import annotations

import math

import numpy as np

from ..ir import Graph, Node, TensorType, Value, constant
from ..rewrite import FLOATS, Pat, Rule, is_scalar, rewrite

_RSQRT2 = 1 / math.sqrt(2)


_scalar = is_scalar


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


def _gelu(graph: Graph, final: Node, m: dict[str, Value]) -> bool:
    """final = half * erfc(t), half = 0.5 * x, t = -x / sqrt(2), x's type kept."""
    x = _erfc_argument_source(m["t"])
    if x is None or _scaled_by(m["half"].producer, 0.5) is not x \
            or final.outputs[0].type != x.type:
        return False  # (a broadcasting multiply is not this idiom)
    erfc = m["erfc"].producer
    _replace_with_unary(graph, final, x, "gelu", (final, erfc, m["half"].producer))
    return True


def _replace_with_unary(graph: Graph, final: Node, x: Value, fn: str,
                        parts: tuple[Node, ...]) -> None:
    """A new `unary fn(x)` takes `final`'s place and its readers; the other parts are
    left for eliminate_dead_code."""
    node = Node("unary", [x], [], {"fn": fn}, tuple(dict.fromkeys(
        o for n in parts for o in n.origin)))
    node.outputs = [Value(TensorType(x.shape, x.dtype), producer=node)]
    graph.insert_before(final, node)
    graph.replace_uses(final.outputs[0], node.outputs[0])
    graph.remove(final)


# (0.5 * x) * erfc(-x / sqrt(2)): the multiply reads the erfc and the half once each.
GELU = [Rule("gelu", Pat("binary", fn="mul", commutative=True, inputs=(
    Pat("unary", fn="erfc", private=True, name="erfc", inputs=(Pat(name="t"),)),
    Pat(private=True, name="half"))), _gelu)]


def recognize_gelu(graph: Graph) -> Graph:
    """(0.5 * x) * erfc(-x / sqrt(2)) becomes `unary gelu(x)`."""
    return rewrite(graph, GELU)  # the dead pieces go in eliminate_dead_code


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _cube_of(v: Value) -> Value | None:
    """x if `v` = x * square(x) (either order) or x ** 3."""
    node = v.producer
    if node is None or node.kind != "binary":
        return None
    a, b = node.inputs
    if node.attrs["fn"] == "pow":
        return a if _scalar(b, 3.0) else None
    if node.attrs["fn"] != "mul":
        return None
    for x, sq in ((a, b), (b, a)):
        if (n := _made_by(sq, "unary", "square")) is not None and n.inputs[0] is x:
            return x
    return None


def _tanh_gelu_source(t: Value) -> Value | None:
    """x if `t` = sqrt(2/pi) * (x + 0.044715 * x**3), in TF's spelling."""
    s = _scaled_by(t.producer, _SQRT_2_OVER_PI)
    add = None if s is None else s.producer
    if add is None or add.kind != "binary" or add.attrs["fn"] != "add":
        return None
    a, b = add.inputs
    for x, rest in ((a, b), (b, a)):
        cube = _scaled_by(rest.producer, 0.044715)
        if cube is not None and _cube_of(cube) is x:
            return x
    return None


def _gelu_tanh(graph: Graph, final: Node, m: dict[str, Value]) -> bool:
    x = _tanh_gelu_source(m["tanh"].producer.inputs[0])
    if x is None or _scaled_by(m["half"].producer, 0.5) is not x \
            or final.outputs[0].type != x.type:
        return False
    parts = (m["tanh"].producer, m["plus_one"].producer, m["half"].producer, final)
    _replace_with_unary(graph, final, x, "gelu_tanh", parts)
    return True


# half * (tanh(...) + 1): the tanh read once, by the add of one.
GELU_TANH = [Rule("gelu_tanh", Pat("binary", fn="mul", commutative=True, inputs=(
    Pat("binary", fn="add", commutative=True, name="plus_one", inputs=(
        Pat("unary", fn="tanh", name="tanh",
            where=lambda v: v.dtype in FLOATS and v.producer.graph.use_count(v) == 1),
        Pat.const(1.0))),
    Pat(name="half"))), _gelu_tanh)]


def recognize_gelu_tanh(graph: Graph) -> Graph:
    """(0.5 * x) * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))) becomes
    `unary gelu_tanh(x)`."""
    return rewrite(graph, GELU_TANH)  # the dead pieces go in eliminate_dead_code


def _swish(graph: Graph, node: Node, m: dict[str, Value]) -> bool:
    x, arg = m["x"], m["sig"].producer.inputs[0]
    if node.outputs[0].type != x.type or not (arg is x or _scaled_by(arg.producer, 1.0) is x):
        return False
    # tf.nn.silu writes sigmoid(beta * x) with beta = 1.0
    swish = Node("unary", [x], node.outputs, {"fn": "swish"},
                 tuple(dict.fromkeys((*m["sig"].producer.origin, *node.origin))))
    graph.replace(node, swish)
    node.outputs[0].producer = swish
    return True


# x * sigmoid(...), either order; the action checks the sigmoid reads x (or 1.0 * x).
SWISH = [Rule("swish", Pat("binary", fn="mul", inputs=(
    Pat(name="x"), Pat("unary", fn="sigmoid", name="sig"))), _swish),
         Rule("swish", Pat("binary", fn="mul", inputs=(
             Pat("unary", fn="sigmoid", name="sig"), Pat(name="x"))), _swish)]


def recognize_swish(graph: Graph) -> Graph:
    """x * sigmoid(x) or x * sigmoid(1.0 * x) (either order) becomes `unary swish(x)`."""
    return rewrite(graph, SWISH)  # an unread sigmoid goes in eliminate_dead_code


def _hard_sigmoid(graph: Graph, node: Node, m: dict[str, Value]) -> bool:
    x = m["x"]
    if node.outputs[0].type != x.type:
        return False
    parts = (m["plus3"].producer, m["relu6"].producer, node)
    _replace_with_unary(graph, node, x, "hard_sigmoid", parts)
    return True


def _hard_swish(graph: Graph, node: Node, m: dict[str, Value]) -> bool:
    gate = m["gate"].producer
    if gate.inputs[0] is not m["x"] or node.outputs[0].type != m["x"].type:
        return False
    _replace_with_unary(graph, node, m["x"], "hard_swish", (gate, node))
    return True


# relu6(x + 3) / 6 or relu6(x + 3) * (1/6), the relu6 and the add private to the formula:
# Keras' hard_sigmoid on TensorFlow, and MobileNetV3's own.
_RELU6_OF_X_PLUS_3 = Pat("unary", fn="relu6", private=True, name="relu6", inputs=(
    Pat("binary", fn="add", commutative=True, private=True, name="plus3",
        inputs=(Pat(name="x"), Pat.const(3.0))),))
HARD_SIGMOID = [
    Rule("hard_sigmoid", Pat("binary", fn="div", inputs=(_RELU6_OF_X_PLUS_3, Pat.const(6.0))),
         _hard_sigmoid),
    Rule("hard_sigmoid", Pat("binary", fn="mul", commutative=True, inputs=(
        _RELU6_OF_X_PLUS_3, Pat.const(1 / 6))), _hard_sigmoid)]
# x * hard_sigmoid(x), either order (hard_sigmoid recognized first); the action checks the
# gate reads x.
HARD_SWISH = [Rule("hard_swish", Pat("binary", fn="mul", commutative=True, inputs=(
    Pat(name="x"), Pat("unary", fn="hard_sigmoid", private=True, name="gate"))), _hard_swish)]


def recognize_hard_swish(graph: Graph) -> Graph:
    """relu6(x + 3) / 6 (or * 1/6) becomes `unary hard_sigmoid(x)`, and x times that
    `unary hard_swish(x)`: one pass, or a convolution's epilogue, for MobileNetV3's
    activation where it took three."""
    return rewrite(rewrite(graph, HARD_SIGMOID), HARD_SWISH)


def _made_by(v: Value, kind: str, fn: str | None = None) -> Node | None:
    """The node producing `v` if it is a `kind` (with attrs fn == `fn`), else None."""
    node = v.producer
    if node is None or node.kind != kind or (fn is not None and node.attrs.get("fn") != fn):
        return None
    return node


def _last_axis_mean_of(v: Value) -> Value | None:
    """x if `v` = mean(x) over x's last axis, keeping dims."""
    node = _made_by(v, "reduce", "mean")
    if node is None or not node.attrs.get("keepdims"):
        return None
    x = node.inputs[0]
    return x if x.shape and list(node.attrs["axes"]) == [len(x.shape) - 1] else None


def _channel_vector(v: Value, channels: int) -> np.ndarray | None:
    """A constant that broadcasts along the last axis only, as a float32 [channels]."""
    if not v.is_const or v.dtype != "float32" or v.data.size != channels \
            or any(d != 1 for d in v.shape[:-1]) or (v.shape and v.shape[-1] != channels):
        return None
    return np.asarray(v.data, np.float32).reshape(channels)


def _product_of(v: Value, a: Value, b: Value) -> Node | None:
    """The node computing v = a * b (either operand order), else None."""
    node = _made_by(v, "binary", "mul")
    if node is None or {id(x) for x in node.inputs} != {id(a), id(b)}:
        return None
    return node


def _binary_operands(node: Node | None, fn: str, v: Value) -> Value | None:
    """The other operand of `node` if it is binary `fn` with `v` as one operand."""
    if node is None or node.kind != "binary" or node.attrs["fn"] != fn:
        return None
    return _other(node, v)


def _shift_of(s: Value, mean: Value, inv: Value, channels: int
              ) -> tuple[np.ndarray | None, list[Node]] | None:
    """Whether `s` is beta - mean * inv (beta may be absent): (beta or None, its nodes)."""
    def minus_mean_inv(v: Value) -> list[Node] | None:  # -mean * inv, or -(mean * inv)
        node = _made_by(v, "binary", "mul")
        if node is not None:
            a, b = node.inputs
            for neg, other in ((a, b), (b, a)):
                if other is inv and (n := _made_by(neg, "unary", "neg")) is not None \
                        and n.inputs[0] is mean:
                    return [node, n]
        n = _made_by(v, "unary", "neg")
        if n is not None and (m := _product_of(n.inputs[0], mean, inv)) is not None:
            return [n, m]
        return None

    if (nodes := minus_mean_inv(s)) is not None:
        return None, nodes
    node = s.producer
    if node is None or node.kind != "binary" or node.attrs["fn"] not in ("add", "sub"):
        return None
    a, b = node.inputs
    if node.attrs["fn"] == "add":
        for beta, rest in ((a, b), (b, a)):
            vec = _channel_vector(beta, channels)
            if vec is not None and (nodes := minus_mean_inv(rest)) is not None:
                return vec, [node, *nodes]
        return None
    vec = _channel_vector(a, channels)  # beta - mean * inv
    m = _product_of(b, mean, inv)
    if vec is None or m is None:
        return None
    return vec, [node, m]


def _layer_norm(graph: Graph, r_node: Node, m: dict[str, Value]) -> bool:
    found = _statistics(r_node)
    if found is None:
        return False
    x, mean, eps, stat_nodes = found
    channels = x.shape[-1]
    r = r_node.outputs[0]
    # inv = r * gamma (or r alone), then y = x * inv + shift.
    candidates = [(r, None, [])]
    for node in graph.uses(r):
        g = _binary_operands(node, "mul", r)
        vec = None if g is None else _channel_vector(g, channels)
        if vec is not None:
            candidates.append((node.outputs[0], vec, [node]))
    for inv, gamma, inv_nodes in candidates:
        match = _final_add(graph, x, mean, inv, channels)
        if match is None:
            continue
        y_node, beta, tail = match
        ln = Node("layer_norm", [
            x, constant(gamma if gamma is not None else np.ones(channels, np.float32)),
            constant(beta if beta is not None else np.zeros(channels, np.float32))],
            [], {"epsilon": eps}, tuple(dict.fromkeys(
                o for n in (*stat_nodes, r_node, *inv_nodes, *tail, y_node)
                for o in n.origin)))
        ln.outputs = [Value(TensorType(x.shape, x.dtype), producer=ln)]
        graph.insert_before(y_node, ln)
        graph.replace_uses(y_node.outputs[0], ln.outputs[0])
        graph.remove(y_node)
        return True
    return False


# Rooted at rsqrt(var + eps): the statistics above it and the scale and shift below it
# take more than one pattern can say (either operand order at each of five levels, gamma
# and beta optional), so the action walks them.
LAYER_NORM = [Rule("layer_norm", Pat("unary", fn="rsqrt"), _layer_norm)]


def recognize_layer_norm(graph: Graph) -> Graph:
    """(x - mean) * rsqrt(var + eps) * gamma + beta over x's last axis, in the forms
    Keras and tf.nn.batch_normalization write it, becomes `layer_norm(x, gamma, beta)`."""
    return rewrite(graph, LAYER_NORM)  # the dead pieces go in eliminate_dead_code



def _one_float(v: Value) -> float | None:
    """The value of a one-element float constant, else None."""
    if not v.is_const or v.data.size != 1 or v.dtype not in FLOATS:
        return None
    return float(np.asarray(v.data).reshape(()))


def _masked_softmax(graph: Graph, final: Node, m: dict[str, Value]) -> bool:
    """final = where(mask, softmax(where(mask, x, fill)), masked) over x's last axis, the
    mask broadcasting to x without growing it, fill and masked scalar constants."""
    x, mask, sm = m["x"], m["mask"], m["p"].producer
    fill, masked = _one_float(m["fill"]), _one_float(m["masked"])
    if fill is None or masked is None or sm.attrs.get("log") \
            or sm.attrs["axis"] != len(x.shape) - 1 or x.dtype not in ("float32", "bfloat16") \
            or m["z"].type != x.type or final.outputs[0].type != x.type \
            or len(mask.shape) > len(x.shape) \
            or any(d not in (1, e) for d, e in zip(mask.shape[::-1], x.shape[::-1])):
        return False
    node = Node("masked_softmax", [x, mask], final.outputs, {"fill": fill, "masked": masked},
                tuple(dict.fromkeys(o for n in (m["z"].producer, sm, final)
                                    for o in n.origin)))
    graph.replace(final, node)
    final.outputs[0].producer = node
    return True


# where(mask, softmax(where(mask, x, fill)), masked): the inner select and the softmax
# each read once, both selects by the same mask.
MASKED_SOFTMAX = [Rule("masked_softmax", Pat("select", inputs=(
    Pat(name="mask"),
    Pat("softmax", private=True, name="p", inputs=(
        Pat("select", private=True, name="z", inputs=(
            Pat(name="mask"), Pat(name="x"), Pat(name="fill"))),)),
    Pat(name="masked"))), _masked_softmax)]


def recognize_masked_softmax(graph: Graph) -> Graph:
    """where(mask, softmax(where(mask, x, fill)), masked) over x's last axis becomes
    `masked_softmax(x, mask)` (Keras' masked Softmax: fill -1e9, masked 0)."""
    return rewrite(graph, MASKED_SOFTMAX)  # the dead pieces go in eliminate_dead_code


def _statistics(r_node: Node) -> tuple[Value, Value, float, list[Node]] | None:
    """For rsqrt(var + eps), var = mean((x - mean(x))^2) over x's last axis:
    (x, mean, eps, the nodes), else None."""
    add = _made_by(r_node.inputs[0], "binary", "add")
    if add is None:
        return None
    for var, eps in (add.inputs, add.inputs[::-1]):
        if not eps.is_const or eps.data.size != 1 or eps.dtype != "float32":
            continue
        d = _last_axis_mean_of(var)
        sq = None if d is None else _made_by(d, "binary", "squared_difference")
        if sq is None:
            continue
        for x, mean in (sq.inputs, sq.inputs[::-1]):
            if _last_axis_mean_of(mean) is x and x.dtype == "float32":
                eps_value = float(np.asarray(eps.data).reshape(()))
                if eps_value >= 0:
                    return x, mean, eps_value, [mean.producer, sq, var.producer, add]
    return None


def _final_add(graph: Graph, x: Value, mean: Value, inv: Value, channels: int
               ) -> tuple[Node, np.ndarray | None, list[Node]] | None:
    """y = x * inv + shift among the readers of inv: (y's node, beta, the other nodes)."""
    for node in graph.uses(inv):
        if _binary_operands(node, "mul", inv) is not x:
            continue
        for add in graph.uses(node.outputs[0]):
            shift = _binary_operands(add, "add", node.outputs[0])
            if shift is None or add.outputs[0].type != x.type:
                continue
            found = _shift_of(shift, mean, inv, channels)
            if found is not None:
                beta, nodes = found
                return add, beta, [node, *nodes]
    return None
