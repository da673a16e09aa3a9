"""Unroll loops whose trip count is fixed by shapes (Keras LSTM, GRU, SimpleRNN).

The device runs no loops. A functional `While` (what `tf.while_loop` and Keras RNN layers
without `unroll=True` leave in a frozen graph) whose condition reads only values fixed by
constants and tensor shapes runs the same number of times for every input of the compile
shape. Such a loop is replaced by that many copies of its body, each reading the previous
copy's loop variables, and a `IdentityN` of the same name passing on the last ones. The
TensorLists the loop reads and writes (a TensorArray over time steps) then become plain
tensors: `TensorListFromTensor` + `TensorListGetItem(i)` a `GatherV2` of row i,
`TensorListReserve` + `TensorListSetItem(i)` + `TensorListStack` a `Pack` of the items.

Anything this cannot prove or rewrite (a trip count that depends on the data, more than
`MAX_STEPS` iterations, a TensorList used otherwise, a body TensorFlow cannot rebuild)
leaves the graph as it was: the loop stays on TensorFlow and the report says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2

from neuronish.graph import (
    Graph,
    PartitionError,
    canonical,
    control_refs,
    data_refs,
    function_body,
    is_control,
    parse_input,
    producer,
)
from neuronish.shape_inference.shapes import batched_inputs, infer, placeholder_name
from neuronish.shape_inference.values import static_values

LOOP_OPS = frozenset({"While", "StatelessWhile"})
MAX_STEPS = 512


class _CannotUnroll(Exception):
    pass


def unroll_loops(graph: Graph, input_shapes: Mapping[str, Sequence[int]],
                 fetches: Sequence[str] = ()) -> bool:
    """Unroll every loop of `graph` with a shape-fixed trip count; whether it did (it
    leaves the graph as it was when there is none or any step fails). `input_shapes` are
    the compile shapes of the Placeholders (by name or "name:0"); `fetches` the tensors
    the caller reads, kept whatever happens around them.

    The unrolling is done on a copy, indexed once and edited through its Graph, which
    `graph` takes over at the end: it can give up halfway (a count that turns out to
    follow the data), and loops are rare enough that the copy costs nothing on most
    graphs."""
    # TensorLists without a loop are rewritten too: a TensorArray filled in a Python loop
    # traces to straight-line TensorListReserve / SetItem / Stack (keras_hub's RWKV7).
    if not any(n.op in LOOP_OPS or n.op.startswith("TensorList")
               for n in graph.graph_def.node):
        return False
    try:
        copy = graph_pb2.GraphDef()
        copy.CopyFrom(graph.graph_def)
        work = Graph.build(copy)
        library = _Library(work.graph_def)
        for _ in range(8):  # loops inside loop bodies surface one level per round
            loops = [n for n in work.graph_def.node if n.op in LOOP_OPS]
            if not loops:
                break
            # Checking and counting the loops edit nothing, so what constants and shapes
            # fix, the shapes, and the graph the counts are run in (kept in `work.memo`
            # until the first edit) are found once for all loops.
            static = static_values(work)
            fixed_outer = static.constant | static.shape
            # Proven before anything runs: running a loop whose count follows the data on
            # made-up inputs could take forever.
            _check_count_is_fixed(library, loops, fixed_outer)
            trips = _trip_counts(work, library, loops, input_shapes, fixed_outer)
            if not trips:
                raise _CannotUnroll("no loop's trip count follows from constants and shapes")
            loops = [n.name for n in loops if n.name in trips]
            cond_reads = []
            for loop in loops:
                cond_reads += _unroll(work, library, loop, trips[loop])
            _check_fixed(work, cond_reads)
            _lists_to_tensors(work, input_shapes)
            _bypass(work, set(loops) - {producer(f) for f in fetches})
            work.drop_dead(fetches)
        if any(n.op.startswith("TensorList") for n in work.graph_def.node):
            _lists_to_tensors(work, input_shapes)
            work.drop_dead(fetches)
        if any(n.op in LOOP_OPS or n.op.startswith("TensorList") for n in work.graph_def.node):
            return False
    except _CannotUnroll:
        return False
    graph.adopt(work)
    return True


# --- running the graph at the compile shapes -------------------------------------------------

def _evaluate(graph: Graph, input_shapes: Mapping[str, Sequence[int]],
              tensors: list[str]) -> list[np.ndarray]:
    """The values of `tensors`, which must follow from constants and shapes alone: each
    shape op whose input's shape is known at `input_shapes` becomes that constant, and
    nothing is fed (no data, tables or other resources are needed)."""
    with tf.compat.v1.Session(graph=_constant_graph(graph, input_shapes)) as session:
        try:
            return session.run(tensors)
        except (tf.errors.OpError, ValueError) as e:
            raise _CannotUnroll(str(e)) from None


def _constant_graph(graph: Graph, input_shapes: Mapping[str, Sequence[int]]) -> tf.Graph:
    """`graph` in TensorFlow with its shape ops at `input_shapes` as constants, built
    once per version of the graph and shapes (kept in its memo, which an edit drops): a
    round runs each loop's count at two batch sizes, and each run inferred the shapes and
    imported the whole graph again (keras_rnn_loop's three loops: 7 inferences, 3.4 s of
    its 7.8 s of unrolling)."""
    key = ("constant graph", tuple(sorted((k, tuple(v)) for k, v in input_shapes.items())))
    if key in graph.memo:
        return graph.memo[key]
    graph_def = graph.graph_def
    try:
        infos = infer(graph_def, input_shapes)
    except PartitionError as e:
        raise _CannotUnroll(str(e)) from None
    constant = graph_pb2.GraphDef()
    constant.CopyFrom(graph_def)
    for original, node in zip(graph_def.node, constant.node):
        if original.op not in ("Shape", "Size", "Rank") or not original.input:
            continue
        info = infos.get(canonical(original.input[0]))
        if info is not None and info.fully_known:
            shape = np.asarray(info.shape, dtype=np.int64)
            value = {"Shape": shape, "Size": np.prod(shape),
                     "Rank": np.int64(len(shape))}[original.op]
            dtype = tf.as_dtype(original.attr["out_type"].type) if "out_type" in \
                original.attr else tf.int32
            node.Clear()
            node.name, node.op = original.name, "Const"
            node.attr["dtype"].type = dtype.as_datatype_enum
            node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(
                np.asarray(value).astype(dtype.as_numpy_dtype)))
    imported = tf.Graph()
    with imported.as_default():
        tf.graph_util.import_graph_def(constant, name="")
    graph.memo[key] = imported
    return imported


def _trip_counts(graph: Graph, library: _Library, loops: list[node_def_pb2.NodeDef],
                 input_shapes: Mapping[str, Sequence[int]],
                 fixed_outer: frozenset[str]) -> dict[str, int]:
    """Iterations of each loop, found by running its condition and the body's fixed
    variables (`_check_count_is_fixed`) on their starting values: the same at the compile
    shapes and one batch larger (the compiled program serves every batch), and at most
    MAX_STEPS."""
    batched = batched_inputs(graph.graph_def)
    bigger = {k: [d + 1 if i == 0 and placeholder_name(k) in batched else d
                  for i, d in enumerate(v)] for k, v in input_shapes.items()}
    trips = {}
    for node in loops:
        try:
            counts = set(_simulate(graph, library, node, (input_shapes, bigger), fixed_outer))
        except _CannotUnroll:
            # Its count may follow from shapes that loops before it leave unknown until
            # they are unrolled (Keras 2's Bidirectional GRU, then an LSTM over its output):
            # the next round counts it.
            continue
        if len(counts) != 1:
            raise _CannotUnroll(f"{node.name} runs {sorted(counts)} times at two batch sizes")
        trips[node.name] = counts.pop()
    return trips


def _simulate(graph: Graph, library: _Library, node: node_def_pb2.NodeDef,
              shape_sets: Sequence[Mapping[str, Sequence[int]]],
              fixed_outer: frozenset[str]) -> list[int]:
    """How many times loop `node` runs at each of `shape_sets`: its condition and its
    fixed variables, stepped in TensorFlow sessions from their starting values (the
    condition and the body imported once for all the sets)."""
    values = data_refs(node)
    fixed = sorted(_fixed_variables(library, node, fixed_outer))
    starts = [dict(zip(fixed, _evaluate(graph, shapes, [canonical(values[k]) for k in fixed])))
              for shapes in shape_sets]
    cond, cond_graph, cond_results = library.body(node.attr["cond"].func.name)
    body, body_graph, body_results = library.body(node.attr["body"].func.name)
    cond_args = [a.name for a in cond.signature.input_arg]
    body_args = [a.name for a in body.signature.input_arg]
    cond_out = cond_results[0]
    body_outs = [body_results[k] for k in fixed]
    sessions = []

    def steps(current: dict[int, np.ndarray]) -> int:
        for step in range(MAX_STEPS + 1):
            go = cond_session.run(cond_out, {f"{cond_args[k]}:0": v for k, v in current.items()})
            if not bool(go):
                return step
            current = dict(zip(fixed, body_session.run(
                body_outs, {f"{body_args[k]}:0": v for k, v in current.items()})))
        raise _CannotUnroll(f"{node.name} runs more than {MAX_STEPS} times")

    try:
        for function_graph in (cond_graph, body_graph):
            imported = tf.Graph()
            with imported.as_default():
                tf.graph_util.import_graph_def(function_graph.graph_def, name="")
            sessions.append(tf.compat.v1.Session(graph=imported))
        cond_session, body_session = sessions
        return [steps(current) for current in starts]
    except (tf.errors.OpError, ValueError) as e:
        raise _CannotUnroll(f"{node.name}: {e}") from None
    finally:
        for session in sessions:
            session.close()


def _check_count_is_fixed(library: _Library, loops: list[node_def_pb2.NodeDef],
                          fixed_outer: frozenset[str]) -> None:
    """Each loop's condition reads only loop variables that start fixed (constants and
    shapes: `fixed_outer`) and that the body computes from such variables only."""
    for node in loops:
        if not set(_cond_args(library, node)) <= _fixed_variables(library, node, fixed_outer):
            raise _CannotUnroll(f"{node.name}: its condition reads values computed from data")


def _fixed_variables(library: _Library, node: node_def_pb2.NodeDef,
                     fixed_outer: frozenset[str]) -> set[int]:
    """Positions of the loop variables that start fixed (`fixed_outer`: the graph's nodes
    computed from constants and shapes) and that the body computes from such variables
    only."""
    body, body_graph, results = library.body(node.attr["body"].func.name)
    args = [a.name for a in body.signature.input_arg]
    values = data_refs(node)
    if len(values) != len(args):
        raise _CannotUnroll(f"{node.name}: {len(values)} inputs, body takes {len(args)}")
    # the nodes each result is computed from, through data edges
    reads = [body_graph.needed([r], control=False) for r in results]
    fixed = {k for k, v in enumerate(values) if producer(v) in fixed_outer}
    while True:  # drop variables the body computes from a variable that is not fixed
        loose = {k for k in fixed if any(args[j] in reads[k] for j in
                                        set(range(len(args))) - fixed)}
        if not loose:
            return fixed
        fixed -= loose


def _check_fixed(index: Graph, tensors: list[str]) -> None:
    """Every tensor in `tensors` is computed from constants and shapes only."""
    static = static_values(index)
    fixed = static.constant | static.shape
    for t in tensors:
        if producer(t) not in fixed:
            raise _CannotUnroll(f"the loop condition reads {t}, computed from data")


# --- copying the body ------------------------------------------------------------------------

class _Library:
    """The graph's library functions by name, each body read (`function_body`: TensorFlow's
    converter, then an index) once per `unroll_loops`: checking, counting and copying a
    loop each read its condition and body, and rounds read the same ones again (a loop
    that could not be counted yet, or an inner loop that unrolling its outer one brought
    out). Unrolling edits the graph's nodes, never its library, and the bodies read here
    are only read, so one copy of each serves them all."""

    def __init__(self, graph_def: graph_pb2.GraphDef):
        self._functions = {f.signature.name: f for f in graph_def.library.function}
        self._bodies: dict[str, tuple[function_pb2.FunctionDef, Graph, list[str]]] = {}

    def body(self, name: str) -> tuple[function_pb2.FunctionDef, Graph, list[str]]:
        """Function `name`, its body as a Graph, and the tensors it returns."""
        if name not in self._bodies:
            fdef = self._functions.get(name)
            if fdef is None:
                raise _CannotUnroll(f"function {name} is not in the graph's library")
            self._bodies[name] = (fdef, *function_body(fdef))
        return self._bodies[name]


def _cond_args(library: _Library, node: node_def_pb2.NodeDef) -> list[int]:
    """Which loop variables the loop's condition reads (positions)."""
    cond, cond_graph, results = library.body(node.attr["cond"].func.name)
    seen = cond_graph.needed(results)
    return [k for k, a in enumerate(cond.signature.input_arg) if a.name in seen]


