"""Inline the function calls that freezing leaves in a GraphDef.

`convert_variables_to_constants_v2` inlines the signature's calls with
Grappler, which skips a call marked for XLA compilation (`_XlaMustCompile`,
what Keras uses for `Conv2D(groups=...)`) or `_noinline`, and everything such
a function calls in turn. Those calls hold plain computation (their variables
were already turned into constant inputs); `inline_calls` splices their bodies
into the outer graph so the partitioner sees every op.

A call node `outer/call` of function `f` becomes `f`'s nodes renamed
`outer/call/<node>`; its inputs feed the body's arguments and its consumers
read the body's results. Calls inside the inlined bodies are inlined in the
next round, until none is left. Functional control flow (`While`, `If`) is
not a call: its bodies stay in the library, on TensorFlow.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2, node_def_pb2
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def

from neuronish.graph import control_refs, data_refs, parse_input, producer

CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
# Deeper nesting than this is a function calling itself.
_MAX_ROUNDS = 64


class InlineError(ValueError):
    """A call that cannot be inlined; the message names the node and why."""


def called_function(node: node_def_pb2.NodeDef, library: set[str]) -> str | None:
    """The library function `node` calls, or None if it is not a function call."""
    if node.op in CALL_OPS:
        return node.attr["f"].func.name
    return node.op if node.op in library else None


def inline_calls(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """Inline every function call in `graph_def`'s outer graph, in place, and return it.
    In place because copying the graph's nodes costs as much as its weights (~2 s for
    ConvNeXtLarge's 790 MB); after an InlineError it is left partly inlined."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    library = set(functions)
    if not any(called_function(n, library) for n in graph_def.node):
        return graph_def
    before = {n.name for n in graph_def.node}
    nodes = list(graph_def.node)  # the graph's own messages: readers are rewired in them
    # Converting a body that calls other functions looks them up in the default graph.
    with _graph_holding(graph_def.library).as_default():
        for _ in range(_MAX_ROUNDS):
            calls = [(n, f) for n in nodes if (f := called_function(n, library)) is not None]
            if not calls:
                break
            nodes = _inline_round(nodes, calls, functions)
        else:
            raise InlineError(f"function calls nested deeper than {_MAX_ROUNDS} levels (a "
                              f"function that calls itself?): "
                              f"{sorted(n.name for n, _ in calls)[:5]}")
    position = {n.name: i for i, n in enumerate(nodes)}
    if len(position) != len(nodes):
        seen: set[str] = set()
        twice = sorted({n.name for n in nodes if n.name in seen or seen.add(n.name)})
        raise InlineError(f"inlining gives two nodes the name {twice[0]!r}: an inlined body "
                          "node is named like a node of the outer graph")
    for i in reversed(range(len(graph_def.node))):  # the calls, now inlined
        if graph_def.node[i].name not in position:
            del graph_def.node[i]
    graph_def.node.extend(n for n in nodes if n.name not in before)  # the bodies
    # Each body where its call was; sorting moves the messages, it does not copy them.
    graph_def.node.sort(key=lambda n: position[n.name])
    return graph_def


def _graph_holding(library: function_pb2.FunctionDefLibrary) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_pb2.GraphDef(library=library), name="")
    return graph


def _inline_round(nodes: list[node_def_pb2.NodeDef],
                  calls: list[tuple[node_def_pb2.NodeDef, str]],
                  functions: dict) -> list[node_def_pb2.NodeDef]:
    """Inline one level of calls ((call node, function name) pairs): returns the new node
    list."""
    results: dict[str, list[str]] = {}  # call node -> the tensor behind each of its outputs
    bodies: dict[str, list[node_def_pb2.NodeDef]] = {}
    for node, fname in calls:
        if fname not in functions:
            raise InlineError(f"{node.name} ({node.op}) calls function {fname!r}, which the "
                              "graph's library does not hold; the SavedModel is incomplete")
        bodies[node.name], results[node.name] = _body(node, functions[fname])

    def resolve(ref: str) -> list[str]:
        """A reference to a call's output -> the tensor(s) that now produce it."""
        name, index = parse_input(ref)
        if name not in results:
            return [ref]
        if index < 0:  # a control edge: wait for every result of the call
            return sorted({"^" + producer(t) for t in results[name]})
        if index >= len(results[name]):
            raise InlineError(f"{ref} reads output {index} of the call {name}, which returns "
                              f"{len(results[name])}")
        return [results[name][index]]

    out = []
    for node in nodes:
        group = bodies.get(node.name, [node])
        for member in group:
            refs = [r for ref in member.input for r in resolve(ref)]
            # A tensor now produced by another call's body may itself be a call's result
            # (a call feeding a call): resolve until stable.
            while any(producer(r) in results for r in refs):
                refs = [r for ref in refs for r in resolve(ref)]
            del member.input[:]
            member.input.extend(refs)
            out.append(member)
    return out


def _body(call: node_def_pb2.NodeDef, fdef: object) -> tuple[list[node_def_pb2.NodeDef],
                                                             list[str]]:
    """`fdef`'s nodes renamed under `call`'s name and wired to its inputs, and the
    tensor behind each of the call's outputs."""
    name = fdef.signature.name
    body, flat = function_def_to_graph_def(fdef)
    data_inputs = data_refs(call)
    control_inputs = control_refs(call)
    args = [a.name for a in fdef.signature.input_arg]
    if len(data_inputs) != len(args):
        raise InlineError(f"{call.name} ({call.op}) passes {len(data_inputs)} inputs to "
                          f"function {name!r}, which takes {len(args)}")
    argument = dict(zip(args, data_inputs, strict=True))
    prefix = call.name + "/"

    def rename(ref: str) -> str:
        """A body input (GraphDef spelling) -> the outer graph's."""
        node, index = parse_input(ref)
        if node in argument:  # an argument: the caller's input tensor
            target = argument[node]
            if index > 0:
                raise InlineError(f"function {name!r} reads output {index} of argument {node}")
            return "^" + producer(target) if index < 0 else target
        return "^" + prefix + node if index < 0 else prefix + ref

    nodes = []
    for node in body.node:
        if node.name in argument and node.op == "Placeholder":
            continue
        copy = node_def_pb2.NodeDef()
        copy.CopyFrom(node)
        copy.name = prefix + node.name
        refs = [rename(r) for r in node.input]
        if not refs:  # a source node (a constant) waits for whatever the call waited for
            refs = list(control_inputs)
        del copy.input[:]
        copy.input.extend(refs)
        nodes.append(copy)
    outputs = []
    for arg in fdef.signature.output_arg:
        tensor = flat.get(fdef.ret[arg.name], fdef.ret[arg.name])
        outputs.append(rename(tensor))
    return nodes, outputs
