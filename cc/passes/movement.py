"""Move reshapes below the point-wise instructions that follow them.

A dense layer on a [batch, seq, features] tensor (Keras' Dense, `tf.tensordot`) is
reshape -> matmul -> reshape, and its bias add and activation come after the second
reshape, where the passes that fold them into the matmul (fold_scale_shift,
fuse_activation) cannot see them. A reshape that keeps the last dimension commutes
with an element-wise op whose other operand is a constant varying only along that
dimension (a bias, a scale) or with a unary op: doing the op first and reshaping after
computes the same values, and leaves the op next to its producer.
"""

from __future__ import annotations

from ..ir import Graph, Node, TensorType, Value, constant
from ..rewrite import Pat, Rule, rewrite


def _last_dim_constant(c: Value, features: int) -> bool:
    return c.is_const and all(d == 1 for d in c.shape[:-1]) and (
        not c.shape or c.shape[-1] in (1, features))


def _scalar_operand(reshape: Node, user: Node) -> bool:
    """user is y * c (or +, -, /) for a one-element constant c: it commutes with any
    reshape (attention's query scale sits after the heads are split off)."""
    y = reshape.outputs[0]
    if user.kind != "binary" or user.attrs["fn"] not in ("add", "sub", "mul", "div"):
        return False
    other = user.inputs[1] if user.inputs[0] is y else user.inputs[0]
    return other is not y and other.is_const and other.data.size == 1


def _sinkable(reshape: Node, user: Node) -> bool:
    x, y = reshape.inputs[0], reshape.outputs[0]
    if user.outputs[0].type != y.type:
        return False  # the op must not broadcast y up to a bigger shape
    if _scalar_operand(reshape, user):
        return True
    if not x.shape or not y.shape or x.shape[-1] != y.shape[-1]:
        return False
    if user.kind == "unary":
        return True
    if user.kind == "binary" and user.attrs["fn"] in ("add", "sub", "mul", "div", "maximum",
                                                      "minimum"):
        other = user.inputs[1] if user.inputs[0] is y else user.inputs[0]
        return other is not y and _last_dim_constant(other, y.shape[-1]) \
            and len(other.shape) <= len(x.shape)
    return False


def _collapse(graph: Graph, reshape: Node, m: dict[str, Value]) -> bool:
    """reshape(reshape(x)) is one reshape of x, or x itself when the shapes agree."""
    inner = m["inner"].producer
    x, y = inner.inputs[0], reshape.outputs[0]
    if x.type == y.type and not graph.is_output(y):
        graph.replace_uses(y, x)
        graph.remove(reshape)
    else:
        reshape.inputs = [x]
        reshape.origin = tuple(dict.fromkeys((*inner.origin, *reshape.origin)))
    graph.remove(inner)
    return True


def _sink(graph: Graph, reshape: Node, m: dict[str, Value]) -> bool:
    """reshape -> its only reader (sinkable) becomes that op on x -> reshape."""
    y = reshape.outputs[0]
    if graph.use_count(y) != 1 or graph.is_output(y):
        return False
    user = graph.uses(y)[0]
    if not _sinkable(reshape, user):
        return False
    x = reshape.inputs[0]
    inputs = []
    for v in user.inputs:
        if v is y:
            inputs.append(x)
        elif v.is_const and v.data.size == 1:  # a scalar, whatever its rank
            inputs.append(constant(v.data.reshape(())))
        elif v.is_const and len(v.shape) > 1:  # [1, 1, F] -> [F]
            inputs.append(constant(v.data.reshape(v.shape[-1:])))
        else:
            inputs.append(v)
    moved = Node(user.kind, inputs, [], dict(user.attrs), user.origin)
    moved.outputs = [Value(TensorType(x.shape, user.outputs[0].dtype), producer=moved)]
    again = Node("reshape", [moved.outputs[0]], [], dict(reshape.attrs), reshape.origin)
    again.outputs = [Value(user.outputs[0].type, producer=again)]
    graph.insert_before(user, moved)
    graph.insert_before(user, again)
    graph.replace_uses(user.outputs[0], again.outputs[0])
    graph.remove(user)
    graph.remove(reshape)
    return True


# Rooted at a reshape: first fold a reshape feeding it (read by nothing else), then move
# it below its reader. The driver revisits the reshape each rewrite leaves behind, so a
# chain sinks one op at a time without rescanning the graph (it restarted from the top
# after every move, quadratic in the number of reshapes).
SINK_RESHAPES = [
    Rule("collapse_reshapes", Pat("reshape", inputs=(
        Pat("reshape", private=True, name="inner"),)), _collapse),
    Rule("sink_reshape", Pat("reshape"), _sink),
]


def sink_reshapes(graph: Graph) -> Graph:
    """reshape (last dim kept) -> unary / binary-with-a-per-feature-constant becomes
    that op -> reshape, repeatedly, so a chain of them ends up before the reshape; and
    back-to-back reshapes become one (or none)."""
    return rewrite(graph, SINK_RESHAPES)
