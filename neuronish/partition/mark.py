"""Stage 1: decide, node by node, whether the device can run it, and if not, why.

A node can run on the device unless the first of these rules that applies
says otherwise (the order is the order of `Reason`):

1. PLACEHOLDER: graph inputs (Placeholder, PlaceholderWithDefault) stay on
   TensorFlow; they are what the caller feeds.
2. EXCLUDED: the caller excluded the node by name (`exclude_nodes`), e.g.
   after the compiler rejected it; the caller's reason is kept.
3. NO_FUSE: the node's name or op type is in `no_fuse_ops`.
4. DTYPE: an input or output has a dtype the device cannot hold (string,
   resource, variant, complex, bfloat16, quantized, ...).
5. SHAPE: an input or output shape is not fully known at the compile batch
   (the device compiles static shapes).
6. STATEFUL: the op is stateful (random numbers, variables, queues,
   asserts): compiling it would freeze one result or drop its side effect.
7. UNSUPPORTED_OP: `neuronish-cc list-operators` does not list the op type.
8. UNSUPPORTED_ATTRS: the compiler refuses the node's attribute values (a
   dtype, data_format, padding... its lowering's `supports` check), as
   `neuronish-cc list-operators --json --check GRAPH` reports before anything
   is compiled; the detail is the compiler's own reason.
9. SHAPE_VALUE: the value is computed from tensor shapes (see `values`) but
   the device cannot compute all of it (an input stays on TensorFlow).  On
   the device it would be frozen at the compile batch; on TensorFlow it
   follows the batch.

`force_fuse_ops` (node names or op types) overrides rule 7 and the
cluster-size check of `drop_small`, nothing else: a forced node still stays
on TensorFlow for rules 1-6, 8 and 9, so no_fuse_ops beats force_fuse_ops.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from tensorflow.core.framework import graph_pb2

from neuronish import contracts
from neuronish.graph import Graph, PartitionError, canonical, is_stateful, producer
from neuronish.shape_inference.shapes import TensorInfo
from neuronish.shape_inference.values import device_static_nodes, static_values

DEVICE_DTYPES = frozenset(contracts.DEVICE_DTYPES)
INPUT_OPS = contracts.INPUT_OPS


class Reason(Enum):
    """Why a node stays on TensorFlow, in the order the rules are checked."""

    PLACEHOLDER = "graph input: Placeholders stay on TensorFlow"
    EXCLUDED = "excluded by the caller"
    NO_FUSE = "listed in no_fuse_ops"
    DTYPE = "has a dtype the device cannot hold"
    SHAPE = "shape not fully known at the compile batch size"
    STATEFUL = "stateful op"
    UNSUPPORTED_OP = "op type not supported by neuronish-cc"
    UNSUPPORTED_ATTRS = "attribute values neuronish-cc refuses"
    SHAPE_VALUE = "shape-derived value the device cannot compute whole"
    BATCH_MIXING = "mixes samples across the batch (kept off so the device keeps a dynamic batch)"


@dataclass(frozen=True)
class NodeMark:
    """The verdict on one node."""

    name: str
    op: str
    reason: Reason | None = None  # None: the device can run it
    detail: str = ""  # what about this node triggered `reason`
    forced: bool = False  # named by force_fuse_ops (and not kept off by rules 1-6)

    @property
    def supported(self) -> bool:
        return self.reason is None

    def describe(self) -> str:
        """"name (Op): reason: detail" for reports and errors."""
        if self.reason is None:
            return f"{self.name} ({self.op}): runs on the device"
        text = f"{self.name} ({self.op}): {self.reason.value}"
        return f"{text}: {self.detail}" if self.detail else text


@dataclass(frozen=True)
class Marking:
    """Every node's verdict, in GraphDef order."""

    nodes: dict[str, NodeMark]
    # no_fuse_ops / force_fuse_ops entries that name neither a node nor an op
    # type of this graph (a typo, or an op the model does not use).
    unmatched_selectors: tuple[str, ...] = ()

    def supported(self, name: str) -> bool:
        return self.nodes[name].reason is None

    @property
    def unsupported(self) -> dict[str, NodeMark]:
        """Nodes that stay on TensorFlow, with why."""
        return {n: m for n, m in self.nodes.items() if m.reason is not None}


_LOOP_OPS = frozenset({"While", "StatelessWhile"})
_LOOP_HINT = ("a loop (tf.while_loop and its TensorLists) whose trip count the input shapes do "
              "not fix, or that rewrites/unroll.py could not rewrite: the device runs no "
              "loops, so it stays on TensorFlow (loops of a fixed count, as Keras LSTM, GRU "
              "and SimpleRNN over fixed-length sequences, are unrolled and compile whole)")