def _unroll(graph: Graph, library: _Library, loop: str, trips: int) -> list[str]:
    """Replace node `loop` by `trips` copies of its body and an IdentityN of its name;
    returns the tensors the condition read at each step (they must be fixed)."""
    node = graph.nodes[loop]
    body, body_graph, results = library.body(node.attr["body"].func.name)
    args = [a.name for a in body.signature.input_arg]
    values = data_refs(node)
    controls = control_refs(node)
    if len(values) != len(args) or len(results) != len(args):
        raise _CannotUnroll(f"{loop}: {len(values)} loop variables, body takes {len(args)}")
    cond_args = _cond_args(library, node)
    cond_reads = []
    for step in range(trips + 1):
        cond_reads.extend(values[k] for k in cond_args)
        if step == trips:
            break
        prefix = f"{loop}/unrolled_{step}/"
        bound = dict(zip(args, values))
        for inner in body_graph.graph_def.node:
            if inner.name in bound:
                continue
            copy = graph.add_node(prefix + inner.name, inner.op)
            copy.CopyFrom(inner)
            copy.name = prefix + inner.name
            if "_class" in copy.attr:  # colocations name the body's own nodes
                del copy.attr["_class"]
            # (the loop's control inputs gate its first step)
            graph.set_inputs(copy.name, [_rename(ref, bound, prefix) for ref in inner.input]
                             or (controls if step == 0 else []))
        values = [_rename(r, bound, prefix) for r in results]
    types = attr_value_pb2.AttrValue()
    types.CopyFrom(node.attr["T"])  # (the loop's NodeDef is deleted next)
    passthrough = graph.replace_node(loop, "IdentityN",
                                     [*values, *(controls if trips == 0 else [])])
    passthrough.attr["T"].CopyFrom(types)
    return cond_reads


