"""The partitioner, stage by stage and end to end.

End-to-end tests splice each subgraph back as a stand-in for the NeuronOp
(an IdentityN fed with the subgraph's results, computed by running the
standalone subgraph GraphDef at its compiled shapes, splitting other batch
sizes into padded chunks as the device does) and compare the whole graph with
the original at the compile batch and at another batch.  Some tests compile
with the real compiler (in-process) and run on the simulated device instead.
"""

from __future__ import annotations

import graphlib
import math
import random
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from neuronish import partition as P
from neuronish.graph import (
    Graph,
    is_stateful,
    producer,
    topological_order,
)
from neuronish.partition.mark import Marking, NodeMark, Reason

SUPPORTED = frozenset({"Const", "Identity", "Relu", "AddV2", "Mul", "MatMul", "BiasAdd", "Shape",
                       "StridedSlice", "Pack", "Reshape", "Transpose", "Mean", "Sub", "Exp",
                       "Cast", "Tanh", "NoOp", "Sum", "Square", "Fill"})
F32 = tf.float32


# -- helpers ---------------------------------------------------------------------------------


def freeze(fn: Callable, *specs: tf.TensorSpec) -> tuple[graph_pb2.GraphDef, list[str]]:
    """Trace `fn`, freeze it: (GraphDef, output tensor names)."""
    concrete = tf.function(fn, autograph=False).get_concrete_function(*specs)
    frozen = convert_variables_to_constants_v2(concrete)
    return frozen.graph.as_graph_def(), [t.name for t in frozen.outputs]


def run_graph(graph_def: graph_pb2.GraphDef, feeds: dict[str, np.ndarray],
              fetches: Sequence[str]) -> list[np.ndarray]:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(list(fetches), feeds)