_LIST_HINT = ("a TensorList (a TensorArray written outside any loop) whose positions or "
              "element shapes the input shapes do not fix, so rewrites/unroll.py could not "
              "rewrite it into tensors: it stays on TensorFlow")


def mark(
    graph: Graph | graph_pb2.GraphDef,
    infos: Mapping[str, TensorInfo],
    supported_ops: Collection[str],
    no_fuse_ops: Iterable[str] = (),
    force_fuse_ops: Iterable[str] = (),
    *,
    exclude_nodes: Mapping[str, str] | None = None,
    device_dtypes: Collection[str] = DEVICE_DTYPES,
    refused: Mapping[str, str] | None = None,
    batch_mixing: Mapping[str, str] | None = None,
    fetches: Iterable[str] | None = None,
) -> Marking:
    """Mark every node of `graph` supported or not (see the module docstring).

    `infos` is `shapes.infer` at the compile batch.  `no_fuse_ops` and
    `force_fuse_ops` hold node names or op types.  `exclude_nodes` maps node
    names to the reason they must stay on TensorFlow; a name not in the graph
    raises PartitionError. `refused` maps node names to the compiler's reason for
    refusing their attribute values (`CompilerSupport.refused`).
    `batch_mixing` maps nodes that
    mix samples across the batch to why (the partitioner's own second look).
    """
    graph = Graph.of(graph)
    graph_def = graph.graph_def
    refused = refused or {}
    no_fuse, force = set(no_fuse_ops), set(force_fuse_ops)
    exclude = dict(exclude_nodes or {})
    missing = sorted(set(exclude) - set(graph.nodes))
    if missing:
        raise PartitionError(f"exclude_nodes names {missing}, which are not nodes of the graph; "
                             f"pass names of the outer graph's nodes")
    known = set(graph.nodes) | {n.op for n in graph_def.node}
    unmatched = tuple(sorted((no_fuse | force) - known))

    # Rules 4 and 5 look at the outputs something uses: a node's first, the ones read or
    # fetched. TensorFlow leaves FusedBatchNormV3's reserve_space_3 (undefined in
    # inference) without a shape, and nothing reads it; without `fetches`, every output
    # of a node nothing reads counts as fetched.
    fetched = None if fetches is None else {canonical(f) for f in fetches}

    def used(t: str) -> bool:
        return (t.endswith(":0") or bool(graph.readers(t))
                or (t in fetched if fetched is not None else
                    not graph.consumers(producer(t))))

    has_loops = any(n.op in _LOOP_OPS for n in graph_def.node)
    marks: dict[str, NodeMark] = {}
    for node in graph_def.node:
        tensors = [*graph.data_inputs[node.name],
                   *(t for t in _outputs(node.name, infos) if used(t))]
        reason, detail = _first_rule(node.name, node.op, tensors, infos, exclude, no_fuse,
                                     device_dtypes)
        if node.op in _LOOP_OPS or node.op.startswith("TensorList"):
            hint = _LOOP_HINT if has_loops else _LIST_HINT
            detail = f"{detail}; {hint}" if detail else hint
        forced = reason is None and (node.name in force or node.op in force)
        if reason is None and not forced and node.op not in supported_ops:
            reason = Reason.UNSUPPORTED_OP
        elif reason is None and node.name in refused:
            reason, detail, forced = Reason.UNSUPPORTED_ATTRS, refused[node.name], False
        if reason is None and node.name in (batch_mixing or {}):
            reason, detail, forced = Reason.BATCH_MIXING, batch_mixing[node.name], False
        marks[node.name] = NodeMark(node.name, node.op, reason, detail, forced)
    _keep_shape_values_whole(graph, marks)
    return Marking(marks, unmatched)


def _keep_shape_values_whole(graph: Graph, marks: dict[str, NodeMark]) -> None:
    """Rule 8: a shape-derived value the device cannot compute from scratch stays on TF."""
    shape_values = static_values(graph).shape
    device_static = device_static_nodes(graph, lambda n: marks[n].reason is None)
    for name in graph.order:  # topological, so a blocker upstream is named first
        mark_ = marks[name]
        if mark_.reason is not None or name not in shape_values or name in device_static:
            continue
        blocker = next(producer(t) for t in graph.data_inputs[name]
                       if producer(t) not in device_static)
        detail = (f"computed from tensor shapes, but {blocker} ({graph.nodes[blocker].op}) "
                  f"stays on TensorFlow")
        marks[name] = NodeMark(name, mark_.op, Reason.SHAPE_VALUE, detail)


