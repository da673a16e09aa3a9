"""The compiler IR's use lists, the pattern rewrite driver and the incremental verifier
(cc/ir.py, cc/rewrite.py, cc/verify.py), on IR built by hand: no TensorFlow needed."""

from __future__ import annotations

import random

import numpy as np
import pytest

from neuronish.cc import verify as verify_module
from neuronish.cc.errors import VerificationError
from neuronish.cc.ir import Graph, Node, TensorType, Value, constant
from neuronish.cc.passes.fuse import fold_scale_shift, fuse_activation
from neuronish.cc.pipeline import Pass, run_pipeline
from neuronish.cc.rewrite import Pat, Rule, rewrite
from neuronish.cc.verify import verify

F32 = TensorType((2, 4), "float32")


def _unary(x: Value, fn: str) -> Node:
    node = Node("unary", [x], [], {"fn": fn})
    node.outputs = [Value(x.type, producer=node)]
    return node


def _binary(a: Value, b: Value, fn: str) -> Node:
    node = Node("binary", [a, b], [], {"fn": fn})
    node.outputs = [Value(a.type, producer=node)]
    return node


def _chain(n: int, fn: str = "relu") -> Graph:
    x = Value(F32, name="x")
    nodes, v = [], x
    for _ in range(n):
        nodes.append(_unary(v, fn))
        v = nodes[-1].outputs[0]
    return Graph([x], [v], nodes, [0], [0])


def _brute_force_uses(graph: Graph) -> dict[int, list[Node]]:
    uses: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for v in node.inputs:
            uses.setdefault(v.id, []).append(node)
    return uses


def _same_uses(graph: Graph) -> None:
    want = _brute_force_uses(graph)
    got = graph.consumers()
    assert {k: sorted(map(id, v)) for k, v in got.items()} == \
        {k: sorted(map(id, v)) for k, v in want.items()}
    for vid, users in want.items():
        assert graph.use_count(users[0].inputs[[v.id for v in users[0].inputs].index(vid)]) \
            == len(users)


def test_use_lists_follow_every_kind_of_edit() -> None:
    rng = random.Random(0)
    graph = _chain(30)
    for step in range(300):
        nodes = list(graph.nodes)
        node = rng.choice(nodes)
        k = nodes.index(node)
        earlier = [graph.inputs[0]] + [n.outputs[0] for n in nodes[:k]]
        op = step % 5
        if op == 0:  # rewire to any earlier value, maybe twice (x * x)
            a = rng.choice(earlier)
            node.inputs = [a]
            if rng.random() < 0.5:
                graph.replace(node, new := _binary(a, a, "mul"))
                new.outputs = node.outputs
                node.outputs[0].producer = new
        elif op == 1 and k > 0:  # readers of this value read the previous one instead
            graph.replace_uses(node.outputs[0], nodes[k - 1].outputs[0])
        elif op == 2:
            graph.insert_before(node, _unary(rng.choice(earlier), "abs"))
        elif op == 3 and len(nodes) > 5 and not graph.use_count(node.outputs[0]) \
                and not graph.is_output(node.outputs[0]):
            graph.remove(node)
        else:  # a whole new schedule with one node dropped and one added
            extra = _unary(rng.choice(earlier), "neg")
            graph.nodes = [*nodes[:k], extra, *nodes[k:]]
        _same_uses(graph)
        assert graph.node_count == len(graph.nodes)
        assert all(n.graph is graph for n in graph.nodes)


def test_replace_uses_reaches_graph_outputs_and_every_operand() -> None:
    graph = _chain(2)
    a, b = graph.nodes
    square = _binary(a.outputs[0], a.outputs[0], "mul")
    graph.append(square)
    graph.outputs.append(a.outputs[0])
    graph.output_batch_axes.append(0)
    graph.replace_uses(a.outputs[0], graph.inputs[0])
    assert b.inputs == (graph.inputs[0],) and square.inputs == (graph.inputs[0],) * 2
    assert graph.outputs[1] is graph.inputs[0] and graph.use_count(a.outputs[0]) == 0
    assert graph.use_count(graph.inputs[0]) == 4  # a, b, and square twice


