"""Passes keep the numbers, do what they claim, and the IR verifier catches breakage."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.cc.errors import VerificationError
from neuronish.cc.graphdef import parse_graph_def
from neuronish.cc.interpret import interpret
from neuronish.cc.ioconfig import parse_io_config
from neuronish.cc.ir import format_graph
from neuronish.cc.lower import lower
from neuronish.cc.memory import lifetimes, plan_memory
from neuronish.cc.pipeline import Dumper, build_pipeline, run_pipeline
from neuronish.cc.verify import verify
from neuronish.runtime import load
from tests.graphs import TracedGraph, conv_bn_relu, dense_relu, trace


def _const_chain() -> TracedGraph:
    """Shape arithmetic, identities and constant-only math around a real op."""
    k = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))

    def fn(x: tf.Tensor) -> tf.Tensor:
        shape = tf.shape(x)
        flat = tf.reshape(x, tf.stack([shape[0], -1]))
        scale = tf.exp(k) * 2.0 + 1.0  # folds to one constant
        y = tf.identity(tf.matmul(flat, tf.transpose(scale)))
        return tf.nn.relu6(y - 1.0) * 1.0

    return trace(fn, tf.TensorSpec([4, 3], tf.float32, name="x"))


def _residual_block() -> TracedGraph:
    """ResNet's two shortcut shapes: identity (x + conv(x)) and projection, where
    the shortcut is itself a conv whose output the main path's conv must wait for."""
    rng = np.random.default_rng(5)
    w1, w2, wp = (tf.constant(rng.standard_normal(s).astype(np.float32) * 0.2)
                  for s in ([3, 3, 8, 8], [1, 1, 8, 16], [1, 1, 8, 16]))
    shift = tf.constant(rng.standard_normal(16).astype(np.float32))

    def fn(x: tf.Tensor) -> tf.Tensor:
        h = tf.nn.relu(x + tf.nn.conv2d(x, w1, 1, "SAME"))  # identity shortcut
        shortcut = tf.nn.conv2d(h, wp, 1, "VALID")
        return tf.nn.relu(tf.nn.conv2d(h, w2, 1, "VALID") + shift + shortcut)

    return trace(fn, tf.TensorSpec([2, 6, 6, 8], tf.float32, name="x"))


_SCALE_SHIFT = {  # producer -> its weights' shape and the channel count
    "depthwise": ((3, 3, 3, 2), 6), "matmul": ((5, 3), 3), "matmul_tb": ((3, 5), 3)}


def _scale_shift(producer: str) -> TracedGraph:
    """A producer followed by the per-channel `* scale / divisor - shift + bias` chain
    Keras's inference BatchNorm becomes, then ReLU."""
    rng = np.random.default_rng(11)
    wshape, channels = _SCALE_SHIFT[producer]
    w = tf.constant(rng.standard_normal(wshape).astype(np.float32))
    scale, divisor = (tf.constant(rng.uniform(0.5, 1.5, channels).astype(np.float32))
                      for _ in range(2))
    shift, bias = (tf.constant(rng.standard_normal(channels).astype(np.float32))
                   for _ in range(2))

    def fn(x: tf.Tensor) -> tf.Tensor:
        if producer == "depthwise":
            y = tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME")
        else:
            y = tf.matmul(x, w, transpose_b=producer == "matmul_tb")
        return tf.nn.relu(tf.nn.bias_add(y, bias) * scale / divisor - shift)

    spec = [2, 6, 6, 3] if producer == "depthwise" else [4, 5]
    return trace(fn, tf.TensorSpec(spec, tf.float32, name="x"))


GRAPHS = {"dense": dense_relu, "conv_bn": conv_bn_relu, "const_chain": _const_chain,
          "residual": _residual_block,
          **{f"scale_shift_{p}": functools.partial(_scale_shift, p) for p in _SCALE_SHIFT}}


def _lowered(g: TracedGraph):
    return lower(parse_graph_def(g.graph_def), parse_io_config(g.io_config))


def _feeds(g: TracedGraph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype)
            for shape, dtype in g.io_config["inputs"].values()]


