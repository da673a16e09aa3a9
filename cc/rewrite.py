"""Local rewrites declared as patterns, run by one worklist driver to a fixed point.

A pass that looks at a node and its neighbours and replaces a few of them is written
as rules: a `Pat` describing the values around the node (tinygrad's `UPat`, TVM's
dataflow patterns, written here afresh), and a function given the graph, the node and
what the pattern bound, which edits the graph through its API and says whether it
did. `rewrite(graph, rules)` runs them:

- every node is visited once in schedule order; a rule whose pattern matches and
  whose function returns True changed the graph;
- the nodes that edit touched (changed, inserted, or reading a retyped value), the
  producers of their inputs and the readers of their outputs go back on the worklist,
  so a rewrite that makes another possible is found without re-scanning the graph;
- the driver stops when the worklist is empty: a fixed point.

Each rewrite touches a bounded neighbourhood, so a run costs about the node count
times the rules tried per node, not the node count squared as a rescan-until-nothing-
changes loop with a rebuilt consumers map did (40 s for 20,000 nodes).

    ADD_OF_CONST = Pat("binary", fn="add", inputs=(Pat(name="x"), Pat.const(0.0)))
    rules = [Rule("add_zero", ADD_OF_CONST, lambda g, node, m: ...)]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from .ir import Graph, Node, Value

FLOATS = ("float32", "float64", "float16")


@dataclass(frozen=True)
class Pat:
    """What a value must be. Every field left as None matches anything.

    kind / fn      its producer's kind (a name or a tuple of names) and `attrs["fn"]`
    inputs         patterns for the producer's operands, in order
    commutative    for two operands: also try them swapped
    name           bind the value under this name; a name seen again must be the same
                   value (x * sigmoid(x))
    scalar         a one-element float constant equal to this (relative 1e-6)
    private        the value is read by exactly one operand and is not a graph output
    where          a last test of the value"""

    kind: str | tuple[str, ...] | None = None
    fn: str | tuple[str, ...] | None = None
    inputs: tuple[Pat, ...] | None = None
    commutative: bool = False
    name: str | None = None
    scalar: float | None = None
    private: bool = False
    where: Callable[[Value], bool] | None = None

    @staticmethod
    def const(value: float, name: str | None = None) -> Pat:
        return Pat(scalar=value, name=name)

    def match(self, graph: Graph, v: Value, bound: dict[str, Value] | None = None
              ) -> dict[str, Value] | None:
        """The names bound if `v` matches (a new dict), else None."""
        node = v.producer
        if node is not None:
            if self.fn is not None and not _is(node._attrs.get("fn"), self.fn):
                return None  # (the common miss, before any dict is made)
            if not bound and self.inputs is not None and self.kind is not None \
                    and not self._operands_may_match(node):
                return None  # (the next most common: an operand of the wrong kind)
        bound = dict(bound or {})
        return bound if self._match(graph, v, bound) else None

    def _match(self, graph: Graph, v: Value, bound: dict[str, Value]) -> bool:
        if self.name is not None and self.name in bound:
            return bound[self.name] is v
        if self.scalar is not None and not is_scalar(v, self.scalar):
            return False
        if self.private and (graph.use_count(v) != 1 or graph.is_output(v)):
            return False
        if self.kind is not None:
            node = v.producer
            if node is None or not _is(node.kind, self.kind):
                return False
            if self.fn is not None and not _is(node.attrs.get("fn"), self.fn):
                return False
            if self.inputs is not None and not self._match_inputs(graph, node, bound):
                return False
        if self.where is not None and not self.where(v):
            return False
        if self.name is not None:
            bound[self.name] = v
        return True

    def _operands_may_match(self, node: Node) -> bool:
        """False when no order of `node`'s operands can match `inputs`, judged by the
        kind and fn of each operand's producer alone (no dicts, no recursion): most nodes
        a pattern's kind admits fail right there. Operand patterns whose name occurs
        twice in the pattern are left to the full match (a bound name is checked by
        identity, before its kind)."""
        checks = self.__dict__.get("_operand_checks")
        if checks is None:
            checks = _operand_checks(self)
            object.__setattr__(self, "_operand_checks", checks)  # (a cache, not a field)
        operands = node._inputs
        if len(operands) != len(checks):
            return False
        if _producers_fit(checks, operands):
            return True
        return self.commutative and len(operands) == 2 and \
            _producers_fit(checks, (operands[1], operands[0]))

    def _match_inputs(self, graph: Graph, node: Node, bound: dict[str, Value]) -> bool:
        if len(node.inputs) != len(self.inputs):
            return False
        orders = [node.inputs]
        if self.commutative and len(node.inputs) == 2:
            orders.append(node.inputs[::-1])
        for operands in orders:
            trial = dict(bound)
            if all(p._match(graph, x, trial) for p, x in zip(self.inputs, operands)):
                bound.clear()
                bound.update(trial)
                return True
        return False


def _names(p: Pat, counts: dict[str, int]) -> dict[str, int]:
    if p.name is not None:
        counts[p.name] = counts.get(p.name, 0) + 1
    for q in p.inputs or ():
        _names(q, counts)
    return counts


def _operand_checks(p: Pat) -> tuple[tuple[object, object], ...]:
    """(kind, fn) each operand's producer must have, per operand pattern of `p` (None:
    not checked here)."""
    counts = _names(p, {})
    return tuple((q.kind, q.fn) if q.kind is not None and (q.name is None or counts[q.name] == 1)
                 else (None, None) for q in p.inputs or ())


def _producers_fit(checks: tuple[tuple[object, object], ...], operands: tuple[Value, ...]
                   ) -> bool:
    for (kind, fn), x in zip(checks, operands):
        if kind is None:
            continue
        node = x.producer
        if node is None or not (node.kind == kind if type(kind) is str else node.kind in kind):
            return False
        if fn is not None and not _is(node._attrs.get("fn"), fn):
            return False
    return True


def _is(got: object, want: str | tuple[str, ...]) -> bool:
    return got == want if isinstance(want, str) else got in want


def is_scalar(v: Value, want: float) -> bool:
    """`v` is a float constant holding `want` (any shape of ones, e.g. () or [1, 1])."""
    if not v.is_const or v.data.size != 1 or v.dtype not in FLOATS:
        return False
    got = float(np.asarray(v.data).reshape(()))
    return abs(got - want) <= 1e-6 * abs(want)


# A rewrite: the graph, the node whose output matched, the bound values -> changed?
Action = Callable[[Graph, Node, dict[str, Value]], bool]


@dataclass(frozen=True)
class Rule:
    """`pattern` is matched against the output of each node of a kind in `pattern.kind`
    (every node if the pattern names no kind); `action` does the rewrite."""

    name: str
    pattern: Pat
    action: Action


def rewrite(graph: Graph, rules: Iterable[Rule]) -> Graph:
    """Apply `rules` until none applies (see the module docstring)."""
    table = _RuleTable(list(rules))
    lookup = table.lookup
    # Only nodes some rule could match start on the worklist: a pass whose patterns name
    # kinds and fns this graph lacks costs one cheap look per node (a 200,000-node graph
    # ran every node through the loop below in each of ~13 rewrite passes).
    if table.anywhere:
        work: deque[Node] = deque([node for node in graph.nodes if lookup(node)])
    else:  # (a set test first: most nodes are of no kind the rules name)
        kinds = table.kinds
        work = deque([node for node in graph.nodes if node.kind in kinds and lookup(node)])
    if not work:
        return graph
    queued = set(work)
    journal: list[Node] = []
    graph.listeners.append(journal.append)
    try:
        while work:
            node = work.popleft()
            queued.discard(node)
            if node.graph is not graph:
                continue
            for rule in lookup(node):
                if len(node._outputs) != 1:
                    break
                bound = rule.pattern.match(graph, node._outputs[0])
                if bound is None or not rule.action(graph, node, bound):
                    journal.clear()
                    continue
                for touched in _neighbourhood(graph, journal):
                    if touched not in queued:
                        queued.add(touched)
                        work.append(touched)
                journal.clear()
                break  # this node is queued again if it is still there
    finally:
        graph.listeners.remove(journal.append)
    return graph


class _RuleTable:
    """The rules that can match a node, in the order given, by its kind and `fn`: a
    rule whose pattern names a kind is tried only on nodes of that kind, one naming an
    fn only on nodes with that fn (every node gets the rules that name neither)."""

    _OTHER = object()  # the key part of an fn that is not a string (no named fn equals it)

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self.anywhere = [r for r in rules if r.pattern.kind is None]
        self.kinds = {k for r in rules if r.pattern.kind is not None
                      for k in ((r.pattern.kind,) if isinstance(r.pattern.kind, str)
                                else r.pattern.kind)}
        self.table: dict[tuple[str, object], list[Rule]] = {}

    def lookup(self, node: Node) -> list[Rule]:
        fn = node._attrs.get("fn")
        key = (node.kind, fn if type(fn) is str else self._OTHER)
        found = self.table.get(key)
        if found is None:
            found = self.table[key] = self._select(node.kind, key[1])
        return found

    def _select(self, kind: str, fn: object) -> list[Rule]:
        if kind not in self.kinds:
            candidates = self.anywhere
        else:
            candidates = [r for r in self.rules if r.pattern.kind is None
                          or _is(kind, r.pattern.kind)]
        return [r for r in candidates if r.pattern.fn is None
                or (fn is not self._OTHER and _is(fn, r.pattern.fn))]


def _neighbourhood(graph: Graph, touched: list[Node]) -> list[Node]:
    """The touched nodes still in the graph, the producers of their inputs and the readers
    of their outputs: the nodes whose matches an edit may have changed."""
    out: dict[Node, None] = {}
    for node in touched:
        for v in node.inputs:
            if v.producer is not None and v.producer.graph is graph:
                out[v.producer] = None
        if node.graph is not graph:  # (removed)
            continue
        out[node] = None
        for o in node.outputs:
            for reader in graph.readers(o):
                out[reader] = None
    return list(out)