def test_inputs_cannot_be_edited_in_place() -> None:
    node = _chain(1).nodes[0]
    with pytest.raises(TypeError):
        node.inputs[0] = node.inputs[0]  # type: ignore[index]


def test_patterns_bind_names_try_both_orders_and_check_private_values() -> None:
    graph = _chain(1, "sigmoid")
    x = graph.inputs[0]
    sig = graph.nodes[0].outputs[0]
    swish = Pat("binary", fn="mul", commutative=True, inputs=(
        Pat(name="x"), Pat("unary", fn="sigmoid", inputs=(Pat(name="x"),))))
    for a, b in ((x, sig), (sig, x)):
        mul = graph.append(_binary(a, b, "mul"))
        assert swish.match(graph, mul.outputs[0]) == {"x": x}
    y = Value(F32, name="y")
    other = graph.append(_binary(y, sig, "mul"))  # y * sigmoid(x): not a swish
    assert swish.match(graph, other.outputs[0]) is None
    assert Pat(private=True).match(graph, sig) is None  # read three times
    half = graph.append(_binary(x, constant(np.float32(0.5)), "mul"))
    assert Pat("binary", inputs=(Pat(), Pat.const(0.5))).match(graph, half.outputs[0]) == {}
    assert Pat("binary", inputs=(Pat(), Pat.const(2.0))).match(graph, half.outputs[0]) is None


def test_the_driver_reaches_a_fixed_point_visiting_each_node_a_bounded_number_of_times(
        ) -> None:
    """abs(abs(...abs(x))) collapses to one abs: each rewrite makes the next possible
    further down, which a single sweep finds only because the driver re-queues the
    neighbourhood; the match attempts stay proportional to the node count."""
    n = 5000
    graph = _chain(n, "abs")
    attempts = 0

    def counted(v: Value) -> bool:
        nonlocal attempts
        attempts += 1
        return True

    def collapse(g: Graph, node: Node, m: dict) -> bool:
        inner = m["inner"].producer
        node.inputs = inner.inputs
        if not g.use_count(inner.outputs[0]):
            g.remove(inner)
        return True

    rules = [Rule("abs_abs", Pat("unary", fn="abs", where=counted, inputs=(
        Pat("unary", fn="abs", name="inner"),)), collapse)]
    rewrite(graph, rules)
    assert [n.kind for n in graph.nodes] == ["unary"] and graph.nodes[0].inputs[0] is \
        graph.inputs[0]
    assert attempts <= 4 * n, attempts
    verify(graph)


def _scale_shift_chain(blocks: int) -> Graph:
    rng = np.random.default_rng(0)
    x = Value(TensorType((2, 8), "float32"), name="x")
    nodes, v = [], x
    for _ in range(blocks):
        mm = Node("matmul", [v, constant(rng.standard_normal((8, 8)).astype(np.float32))],
                  [], {})
        mm.outputs = [Value(TensorType((2, 8), "float32"), producer=mm)]
        mul = _binary(mm.outputs[0], constant(rng.uniform(1, 2, 8).astype(np.float32)), "mul")
        add = _binary(mul.outputs[0], constant(rng.standard_normal(8).astype(np.float32)),
                      "add")
        relu = _unary(add.outputs[0], "relu")
        nodes += [mm, mul, add, relu]
        v = relu.outputs[0]
    return Graph([x], [v], nodes, [0], [0])


def test_fusions_on_the_driver_fold_every_block() -> None:
    graph = fuse_activation(fold_scale_shift(_scale_shift_chain(200)))
    assert {n.kind for n in graph.nodes} == {"matmul"} and graph.node_count == 200
    assert all(n.attrs["activation"] == "relu" and len(n.inputs) == 3 for n in graph.nodes)
    verify(graph)


