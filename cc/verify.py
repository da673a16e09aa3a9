"""IR invariants, checked after every pass: a broken one is a compiler bug, reported
with the offending node and its neighbours.

Two kinds of check, so that verifying after each of the ~20 passes costs what the
pass changed rather than the whole graph again:

- structure (every value defined once, before it is read, by the node it points back
  at; every graph output computed; batch axes matching): a few set operations per
  node, always over the whole graph;
- types (the kind is known, its attributes are valid and inference gives the output
  types the node has): the costly part, only for the nodes given as `changed` (the
  graph's record of the nodes added or edited since the last check, and the readers of
  retyped values). `verify(graph)` with no `changed` checks every node; the pipeline
  does so on the lowered graph and after the last pass.
"""

from __future__ import annotations

from collections.abc import Collection

from . import kinds
from .errors import NodeError, VerificationError
from .ir import Graph, Node, format_graph, neighbours


def _fail(graph: Graph, node: Node | None, message: str) -> VerificationError:
    context = ""
    if node is not None:
        near = [node, *neighbours(graph, node)][:6]
        context = "\n  near: " + "\n        ".join(repr(n) for n in near)
    return VerificationError(f"IR verification failed: {message}{context}")


def _check_types(graph: Graph, node: Node) -> None:
    if node.kind not in kinds.INFER:
        raise _fail(graph, node, f"unknown instruction kind {node.kind!r}")
    try:
        expected = kinds.infer(node.kind, [v.type for v in node.inputs], node.attrs)
    except NodeError as e:
        raise _fail(graph, node, f"{node.kind}: {e.reason}") from None
    got = [o.type for o in node.outputs]
    if expected != got:
        raise _fail(graph, node, f"{node.kind} outputs are typed {got}, inference gives "
                                 f"{expected}")


def verify(graph: Graph, changed: Collection[Node] | None = None) -> None:
    """Raise VerificationError at the first broken invariant; type-check only the nodes
    in `changed` (every node if None)."""
    defined = {v.id for v in graph.inputs}
    everything = changed is None
    for node in graph.nodes:
        if everything or node in changed:
            _check_types(graph, node)
        for v in node.inputs:
            if v.id not in defined and not v.is_const:
                raise _fail(graph, node, f"{node.kind} reads a value before it is defined "
                                         "(nodes out of order, or a dangling value)")
        for o in node.outputs:
            if o.id in defined:
                raise _fail(graph, node, "a value is defined twice")
            if o.producer is not node:
                raise _fail(graph, node, "an output does not point back at its producer")
            defined.add(o.id)
    for v in graph.outputs:
        if not v.is_const and v.id not in defined:
            raise _fail(graph, None, f"graph output {v.name or v.id} is never computed\n"
                        + format_graph(graph))
    if len(graph.input_batch_axes) != len(graph.inputs) or len(graph.output_batch_axes) != len(
            graph.outputs):
        raise _fail(graph, None, "batch axes do not match the graph's inputs/outputs")


class IncrementalVerifier:
    """Verifies a graph as passes edit it: in full the first time, for a graph object it
    has not seen, and when values were retyped where no graph could record it; otherwise
    the types of the nodes the graph recorded as changed since the last check."""

    def __init__(self) -> None:
        self._graph: Graph | None = None
        self._untracked = -1

    def __call__(self, graph: Graph, full: bool = False) -> None:
        changed = graph.take_changes()
        if full or graph is not self._graph or Graph.untracked_edits != self._untracked:
            changed = None
        verify(graph, changed)
        self._graph, self._untracked = graph, Graph.untracked_edits