def _rename(ref: str, bound: Mapping[str, str], prefix: str) -> str:
    """A body's input `ref` in the copy named `prefix`: an argument's the value `bound` to
    it, any other node's its copy's."""
    node, index = parse_input(ref)
    if node in bound:
        return "^" + producer(bound[node]) if index < 0 else bound[node]
    return "^" + prefix + node if index < 0 else prefix + ref


# --- TensorLists to tensors ------------------------------------------------------------------

def _lists_to_tensors(graph: Graph, input_shapes: Mapping[str, Sequence[int]]) -> None:
    """Rewrite the TensorList ops of straight-line code into GatherV2, Pack and Identity,
    following each list from where it is made to where it is read."""
    order = [graph.nodes[n] for n in graph.order]
    list_ops = [n for n in order if n.op.startswith("TensorList")]
    if not list_ops:
        return
    # Positions and sizes must be fixed by constants and shapes, like the trip count.
    static = static_values(graph)
    fixed = static.constant | static.shape
    needed = {}
    for n in list_ops:
        for k in {"TensorListGetItem": [1], "TensorListSetItem": [1],
                  "TensorListReserve": [1]}.get(n.op, []):
            tensor = canonical(n.input[k])
            if producer(tensor) not in fixed:
                raise _CannotUnroll(f"{n.name} reads position {tensor}, computed from data")
            needed[tensor] = None
    names = list(needed)
    known = dict(zip(names, (int(np.asarray(v).reshape(())) for v in
                             _evaluate(graph, input_shapes, names))))
    lists: dict[str, tuple[str, object]] = {}  # variant tensor -> ("rows", t) | ("items", [..])
    for n in order:
        refs = [canonical(i) for i in data_refs(n)]
        if n.op.startswith("TensorList") and refs and refs[0] not in lists and \
                graph.nodes[producer(refs[0])].op in LOOP_OPS:
            continue  # a list a loop counted in a later round returns: read then
        if n.op == "TensorListFromTensor":
            lists[f"{n.name}:0"] = ("rows", refs[0])
        elif n.op == "TensorListReserve":
            lists[f"{n.name}:0"] = ("items", [None] * known[refs[1]])
        elif n.op in ("Identity", "IdentityN"):
            for k, ref in enumerate(refs):
                if ref in lists:
                    lists[f"{n.name}:{k}"] = lists[ref]
        elif n.op == "TensorListSetItem":
            kind, items = _list(lists, refs[0], n)
            if kind != "items":
                raise _CannotUnroll(f"{n.name} writes into a list made from a tensor")
            items = list(items)
            position = known[refs[1]]
            if not 0 <= position < len(items):
                raise _CannotUnroll(f"{n.name} writes position {position} of {len(items)}")
            items[position] = refs[2]
            lists[f"{n.name}:0"] = ("items", items)
        elif n.op == "TensorListGetItem":
            kind, value = _list(lists, refs[0], n)
            position = known[refs[1]]
            if kind == "rows":
                int32 = tf.int32.as_datatype_enum
                _replace(graph, n, "GatherV2", [value, _const(graph, n.name + "/position",
                                                              position),
                                                _const(graph, n.name + "/axis", 0)],
                         {"Tparams": n.attr["element_dtype"].type, "Tindices": int32,
                          "Taxis": int32}, {"batch_dims": 0})
            else:
                if value[position] is None:
                    raise _CannotUnroll(f"{n.name} reads position {position}, never written")
                _replace(graph, n, "Identity", [value[position]],
                         {"T": n.attr["element_dtype"].type})
        elif n.op == "TensorListStack":
            kind, value = _list(lists, refs[0], n)
            if kind == "rows":
                _replace(graph, n, "Identity", [value], {"T": n.attr["element_dtype"].type})
            elif None in value or not value:
                raise _CannotUnroll(f"{n.name} stacks a list with unwritten positions")
            else:
                _replace(graph, n, "Pack", list(value), {"T": n.attr["element_dtype"].type},
                         {"N": len(value), "axis": 0})
        elif n.op.startswith("TensorList"):
            raise _CannotUnroll(f"{n.name}: {n.op} is not rewritten")
        elif any(r in lists for r in refs) and n.op in LOOP_OPS:
            continue  # a loop counted in a later round: its lists stay lists till then
        elif any(r in lists for r in refs) and n.op not in ("Identity", "IdentityN"):
            raise _CannotUnroll(f"{n.name} ({n.op}) reads a TensorList")