def _retype_one(graph: Graph) -> Graph:
    node = graph.nodes[len(graph.nodes) // 2]
    node.outputs[0].type = TensorType((1, 1), "float32")
    return graph


def _bad_attribute(graph: Graph) -> Graph:
    node = graph.nodes[1]
    node.attrs = {**node.attrs, "fn": "no_such_function"}
    return graph


@pytest.mark.parametrize("bad_pass", [_retype_one, _bad_attribute])
def test_the_pipeline_verifier_catches_a_broken_changed_node(bad_pass) -> None:  # noqa: ANN001
    with pytest.raises(VerificationError, match=f"after pass {bad_pass.__name__}"):
        run_pipeline(_chain(50), [Pass("noop", lambda g: g), Pass(bad_pass.__name__, bad_pass)])


def test_the_verifier_between_passes_infers_only_what_changed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Counted where the verifier type-checks a node (inference itself is memoized by
    # signature, so counting `kinds.infer` would count signatures, not nodes).
    inferred: list[str] = []
    real = verify_module._check_types

    def counting(graph: Graph, node: Node) -> None:
        inferred.append(node.kind)
        real(graph, node)

    monkeypatch.setattr(verify_module, "_check_types", counting)

    def add_one(graph: Graph) -> Graph:
        graph.append(_unary(graph.outputs[0], "neg"))
        graph.outputs[0] = graph.nodes[-1].outputs[0]
        return graph

    n = 200
    run_pipeline(_chain(n), [Pass("noop", lambda g: g), Pass("add_one", add_one)])
    # in full on entry (n) and at the end (n + 1); between passes the one new node
    assert len(inferred) == n + 1 + (n + 1), len(inferred)


def test_an_edit_no_graph_can_see_makes_the_next_check_a_full_one() -> None:
    def retype_input(graph: Graph) -> Graph:
        graph.inputs[0].type = TensorType((3, 3), "float32")
        return graph

    with pytest.raises(VerificationError, match="after pass retype_input.*typed"):
        run_pipeline(_chain(20), [Pass("retype_input", retype_input)])


def test_is_output_follows_every_change_of_the_outputs_list() -> None:
    a, b, c = (Value(F32) for _ in range(3))
    g = Graph([a], [a, b])
    assert g.is_output(b) and not g.is_output(c)
    g.outputs[1] = c
    assert g.is_output(c) and not g.is_output(b)
    g.outputs.append(b)
    assert g.is_output(b)
    g.outputs.pop()
    assert not g.is_output(b)
    g.outputs += [b]
    assert g.is_output(b)
    del g.outputs[-1]
    assert not g.is_output(b)
    g.outputs = [b]
    assert g.is_output(b) and not g.is_output(a)


def _reshape(x: Value, shape: tuple[int, ...]) -> Node:
    node = Node("reshape", [x], [], {"shape": list(shape)})
    node.outputs = [Value(TensorType(shape, x.dtype), producer=node)]
    return node


def test_sink_reshapes_on_the_driver_moves_every_op_above_one_reshape() -> None:
    """reshape -> relu -> reshape -> relu ... (n of each, the last dim kept): every relu
    moves above the reshapes, which fold into one; the values stay the same."""
    from neuronish.cc.interpret import interpret
    from neuronish.cc.passes.movement import sink_reshapes

    x = Value(TensorType((2, 3, 8), "float32"), name="x")
    nodes, v = [], x
    for k in range(400):
        nodes.append(_reshape(v, (6, 8) if k % 2 == 0 else (2, 3, 8)))
        nodes.append(_unary(nodes[-1].outputs[0], ("relu", "neg", "abs", "tanh")[k % 4]))
        v = nodes[-1].outputs[0]
    graph = Graph([x], [v], nodes, [0], [0])
    feed = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    want = interpret(graph, [feed])
    sink_reshapes(graph)
    verify(graph)
    kinds_left = [n.kind for n in graph.nodes]
    assert kinds_left == ["unary"] * 400 + ["reshape"] * (kinds_left[-1] == "reshape"), \
        kinds_left[:10]
    np.testing.assert_array_equal(interpret(graph, [feed])[0], want[0])