def emulated_device(sub: P.Subgraph, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The NeuronOp's contract: run at the compiled shapes, split other batches into chunks."""

    def run(ins: list[np.ndarray]) -> list[np.ndarray]:
        # Static placeholders: TensorFlow rejects any shape but the compiled one.
        return run_graph(sub.graph_def, dict(zip(sub.input_names, ins)), sub.output_names)

    axes = sub.input_batch_axes
    batches = {a.shape[ax] for a, ax in zip(arrays, axes) if ax >= 0}
    compiled = {s[ax] for s, ax in zip(sub.input_shapes, axes) if ax >= 0}
    if not batches or batches == compiled:
        return run(arrays)
    (batch,), (size,) = batches, compiled
    chunks = []
    for k in range(math.ceil(batch / size)):
        rows = np.minimum(np.arange(k * size, (k + 1) * size), batch - 1)  # pad: repeat last row
        chunks.append(run([a if ax < 0 else np.take(a, rows, axis=ax)
                           for a, ax in zip(arrays, axes)]))
    outs = []
    for i, ax in enumerate(sub.output_batch_axes):
        if ax < 0:
            outs.append(chunks[0][i])
        else:
            full = np.concatenate([c[i] for c in chunks], axis=ax)
            outs.append(np.take(full, np.arange(batch), axis=ax))
    return outs


def real_device(sub: P.Subgraph, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Compile with the real compiler (in-process) and run on the simulated device."""
    from neuronish.cc.compiler import compile_graph
    from neuronish.runtime import load

    with load(compile_graph(sub.serialize(), sub.io_config)) as model:
        out = model.run(dict(zip(sub.input_names, arrays)))
    return [out[name] for name in sub.output_names]


def fused_node(sub: P.Subgraph) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=sub.name, op="NeuronOp")
    node.input.extend(sub.inputs)
    return node


Device = Callable[[P.Subgraph, list[np.ndarray]], list[np.ndarray]]


def run_spliced(spliced: P.Spliced, subgraphs: Sequence[P.Subgraph], feeds: dict[str, np.ndarray],
                fetches: Sequence[str], device: Device = emulated_device) -> list[np.ndarray]:
    """Run a spliced graph; each NeuronOp becomes IdentityN over fed Placeholders."""
    gd = graph_pb2.GraphDef()
    gd.CopyFrom(spliced.graph_def)
    subs = {s.name: s for s in subgraphs}
    order = [n for n in Graph.build(gd).order if n in subs]  # before cutting the edges
    reads: dict[str, list[str]] = {}
    for node in gd.node:
        if node.op != "NeuronOp":
            continue
        sub = subs[node.name]
        reads[node.name] = [i for i in node.input if not i.startswith("^")]
        control = [i for i in node.input if i.startswith("^")]
        node.op = "IdentityN"
        del node.input[:]
        for k, dtype in enumerate(sub.output_dtypes):
            ph = gd.node.add(name=f"{node.name}/result_{k}", op="Placeholder")
            ph.attr["dtype"].type = tf.as_dtype(dtype).as_datatype_enum
            node.input.append(ph.name)
            node.attr["T"].list.type.append(tf.as_dtype(dtype).as_datatype_enum)
        node.input.extend(control)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(gd, name="")
    feeds = dict(feeds)
    with tf.compat.v1.Session(graph=graph) as session:
        for name in order:
            arrays = session.run(reads[name], feeds) if reads[name] else []
            for k, value in enumerate(device(subs[name], arrays)):
                feeds[f"{name}/result_{k}:0"] = value
        return session.run(list(fetches), feeds)


def splice_all(graph_def: graph_pb2.GraphDef, part: P.Partition,
               fetches: Sequence[str]) -> P.Spliced:
    return P.splice(graph_def, [(s, fused_node(s)) for s in part.subgraphs], fetches)


def check_end_to_end(graph_def: graph_pb2.GraphDef, outputs: list[str], part: P.Partition,
                     feeds_for: Callable[[int], dict[str, np.ndarray]], batches: Sequence[int],
                     device: Device = emulated_device) -> P.Spliced:
    spliced = splice_all(graph_def, part, outputs)
    ops = {n.op for n in spliced.graph_def.node}
    assert "NeuronOp" in ops
    fetches = [spliced.renamed.get(t, t) for t in outputs]
    for batch in batches:
        feeds = feeds_for(batch)
        want = run_graph(graph_def, feeds, outputs)
        got = run_spliced(spliced, part.subgraphs, feeds, fetches, device)
        for w, g in zip(want, got):
            assert g.shape == w.shape and g.dtype == w.dtype, (batch, g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    return spliced


def cluster_of(part: P.Partition, node: str) -> str | None:
    for s in part.subgraphs:
        if node in s.node_names and node not in s.duplicated_nodes:
            return s.name
    return None


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def spec(*shape: int | None, name: str = "x", dtype: tf.DType = F32) -> tf.TensorSpec:
    return tf.TensorSpec(shape, dtype, name=name)


W = rand(8, 8, seed=1)


# -- the compiler's operator list ------------------------------------------------------------


def test_supported_ops_come_from_the_compiler() -> None:
    ops = P.supported_ops()
    assert {"MatMul", "Conv2D", "Shape", "Reshape"} <= ops
    assert "MatrixInverse" not in ops and "AsString" not in ops
    assert P.supported_ops() is ops  # cached per command


def test_supported_ops_honours_the_command_and_reports_failures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = f"{sys.executable} -c \"print('Relu'); print('FakeOp')\""
    monkeypatch.setenv("NEURONISH_CC", fake)
    assert P.supported_ops() == {"Relu", "FakeOp"}
    with pytest.raises(P.PartitionError, match="status 3"):
        P.supported_ops([sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(P.PartitionError, match="NEURONISH_CC"):
        P.supported_ops(["/nonexistent/neuronish-cc"])


def test_compiler_support_names_refused_nodes_and_copes_with_an_older_compiler(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def fn(x):
        return tf.nn.max_pool2d(tf.nn.relu(x), ksize=[1, 1, 1, 2], strides=[1, 1, 1, 2],
                                padding="VALID")

    gd, _ = freeze(fn, spec(1, 4, 4, 4))
    support = P.compiler_support(gd)
    assert {"Relu", "MaxPool"} <= support.ops
    (node, reason), = support.refused.items()
    assert gd_op(gd, node).startswith("MaxPool") and "ksize" in reason
    # A compiler that only knows the plain list (exit 2 on --json): no refusals, no error.
    fake = f"{sys.executable} -c \"import sys; sys.exit(2) if '--json' in sys.argv else " \
           f"print('Relu')\""
    monkeypatch.setenv("NEURONISH_CC", fake)
    assert P.compiler_support(gd) == P.CompilerSupport(frozenset({"Relu"}))


def gd_op(gd: graph_pb2.GraphDef, name: str) -> str:
    return next(n.op for n in gd.node if n.name == name)


def test_device_dtypes_match_the_compiler() -> None:
    from neuronish.cc.ioconfig import DEVICE_DTYPES

    assert P.DEVICE_DTYPES == frozenset(DEVICE_DTYPES)


# -- shapes and batch axes -------------------------------------------------------------------


def test_infer_sets_input_shapes_and_folds_shape_arithmetic() -> None:
    def fn(x):
        y = tf.nn.relu(x, name="y")
        n = tf.shape(y)[0]
        return tf.reshape(y, tf.stack([n, 12]), name="flat")

    gd, _ = freeze(fn, spec(None, 4, 3))
    infos = P.infer(gd, {"x:0": [5, 4, 3]})
    assert infos["y:0"] == P.TensorInfo((5, 4, 3), "float32")
    assert infos["flat:0"].shape == (5, 12)  # through Shape -> StridedSlice -> Pack
    assert P.infer(gd, {})["flat:0"].shape == (None, 12)
    with pytest.raises(P.PartitionError, match="no Placeholder"):
        P.infer(gd, {"y": [1, 4, 3]})


def test_batch_axes_follow_the_batch() -> None:
    def fn(x, k):
        y = tf.nn.relu(x, name="y")
        t = tf.transpose(y, [1, 0, 2], name="t")
        s = tf.reduce_sum(y, axis=0, name="over_batch")
        f = tf.reshape(y, [-1], name="flat")  # batch folded into one dimension
        return t, s, f, tf.identity(k * 2.0, name="k2")

    gd, _ = freeze(fn, spec(None, 4, 3), spec(name="k"))
    axes = P.batch_axes(gd, {"x": [4, 4, 3], "k": []}, 4)
    assert axes["y:0"] == 0 and axes["t:0"] == 1
    assert axes["over_batch:0"] == -1 and axes["k2:0"] == -1
    assert axes["flat:0"] is None
    # A batch equal to another dimension is still told apart (4 vs 4).
    assert axes["x:0"] == 0


def test_a_colocation_with_a_node_inlining_removed_does_not_stop_shape_inference() -> None:
    # A tf.Module's signature keeps `_class: loc:@StatefulPartitionedCall/Identity_2` on
    # nodes whose colocation partner inlining removed; importing that graph fails.
    gd, outs = freeze(lambda x: tf.nn.relu(x, name="r"), spec(None, 4))
    node = next(n for n in gd.node if n.name == "r")
    node.attr["_class"].list.s.append(b"loc:@gone/Identity_2")
    infos = P.infer(gd, {"x": [3, 4]})
    assert infos["r:0"].shape == (3, 4)


def test_batch_axes_refuse_a_graph_with_a_baked_batch() -> None:
    def fn(x):
        return tf.reshape(x, [2, 12])

    gd, _ = freeze(fn, spec(None, 4, 3))
    with pytest.raises(P.PartitionError, match="baked in"):
        P.batch_axes(gd, {"x": [2, 4, 3]}, 2)


# -- mark ------------------------------------------------------------------------------------


def _string_graph() -> tuple[graph_pb2.GraphDef, list[str]]:
    def fn(x):
        a = tf.add(x, 1, name="a")
        text = tf.strings.as_string(a, name="text")  # string in the middle
        back = tf.strings.to_number(text, out_type=tf.int32, name="back")
        return tf.multiply(back, 3, name="m")

    return freeze(fn, spec(None, 4, dtype=tf.int32))


def test_mark_gives_the_reason_for_each_node() -> None:
    def fn(x):
        r = tf.nn.relu(x, name="r")
        noise = tf.random.uniform([2, 4], name="noise")  # stateful
        u = tf.unique(tf.reshape(r, [-1]), name="u").y  # data-dependent shape
        return tf.sin(r, name="s") + noise, tf.identity(u, name="uid")

    gd, _ = freeze(fn, spec(2, 4))
    infos = P.infer(gd, {"x": [2, 4]})
    marking = P.mark(gd, infos, SUPPORTED | {"RandomUniform", "Unique"})
    m = marking.nodes
    assert m["x"].reason is Reason.PLACEHOLDER
    assert m["r"].supported
    assert m["s"].reason is Reason.UNSUPPORTED_OP
    assert m["noise/RandomUniform"].reason is Reason.STATEFUL
    assert m["u"].reason is Reason.SHAPE and "[?]" in m["u"].detail
    assert m["uid"].reason is Reason.SHAPE  # its input's shape is unknown
    assert set(marking.unsupported) >= {"x", "s", "u", "uid", "noise/RandomUniform"}

    gd, _ = _string_graph()
    marking = P.mark(gd, P.infer(gd, {"x": [2, 4]}), SUPPORTED | {"AsString", "StringToNumber"})
    assert marking.nodes["text"].reason is Reason.DTYPE and "string" in marking.nodes["text"].detail
    assert marking.nodes["back"].reason is Reason.DTYPE  # reads a string
    assert marking.nodes["a"].supported and marking.nodes["m"].supported


def test_no_fuse_and_force_fuse_by_name_and_type() -> None:
    gd, _ = _string_graph()
    infos = P.infer(gd, {"x": [2, 4]})
    by_name = P.mark(gd, infos, SUPPORTED, no_fuse_ops=["a"])
    assert by_name.nodes["a"].reason is Reason.NO_FUSE and "name" in by_name.nodes["a"].detail
    by_type = P.mark(gd, infos, SUPPORTED, no_fuse_ops=["Mul"])
    assert by_type.nodes["m"].reason is Reason.NO_FUSE and "op type" in by_type.nodes["m"].detail

    def fn(x):
        return tf.sin(tf.nn.relu(x, name="r"), name="s")

    gd2, _ = freeze(fn, spec(2, 4))
    infos2 = P.infer(gd2, {"x": [2, 4]})
    assert P.mark(gd2, infos2, SUPPORTED, force_fuse_ops=["s"]).nodes["s"].forced
    assert P.mark(gd2, infos2, SUPPORTED, force_fuse_ops=["Sin"]).nodes["s"].supported
    # no_fuse beats force_fuse; force_fuse never overrides the dtype rule.
    both = P.mark(gd2, infos2, SUPPORTED, no_fuse_ops=["Sin"], force_fuse_ops=["s"])
    assert both.nodes["s"].reason is Reason.NO_FUSE
    forced_string = P.mark(gd, infos, SUPPORTED, force_fuse_ops=["AsString", "back"])
    assert forced_string.nodes["text"].reason is Reason.DTYPE
    assert forced_string.nodes["back"].reason is Reason.DTYPE
    assert P.mark(gd2, infos2, SUPPORTED, no_fuse_ops=["Typo"]).unmatched_selectors == ("Typo",)


def test_exclude_nodes_keeps_the_callers_reason() -> None:
    gd, _ = _string_graph()
    infos = P.infer(gd, {"x": [2, 4]})
    marking = P.mark(gd, infos, SUPPORTED, exclude_nodes={"m": "compiler: int32 Mul"})
    assert marking.nodes["m"].reason is Reason.EXCLUDED
    assert "compiler: int32 Mul" in marking.nodes["m"].describe()
    with pytest.raises(P.PartitionError, match="not nodes of the graph"):
        P.mark(gd, infos, SUPPORTED, exclude_nodes={"nope": "x"})


# -- cluster ---------------------------------------------------------------------------------


def test_no_cycle_through_an_unsupported_node() -> None:
    # a -> u (unsupported) -> c and a -> c: merging a and c would make the
    # fused op both feed u and wait for it.
    def fn(x):
        a = tf.nn.relu(x, name="a")
        u = tf.sin(a, name="u")
        c = tf.add(a, u, name="c")
        return tf.nn.relu(c, name="d")

    gd, outs = freeze(fn, spec(None, 4))
    part = P.partition(gd, {"x": [2, 4]}, SUPPORTED, minimum_segment_size=1,
                       dynamic_batch_size=True)
    assert cluster_of(part, "a") and cluster_of(part, "c")
    assert cluster_of(part, "a") != cluster_of(part, "c")
    assert cluster_of(part, "c") == cluster_of(part, "d")
    check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 4)}, [2, 5])


def test_no_cycle_through_a_third_cluster() -> None:
    # a -> u1 -> b -> u2 -> c and a -> c: b is a cluster of its own and the
    # path a ~> c runs through it.
    def fn(x):
        a = tf.nn.relu(x, name="a")
        b = tf.exp(tf.sin(a, name="u1"), name="b")
        c = tf.add(a, tf.sin(b, name="u2"), name="c")
        return c

    gd, _ = freeze(fn, spec(2, 4))
    marking = P.mark(gd, P.infer(gd, {"x": [2, 4]}), SUPPORTED)
    clusters = {n: c.name for c in P.cluster(gd, marking) for n in c.nodes}
    assert len({clusters["a"], clusters["b"], clusters["c"]}) == 3


def test_control_edges_count_as_paths() -> None:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(F32, [2, 4], name="x")
        a = tf.nn.relu(x, name="a")
        with tf.control_dependencies([a]):  # a -> ^u, then u -> c
            u = tf.sin(x, name="u")
        tf.add(a, u, name="c")
    gd = graph.as_graph_def()
    marking = P.mark(gd, P.infer(gd, {"x": [2, 4]}), SUPPORTED)
    clusters = {n: c.name for c in P.cluster(gd, marking) for n in c.nodes}
    assert clusters["a"] != clusters["c"]


def test_control_inputs_move_onto_the_fused_op() -> None:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(F32, [None, 4], name="x")
        s = tf.sin(x, name="s")
        with tf.control_dependencies([s]):
            a = tf.nn.relu(x, name="a")
        b = tf.exp(a, name="b")
        with tf.control_dependencies([a]):  # inside the cluster: stays in the subgraph
            c = tf.add(b, 1.0, name="c")  # (the edge lands on its Const, "c/y")
        with tf.control_dependencies([c]):
            tf.sin(x, name="after")  # outside reader of ^c
        tf.identity(c, name="out")
    gd = graph.as_graph_def()
    part = P.partition(gd, {"x": [2, 4]}, SUPPORTED, fetches=["out:0", "after:0"])
    (sub,) = part.subgraphs
    assert {"a", "b", "c"} <= set(sub.node_names) and sub.control_inputs == ("s",)
    inner = {n.name: list(n.input) for n in sub.graph_def.node}
    assert "^a" in inner["c/y"] and not any(i.startswith("^") for i in inner["a"])
    spliced = splice_all(gd, part, ["out:0", "after:0"])
    nodes = {n.name: list(n.input) for n in spliced.graph_def.node}
    assert "^s" in nodes[sub.name]
    assert f"^{sub.name}" in nodes["after"]
    assert not {"a", "b", "c"} & set(nodes)


def test_clustering_never_closes_a_cycle_on_random_graphs() -> None:
    rng = random.Random(7)
    for trial in range(60):
        gd = graph_pb2.GraphDef()
        n = rng.randint(5, 60)
        ok: dict[str, bool] = {}
        for i in range(n):
            node = gd.node.add(name=f"n{i}", op="Relu")
            ok[node.name] = rng.random() < 0.75
            for j in rng.sample(range(i), min(i, rng.randint(0, 3))):
                node.input.append(f"n{j}" if rng.random() < 0.85 else f"^n{j}")
        marking = Marking({k: NodeMark(k, "Relu", None if v else Reason.UNSUPPORTED_OP)
                           for k, v in ok.items()})
        clusters = P.cluster(gd, marking)
        owner = {m: c.name for c in clusters for m in c.nodes}
        assert set(owner) == {k for k, v in ok.items() if v}
        assert len(owner) == sum(len(c.nodes) for c in clusters)  # disjoint
        index = Graph.build(gd)
        edges = {(owner.get(p, p), owner.get(n, n)) for n in index.order
                 for p in index.producers(n)}
        assert not _has_cycle({(a, b) for a, b in edges if a != b}), f"trial {trial}"


def _has_cycle(edges: set[tuple[str, str]]) -> bool:
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(b, set()).add(a)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError:
        return True
    return False


def test_contraction_matches_brute_force_reachability() -> None:
    from neuronish.partition.dag import ContractibleDag

    def other_path(dag: ContractibleDag, a: int, b: int) -> bool:
        seen, stack = {a}, [a]
        while stack:
            for nxt in dag.succ[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return b in seen

    rng = random.Random(3)
    for _ in range(400):
        n = rng.randint(2, 30)
        edges = {(i, j) for j in range(n) for i in rng.sample(range(j), min(j, rng.randint(0, 3)))}
        dag = ContractibleDag(n, edges)
        for _ in range(n):
            alive = [i for i in range(n) if dag.find(i) == i]
            candidates = [(a, b) for a in alive for b in sorted(dag.succ[a])]
            if not candidates:
                break
            a, b = rng.choice(candidates)
            dag.succ[a].discard(b)  # is there a path a ~> b besides the edge?
            expected = not other_path(dag, a, b)
            dag.succ[a].add(b)
            assert dag.contract(a, b) == expected
            for x in (i for i in range(n) if dag.find(i) == i):  # ranks stay topological
                assert all(dag.rank[x] < dag.rank[y] for y in dag.succ[x])


def test_clusters_are_named_in_topological_order_and_avoid_taken_names() -> None:
    def fn(x):
        a = tf.nn.relu(x, name="neuron_op_0")  # a name the op would take
        b = tf.exp(tf.sin(a), name="b")
        return b

    gd, _ = freeze(fn, spec(2, 4))
    marking = P.mark(gd, P.infer(gd, {"x": [2, 4]}), SUPPORTED)
    names = [c.name for c in P.cluster(gd, marking)]
    assert names[0] == "neuron_op_1" and "neuron_op_0" not in names
    assert names == sorted(names, key=lambda s: int(s.rsplit("_", 1)[1]))


def _graph(*nodes: tuple[str, tuple[str, ...]]) -> graph_pb2.GraphDef:
    gd = graph_pb2.GraphDef()
    for name, inputs in nodes:
        gd.node.append(node_def_pb2.NodeDef(name=name, op="NoOp" if not inputs else "Identity",
                                            input=list(inputs)))
    return gd


def test_graph_order_releases_the_first_ready_node_in_graphdef_order() -> None:
    # b becomes ready after a, and still comes before c, which was ready from the start:
    # the order is the smallest by GraphDef position at every step, not level by level.
    gd = _graph(("a", ()), ("b", ("a",)), ("c", ()), ("d", ("c", "^b")))
    assert Graph.build(gd).order == ("a", "b", "c", "d")
    gd = _graph(("c", ()), ("d", ("c", "^b")), ("b", ("a",)), ("a", ()))
    assert Graph.build(gd).order == ("c", "a", "b", "d")


def test_one_topological_order_for_partitioner_and_model_freezer() -> None:
    # Of the nodes ready, the first in the order given: GraphDef order for the partitioner,
    # name order for models/freeze.py's canonical order.
    deps = {"c": [], "b": ["c"], "a": [], "d": ["a", "b"]}
    assert topological_order(deps) == ["c", "b", "a", "d"]
    assert topological_order({k: deps[k] for k in sorted(deps)}) == ["a", "c", "b", "d"]
    with pytest.raises(graphlib.CycleError):
        topological_order({"a": ["b"], "b": ["a"]})
    from models.freeze import _canonical_order

    gd = graph_pb2.GraphDef()
    for name, inputs in [("z", []), ("y", ["z:0"]), ("x", ["^z"]), ("w", ["y", "x:1"])]:
        gd.node.add(name=name, op="NoOp", input=inputs)
    assert [n.name for n in _canonical_order(Graph(gd)).node] == ["z", "x", "y", "w"]
    assert list(Graph.build(gd).order) == ["z", "y", "x", "w"]


def test_needed_nodes_follow_data_and_control_edges_from_any_spelling() -> None:
    gd = graph_pb2.GraphDef()
    for name, inputs in [("a", []), ("b", ["a:1"]), ("c", ["^b"]), ("d", ["c"]), ("e", ["a"])]:
        gd.node.add(name=name, op="NoOp", input=inputs)
    graph = Graph(gd)
    assert graph.needed(["d:0"]) == {"a", "b", "c", "d"}
    assert graph.needed(["^c", "missing"]) == {"a", "b", "c"}
    assert graph.needed(["e"]) == {"a", "e"}


def test_one_answer_to_is_stateful_for_freezing_and_partitioning() -> None:
    import importlib

    from neuronish import freeze as freeze_module

    mark_module = importlib.import_module("neuronish.partition.mark")  # `P.mark` is the function

    # An op this TensorFlow does not know may do anything: the safe answer is stateful.
    assert is_stateful("NotAnOpTensorFlowKnows")
    assert is_stateful("RandomUniform") and is_stateful("AssignVariableOp")
    assert not is_stateful("Relu") and not is_stateful("MatMul")
    assert freeze_module.is_stateful is is_stateful and mark_module.is_stateful is is_stateful
    # constant folding and the static-value analysis ask the same question
    fold_module = importlib.import_module("neuronish.rewrites.fold")
    values_module = importlib.import_module("neuronish.shape_inference.values")
    assert fold_module.is_stateful is is_stateful and values_module.is_stateful is is_stateful


def test_graph_with_a_cycle_is_refused_naming_the_cycle() -> None:
    gd = _graph(("x", ()), ("a", ("x", "c")), ("b", ("a",)), ("c", ("^b",)))
    with pytest.raises(P.PartitionError, match="cycle") as e:
        Graph.build(gd)
    assert all(repr(n) in str(e.value) for n in ("a", "b", "c"))
    assert "'x'" not in str(e.value)


def test_minimum_segment_size_counts_compute_nodes_only() -> None:
    def fn(x):
        a = tf.identity(tf.nn.relu(x, name="r1"), name="i1")
        a = tf.exp(a, name="e1")  # cluster 1: Relu, Identity, Exp + Const-free: 2 compute
        s = tf.sin(a, name="s")
        return tf.tanh(tf.nn.relu(s, name="r2"), name="t2") * 2.0  # cluster 2: 3 compute

    gd, _ = freeze(fn, spec(2, 4))
    marking = P.mark(gd, P.infer(gd, {"x": [2, 4]}), SUPPORTED)
    clusters = P.cluster(gd, marking)
    sizes = sorted(len(c.compute_nodes) for c in clusters)
    assert sizes == [2, 3]
    first = next(c for c in clusters if "r1" in c.nodes)
    assert "i1" in first.nodes and "i1" not in first.compute_nodes
    kept = P.drop_small(clusters, 3)
    assert [len(c.compute_nodes) for c in kept.kept] == [3]
    (dropped,) = kept.dropped
    assert "r1" in dropped.cluster.nodes and "2 compute nodes < minimum_segment_size 3" in \
        dropped.reason
    assert len(P.drop_small(clusters, 2).kept) == 2
    # A forced node keeps its cluster whatever its size.
    forced = P.mark(gd, P.infer(gd, {"x": [2, 4]}), SUPPORTED, force_fuse_ops=["r1"])
    assert len(P.drop_small(P.cluster(gd, forced), 10).kept) == 1


def test_no_fuse_splits_and_force_fuse_joins_end_to_end() -> None:
    def fn(x):
        a = tf.nn.relu(tf.matmul(x, W, name="mm"), name="a")
        b = tf.sin(a, name="s")
        return tf.tanh(b * 2.0, name="t")

    gd, outs = freeze(fn, spec(None, 8))
    plain = P.partition(gd, {"x": [2, 8]}, SUPPORTED, minimum_segment_size=1)
    assert len(plain.subgraphs) == 2
    forced = P.partition(gd, {"x": [2, 8]}, SUPPORTED, force_fuse_ops=["Sin"])
    (sub,) = forced.subgraphs
    assert {"mm", "a", "s", "t"} <= set(sub.node_names)
    split = P.partition(gd, {"x": [2, 8]}, SUPPORTED, force_fuse_ops=["Sin"], no_fuse_ops=["a"],
                        minimum_segment_size=1)
    assert cluster_of(split, "a") is None and cluster_of(split, "mm") != cluster_of(split, "s")
    assert split.left_on_tensorflow["a"] == P.OnTensorFlow("listed in no_fuse_ops", "by name")
    for part in (plain, forced, split):
        check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 8)}, [2])


def test_a_string_op_in_the_middle() -> None:
    gd, outs = _string_graph()
    part = P.partition(gd, {"x": [2, 4]}, SUPPORTED | {"AsString", "StringToNumber"},
                       minimum_segment_size=1, dynamic_batch_size=True)
    assert cluster_of(part, "a") and cluster_of(part, "m")
    assert cluster_of(part, "a") != cluster_of(part, "m")
    assert cluster_of(part, "text") is None and cluster_of(part, "back") is None
    report = part.op_types_left_on_tensorflow()
    assert report["AsString"] == {"has a dtype the device cannot hold": 1}
    ints = lambda b: {"x:0": np.arange(b * 4, dtype=np.int32).reshape(b, 4)}  # noqa: E731
    check_end_to_end(gd, outs, part, ints, [2, 3])


# -- shape-derived values --------------------------------------------------------------------


def _shape_graph() -> tuple[graph_pb2.GraphDef, list[str]]:
    def fn(x):
        y = tf.nn.relu(x, name="y")
        z = tf.sin(y, name="z")  # unsupported: splits the graph
        n = tf.strided_slice(tf.shape(y, name="shape_y"), [0], [1], shrink_axis_mask=1,
                             name="n")
        flat = tf.reshape(z, tf.stack([n, 12], name="target"), name="flat")
        out = tf.multiply(flat, 2.0, name="out")
        # A shape-derived value read on TensorFlow: must follow the real batch.
        nb = tf.sin(tf.cast(n, F32, name="n_float"), name="nb")
        return out, nb

    return freeze(fn, spec(None, 4, 3))


def test_shape_derived_values_never_leave_a_cluster() -> None:
    gd, outs = _shape_graph()
    part = P.partition(gd, {"x": [2, 4, 3]}, SUPPORTED, minimum_segment_size=1,
                       dynamic_batch_size=True, fetches=outs)
    second = next(s for s in part.subgraphs if "flat" in s.node_names)
    # The cluster computes the shape itself from y (at its compiled batch) ...
    assert {"shape_y", "n", "target"} <= set(second.node_names)
    assert "y:0" in second.inputs and "z:0" in second.inputs
    # ... and the TensorFlow copy still serves n_float.
    assert {"shape_y", "n"} <= set(second.duplicated_nodes)
    static = {"shape_y", "n", "target", "n_float"}
    for s in part.subgraphs:
        assert not {producer(t) for t in s.outputs} & static
    first = next(s for s in part.subgraphs if "y" in s.node_names)
    assert "y:0" in first.outputs
    spliced = check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 4, 3, seed=b)}, [2, 5])
    remaining = {n.name for n in spliced.graph_def.node}
    assert {"shape_y", "n", "n_float"} <= remaining and "target" not in remaining
    assert "flat" not in remaining and "y" not in remaining


def test_a_shape_value_the_device_cannot_compute_whole_stays_on_tensorflow() -> None:
    gd, outs = _shape_graph()  # n's strides come from a Fill (ones_like): make it unsupported
    part = P.partition(gd, {"x": [2, 4, 3]}, SUPPORTED - {"Fill"}, minimum_segment_size=1,
                       dynamic_batch_size=True, fetches=outs)
    n = part.marking.nodes["n"]
    assert n.reason is Reason.SHAPE_VALUE and "ones_like (Fill)" in n.detail
    assert part.marking.nodes["target"].reason is Reason.SHAPE_VALUE
    reshaping = next(s for s in part.subgraphs if "flat" in s.node_names)
    assert "target:0" in reshaping.inputs  # computed on TensorFlow, at the real batch
    check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 4, 3)}, [2])


def test_shape_derived_cluster_compiles_with_the_real_compiler() -> None:
    gd, outs = _shape_graph()
    part = P.partition(gd, {"x": [2, 4, 3]}, minimum_segment_size=1, dynamic_batch_size=True,
                       fetches=outs)
    assert all(s.dynamic_batch for s in part.subgraphs)
    check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 4, 3, seed=b)}, [2, 5],
                     real_device)


# -- batch axes in subgraphs -----------------------------------------------------------------


def test_subgraph_batch_axes_and_io_config() -> None:
    from neuronish.cc.ioconfig import parse_io_config

    def fn(x):
        y = tf.nn.relu(tf.matmul(x, W), name="y")
        return tf.transpose(tf.reshape(y, [-1, 2, 4]), [1, 0, 2], name="t")

    gd, outs = freeze(fn, spec(None, 8))
    part = P.partition(gd, {"x": [3, 8]}, SUPPORTED, dynamic_batch_size=True)
    (sub,) = part.subgraphs
    assert sub.inputs == ("x:0",) and sub.input_names == ("x:0",)
    assert outs == ["Identity:0"] and sub.outputs == ("Identity:0",)  # the signature's Identity
    assert sub.output_shapes == ((2, 3, 4),)
    assert sub.input_batch_axes == (0,) and sub.output_batch_axes == (1,)
    assert sub.dynamic_batch_reason is None
    assert sub.io_config == {"inputs": {"x:0": [[3, 8], "float32", 0]},
                             "outputs": {"Identity:0": 1}}
    io = parse_io_config(sub.io_config)
    assert io.inputs[0].batch_axis == 0 and io.output_batch_axes == (1,)
    assert sub.op_counts["MatMul"] == 1 and sub.op_counts["Const"] >= 1
    placeholder = sub.graph_def.node[0]
    assert placeholder.op == "Placeholder"
    assert [d.size for d in placeholder.attr["shape"].shape.dim] == [3, 8]
    again = P.partition(gd, {"x": [3, 8]}, SUPPORTED, dynamic_batch_size=True)
    assert again.subgraphs[0].serialize() == sub.serialize()
    check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 8, seed=b)}, [3, 7])


def test_a_batch_reduction_stays_on_tensorflow_and_the_rest_keeps_a_dynamic_batch() -> None:
    def fn(x):
        y = tf.nn.relu(tf.matmul(x, W), name="y")
        return tf.subtract(y, tf.reduce_mean(y, axis=0, name="batch_mean"), name="centered")

    gd, outs = freeze(fn, spec(None, 8))
    part = P.partition(gd, {"x": [4, 8]}, SUPPORTED, dynamic_batch_size=True, fetches=outs)
    mean = part.marking.nodes["batch_mean"]
    assert mean.reason is Reason.BATCH_MIXING and "mixes samples" in mean.detail
    assert "batch_mean" in part.reasons() and part.subgraphs
    assert all(s.dynamic_batch_reason is None for s in part.subgraphs)
    # The mean over whichever batch TF is given: every batch size gives TF's numbers.
    check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 8, seed=b)}, [4, 3, 7])
    (off,) = P.partition(gd, {"x": [4, 8]}, SUPPORTED, dynamic_batch_size=False).subgraphs
    assert off.output_batch_axes == (-1,) and "dynamic_batch_size is off" in \
        off.dynamic_batch_reason


def test_identity_n_passing_a_constant_beside_the_batch_keeps_it_dynamic() -> None:
    # Keras' swish (EfficientNet) returns IdentityN(y, x, beta): output 2 is the constant
    # beta, not a mix of samples; each IdentityN output follows its own input only.
    def fn(x):
        y = tf.nn.relu(tf.matmul(x, W))
        out = tf.raw_ops.IdentityN(input=[y, x, tf.constant(1.5)])
        return out[0] * out[2]

    gd, outs = freeze(fn, spec(None, 8))
    part = P.partition(gd, {"x": [1, 8]}, SUPPORTED | {"IdentityN"}, dynamic_batch_size=True)
    (sub,) = part.subgraphs
    assert sub.dynamic_batch_reason is None and sub.output_batch_axes == (0,)
    check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 8, seed=b)}, [1, 3])


def test_an_output_of_ambiguous_batch_axis_stays_on_tensorflow() -> None:
    # A flattened [b * 8] output follows the batch in no single axis: the reshape making
    # it stays on TensorFlow (which computes it at any batch), the rest on the device.
    def fn(x):
        return tf.reshape(tf.nn.relu(tf.matmul(x, W)), [-1], name="flat")

    gd, outs = freeze(fn, spec(None, 8))
    part = P.partition(gd, {"x": [2, 8]}, SUPPORTED, dynamic_batch_size=True, fetches=outs)
    (sub,) = part.subgraphs
    assert sub.dynamic_batch_reason is None and sub.output_batch_axes == (0,)
    flat = part.marking.nodes["flat"]
    assert flat.reason is Reason.BATCH_MIXING and "cannot be told from shapes" in flat.detail
    check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 8, seed=b)}, [2, 3])


def test_a_reshape_that_moves_the_batch_stays_on_tensorflow() -> None:
    # keras_hub's XLNet reshapes its [seq, batch, d] positional tensor to [batch, seq, d]:
    # every shape follows the batch, but at batch 3 each sample reads rows of the others,
    # so three batch-1 runs side by side are not TensorFlow's batch-3 result.
    def fn(x):
        y = tf.nn.relu(tf.matmul(x, W))                      # [b, 8]
        seq_major = tf.transpose(tf.reshape(y, [-1, 4, 2]), [1, 0, 2])   # [4, b, 2]
        mixed = tf.reshape(seq_major, [-1, 4, 2], name="mixed")           # [b, 4, 2]
        return tf.tanh(mixed * 2.0)

    gd, outs = freeze(fn, spec(None, 8))
    x = rand(3, 8, seed=3)
    whole = run_graph(gd, {"x:0": x}, outs)[0]
    apart = np.concatenate([run_graph(gd, {"x:0": x[i:i + 1]}, outs)[0] for i in range(3)])
    assert not np.allclose(whole, apart), "the premise: this graph mixes samples in TF"
    part = P.partition(gd, {"x": [1, 8]}, SUPPORTED, dynamic_batch_size=True, fetches=outs)
    mixed = part.marking.nodes["mixed"]
    assert mixed.reason is Reason.BATCH_MIXING and "moves the batch" in mixed.detail
    assert all(s.dynamic_batch_reason is None for s in part.subgraphs)
    check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 8, seed=b)}, [1, 3])


def test_a_batch_folded_and_unfolded_by_reshapes_stays_dynamic() -> None:
    def fn(x):
        y = tf.reshape(tf.nn.relu(tf.matmul(x, W)), [-1, 4, 2])          # [b, 4, 2]
        flat = tf.reshape(y, [-1, 2])                                     # [b*4, 2]
        return tf.reshape(flat * 2.0, [-1, 2, 4], name="back")           # [b, 2, 4]

    gd, outs = freeze(fn, spec(None, 8))
    part = P.partition(gd, {"x": [1, 8]}, SUPPORTED, dynamic_batch_size=True)
    (sub,) = part.subgraphs
    assert sub.dynamic_batch_reason is None and sub.output_batch_axes == (0,)
    assert not part.reasons().keys() - {"x"}, part.reasons()  # nothing kept off for it
    check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 8, seed=b)}, [1, 3])


# -- splice and partition --------------------------------------------------------------------


def _chain_graph() -> tuple[graph_pb2.GraphDef, list[str]]:
    def fn(x, y):
        a = tf.nn.relu(tf.matmul(x, W), name="a")
        b = tf.nn.bias_add(a, W[0], name="b")
        u = tf.math.lgamma(b, name="u")  # unsupported
        c = tf.exp(u + y, name="c")
        d = tf.tanh(c * a, name="d")  # reads cluster 1 directly as well
        return d, tf.identity(b, name="b_out"), tf.math.lgamma(d, name="tail")

    return freeze(fn, spec(None, 8), spec(None, 8, name="y"))


def test_splice_rewires_readers_and_reports_renamed_outputs() -> None:
    gd, outs = _chain_graph()
    part = P.partition(gd, {"x": [2, 8], "y": [2, 8]}, SUPPORTED, dynamic_batch_size=True,
                       fetches=outs)
    first, second = part.subgraphs
    assert first.name == "neuron_op_0" and second.name == "neuron_op_1"
    assert "a:0" in first.outputs and "a:0" in second.inputs  # a feeds both u and d
    spliced = check_end_to_end(gd, outs, part,
                               lambda b: {"x:0": rand(b, 8), "y:0": rand(b, 8, seed=3)}, [2, 3])
    nodes = {n.name: n for n in spliced.graph_def.node}
    assert not {"a", "b", "c", "d", "MatMul"} & set(nodes)
    for k, t in enumerate(first.outputs):
        assert spliced.renamed[t] == f"neuron_op_0:{k}"
    assert list(nodes["neuron_op_1"].input) == [spliced.renamed.get(t, t) for t in second.inputs]
    assert nodes["u"].input[0] == spliced.renamed["b:0"]
    # Fused signature outputs (Identity nodes) are renamed; the others still exist.
    assert [t in spliced.renamed for t in outs] == [True, True, False]
    assert producer(outs[2]) in nodes
    with pytest.raises(P.PartitionError, match="Subgraph.inputs"):
        P.splice(gd, [(first, node_def_pb2.NodeDef(name=first.name, op="NeuronOp"))])


def test_fetching_an_unexported_tensor_is_an_error() -> None:
    gd, outs = _chain_graph()
    part = P.partition(gd, {"x": [2, 8], "y": [2, 8]}, SUPPORTED, fetches=outs)
    with pytest.raises(P.PartitionError, match="partition\\(fetches"):
        splice_all(gd, part, ["MatMul:0"])


def test_repartition_after_the_compiler_rejects_a_node() -> None:
    gd, outs = _chain_graph()
    shapes = {"x": [2, 8], "y": [2, 8]}
    part = P.partition(gd, shapes, SUPPORTED, fetches=outs, minimum_segment_size=1)
    assert cluster_of(part, "c")
    again = P.partition(gd, shapes, SUPPORTED, fetches=outs, minimum_segment_size=1,
                        exclude_nodes={"c": "neuronish-cc: Exp of this shape is not supported"})
    assert cluster_of(again, "c") is None
    assert again.reasons()["c"] == ("excluded by the caller: neuronish-cc: Exp of this shape is "
                                    "not supported")
    assert again.op_types_left_on_tensorflow()["Exp"] == {"excluded by the caller": 1}
    check_end_to_end(gd, outs, again, lambda b: {"x:0": rand(b, 8), "y:0": rand(b, 8)}, [2])


def test_recovery_rounds_on_one_graph_infer_shapes_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each inference imports the whole graph into TensorFlow; a recovery round changes the
    # excluded nodes only, so partitioning again on the same index reuses the shapes and
    # batch axes, and decides exactly what a fresh partition would.
    from neuronish.shape_inference import shapes as shapes_module

    calls: list[int] = []
    real_infer = shapes_module.infer

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return real_infer(*args, **kwargs)

    monkeypatch.setattr(shapes_module, "infer", counted)
    monkeypatch.setattr(P, "infer", counted)

    def fn(x):
        y = tf.nn.relu(tf.matmul(x, W), name="y")
        return tf.subtract(y, tf.reduce_mean(y, axis=0, name="batch_mean"), name="centered")

    gd, outs = freeze(fn, spec(None, 8))
    graph = Graph.build(gd)
    kwargs = {"dynamic_batch_size": True, "fetches": outs, "minimum_segment_size": 1}
    first = P.partition(graph, {"x": [4, 8]}, SUPPORTED, **kwargs)
    assert len(calls) == 2  # at the batch and at the batch + 1, for the batch axes
    again = P.partition(graph, {"x": [4, 8]}, SUPPORTED, exclude_nodes={"y": "no"},
                        **kwargs)
    assert len(calls) == 2
    assert again.infos is first.infos and again.batch_axes is first.batch_axes
    fresh = P.partition(gd, {"x": [4, 8]}, SUPPORTED, exclude_nodes={"y": "no"}, **kwargs)
    assert len(calls) == 4  # a GraphDef is indexed for the call: it infers afresh
    assert again.reasons() == fresh.reasons() and "y" in again.reasons()
    assert [s.graph_def for s in again.subgraphs] == [s.graph_def for s in fresh.subgraphs]
    assert dict(again.batch_axes) == dict(fresh.batch_axes)
    # Other input shapes are another inference, not the cached one: at batch 3 (the
    # batch + 1, 4, is the first round's inference, kept).
    other = P.partition(graph, {"x": [3, 8]}, SUPPORTED, **kwargs)
    assert len(calls) == 5 and other.infos["x:0"].shape == (3, 8)
    static = P.partition(graph, {"x": [4, 8]}, SUPPORTED, fetches=outs)
    assert static.batch_axes == {} and static.infos["x:0"].shape == (4, 8)
    assert len(calls) == 5  # the shapes at batch 4 are kept as well
    # An edit drops what was inferred: the next round infers the edited graph.
    graph.updated("y")
    P.partition(graph, {"x": [4, 8]}, SUPPORTED, **kwargs)
    assert len(calls) == 7


def test_partition_with_the_compilers_operator_list() -> None:
    gd, outs = _chain_graph()
    part = P.partition(gd, {"x": [2, 8], "y": [2, 8]}, fetches=outs)
    assert cluster_of(part, "a") == cluster_of(part, "b")
    assert part.marking.nodes["u"].reason is Reason.UNSUPPORTED_OP
    assert part.op_types_left_on_tensorflow()["Lgamma"] == {
        "op type not supported by neuronish-cc": 2}


def _random_graph(seed: int) -> Callable:
    """A random mix of supported ops, unsupported ops (Sin, Cos) and shape arithmetic."""
    rng = random.Random(seed)

    def fn(x):
        values = [x]
        for i in range(14):
            a, b = rng.choice(values), rng.choice(values)
            kind = rng.randrange(7)
            if kind == 0:
                v = tf.nn.relu(a)
            elif kind == 1:
                v = tf.sin(a)  # unsupported
            elif kind == 2:
                v = tf.add(a, b)
            elif kind == 3:
                v = tf.tanh(a * 0.5)
            elif kind == 4:
                v = tf.cos(a) if rng.random() < 0.5 else tf.matmul(a, W[:4, :4])
            elif kind == 5:  # reshape through the shape of another tensor
                v = tf.reshape(tf.transpose(tf.reshape(a, [-1, 2, 2]), [0, 2, 1]), tf.shape(b))
            else:  # a batch-size-dependent value read on TensorFlow
                v = a + tf.sin(tf.cast(tf.shape(b)[0], F32))
            values.append(tf.identity(v, name=f"v{i}"))
        return values[-1], values[len(values) // 2]

    return fn


@pytest.mark.parametrize("seed", range(8))
def test_random_graphs_compute_the_same_after_splicing(seed: int) -> None:
    gd, outs = freeze(_random_graph(seed), spec(None, 4))
    part = P.partition(gd, {"x": [2, 4]}, SUPPORTED, minimum_segment_size=1,
                       dynamic_batch_size=True, fetches=outs)
    assert part.subgraphs
    check_end_to_end(gd, outs, part, lambda b: {"x:0": rand(b, 4, seed=b)}, [2, 3])


def _dynamic_zoo_graph(name: str) -> tuple[graph_pb2.GraphDef, object]:
    from models.cache import cached_frozen_graph

    frozen = cached_frozen_graph(name, 2)
    # The dynamic-batch freeze: Shape arithmetic and the inlined call's
    # control edges are still there, as the SavedModel loader may leave them.
    return graph_pb2.GraphDef.FromString(frozen.reference_graph_def), frozen


@pytest.mark.slow
def test_partitioning_resnet50_makes_one_cluster(record_property: Callable) -> None:
    """The whole ResNet50 graph is one cluster. The times are recorded (in the JUnit
    XML with --junitxml), not asserted: these machines are shared and noisy."""
    gd, frozen = _dynamic_zoo_graph("resnet50")  # ~2500 nodes
    shapes = {k: s for k, (s, _) in frozen.inputs.items()}
    marking = P.mark(gd, P.infer(gd, shapes), P.supported_ops())
    start = time.perf_counter()
    P.cluster(gd, marking)
    record_property("cluster_seconds", round(time.perf_counter() - start, 3))
    start = time.perf_counter()
    part = P.partition(gd, shapes, dynamic_batch_size=True, fetches=frozen.outputs)
    record_property("partition_seconds", round(time.perf_counter() - start, 3))
    (sub,) = part.subgraphs
    assert sub.op_counts["Conv2D"] == 53 and sub.dynamic_batch
    assert len(sub.node_names) > 0.99 * len(gd.node)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_encoder", "resnet50"])
def test_zoo_models_partition_compile_and_match_tensorflow(name: str) -> None:
    from models.freeze import example_inputs

    gd, frozen = _dynamic_zoo_graph(name)
    shapes = {k: s for k, (s, _) in frozen.inputs.items()}
    part = P.partition(gd, shapes, dynamic_batch_size=True, fetches=frozen.outputs)
    assert all(s.dynamic_batch for s in part.subgraphs)
    spliced = splice_all(gd, part, frozen.outputs)
    fetches = [spliced.renamed.get(t, t) for t in frozen.outputs]
    for batch in (2, 3):
        feeds = example_inputs(frozen, batch, seed=batch)
        want = run_graph(gd, feeds, frozen.outputs)
        got = run_spliced(spliced, part.subgraphs, feeds, fetches, real_device)
        for w, g in zip(want, got):
            assert g.shape == w.shape
            assert np.max(np.abs(g - w)) <= 1e-4 * np.max(np.abs(w))


def test_subgraph_bytes_are_the_graphdefs_deterministic_serialization() -> None:
    from neuronish.partition.encapsulate import serialize_graph_def

    @tf.function
    def fn(x):
        w = tf.constant(np.arange(4000, dtype=np.float32).reshape(40, 100))
        y = tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.sin(v)), (0, x))[1]
        return tf.matmul(y, w)

    gd = fn.get_concrete_function(tf.TensorSpec([2, 40], tf.float32)).graph.as_graph_def()
    assert gd.library.function and gd.versions.producer  # every field kind is exercised
    gd.node[0].attr["_big"].s = bytes(300)  # a length past one varint byte
    assert serialize_graph_def(gd) == gd.SerializeToString(deterministic=True)
    assert serialize_graph_def(graph_pb2.GraphDef()) == b""


def test_input_strings_are_read_and_renamed_one_way() -> None:
    """The helpers every rewrite shares for GraphDef input strings ("n", "n:1", "^n"):
    renaming keeps the port and the "^"; the dead-node walk follows control edges unless
    told not to; deletion keeps the order of the rest."""
    from tensorflow.core.framework import graph_pb2

    from neuronish.graph import (
        control_refs,
        data_refs,
        keep_only,
        rename_ref,
    )

    renamed = {"a": "b"}
    assert [rename_ref(r, renamed) for r in ("a", "a:1", "^a", "c:2", "^c", "ab:0")] == \
        ["b", "b:1", "^b", "c:2", "^c", "ab:0"]
    g = graph_pb2.GraphDef()
    for name, inputs in (("x", []), ("gate", []), ("y", ["x:0", "^gate"]), ("z", ["y"]),
                         ("unread", ["x"])):
        g.node.add(name=name, op="Identity").input.extend(inputs)
    y = g.node[2]
    assert data_refs(y) == ["x:0"] and control_refs(y) == ["^gate"]
    assert Graph(g).needed(["z:0"]) == {"x", "gate", "y", "z"}
    assert Graph(g).needed(["z"], control=False) == {"x", "y", "z"}
    keep_only(g, {"x", "y", "z"})
    assert [n.name for n in g.node] == ["x", "y", "z"]
