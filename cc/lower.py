"""TF GraphDef → IR: pick the nodes the outputs need, check them all, lower them.

All problems are collected before anything is reported, so one compile names
everything that stands in the way: io-config tensors that do not exist or do not
fit, op types the registry lacks, attribute values a lowering refuses, operands
that must be constant but are computed. A node whose inputs come from a node
that already failed is not lowered (its problem is explained upstream), but it
is still checked for its op type and attributes.
"""

from __future__ import annotations

import traceback

import numpy as np

from neuronish.common.nogc import paused_gc
from neuronish.runtime.signature import TensorSignature

from . import batch, ops  # noqa: F401  (ops registers every lowering)
from .errors import CompilerError, InvalidGraph, NodeError, NodeProblem, UnsupportedNodes
from .graphdef import TensorRef, TFNode
from .interpret import fold_node
from .ioconfig import IOConfig
from .ir import Graph, TensorType, Value
from .ops.registry import LOWERINGS, LowerCtx, _output_types

_NAMES_HINT = ("tensor names are '<node name>:<output index>'; check the spelling against "
               "the GraphDef's node names")


def tf_output_count(node: TFNode) -> int | None:
    """How many outputs the TF node has, where the node alone says so (None: unknown
    without lowering it). Used to check io-config inputs, which are never lowered."""
    if node.op in ("Placeholder", "PlaceholderWithDefault", "Const"):
        return 1
    if node.op == "NoOp":
        return 0
    if node.op == "IdentityN":
        types = node.get("T")
        return len(types) if isinstance(types, list) else None
    count = {"Split": node.get("num_split"), "SplitV": node.get("num_split"),
             "Unpack": node.get("num")}.get(node.op)
    return count if isinstance(count, int) else None


def _outputs_text(node: str, count: int) -> str:
    return ", ".join(f"{node}:{i}" for i in range(count)) or "none"


class _Problems:
    """Problems in the order a reader wants them: io-config first, then nodes in
    topological order; and the nodes whose outputs cannot be had."""

    def __init__(self) -> None:
        self.io: list[NodeProblem] = []
        self.nodes: list[NodeProblem] = []
        self.failed: set[str] = set()  # nodes whose outputs cannot be had

    def add_io(self, node: str, op: str, reason: str, hint: str) -> None:
        self.io.append(NodeProblem(node, op, reason, hint))

    def add(self, node: TFNode, reason: str, hint: str = "") -> None:
        self.nodes.append(NodeProblem(node.name, node.op, reason, hint))
        self.failed.add(node.name)

    def all(self, order: list[TFNode]) -> list[NodeProblem]:
        position = {n.name: i for i, n in enumerate(order)}
        return self.io + sorted(self.nodes, key=lambda p: position.get(p.node, -1))


def _check_inputs(by_name: dict[str, TFNode], io: IOConfig,
                  problems: _Problems) -> tuple[dict[TensorRef, TensorSignature], set[str]]:
    """The io-config's inputs that fit the graph, and every node the io-config feeds
    (the walk stops there, well fed or not)."""
    fed: dict[TensorRef, TensorSignature] = {}
    fed_nodes: set[str] = set()
    for p in io.problems:
        ref = TensorRef.parse(p.tensor)
        node = by_name.get(ref.node)
        fed_nodes.add(ref.node)
        problems.failed.add(ref.node)
        problems.add_io(ref.node, node.op if node else "", p.reason, p.hint)
    for spec in io.inputs:
        ref = TensorRef.parse(spec.name)
        node = by_name.get(ref.node)
        fed_nodes.add(ref.node)
        if node is None:
            problems.add_io(ref.node, "", f"io-config input {spec.name!r} names node "
                            f"{ref.node!r}, which does not exist in the graph", _NAMES_HINT)
            continue
        count = tf_output_count(node)
        if count is not None and ref.index >= count:
            problems.failed.add(ref.node)
            problems.add_io(ref.node, node.op, f"io-config input {spec.name!r}: node "
                            f"{ref.node!r} ({node.op}) has {count} output(s) "
                            f"({_outputs_text(ref.node, count)}), so there is no output "
                            f"{ref.index}", f"feed {_outputs_text(ref.node, count)} instead"
                            if count else "feed a node that has outputs")
            continue
        if ref in fed:  # "x:0" and "x:00" are one tensor
            problems.add_io(ref.node, node.op, f"io-config inputs {fed[ref].name!r} and "
                            f"{spec.name!r} are the same tensor", "feed it once")
            continue
        if (reason := _check_feed(node, spec.shape, spec.dtype)) is not None:
            problems.add_io(node.name, node.op, reason, "fix the io-config")
        fed[ref] = spec
    for name in io.outputs:
        ref = TensorRef.parse(name)
        if ref.node not in by_name:
            problems.add_io(ref.node, "", f"io-config output {name!r} names node {ref.node!r}, "
                            "which does not exist in the graph", _NAMES_HINT)
    return fed, fed_nodes


