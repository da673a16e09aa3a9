"""Reference interpreter: run an IR graph node by node with the device kernels.

Used to check that a pass keeps a graph's numbers (tests) and by constant
folding; the device itself runs the compiled program, not this.

An exception to docs/contracts.md's import rule (the compiler imports only the
executable-format module from the runtime), on purpose: this module imports
`neuronish.runtime.kernels`, so constant folding computes with exactly the numpy
kernels the device runs. One reference interpreter means a folded constant can
never differ from what the device would have computed (rounding, integer
overflow, NaN handling), and each kind's semantics are written once (docs/isa.md).
The kernels import only numpy and scipy, never TensorFlow, so the compiler's
start-up stays fast. No other compiler module imports the kernels (the memory plan's
scratch sizes are runtime/isa.py's rule).
"""

from __future__ import annotations

import numpy as np

from neuronish.runtime import isa
from neuronish.runtime.kernels import evaluate

from .ir import Graph, Node, Value, constant

# What constant folding may compute: a fold whose outputs take more than
# MAX_FOLD_BYTES and more than FOLD_GROWTH times its constant inputs is left as an
# instruction the device runs. Without it a 200-byte GraphDef (Fill to [2^28, 4])
# made the compiler allocate 4 GiB; with it a compile's folding costs at most a
# multiple of the constants the graph itself holds. (Reshaped, transposed or
# dequantized weights grow by at most 4x and still fold.)
MAX_FOLD_BYTES = 64 << 20
FOLD_GROWTH = 4


def fold_fits(node: Node) -> bool:
    """Whether folding `node` stays within the bound above (exact integer sizes)."""
    out = sum(isa.nbytes(o.shape, o.dtype) for o in node.outputs)
    given = sum(isa.nbytes(v.shape, v.dtype) for v in node.inputs)
    return out <= max(MAX_FOLD_BYTES, FOLD_GROWTH * given)


def run_node(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    return evaluate(node.kind, args, node.attrs, [(o.shape, o.dtype) for o in node.outputs])


def fold_node(node: Node) -> list[Value]:
    """Evaluate a node whose inputs are all constants; its outputs as constants."""
    return [constant(a) for a in run_node(node, [v.data for v in node.inputs])]


def interpret(graph: Graph, feeds: list[np.ndarray]) -> list[np.ndarray]:
    env: dict[int, np.ndarray] = {v.id: np.asarray(x) for v, x in zip(graph.inputs, feeds)}

    def get(v: Value) -> np.ndarray:
        return v.data if v.is_const else env[v.id]

    for node in graph.nodes:
        for out, arr in zip(node.outputs, run_node(node, [get(v) for v in node.inputs])):
            env[out.id] = arr
    return [np.array(get(v)) for v in graph.outputs]