def _first_rule(
    name: str,
    op: str,
    tensors: list[str],
    infos: Mapping[str, TensorInfo],
    exclude: Mapping[str, str],
    no_fuse: Collection[str],
    device_dtypes: Collection[str],
) -> tuple[Reason | None, str]:
    """The first of rules 1-6 that keeps the node on TensorFlow, with the detail."""
    if op in INPUT_OPS:
        return Reason.PLACEHOLDER, ""
    if name in exclude:
        return Reason.EXCLUDED, exclude[name]
    if name in no_fuse or op in no_fuse:
        return Reason.NO_FUSE, f"by {'name' if name in no_fuse else 'op type'}"
    bad = [t for t in tensors if infos[t].dtype not in device_dtypes]
    if bad:
        return Reason.DTYPE, ", ".join(f"{t} is {infos[t].dtype}" for t in bad)
    bad = [t for t in tensors if not infos[t].fully_known]
    if bad:
        return Reason.SHAPE, ", ".join(f"{t} has shape {_shape_text(infos[t])}" for t in bad)
    if is_stateful(op):
        return Reason.STATEFUL, "its result or side effect differs from call to call"
    return None, ""


def _outputs(name: str, infos: Mapping[str, TensorInfo]) -> list[str]:
    outputs, k = [], 0
    while f"{name}:{k}" in infos:
        outputs.append(f"{name}:{k}")
        k += 1
    return outputs


def _shape_text(info: TensorInfo) -> str:
    if info.shape is None:
        return "<unknown rank>"
    return "[" + ", ".join("?" if d is None else str(d) for d in info.shape) + "]"


# -- what the compiler accepts ---------------------------------------------------------------

_SUPPORTED_CACHE: dict[tuple[str, ...], frozenset[str]] = {}


@dataclass(frozen=True)
class CompilerSupport:
    """What the compiler accepts: its op types, and the nodes of one graph whose
    attribute values it refuses (node -> its reason)."""

    ops: frozenset[str]
    refused: Mapping[str, str] = field(default_factory=dict)


class _CompilerExit(PartitionError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _run_compiler(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PartitionError(
            f"could not run {shlex.join(argv)}: {e}; install neuronish (which provides "
            f"neuronish-cc) in this environment or set NEURONISH_CC to the compiler command"
        ) from None
    if done.returncode != 0:
        raise _CompilerExit(f"{shlex.join(argv)} exited with status {done.returncode}:\n"
                            f"{done.stderr.strip()}", done.returncode)
    return done.stdout


def supported_ops(compiler_cmd: list[str] | None = None) -> frozenset[str]:
    """The TF op types the compiler supports: `<cmd> list-operators --framework TENSORFLOW`.

    Runs the compiler as a subprocess (never in-process) once per command and
    caches the answer.  Raises PartitionError if it cannot be run or fails.
    """
    cmd = tuple(compiler_cmd or contracts.default_compiler())
    if cmd in _SUPPORTED_CACHE:
        return _SUPPORTED_CACHE[cmd]
    argv = [*cmd, "list-operators", "--framework", "TENSORFLOW"]
    ops = frozenset(line.strip() for line in _run_compiler(argv).splitlines() if line.strip())
    if not ops:
        raise PartitionError(f"{shlex.join(argv)} listed no operators")
    _SUPPORTED_CACHE[cmd] = ops
    return ops


def compiler_support(graph_def: graph_pb2.GraphDef,
                     compiler_cmd: list[str] | None = None) -> CompilerSupport:
    """The compiler's op types and its verdict on every node's attribute values, in one
    `<cmd> list-operators --framework TENSORFLOW --json --check NODES.pb` process.

    NODES.pb holds each node's name, op type and attributes only (no inputs, no
    constant values): attribute checks read nothing else, and weights would only
    cost time.
    """
    cmd = [*(compiler_cmd or contracts.default_compiler())]
    nodes = graph_pb2.GraphDef()
    for node in graph_def.node:
        copy = nodes.node.add(name=node.name, op=node.op)
        for key, value in node.attr.items():
            if not (node.op == "Const" and key == "value"):
                copy.attr[key].CopyFrom(value)
    with tempfile.TemporaryDirectory(prefix="neuronish-check-") as tmp:
        path = Path(tmp) / "nodes.pb"
        path.write_bytes(nodes.SerializeToString())
        argv = [*cmd, "list-operators", "--framework", "TENSORFLOW", "--json",
                "--check", str(path)]
        try:
            out = _run_compiler(argv)
        except _CompilerExit as e:
            if e.status != 2:
                raise
            # A compiler without --json/--check (bad usage): its op list still works, and
            # what it refuses is found by compiling, as before.
            return CompilerSupport(supported_ops(cmd))
    try:
        answer = json.loads(out)
        ops, refused = frozenset(answer["operators"]), dict(answer.get("refused", {}))
    except (ValueError, KeyError, TypeError) as e:
        raise PartitionError(f"{shlex.join(argv)} did not print the JSON it should "
                             f"({e}): {out[:200]!r}") from None
    return CompilerSupport(ops, refused)
