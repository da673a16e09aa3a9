"""Which node values are fixed, and which are computed from tensor shapes.

A compiled program runs at one static shape: any value computed from a
tensor's shape (Shape, ShapeN, Size, Rank and what is computed from them and
Consts) is a compile-time constant inside it.  On TensorFlow the same value
follows the batch the graph is run at.  The partitioner therefore never lets
such a value cross a cluster boundary; these sets say which values they are.
They depend on the graph alone, not on what the device supports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from neuronish.graph import Graph, is_stateful, producer

SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


@dataclass(frozen=True)
class StaticValues:
    constant: frozenset[str]  # Consts, and stateless nodes computed from Consts only
    shape: frozenset[str]  # shape ops, and stateless nodes computed from them and Consts


def static_values(index: Graph) -> StaticValues:
    constant: set[str] = set()
    shape: set[str] = set()
    for name in index.order:
        op = index.nodes[name].op
        sources = [producer(t) for t in index.data_inputs[name]]
        if op == "Const":
            constant.add(name)
        elif op in SHAPE_OPS:
            shape.add(name)
        elif sources and not is_stateful(op) and all(s in constant or s in shape for s in sources):
            (shape if any(s in shape for s in sources) else constant).add(name)
    return StaticValues(frozenset(constant), frozenset(shape))


def device_static_nodes(
    index: Graph, supported: Callable[[str], bool]
) -> frozenset[str]:
    """Static values the device can compute itself, so that clusters can take copies.

    A supported Const, Shape, ShapeN, Size or Rank, or a supported node whose
    data inputs are all such nodes.  Control inputs do not change a value:
    a cluster that copies such a node takes over its control inputs.
    """
    found: set[str] = set()
    for name in index.order:
        if not supported(name):
            continue
        op = index.nodes[name].op
        inputs = index.data_inputs[name]
        if op == "Const" or op in SHAPE_OPS or (
            inputs and all(producer(t) in found for t in inputs)
        ):
            found.add(name)
    return frozenset(found)