def _list(lists: Mapping[str, tuple[str, object]], ref: str,
          node: node_def_pb2.NodeDef) -> tuple[str, object]:
    if ref not in lists:
        raise _CannotUnroll(f"{node.name} reads a TensorList this cannot follow ({ref})")
    return lists[ref]


def _const(graph: Graph, name: str, value: int) -> str:
    node = graph.add_node(name, "Const")
    node.attr["dtype"].type = tf.int32.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.int32(value)))
    return f"{name}:0"


def _replace(graph: Graph, node: node_def_pb2.NodeDef, op: str, inputs: list[str],
             types: Mapping[str, int], ints: Mapping[str, int] | None = None) -> None:
    """Turn `node` into `op` over `inputs` (its control inputs kept), with dtype
    attributes `types` (enums) and integer attributes `ints`."""
    controls = control_refs(node)
    name = node.name
    node.Clear()
    node.name, node.op = name, op
    for key, value in types.items():
        node.attr[key].type = value
    for key, value in (ints or {}).items():
        node.attr[key].i = value
    graph.set_inputs(name, [*inputs, *controls])


def _bypass(graph: Graph, passthroughs: set[str]) -> None:
    """Readers of the IdentityN that replaced a loop read its inputs instead, so the lists
    it passed on are read by nothing (and `drop_dead` removes them)."""
    sources = {p: list(graph.nodes[p].input) for p in passthroughs}  # before any is rewired
    for reader in {r for p in passthroughs for r in graph.consumers(p)}:
        rewired = []
        for ref in graph.nodes[reader].input:
            source, k = parse_input(ref)
            if source not in sources:
                rewired.append(ref)
            elif k >= 0:  # (a control edge goes: the unrolled steps have no side effects)
                rewired.append(sources[source][k])
        # Only control edges may repeat after rewiring; a data input read twice
        # (Mul(loop:1, loop:1)) is two operands and both stay.
        controls = [r for r in rewired if is_control(r)]
        graph.set_inputs(reader, [r for r in rewired if not is_control(r)]
                         + list(dict.fromkeys(controls)))
