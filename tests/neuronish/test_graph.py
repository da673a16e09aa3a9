"""The one Graph object: every lookup after an edit sees the edit (no stale index), and
results kept in its memo (inferred shapes) are dropped by an edit and kept otherwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from neuronish.graph import Graph, PartitionError, parse_input
from neuronish.shape_inference import shapes
from neuronish.shape_inference.shapes import infer_once

F32 = tf.float32.as_datatype_enum


def _chain() -> graph_pb2.GraphDef:
    """x -> a = Relu(x) -> b = Neg(a) -> c = AddV2(a, b), with a Const k beside."""
    gd = graph_pb2.GraphDef()
    x = gd.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = F32
    x.attr["shape"].shape.CopyFrom(tf.TensorShape([None, 3]).as_proto())
    k = gd.node.add(name="k", op="Const")
    k.attr["dtype"].type = F32
    k.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.float32(2.0)))
    for name, op, inputs in (("a", "Relu", ["x"]), ("b", "Neg", ["a:0"]),
                             ("c", "AddV2", ["a", "b"])):
        node = gd.node.add(name=name, op=op)
        node.input.extend(inputs)
        node.attr["T"].type = F32
    return gd


def _fresh(graph: Graph) -> Graph:
    """What a new index of the same GraphDef says: an edited Graph must agree with it."""
    copy = graph_pb2.GraphDef()
    copy.CopyFrom(graph.graph_def)
    return Graph(copy)


def _same_indexes(graph: Graph) -> None:
    graph.verify()
    fresh = _fresh(graph)
    assert graph.nodes.keys() == fresh.nodes.keys()
    assert graph.order == fresh.order
    for name in fresh.nodes:
        assert graph.data_inputs[name] == fresh.data_inputs[name], name
        assert graph.control_inputs[name] == fresh.control_inputs[name], name
        assert set(graph.consumers(name)) == set(fresh.consumers(name)), name
        assert set(graph.data_consumers(name)) == set(fresh.data_consumers(name)), name
        for k in range(2):
            assert set(graph.readers(f"{name}:{k}")) == set(fresh.readers(f"{name}:{k}"))


def test_each_edit_is_seen_by_the_next_lookup() -> None:
    graph = Graph(_chain())
    assert graph.order == ("x", "k", "a", "b", "c")
    assert set(graph.readers("a:0")) == {"b", "c"}

    # Redirect the uses of a:0: b and c now read k, a has no reader left.
    graph.replace_uses("a:0", "k")
    assert graph.readers("a:0") == () and set(graph.readers("k:0")) == {"b", "c"}
    assert graph.data_inputs["c"] == ("k:0", "b:0")
    assert list(graph.graph_def.node[4].input) == ["k", "b"]
    _same_indexes(graph)

    # A new node is indexed at once, and the order includes it where its inputs put it.
    d = graph.add_node("d", "Mul", ["c", "x:0", "^a"])
    d.attr["T"].type = F32
    assert graph.readers("c:0") == ("d",) and graph.control_consumers("a") == ("d",)
    assert graph.order.index("d") > graph.order.index("c")
    _same_indexes(graph)

    # A node edited in place and announced with `updated`.
    graph.nodes["b"].input[0] = "x"
    graph.updated("b")
    assert graph.producers("b") == ["x"] and "b" in graph.readers("x:0")
    _same_indexes(graph)

    # Removing: a node still read cannot go; a dead one can, and leaves no trace.
    with pytest.raises(PartitionError, match="'d' still reads it"):
        graph.remove(["a"])
    graph.set_inputs("d", ["c", "x:0"])
    assert graph.control_consumers("a") == ()
    graph.drop_dead(["d:0"])
    assert "a" not in graph.nodes and "a" not in graph.order
    assert [n.name for n in graph.graph_def.node] == ["x", "k", "b", "c", "d"]
    _same_indexes(graph)
    assert graph.needed(["d"]) == {"x", "k", "b", "c", "d"}


def test_a_rename_reaches_every_reader_and_keeps_the_order() -> None:
    """Freezing renames nodes (call prefixes stripped) on the signature's Graph: readers'
    inputs follow, control and port spellings kept, GraphDef order kept; a taken name
    is refused naming both."""
    gd = _chain()
    gd.node.add(name="d", op="NoOp").input.extend(["^a"])
    graph = Graph(gd)
    graph.rename({"a": "relu", "b": "neg"})
    _same_indexes(graph)
    assert [n.name for n in graph.graph_def.node] == ["x", "k", "relu", "neg", "c", "d"]
    assert list(graph.nodes["c"].input) == ["relu", "neg"]
    assert list(graph.nodes["neg"].input) == ["relu:0"]
    assert list(graph.nodes["d"].input) == ["^relu"]
    assert set(graph.readers("relu:0")) == {"neg", "c"}
    with pytest.raises(PartitionError, match="'c' to 'k'"):
        graph.rename({"c": "k"})


def test_a_replaced_node_moves_to_the_end_and_keeps_its_readers() -> None:
    """Unrolling replaces a loop by an IdentityN that reads nodes added after the loop:
    the replacement goes to the GraphDef's end under the same name, its old inputs are
    unlinked, and the nodes that read the old node read the new one."""
    graph = Graph(_chain())
    new = graph.replace_node("b", "Identity", ["x", "^k"])
    new.attr["T"].type = F32
    assert [n.name for n in graph.graph_def.node] == ["x", "k", "a", "c", "b"]
    assert graph.nodes["b"] is new and graph.producers("b") == ["x", "k"]
    assert graph.readers("a:0") == ("c",) and graph.readers("b:0") == ("c",)
    assert graph.order.index("b") < graph.order.index("c")
    _same_indexes(graph)
    with pytest.raises(KeyError):
        graph.replace_node("nowhere", "NoOp")


def test_an_edit_behind_the_graphs_back_is_caught_by_verify() -> None:
    graph = Graph(_chain())
    graph.verify()
    graph.nodes["c"].input[1] = "x"  # b no longer read, but the index still says so
    with pytest.raises(PartitionError, match="node 'c' reads .* Graph.updated"):
        graph.verify()
    graph.updated("c")
    graph.verify()
    assert graph.readers("b:0") == ()
    graph.graph_def.node.add(name="stray", op="NoOp")
    with pytest.raises(PartitionError, match="without Graph.add_node"):
        graph.verify()


def test_an_edit_that_makes_a_cycle_or_a_dangling_input_is_named() -> None:
    graph = Graph(_chain())
    graph.set_inputs("a", ["c"])
    with pytest.raises(PartitionError, match="cycle"):
        graph.order  # noqa: B018
    graph = Graph(_chain())
    graph.set_inputs("a", ["nowhere:0"])
    with pytest.raises(PartitionError, match="'a' .* no node 'nowhere'"):
        graph.order  # noqa: B018
    with pytest.raises(PartitionError, match="two nodes named 'a'"):
        graph_def = _chain()
        graph_def.node.add(name="a", op="Relu")
        Graph(graph_def)


def test_shapes_are_inferred_once_per_version_of_the_graph(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = shapes.infer
    monkeypatch.setattr(shapes, "infer", lambda *a: calls.append(1) or real(*a))
    graph = Graph(_chain())
    first = infer_once(graph, {"x": [2, 3]})
    assert infer_once(graph, {"x:0": [2, 3]}) is not None and len(calls) == 2  # another key
    assert infer_once(graph, {"x": [2, 3]}) is first and len(calls) == 2
    assert first["c:0"].shape == (2, 3)
    # After an edit the shapes are inferred again, of the edited graph.
    axis = graph.add_node("axis", "Const")
    axis.attr["dtype"].type = tf.int32.as_datatype_enum
    axis.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.int32(1)))
    total = graph.add_node("sum", "Sum", ["c", "axis"])
    total.attr["T"].type = F32
    total.attr["Tidx"].type = tf.int32.as_datatype_enum
    again = infer_once(graph, {"x": [2, 3]})
    assert len(calls) == 3 and again["sum:0"].shape == (2,)
    assert infer_once(graph, {"x": [2, 3]}) is again and len(calls) == 3


def _rewrites() -> list:
    from tests.neuronish.test_fold import _mel_like_table
    from tests.neuronish.test_rewrite import _segments, _spectrogram
    from tests.neuronish.test_unroll import _rnn

    # (what rewrites it, the model, its input shape with the batch free)
    return [("fold", _mel_like_table, [None, 5, 4]), ("unroll", _rnn, [None, 5, 4]),
            ("complex pairs", _spectrogram, [None, 5, 4]), ("segments", _segments, [None, 6])]


@pytest.mark.parametrize("case", range(4), ids=[c[0] for c in _rewrites()])
def test_after_the_rewrites_the_graph_is_what_a_new_index_says(tmp_path: Path,
                                                                case: int) -> None:
    """The rewrites edit the compile's Graph in place; every index must match a fresh one
    of the rewritten GraphDef, and partitioning the edited Graph must give what
    partitioning a new one does."""
    from neuronish import partition as P
    from neuronish.rewrites.rewrite import rewrite_for_device
    from tests.neuronish.test_unroll import _frozen

    _, fn, shape = _rewrites()[case]
    frozen = _frozen(tmp_path, fn, shape)
    fetches = list(frozen.outputs.values())
    graph = Graph(frozen.graph_def)
    before = len(frozen.graph_def.node), graph.version
    shapes_at = {"x:0": [2, *shape[1:]]}
    rewrite_for_device(graph, shapes_at, fetches)
    assert graph.version > before[1], "nothing was rewritten: the case tests nothing"
    _same_indexes(graph)
    supported = P.supported_ops()
    edited = P.partition(graph, shapes_at, supported, fetches=fetches, minimum_segment_size=1)
    fresh = P.partition(_fresh(graph).graph_def, shapes_at, supported, fetches=fetches,
                        minimum_segment_size=1)
    assert [s.graph_def for s in edited.subgraphs] == [s.graph_def for s in fresh.subgraphs]
    assert edited.reasons() == fresh.reasons() and edited.subgraphs


def test_an_input_reference_with_other_digits_is_a_node_name_not_a_crash() -> None:
    assert parse_input("dense/BiasAdd:1") == ("dense/BiasAdd", 1)
    assert parse_input("^init") == ("init", -1)
    # str.isdigit() takes '²' and int() refuses it: read as part of a name, as TF would not
    # accept it as an index either.
    assert parse_input("x:\u00b2") == ("x:\u00b2", 0)
