"""`--auto-cast` to bf16, end to end: values between bf16-capable instructions stay bf16.

After `auto_cast`, every matmul-like instruction reads its operands in bfloat16 but still
writes float32, so the next one converts its input back: on ResNet50 that was a reorder
per convolution, and pooling and residual adds ran in float32 (issue 20). This pass
assigns each value a dtype instead:

- a matmul-like instruction computing in bfloat16 writes bfloat16 (its bias, residual and
  activation epilogue still work on the float32 accumulator; the result is rounded once,
  to nearest even, as oneDNN's bf16 primitives do);
- softmax (computed in float32 from the bf16 scores, rounded once) and select (the
  attention mask: it only picks values), or masked_softmax (both in one), so attention's
  scores stay bf16 from their matmul to the next one;
- pooling, the activations and element-wise functions oneDNN has bf16 kernels for,
  add/sub/mul/div/maximum/minimum (where oneDNN takes the broadcast), a mean or max over
  an image's H and W (a global pool), concat and the movement kinds write bfloat16 when
  every value they read is bfloat16 (a constant operand is rounded to bfloat16); each
  computes in float32 and rounds its result once (both engines);
- conversions (`cast`) happen only at the edges of such regions: a float32 value entering
  a matmul-like instruction, a bfloat16 value read by anything else (softmax, layer norm,
  reductions, the graph's outputs), each value converted once.

The dtypes show in the IR dump and in `neuronish-cc inspect`. Error: each bf16 value is
one more rounding (2^-9 relative); docs/auto-cast.md has the measured figures.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401 (gives numpy the "bfloat16" dtype)

from neuronish.runtime import isa

from ..ir import Graph, Node, TensorType, Value, constant
from .choices import deciding

BF16 = "bfloat16"
# What the native engine runs on bfloat16 tensors with oneDNN (runtime/native/spec.py):
# its element-wise functions, its binary ops with the second operand broadcasting.
_FOLLOW_UNARY = frozenset({"relu", "relu6", "leaky_relu", "elu", "selu", "sigmoid", "tanh",
                           "gelu", "gelu_tanh", "swish", "hard_sigmoid", "hard_swish", "exp",
                           "sqrt", "rsqrt", "square", "abs",
                           "neg", "reciprocal"})
_MOVEMENT = frozenset({"reshape", "copy", "transpose", "concat", "strided_slice"})


def _follows(node: Node) -> bool:
    """Whether `node` may read and write bfloat16 when its inputs are."""
    if node.kind == "pool":
        return True
    if node.kind == "unary":
        return node.attrs["fn"] in _FOLLOW_UNARY
    if node.kind == "binary":
        a, b = node.inputs[:2]  # (an addend c broadcasts as b does: one pass either way)
        return isa.one_pass_binary(node.attrs["fn"], a.shape, b.shape, node.outputs[0].shape)
    if node.kind == "softmax":  # (attention's probabilities: oneDNN's bf16 softmax)
        return not node.attrs.get("log")
    if node.kind == "select":  # (attention's mask: picks values, exact in any dtype)
        return True
    if node.kind == "masked_softmax":  # (the two above in one: float32 inside, rounded once)
        return True
    if node.kind == "reduce":  # NHWC's H and W: a global pool on the native engine
        return len(node.inputs[0].shape) == 4 and sorted(node.attrs["axes"]) == [1, 2] \
            and node.attrs["fn"] in ("mean", "max")
    return node.kind in _MOVEMENT


def _retyped(v: Value, dtype: str) -> None:
    v.type = TensorType(v.shape, dtype)


def assign_dtypes(graph: Graph, mode: str, cast_type: str) -> Graph:
    """Keep values bfloat16 between bf16-capable instructions (see above)."""
    if mode == "none" or cast_type != "bf16":
        return graph
    out: list[Node] = []
    converted: dict[tuple[int, str], Value] = {}

    def cast(v: Value, to: str, origin: tuple[str, ...]) -> Value:
        if v.is_const:
            return constant(v.data.astype(to))
        key = (v.id, to)
        if key not in converted:
            node = Node("cast", [v], [], {"to": to}, origin)
            node.outputs = [Value(TensorType(v.shape, to), producer=node)]
            out.append(node)
            converted[key] = node.outputs[0]
        return converted[key]

    # the steps between a choice's scores and the choice stay float32 (choices.py)
    choosing = deciding(graph)[1]
    for node in graph.nodes:
        floats = [v for v in node.inputs if v.dtype in ("float32", BF16)]
        matmul_like = node.kind in isa.MATMUL_LIKE and node.attrs.get("compute") == BF16 \
            and node.outputs[0].dtype == "float32"
        follow = _follows(node) and not any(v.id in choosing for v in node.outputs) and \
            floats and all(
            v.dtype == BF16 or v.is_const for v in floats) and any(
            v.dtype == BF16 for v in floats) and node.outputs[0].dtype == "float32"
        if matmul_like:
            x = node.inputs[0]
            inputs = list(node.inputs)
            inputs[0] = x if x.dtype == BF16 else cast(x, BF16, node.origin)
            # A matmul's residual is the transformer's residual stream (layer norm's
            # float32 output): read as it is, rounding it would add an error per layer.
            # Where the stream starts at a matmul (ELECTRA's embedding projection) it is
            # bf16: widened (exactly), so the matmul still writes the stream in float32.
            if node.attrs.get("residual") and node.kind != "matmul":
                inputs[-1] = cast(inputs[-1], BF16, node.origin) \
                    if inputs[-1].dtype != BF16 else inputs[-1]
            elif node.attrs.get("residual") and inputs[-1].dtype == BF16:
                inputs[-1] = cast(inputs[-1], "float32", node.origin)
            node.inputs = inputs
            # (a computed second operand, attention's keys or values, is read as it is)
        elif follow:
            node.inputs = [cast(v, BF16, node.origin) if v.is_const and v.dtype == "float32"
                           else v for v in node.inputs]
        else:  # reads float32: bfloat16 values are converted back at this edge
            node.inputs = [cast(v, "float32", node.origin) if v.dtype == BF16 and not (
                node.kind in isa.MATMUL_LIKE and i == 1) else v
                for i, v in enumerate(node.inputs)]
        keeps_f32 = matmul_like and node.kind == "matmul" and node.attrs.get("residual")
        if (matmul_like and not keeps_f32) or follow:
            for v in node.outputs:
                _retyped(v, BF16)
        out.append(node)
    for k, v in enumerate(graph.outputs):
        if v.dtype == BF16:  # the graph's outputs keep their float32 signature
            back = cast(v, "float32", v.producer.origin if v.producer else ())
            back.name, graph.outputs[k] = v.name, back
    graph.nodes = out
    return graph