def _needed(by_name: dict[str, TFNode], io: IOConfig, fed: set[str],
            problems: _Problems) -> list[TFNode]:
    """Nodes the outputs depend on through data edges, in topological order; the
    walk stops at nodes the io-config feeds. A node reading a node that does not
    exist is recorded as a problem."""
    order: list[TFNode] = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    roots = [r.node for r in map(TensorRef.parse, io.outputs) if r.node in by_name]
    for root in roots:
        stack = [(root, False)]
        while stack:
            name, expanded = stack.pop()
            if expanded:
                state[name] = 2
                order.append(by_name[name])
                continue
            if state.get(name) == 2:
                continue
            if state.get(name) == 1:
                raise InvalidGraph(f"the graph has a cycle through node {name!r}")
            state[name] = 1
            stack.append((name, True))
            if name in fed:
                continue
            for ref in by_name[name].inputs:
                if ref.node not in by_name:
                    problems.add(by_name[name], f"reads {ref}, but no node {ref.node!r} exists "
                                 "in the GraphDef", "the GraphDef is incomplete: export it "
                                 "again, or feed that tensor in the io-config")
                elif state.get(ref.node) != 2:
                    stack.append((ref.node, False))
    return order


def _check_feed(node: TFNode, spec_shape: tuple[int, ...], spec_dtype: str) -> str | None:
    if node.op != "Placeholder":
        return None
    dtype = node.get("dtype")
    if dtype != spec_dtype:
        return f"the Placeholder has dtype {dtype}, the io-config says {spec_dtype}"
    shape = node.get("shape")
    if shape is not None:  # None: unknown rank, anything fits
        if len(shape) != len(spec_shape) or any(
                d >= 0 and d != s for d, s in zip(shape, spec_shape)):
            return (f"the Placeholder has shape {list(shape)}, the io-config gives "
                    f"{list(spec_shape)} (only unknown dims, -1, may be filled in)")
    return None


def _check_ops(order: list[TFNode], fed_nodes: set[str], problems: _Problems) -> None:
    """Op types and attribute values, for every needed node (even below a failure).

    A lowering's `check` reads the node's attributes alone, so its verdict is kept by op
    type and attributes (100,000 alike Relus are checked once); a Const's tensor-valued
    attribute is not keyed, so Consts are checked one by one (a cheap dtype test)."""
    verdicts: dict[tuple, object] = {}
    for node in order:
        if node.name in fed_nodes:
            continue
        op = node.op
        lowering = LOWERINGS.get(op)
        if op == "Placeholder":
            problems.add(node, "this input is not fed",
                         f"add '{node.name}:0' to the io-config inputs")
            continue
        if lowering is None:
            problems.add(node, f"op type {op} is not supported by the device",
                         "keep this node on TensorFlow (the partitioner does), or rewrite the "
                         "model with supported ops")
            continue
        attrs = node.attr_key() if op != "Const" else None
        if attrs is None:
            reason = lowering.check(node)
        else:
            key = (op, attrs)
            known = verdicts.get(key, _UNCHECKED)
            reason = lowering.check(node) if known is _UNCHECKED else known
            verdicts[key] = reason
        if reason is not None:
            problems.add(node, str(reason))


_UNCHECKED = object()


