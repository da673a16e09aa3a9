"""Static shapes of table lookups (`StringLookup`, `IntegerLookup`, `tf.lookup`).

`LookupTableFindV2`'s shape function reads the table's value shape from its
resource handle's data, which the placeholder a frozen graph has for the table
does not carry: TensorFlow types the result unknown, and everything after a
`StringLookup` (the embeddings and the network behind them) stays on TensorFlow.
A lookup returns the keys' shape followed by the values' shape, which the
default value has, so in the copy of the graph used for shape inference only
the lookup becomes `Fill(Concat(Shape(keys), Shape(default_value)), 0)`.
"""

from __future__ import annotations

import tensorflow as tf

from neuronish.graph import Graph
from neuronish.shape_inference.stand_ins import concat, replace_with_fill

LOOKUP_OPS = frozenset({"LookupTableFindV2"})


def stand_in(graph: Graph) -> None:
    """Rewrite (in place) every table lookup of `graph` as above."""
    for node in list(graph.graph_def.node):
        if node.op not in LOOKUP_OPS or len(node.input) < 3:
            continue
        keys, default = node.input[1], node.input[2]
        shapes = []
        for what, ref in (("keys", keys), ("values", default)):
            shape = graph.add_node(f"{node.name}/neuronish_{what}_shape", "Shape", [ref])
            shape.attr["T"].type = node.attr["Tin" if what == "keys" else "Tout"].type
            shape.attr["out_type"].type = tf.int32.as_datatype_enum
            shapes.append(shape.name)
        dims = concat(graph, f"{node.name}/neuronish_dims", shapes, tf.int32)
        replace_with_fill(graph, node, dims, tf.as_dtype(node.attr["Tout"].type))
