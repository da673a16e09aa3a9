"""IR invariants, checked after every pass: a broken one is a compiler bug, reported
with the offending node and its neighbours.

Two kinds of check, so that verifying after each of the ~20 passes costs what the
pass changed rather than the whole graph again:

- structure (every value defined once, before it is read, by the node it points back
  at; every graph output computed; batch axes matching): a few set operations per
  node, over the whole graph whenever the graph recorded any edit since the last check;
- types (the kind is known, its attributes are valid and inference gives the output
  types the node has): the costly part, only for the nodes given as `changed` (the
  graph's record of the nodes added or edited since the last check, and the readers of
  retyped values). `verify(graph)` with no `changed` checks every node; the pipeline
  does so after the last pass. The lowered graph's types were checked node by node as
  the lowering emitted them (`LowerCtx.emit`: the same inference, and the device's size
  limits), so on entry the pipeline checks its structure and the types of any node the
  lowering did not emit. `NEURONISH_VERIFY=full` makes every check a full one.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from . import kinds
from .errors import NodeError, VerificationError
from .ir import Graph, Node, TensorType, format_graph, neighbours
from .signature import Memo, signature_key


def _fail(graph: Graph, node: Node | None, message: str) -> VerificationError:
    context = ""
    if node is not None:
        near = [node, *neighbours(graph, node)][:6]
        context = "\n  near: " + "\n        ".join(repr(n) for n in near)
    return VerificationError(f"IR verification failed: {message}{context}")


# signature -> the output types inference gives (a pure function of the signature): a
# full verification of 200,000 nodes infers a few signatures, not 200,000 times.
_INFERRED: Memo[list[TensorType]] = Memo()


def _check_types(graph: Graph, node: Node) -> None:
    in_types = [v.type for v in node.inputs]
    key = signature_key(node.kind, in_types, node.attrs)
    expected = _INFERRED.get(key)
    if expected is None:
        if node.kind not in kinds.INFER:
            raise _fail(graph, node, f"unknown instruction kind {node.kind!r}")
        try:
            expected = _INFERRED.put(key, kinds.infer(node.kind, in_types, node.attrs))
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


# NEURONISH_VERIFY=full: every check a full one (types of every node, after every pass),
# for hunting a pass that edits the graph behind its back.
FULL = os.environ.get("NEURONISH_VERIFY", "") == "full"


class IncrementalVerifier:
    """Verifies a graph as passes edit it: in full the first time, for a graph object it
    has not seen, and when values were retyped where no graph could record it; otherwise
    the types of the nodes the graph recorded as changed since the last check, and
    nothing at all when the graph did not move since then (no edit recorded, the same
    inputs, outputs and batch axes): most passes find nothing to rewrite in most graphs,
    and the structure walk alone, after each of ~20 passes, cost a 200,000-instruction
    graph 3 s."""

    def __init__(self) -> None:
        self._graph: Graph | None = None
        self._state: tuple | None = None

    def __call__(self, graph: Graph, full: bool = False) -> None:
        state = (graph.edits, Graph.untracked_edits, tuple(graph.inputs), tuple(graph.outputs),
                 tuple(graph.input_batch_axes), tuple(graph.output_batch_axes))
        if not (full or FULL) and graph is self._graph and state == self._state:
            return  # as it was when it passed
        changed = graph.take_changes()  # (None for a new graph: every node is new)
        if full or FULL or (self._state is not None and Graph.untracked_edits != self._state[1]):
            changed = None
        verify(graph, changed)
        self._graph, self._state = graph, state