def _check_outputs(by_name: dict[str, TFNode], io: IOConfig, values: dict[TensorRef, Value],
                   output_counts: dict[str, int], problems: _Problems) -> None:
    for name in io.outputs:
        ref = TensorRef.parse(name)
        node = by_name.get(ref.node)
        if node is None or ref.node in problems.failed or ref in values:
            continue  # reported already, explained upstream, or fine
        count = output_counts.get(ref.node, tf_output_count(node))
        if count is None:  # a fed node of unknown arity: only its fed tensors exist
            have = sorted(str(r) for r in values if r.node == ref.node)
            reason = (f"io-config output {name!r}: the io-config feeds node {ref.node!r} "
                      f"({node.op}) at {', '.join(have)} only")
            hint = f"ask for {', '.join(have)}, or feed {name} too"
        else:
            reason = (f"io-config output {name!r}: node {ref.node!r} ({node.op}) has {count} "
                      f"output(s) ({_outputs_text(ref.node, count)})")
            hint = f"ask for one of {_outputs_text(ref.node, count)}" if count else \
                "ask for the output of a node that has one"
        problems.add_io(ref.node, node.op, reason, hint)


def _check_output_batch_axes(io: IOConfig, values: dict[TensorRef, Value],
                             problems: _Problems) -> None:
    """A batch axis the io-config gives an output must be one of its axes (the rank is
    known only once the graph is lowered)."""
    for name, axis in zip(io.outputs, io.output_batch_axes):
        ref = TensorRef.parse(name)
        value = values.get(ref)
        if axis is None or value is None or -1 <= axis < len(value.shape):
            continue
        problems.add_io(ref.node, "", f"io-config output {name!r} has batch "
                        f"axis {axis}, outside its shape {list(value.shape)}",
                        f"use -1 (none) or an axis in [0, {len(value.shape)})")


def lower(nodes: list[TFNode], io: IOConfig, notes: list[str] | None = None) -> Graph:
    """Lower the part of `nodes` that `io.outputs` needs into an IR graph (`_lower`)."""
    with paused_gc():
        return _lower(nodes, io, notes)


def _lower(nodes: list[TFNode], io: IOConfig, notes: list[str] | None) -> Graph:
    """Lower the part of `nodes` that `io.outputs` needs into an IR graph.

    Raises `UnsupportedNodes` listing every problem found, io-config and graph alike. A
    graph that mixes samples across the batch is refused naming the nodes when the
    io-config gives batch axes; when it left them to their default, it is compiled for
    the fixed batch instead (every axis -1), said in `notes`."""
    by_name = {n.name: n for n in nodes}
    problems = _Problems()
    fed, fed_nodes = _check_inputs(by_name, io, problems)
    order = _needed(by_name, io, fed_nodes, problems)
    _check_ops(order, fed_nodes, problems)

    values: dict[TensorRef, Value] = {}
    inputs: list[Value] = []
    for ref, spec in fed.items():
        v = Value(TensorType(spec.shape, spec.dtype), name=spec.name)
        values[ref] = v
        inputs.append(v)

    ctx = LowerCtx(values, fold_node)
    output_counts: dict[str, int] = {}
    for node in order:
        if node.name in fed_nodes or node.name in problems.failed:
            continue
        if any(r.node in problems.failed for r in node.inputs):
            problems.failed.add(node.name)  # already explained by the node it depends on
            continue
        try:
            outs = _lower_node(ctx, node)
        except NodeError as e:
            problems.add(node, e.reason, e.hint)
            continue
        output_counts[node.name] = len(outs)
        for i, v in enumerate(outs):
            values[TensorRef(node.name, i)] = v
    _check_outputs(by_name, io, values, output_counts, problems)
    _check_output_batch_axes(io, values, problems)
    fixed_batch = []
    if not (problems.io or problems.nodes):  # (`all` sorts: only when there are some)
        mixing = _batch_problems(order, fed, fed_nodes, values, output_counts, io)
        if any(spec.name in io.given_batch_axes for spec in fed.values()):
            problems.nodes += mixing
        else:
            fixed_batch = mixing
    if problems.io or problems.nodes:
        raise UnsupportedNodes(problems.all(order))

    outputs = [values[TensorRef.parse(name)] for name in io.outputs]
    graph = Graph(inputs, outputs, ctx.nodes, [s.batch_axis for s in io.inputs])
    # Every node came from `LowerCtx.emit`, which type-checked it as it was made (the
    # verifier's inference, and the device's size limits) and nothing edits it since:
    # the pipeline's verifier starts from here (cc/verify.py).
    graph.take_changes()
    graph.output_batch_axes = _output_batch_axes(graph, io)
    if fixed_batch:
        graph.input_batch_axes = [-1] * len(graph.inputs)
        graph.output_batch_axes = [-1] * len(graph.outputs)
        if notes is not None:
            notes.append(f"compiled for a fixed batch (calls of another batch size are refused):"
                         f" {fixed_batch[0].node} ({fixed_batch[0].op}) "
                         f"{fixed_batch[0].reason}" + (f", and {len(fixed_batch) - 1} more node(s)"
                                                       if len(fixed_batch) > 1 else "") +
                         "; give the inputs' batch axes in the io-config to have them named "
                         "as errors instead")
    return graph