@pytest.mark.parametrize("name", GRAPHS)
def test_every_pass_keeps_the_numbers(name: str) -> None:
    g = GRAPHS[name]()
    graph = _lowered(g)
    feeds = _feeds(g)
    want = g.reference(dict(zip(g.io_config["inputs"], feeds)))
    np.testing.assert_allclose(interpret(graph, feeds)[0], want[g.io_config["outputs"][0]],
                               rtol=1e-5, atol=1e-5)
    for p in build_pipeline("none"):
        before = interpret(graph, feeds)
        graph = p.run(graph)
        verify(graph)
        after = interpret(graph, feeds)
        for b, a in zip(before, after):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=p.name)


def test_batchnorm_and_activation_fold_into_the_conv() -> None:
    g = conv_bn_relu()
    graph = run_pipeline(_lowered(g), build_pipeline("none"), Dumper(None))
    kinds = [n.kind for n in graph.nodes]
    assert kinds == ["conv2d", "reduce"], format_graph(graph)
    conv = graph.nodes[0]
    assert conv.attrs["activation"] == "relu" and len(conv.inputs) == 3  # bias added
    assert any("Relu" in o for o in conv.origin)  # still points at the TF nodes it absorbed


@pytest.mark.parametrize("producer", _SCALE_SHIFT)
def test_scale_shift_folds_into_depthwise_conv_and_matmul(producer: str) -> None:
    """After fold_scale_shift the chain is gone: one producer whose weights are the
    original scaled per output channel and whose bias carries the shifts; the numbers
    are TensorFlow's."""
    g = _scale_shift(producer)
    graph = _lowered(g)
    (before,) = [n for n in graph.nodes if n.kind != "binary" and n.kind != "unary"]
    w0 = before.inputs[1].data.copy()
    c = {n.attrs["fn"]: n.inputs[1].data for n in graph.nodes if n.kind == "binary"}
    scale, bias = c["mul"] / c["div"], c["add"] * c["mul"] / c["div"] - c["sub"]
    fold = next(p for p in build_pipeline("none") if p.name == "fold_scale_shift")
    graph = fold.run(run_pipeline(graph, build_pipeline("none")[:3], Dumper(None)))
    verify(graph)
    assert [n.kind for n in graph.nodes] == [before.kind, "unary"], format_graph(graph)
    node = graph.nodes[0]
    assert len(node.inputs) == 3 and node.inputs[1].is_const and node.inputs[2].is_const
    assert node.origin[1:] == ("BiasAdd", "mul", "truediv", "sub")  # still names them all
    # The folded weights are the original ones times scale/divisor per output channel.
    w = node.inputs[1].data
    if producer == "depthwise":  # output channel c*M + m uses w[..., c, m]
        factor = (w / w0).reshape(-1, w0.shape[2] * w0.shape[3])
    elif producer == "matmul_tb":  # weights [N, K]
        factor = (w / w0).T
    else:
        factor = w / w0
    np.testing.assert_allclose(factor, np.broadcast_to(scale, factor.shape), rtol=1e-5)
    np.testing.assert_allclose(node.inputs[2].data, bias, rtol=1e-5, atol=1e-6)
    feeds = _feeds(g, seed=2)
    want = g.reference(dict(zip(g.io_config["inputs"], feeds)))["Identity:0"]
    np.testing.assert_allclose(interpret(graph, feeds)[0], want, rtol=1e-5, atol=1e-5)
    with load(compile_graph(g.graph_def, g.io_config), runtime="python") as model:
        assert [i.kind for i in model.exe.programs[0]] == [before.kind]  # relu fused too
        got = model.run({"x:0": feeds[0]})["Identity:0"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_residual_add_and_activation_fuse_into_the_conv() -> None:
    g = _residual_block()
    graph = run_pipeline(_lowered(g), build_pipeline("none"), Dumper(None))
    assert [n.kind for n in graph.nodes] == ["conv2d"] * 3, format_graph(graph)
    identity, first, last = graph.nodes
    assert identity.attrs["residual"] and identity.inputs[-1] is graph.inputs[0]
    # The two convs of the projection block: either may take the add (a + b == b + a
    # exactly); the one that does runs after the other, whose output it adds.
    assert not first.attrs.get("residual") and first.attrs["activation"] == "none"
    assert last.attrs["residual"] and last.inputs[-1] is first.outputs[0]
    assert last.attrs["activation"] == "relu"
    with load(compile_graph(g.graph_def, g.io_config)) as model:
        x = _feeds(g, seed=1)[0]
        got = model.run({"x:0": x})["Identity:0"]
    np.testing.assert_allclose(got, g.reference({"x:0": x})["Identity:0"], rtol=1e-5, atol=1e-5)


def test_constant_subgraphs_are_folded() -> None:
    graph = run_pipeline(_lowered(_const_chain()), build_pipeline("none"), Dumper(None))
    assert [n.kind for n in graph.nodes] == ["matmul"], format_graph(graph)


def test_verifier_names_the_broken_node() -> None:
    graph = _lowered(conv_bn_relu())
    graph.nodes = graph.nodes[::-1]
    with pytest.raises(VerificationError, match="before it is defined"):
        verify(graph)
    graph = _lowered(dense_relu())
    out = graph.nodes[0].outputs[0]
    out.type = dataclasses.replace(out.type, shape=(1, 1))
    with pytest.raises(VerificationError, match="matmul outputs are typed"):
        verify(graph)


@pytest.mark.parametrize("name", GRAPHS)
def test_memory_plan_never_overlaps_live_buffers(name: str) -> None:
    graph = run_pipeline(_lowered(GRAPHS[name]()), build_pipeline("none"), Dumper(None))
    plan = plan_memory(graph)
    bufs = lifetimes(graph)
    where = {**{("value", k): v for k, v in plan.value_offsets.items()},
             **{("scratch", k): v[0] for k, v in plan.scratch.items()}}
    for a, b in itertools.combinations(bufs, 2):
        if a.first <= b.last and b.first <= a.last:
            lo, hi = sorted([(where[a.key], a), (where[b.key], b)], key=lambda t: t[0])
            assert lo[0] + lo[1].nbytes <= hi[0], (a, b)
    assert all(where[b.key] + b.nbytes <= plan.arena_bytes for b in bufs)


def test_memory_plan_reuses_buffers() -> None:
    """A chain of eight elementwise ops needs two buffers, not seven (sin: no activation,
    which the add before it would take)."""
    def fn(x: tf.Tensor) -> tf.Tensor:
        for i in range(8):
            x = tf.sin(x) + float(i)
        return x

    g = trace(fn, tf.TensorSpec([64, 64], tf.float32, name="x"))
    graph = run_pipeline(_lowered(g), build_pipeline("none"), Dumper(None))
    plan = plan_memory(graph)
    one = 64 * 64 * 4
    assert plan.unshared_bytes >= 14 * one
    assert plan.arena_bytes <= 2 * one


def test_dump_dir_gets_one_file_per_pass(tmp_path, monkeypatch) -> None:
    g = conv_bn_relu()
    compile_graph(g.graph_def, g.io_config, dump_dir=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files[0] == "000_lowered.txt" and files[-1].endswith("_memory_plan.txt")
    assert "001_fold_constants.txt" in files and any("fold_scale_shift" in f for f in files)
    lowered = (tmp_path / "000_lowered.txt").read_text()
    assert "conv2d(" in lowered and "# tf: Conv2D" in lowered


@pytest.mark.parametrize("cast_type, bound", [("bf16", 2e-2), ("fp16", 3e-3)])
def test_auto_cast_rounds_within_the_documented_error(cast_type: str, bound: float) -> None:
    g = conv_bn_relu(batch=4)
    x = np.random.default_rng(3).standard_normal((4, 8, 8, 3)).astype(np.float32)
    want = g.reference({"x:0": x})["Identity:0"]
    results = {}
    for mode in ("none", "matmult", "all"):
        with load(compile_graph(g.graph_def, g.io_config, auto_cast=mode,
                                auto_cast_type=cast_type)) as model:
            results[mode] = model.run({"x:0": x})["Identity:0"]
    scale = np.max(np.abs(want))
    assert np.max(np.abs(results["none"] - want)) / scale < 1e-5
    for mode in ("matmult", "all"):
        err = np.max(np.abs(results[mode] - want)) / scale
        assert 1e-7 < err < bound, (mode, err)  # rounding happened, and stayed bounded


def _dense_residual() -> TracedGraph:
    """A Keras-style Dense on [batch, seq, features] (tensordot: reshape, matmul,
    reshape), its bias, a residual add of the layer's input, then relu."""
    rng = np.random.default_rng(4)
    w = tf.constant(rng.normal(size=(16, 16)).astype(np.float32))
    b = tf.constant(rng.normal(size=(16,)).astype(np.float32))

    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(tf.tensordot(x, w, axes=1) + b + x)

    return trace(fn, tf.TensorSpec([2, 5, 16], tf.float32, name="x"))


def test_dense_reshapes_go_and_the_residual_add_fuses_into_the_matmul() -> None:
    g = _dense_residual()
    graph = run_pipeline(_lowered(g), build_pipeline("none"), Dumper(None))
    assert [n.kind for n in graph.nodes] == ["matmul"], format_graph(graph)
    (node,) = graph.nodes
    assert node.inputs[0] is graph.inputs[0] and node.inputs[-1] is graph.inputs[0]
    assert node.attrs["residual"] and node.attrs["activation"] == "relu"
    assert len(node.inputs) == 4  # a, w, bias, residual
    x = _feeds(g, seed=3)[0]
    want = g.reference({"x:0": x})["Identity:0"]
    np.testing.assert_allclose(interpret(graph, [x])[0], want, rtol=1e-5, atol=1e-5)
    with load(compile_graph(g.graph_def, g.io_config), runtime="python") as model:
        assert [i.kind for i in model.exe.programs[0]] == ["matmul"]
        got = model.run({"x:0": x})["Identity:0"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _attention_scores() -> TracedGraph:
    """Keras MultiHeadAttention's scores: einsum("aecd,abcd->acbe", key, query), a
    batched matmul whose output the lowering transposes; the query scaled by a scalar
    after its heads are split off."""
    rng = np.random.default_rng(5)
    wq = tf.constant(rng.normal(size=(16, 16)).astype(np.float32))
    wk = tf.constant(rng.normal(size=(16, 16)).astype(np.float32))

    def fn(x: tf.Tensor) -> tf.Tensor:
        q = tf.reshape(tf.tensordot(x, wq, axes=1), [2, 6, 4, 4]) * 0.5
        k = tf.reshape(tf.tensordot(x, wk, axes=1), [2, 6, 4, 4])
        q = tf.transpose(q, [0, 2, 1, 3])
        k = tf.transpose(k, [0, 2, 3, 1])
        # What the einsum lowers to in the Keras layer: the product, then its transpose.
        return tf.nn.softmax(tf.transpose(tf.matmul(q, k), [0, 1, 3, 2]))

    return trace(fn, tf.TensorSpec([2, 6, 16], tf.float32, name="x"))


def test_attention_score_transpose_and_query_scale_fold_into_the_matmuls() -> None:
    g = _attention_scores()
    graph = run_pipeline(_lowered(g), build_pipeline("none"), Dumper(None))
    kinds_ = [n.kind for n in graph.nodes]
    assert "binary" not in kinds_, format_graph(graph)  # the 0.5 is in the query's weights
    scores = graph.nodes[-2]
    assert [scores.kind, graph.nodes[-1].kind] == ["matmul", "softmax"], format_graph(graph)
    assert scores.attrs["transpose_a"] and scores.attrs["transpose_b"], format_graph(graph)
    # Was 3: q, k, the scores; q's and k's are now the matmul's perm_a and perm_b.
    assert kinds_.count("transpose") == 0, format_graph(graph)
    assert scores.attrs["perm_a"] and scores.attrs["perm_b"], format_graph(graph)
    x = _feeds(g, seed=6)[0]
    want = g.reference({"x:0": x})["Identity:0"]
    np.testing.assert_allclose(interpret(graph, [x])[0], want, rtol=1e-5, atol=1e-5)
    with load(compile_graph(g.graph_def, g.io_config)) as model:
        got = model.run({"x:0": x})["Identity:0"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bf16_matmul_keeps_its_float32_residual_stream() -> None:
    # Under --auto-cast matmult the product reads bfloat16, but the residual it adds
    # (a transformer's residual stream) and the sum it writes stay float32: rounding
    # them would add a bf16 error per layer (BERT's output error 3e-3 -> 1.3e-2).
    g = _dense_residual()
    graph = run_pipeline(_lowered(g), build_pipeline("matmult"), Dumper(None))
    (node,) = [n for n in graph.nodes if n.kind == "matmul"]
    assert node.attrs["residual"] and node.inputs[0].dtype == "bfloat16", format_graph(graph)
    assert node.inputs[-1].dtype == "float32" and node.outputs[0].dtype == "float32"
    x = _feeds(g, seed=3)[0]
    want = g.reference({"x:0": x})["Identity:0"]
    with load(compile_graph(g.graph_def, g.io_config, auto_cast="matmult")) as model:
        got = model.run({"x:0": x})["Identity:0"]
    # bf16 operands: about 2^-8 of the products' magnitude, measured against the largest output
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
