"""An element-wise add, sub or mul read only by a `quantize` writes the 8-bit value itself.

`--quantize int8` puts a `quantize` wherever an int8 instruction reads a float value
(cc/passes/quantize.py). When that value is a `binary`'s result and nothing else reads
it (EfficientNet's squeeze-excite product, depthwise output x sigmoid gate, before each
block's int8 project convolution; a trained BatchNorm's scale, shift and ReLU on a
concat, before DenseNet's int8 bottleneck convolution), the pair becomes one
`binary_quantize`: one pass over the operands writing the 8-bit result, where the pair
wrote the bf16/f32 value and read it back. The numbers do not change: `binary_quantize`
is defined as quantize(binary(a, b [, c], activation)) bit for bit (runtime/isa.py), the
bfloat16 rounding of the value included.

Runs after dtype assignment, so the pair's types are final (with `--auto-cast`, the
product is bf16 and the quantize reads it directly, cc/passes/quantize.py's
`int8_dtype_edges`), and after the dead code it leaves (the product's float32 cast
that no longer has a reader) is gone.
"""

from __future__ import annotations

from neuronish.runtime import isa

from ..ir import Graph, Node, Value
from ..rewrite import Pat, Rule, rewrite


def _float_operands(v: Value) -> bool:
    """The binary reads float32 or bfloat16 operands, all of its result's dtype (as
    binary_quantize's definition takes them), and its activation, if any, is the ReLU
    (the one binary_quantize takes: a clamp at 0 before the 8-bit one)."""
    binary = v.producer
    return (all(x.dtype == v.dtype for x in binary.inputs)
            and v.dtype in ("float32", "bfloat16")
            and binary.attrs.get("activation", "none") in ("none", "relu"))


_PRODUCT = Pat("binary", fn=isa.QUANTIZED_BINARY_FNS, private=True, where=_float_operands,
               name="result")


def _fuse(graph: Graph, quantize: Node, bound: dict[str, Value]) -> bool:
    binary = bound["result"].producer
    fused = Node("binary_quantize", list(binary.inputs), [],
                 {"fn": binary.attrs["fn"],
                  "activation": binary.attrs.get("activation", "none"),
                  "scale": quantize.attrs["scale"], "to": quantize.attrs["to"]},
                 binary.origin + tuple(o for o in quantize.origin if o not in binary.origin))
    old = quantize.outputs[0]
    fused.outputs = [Value(old.type, producer=fused, name=old.name)]
    graph.insert_before(quantize, fused)
    graph.replace_uses(old, fused.outputs[0])
    graph.remove(quantize)
    graph.remove(binary)
    return True


RULES = [Rule("fuse_binary_quantize", Pat("quantize", inputs=(_PRODUCT,)), _fuse)]


def fuse_binary_quantize(graph: Graph) -> Graph:
    """binary add/sub/mul (with its addend and ReLU, if any) whose only reader is a
    quantize -> one binary_quantize."""
    return rewrite(graph, RULES)