def _lower_node(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """One node's lowering; NodeError if it cannot be lowered."""
    ctx.node = node
    try:
        return LOWERINGS[node.op].fn(ctx, node)
    except CompilerError:
        raise
    except Exception as e:  # a bug in a lowering: say where, keep the trace
        raise CompilerError(
            f"internal compiler error while lowering node {node.name!r} ({node.op}): "
            f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            "Please report this with the GraphDef.") from e


class _ConstReads(LowerCtx):
    """A lowering context that records which inputs each lowering takes as compile-time
    constants (its shape operands), for the batch check."""

    def __init__(self, values: dict[TensorRef, Value]):
        super().__init__(values, fold_node)
        self.reads: dict[str, set[int]] = {}

    def const_input(self, node: TFNode, i: int, what: str):  # noqa: ANN201 (as the base)
        self.reads.setdefault(node.name, set()).add(i)
        return super().const_input(node, i, what)

    def emit(self, kind: str, inputs: list[Value], attrs: dict | None = None) -> list[Value]:
        """The base's outputs, checked and folded alike, but a computed result is a bare
        typed Value: the batch check reads only types and constant values at this batch,
        and no lowering reads a producer, so no IR node (with its use lists) is made just
        to be dropped. (The AddN of 100,000 inputs emits 99,999 adds here.) The fold test
        stops at the first computed input, so a weight after it is not counted as looked at
        (`_WatchedConst`); the base is asked only when every input is a constant."""
        if inputs and all(v.is_const for v in inputs):
            return super().emit(kind, inputs, attrs)
        return [Value(t) for t in _output_types(kind, [v._type for v in inputs], attrs or {})]


def _batch_problems(order: list[TFNode], fed: dict[TensorRef, TensorSignature],
                    fed_nodes: set[str], values: dict[TensorRef, Value],
                    output_counts: dict[str, int], io: IOConfig) -> list[NodeProblem]:
    """The nodes that would make a batch split into chunks give other numbers
    (`batch.check`), found by lowering the graph again at the compiled batch + 1.

    One walk: each node is lowered at batch + 1 and then judged (`batch.start`'s walk),
    so a node alike in everything the lowering and the judgement read to one already
    done (`_alike_key`: a chain of 100,000 Relus, 100,000 Muls each by its own weight)
    takes that node's outcome from one lookup instead of being lowered and judged."""
    batches = {spec.shape[spec.batch_axis] for spec in fed.values() if spec.batch_axis >= 0}
    if len(batches) != 1:
        return []  # nothing is batched (or the io-config already disagrees with itself)
    b = batches.pop()
    nxt: dict[TensorRef, Value] = {}
    for ref, spec in fed.items():
        shape = list(spec.shape)
        if spec.batch_axis >= 0:
            shape[spec.batch_axis] = b + 1
        nxt[ref] = Value(TensorType(tuple(shape), spec.dtype), name=spec.name)
    # Nodes no fed tensor reaches are the same at any batch: reuse them (weights).
    reached = set(fed_nodes)
    ctx = _ConstReads(nxt)
    failed: dict[str, str] = {}
    # Lowerings already made at this batch, by what they depend on (`_same_lowering_key`):
    # a chain of 100k alike nodes is lowered once here. Only successes are kept, so every
    # failure is found, and worded, by the lowering itself.
    seen: dict[tuple, tuple[list[tuple[TensorType, object]], frozenset[int]]] = {}
    # ...and, for lowerings that never looked at a weight's values (`_WatchedConst`), by
    # the weights' types instead: 100k Muls, each by its own constant, are lowered once.
    seen_typed: dict[tuple, tuple[list[tuple[TensorType, object]], frozenset[int]]] = {}
    # Whole outcomes (types at batch + 1, inputs read as constants, facts) of nodes whose
    # lowering and judgement read nothing `_alike_key` leaves out.
    alike: dict[tuple, tuple[list[TensorType], frozenset[int], list[batch.Fact]]] = {}
    used = {r for node in order for r in node.inputs} | {TensorRef.parse(n) for n in io.outputs}
    at_next = _facts(nxt, ctx.reads, failed, output_counts)  # filled in as the walk goes
    shapes_next, values_next = at_next.shapes, at_next.values
    walk = batch.start({ref: spec.batch_axis for ref, spec in fed.items()}, used, b,
                       _facts(values, {}, {}, output_counts), at_next,
                       {op: lowering.batch for op, lowering in LOWERINGS.items()})
    facts = walk.facts
    for node in order:
        if node.name in fed_nodes:
            continue
        refs = [TensorRef(node.name, k) for k in range(output_counts.get(node.name, 0))]
        producers = [r.node for r in node.inputs]  # (set tests on it, not generators)
        if reached.isdisjoint(producers):
            for r in refs:
                v = values[r]
                nxt[r] = _WatchedConst(v.type, data=v.data, name=v.name) if v.is_const else v
                shapes_next[r], values_next[r] = v._type.shape, v.data
            walk.visit(node, refs)
            continue
        reached.add(node.name)
        whole = _alike_key(node, refs, values, nxt, facts, used)
        hit_whole = alike.get(whole) if whole is not None else None
        if hit_whole is not None:
            types, reads, out_facts = hit_whole
            for r, t, f in zip(refs, types, out_facts):
                nxt[r] = Value(t)
                shapes_next[r], values_next[r] = t.shape, None
                facts[r] = f
            if reads:
                ctx.reads[node.name] = set(reads)
            continue
        looked = _lower_next(node, refs, ctx, nxt, failed, seen, seen_typed)
        for r in refs:
            v = nxt.get(r)
            if v is not None:
                shapes_next[r], values_next[r] = v._type.shape, v.data
        walk.visit(node, refs)
        if whole is not None and walk.pure and not looked and node.name not in failed and \
                all([nxt[r].data is None for r in refs]):
            alike[whole] = ([nxt[r]._type for r in refs],
                            frozenset(ctx.reads.get(node.name, ())), [facts[r] for r in refs])
    outputs = [(TensorRef.parse(n), a) for n, a in zip(io.outputs, _declared_axes(io, values))]
    problems = walk.finish(outputs, order)
    for node in ctx.nodes:  # node <-> output cycles: freed now, not by a later collection
        node._outputs = []
    return problems


def _lower_next(node: TFNode, refs: list[TensorRef], ctx: _ConstReads,
                nxt: dict[TensorRef, Value], failed: dict[str, str], seen: dict,
                seen_typed: dict) -> bool:
    """Lower `node` at the compiled batch + 1 into `nxt` (or record in `failed` why it
    cannot be), from `seen`/`seen_typed` when a lowering alike was made already; whether
    the lowering looked at a weight's values."""
    if not failed.keys().isdisjoint([r.node for r in node.inputs]):
        failed[node.name] = "an input could not be computed at that batch"
        return False
    ins = [nxt.get(r) for r in node.inputs]
    typed = _same_lowering_key(node, ins, weights_by_type=True) \
        if _WatchedConst in map(type, ins) else None
    hit = seen_typed.get(typed) if typed is not None else None
    key = _same_lowering_key(node, ins) if hit is None else None
    if hit is None and key is not None:
        hit = seen.get(key)
    if hit is not None:
        outs, reads = hit
        for r, (t, data) in zip(refs, outs):
            nxt[r] = Value(t, data=data)
        if reads:
            ctx.reads[node.name] = set(reads)
        return False
    looks = _WatchedConst.looks
    try:
        lowered = _lower_node(ctx, node)
    except NodeError as e:
        failed[node.name] = e.reason
        return _WatchedConst.looks != looks
    for r, v in zip(refs, lowered):
        nxt[r] = v
    result = ([(v.type, v.data) for v in lowered], frozenset(ctx.reads.get(node.name, ())))
    if key is not None:
        seen[key] = result
    looked = _WatchedConst.looks != looks
    if typed is not None and not looked:
        seen_typed[typed] = result
    return looked


def _alike_key(node: TFNode, refs: list[TensorRef], values: dict[TensorRef, Value],
               nxt: dict[TensorRef, Value], facts: dict[TensorRef, batch.Fact],
               used: set[TensorRef]) -> tuple | None:
    """What a node's lowering at batch + 1 and its batch verdict read, when that is all
    types, facts and whether outputs are used: the op, the attributes, each input's fact
    and types at both batches (a weight's by type: an outcome is kept only if its
    lowering did not look at weights' values, nor its rule at any value), the output
    types at the compiled batch and which outputs something reads. None when an input is
    a compile-time value other than a weight, or is missing, or an output is a
    compile-time value."""
    attrs = node.attr_key()
    if attrs is None:
        return None
    parts = []
    for r in node.inputs:
        v, w = values.get(r), nxt.get(r)
        if v is None or w is None:
            return None
        # (shapes and dtypes, not TensorTypes: a dataclass's hash is Python code)
        t = w._type
        if type(w) is _WatchedConst:
            parts.append((facts.get(r), "weight", t.shape, t.dtype))
        elif v.data is not None or w.data is not None:
            return None
        else:
            parts.append((facts.get(r), v._type.shape, v._type.dtype, t.shape, t.dtype))
    for r in refs:
        v = values.get(r)
        if v is None or v.data is not None:  # (a compile-time output is judged by value)
            return None
        parts.append((v._type.shape, v._type.dtype, r in used))
    return (node.op, attrs, tuple(parts))


class _WatchedConst(Value):
    """A constant no fed tensor reaches (a weight), as the lowering at the compiled batch
    + 1 sees it: every look at its values (`data`, `is_const`) is counted, so a lowering
    that never looked is known to depend on its type alone."""

    __slots__ = ("_data",)
    looks = 0

    @property  # type: ignore[override]
    def data(self) -> np.ndarray | None:
        _WatchedConst.looks += 1
        return self._data

    @data.setter
    def data(self, value: np.ndarray | None) -> None:
        self._data = value


def _same_lowering_key(node: TFNode, ins: list[Value | None],
                       weights_by_type: bool = False) -> tuple | None:
    """What a lowering's results (output types, constant outputs, inputs read as
    constants) depend on: the op type, the attributes, each computed input's type and each
    constant input itself (by identity: the key holds the Value, so the id is not reused).
    None when that cannot be keyed cheaply (a tensor-valued attribute, a missing input).

    `weights_by_type`: weights (`_WatchedConst`) by their type instead, which a lowering
    that did not look at their values (`_WatchedConst.looks` unchanged) depends on alone."""
    attrs = node.attr_key()
    if attrs is None:
        return None
    parts = []
    for v in ins:
        if v is None:
            return None
        if weights_by_type and type(v) is _WatchedConst:
            parts.append(("weight", v.type))
            continue
        if v.is_const:
            parts.append(("const", id(v), v))
            continue
        shape = v.type.shape
        if type(shape) is not tuple or any(type(d) is not int for d in shape):
            return None
        parts.append((shape, v.type.dtype))
    return (node.op, attrs, tuple(parts))


def _facts(values: dict[TensorRef, Value], reads: dict[str, set[int]],
           failed: dict[str, str], output_counts: dict[str, int]) -> batch.Lowered:
    return batch.Lowered({r: v._type.shape for r, v in values.items()},  # (not the property)
                         {r: v.data for r, v in values.items()}, reads, failed, output_counts)


def _declared_axes(io: IOConfig, values: dict[TensorRef, Value]) -> list[int]:
    """Each output's batch axis as the executable will record it."""
    batches = {s.shape[s.batch_axis] for s in io.inputs if s.batch_axis >= 0}
    return [_output_axis(values.get(TensorRef.parse(n)), given, batches)
            for n, given in zip(io.outputs, io.output_batch_axes)]


def _output_axis(v: Value | None, given: int | None, batches: set[int]) -> int:
    if given is not None:
        return given
    if v is not None and len(batches) == 1 and v.shape and v.shape[0] in batches \
            and not v.is_const:
        return 0
    return -1


def _output_batch_axes(graph: Graph, io: IOConfig) -> list[int]:
    """Given axes win; otherwise an output is batched on axis 0 when its first dim
    equals the batch of the batched inputs."""
    batches = {v.shape[a] for v, a in zip(graph.inputs, graph.input_batch_axes) if a >= 0}
    return [_output_axis(v, given, batches) for v, given in zip(graph.outputs,
                                                                io.output_batch_axes)]
