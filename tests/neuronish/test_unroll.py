"""Loops of a trip count fixed by shapes are unrolled before partitioning
(neuronish/rewrites/unroll.py); any other loop stays as it is, and on TensorFlow the
report says why. Each graph is frozen the way `compile` freezes it (a saved tf.Module)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish.freeze import freeze_signature
from neuronish.rewrites import unroll
from neuronish.rewrites.unroll import unroll_loops
from tests.helpers import rewritten_copy


def _frozen(tmp_path: Path, fn: object, shape: list[int | None]) -> object:
    module = tf.Module()
    module.w = tf.Variable(np.random.default_rng(0).standard_normal((4, 4)).astype("float32"))
    serve = tf.function(lambda x: {"y": fn(module, x)},
                        input_signature=[tf.TensorSpec(shape, tf.float32, name="x")])
    tf.saved_model.save(module, str(tmp_path / "src"), signatures={"serving_default": serve})
    return freeze_signature(str(tmp_path / "src"))


def _run(graph_def: object, fetches: list[str], x: np.ndarray) -> list[np.ndarray]:
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            return session.run(fetches, {"x:0": x})


def _rnn(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """A recurrence over the 5 time steps of x [b, 5, 4] through TensorArrays, as Keras'
    RNN layers run it."""
    steps = tf.TensorArray(tf.float32, size=5).unstack(tf.transpose(x, [1, 0, 2]))
    out = tf.TensorArray(tf.float32, size=5)

    def body(t, h, out):
        h = tf.tanh(tf.matmul(steps.read(t), module.w) + h)
        return t + 1, h, out.write(t, h)

    _, h, out = tf.while_loop(lambda t, h, out: t < 5, body,
                              [tf.constant(0), tf.zeros_like(x[:, 0]), out])
    return tf.transpose(out.stack(), [1, 0, 2]) + h[:, None]


def _until_small(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """A loop whose trip count depends on the values."""
    return tf.while_loop(lambda v: tf.reduce_max(tf.abs(v)) > 0.1, lambda v: [v * 0.5], [x])[0]


def _per_sample(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """A loop over the batch: its trip count follows the batch size."""
    n = tf.shape(x)[0]
    return tf.while_loop(lambda i, v: i < n, lambda i, v: [i + 1, v + 1.0], [0, x])[1]


def test_a_loop_of_fixed_count_over_tensor_lists_becomes_straight_line_code(
        tmp_path: Path) -> None:
    frozen = _frozen(tmp_path, _rnn, [None, 5, 4])
    fetches = list(frozen.outputs.values())
    assert any(n.op in ("While", "StatelessWhile") for n in frozen.graph_def.node)
    _, unrolled = rewritten_copy(unroll_loops, frozen.graph_def, {"x:0": [2, 5, 4]}, fetches)
    ops = {n.op for n in unrolled.node}
    assert not {"While", "StatelessWhile"} & ops and not any(o.startswith("TensorList")
                                                             for o in ops), ops
    for batch in (2, 3):  # unrolled at batch 2, right at any batch
        x = np.random.default_rng(batch).standard_normal((batch, 5, 4)).astype("float32")
        (want,), (got,) = _run(frozen.graph_def, fetches, x), _run(unrolled, fetches, x)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _two_loops(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """A loop counted from the shape of what another loop returns, which shape inference
    leaves unknown until that loop is unrolled (Keras 2's Bidirectional GRU, then an LSTM
    over its output)."""
    h = tf.while_loop(lambda t, h: t < 3,
                      lambda t, h: (t + 1, tf.tanh(tf.matmul(h, module.w) + x)),
                      [tf.constant(0), tf.zeros_like(x)],
                      shape_invariants=[tf.TensorShape([]), tf.TensorShape(None)])[1]
    steps = tf.shape(h)[1]
    return tf.while_loop(lambda t, acc: t < steps, lambda t, acc: (t + 1, acc * 0.5 + h),
                         [tf.constant(0), tf.zeros_like(x)],
                         shape_invariants=[tf.TensorShape([]), tf.TensorShape(None)])[1]


def test_a_loop_counted_from_another_loops_output_is_unrolled_after_it(
        tmp_path: Path) -> None:
    frozen = _frozen(tmp_path, _two_loops, [None, 4])
    fetches = list(frozen.outputs.values())
    assert sum(n.op in ("While", "StatelessWhile") for n in frozen.graph_def.node) == 2
    _, unrolled = rewritten_copy(unroll_loops, frozen.graph_def, {"x:0": [2, 4]}, fetches)
    ops = {n.op for n in unrolled.node}
    assert not {"While", "StatelessWhile"} & ops and not any(o.startswith("TensorList")
                                                             for o in ops), ops
    for batch in (2, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype("float32")
        (want,), (got,) = _run(frozen.graph_def, fetches, x), _run(unrolled, fetches, x)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _three_loops(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """Three loops of fixed counts side by side, as a model with three RNN layers."""
    outs = [tf.while_loop(lambda t, h, n=n: t < n,
                          lambda t, h: (t + 1, tf.tanh(tf.matmul(h, module.w) + x)),
                          [tf.constant(0), tf.zeros_like(x)])[1] for n in (2, 3, 4)]
    return tf.add_n(outs)


def test_loops_of_one_round_are_counted_from_one_shape_inference_per_batch_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting a loop runs it at the compile shapes and one batch larger, on a graph the
    counting does not edit: its shapes are inferred once per batch size for all the loops
    of the round (they were once inferred again for every loop, 6 times here)."""
    frozen = _frozen(tmp_path, _three_loops, [None, 4])
    fetches = list(frozen.outputs.values())
    assert sum(n.op in ("While", "StatelessWhile") for n in frozen.graph_def.node) == 3
    calls: list[dict] = []
    real = unroll.infer

    def counted(graph_def: object, input_shapes: dict) -> object:
        calls.append(dict(input_shapes))
        return real(graph_def, input_shapes)

    monkeypatch.setattr(unroll, "infer", counted)
    _, unrolled = rewritten_copy(unroll_loops, frozen.graph_def, {"x:0": [2, 4]}, fetches)
    assert not {"While", "StatelessWhile"} & {n.op for n in unrolled.node}
    assert sorted(c["x:0"][0] for c in calls) == [2, 3], calls
    for batch in (2, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype("float32")
        (want,), (got,) = _run(frozen.graph_def, fetches, x), _run(unrolled, fetches, x)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_each_library_function_is_converted_once(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking, counting and copying a loop all read its condition and body; each is
    converted from its FunctionDef once per unrolling, across rounds too: the second
    loop here is counted only in the round after the first is unrolled (the two loops'
    four functions were converted 14 times)."""
    frozen = _frozen(tmp_path, _two_loops, [None, 4])
    fetches = list(frozen.outputs.values())
    loops = [n for n in frozen.graph_def.node if n.op in ("While", "StatelessWhile")]
    functions = {n.attr[k].func.name for n in loops for k in ("cond", "body")}
    assert len(loops) == 2 and len(functions) == 4
    converted: list[str] = []
    real = unroll.function_body

    def counted(fdef: object) -> object:
        converted.append(fdef.signature.name)
        return real(fdef)

    monkeypatch.setattr(unroll, "function_body", counted)
    _, unrolled = rewritten_copy(unroll_loops, frozen.graph_def, {"x:0": [2, 4]}, fetches)
    assert not {"While", "StatelessWhile"} & {n.op for n in unrolled.node}
    assert sorted(converted) == sorted(functions), converted
    x = np.random.default_rng(1).standard_normal((3, 4)).astype("float32")
    (want,), (got,) = _run(frozen.graph_def, fetches, x), _run(unrolled, fetches, x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_loops_whose_count_the_shapes_do_not_fix_are_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    evaluated = []
    real = unroll._evaluate
    monkeypatch.setattr(unroll, "_evaluate", lambda *a, **k: evaluated.append(1) or real(*a, **k))
    for i, (fn, shape) in enumerate(((_until_small, [None, 4]), (_per_sample, [None, 4]))):
        frozen = _frozen(tmp_path / str(i), fn, shape)
        changed, _ = rewritten_copy(unroll_loops, frozen.graph_def, {"x:0": [2, 4]},
                                    list(frozen.outputs.values()))
        assert not changed, fn.__name__
    # A count read from the data is refused before the graph runs on made-up inputs (where
    # such a loop could run for ever); the batch-sized one is caught when it runs.
    assert len(evaluated) == 2


def test_compile_unrolls_a_fixed_loop_and_reports_a_data_dependent_one(tmp_path: Path) -> None:
    src = tmp_path / "rnn"
    _frozen(src, _rnn, [None, 5, 4])
    report = neuronish.saved_model.compile(str(src / "src"), str(tmp_path / "rnn_out"),
                                           batch_size=1)
    assert report["OnNeuronRatio"] == 1.0 and len(report["NeuronOps"]) == 1

    other = tmp_path / "until_small"
    _frozen(other, _until_small, [None, 4])
    report = neuronish.saved_model.compile(str(other / "src"), str(tmp_path / "until_out"),
                                           batch_size=1)
    loops = {n: why for n, why in report["OnTensorFlowNodes"].items() if n.endswith("while")}
    assert loops and all("trip count" in why for why in loops.values()), \
        report["OnTensorFlowNodes"]


def _loop_read_twice(module: tf.Module, x: tf.Tensor) -> tf.Tensor:
    """One node reads the same loop output twice (Mul(loop:1, loop:1))."""
    h = tf.while_loop(lambda t, h: t < 3,
                      lambda t, h: (t + 1, tf.tanh(tf.matmul(h, module.w) + x)),
                      [tf.constant(0), tf.zeros_like(x)])[1]
    return h * h


def test_a_reader_of_one_loop_output_twice_keeps_both_inputs(tmp_path: Path) -> None:
    frozen = _frozen(tmp_path, _loop_read_twice, [None, 4])
    fetches = list(frozen.outputs.values())
    _, unrolled = rewritten_copy(unroll_loops, frozen.graph_def, {"x:0": [2, 4]}, fetches)
    assert not {"While", "StatelessWhile"} & {n.op for n in unrolled.node}
    x = np.random.default_rng(7).standard_normal((2, 4)).astype("float32")
    (want,), (got,) = _run(frozen.graph_def, fetches, x), _run(unrolled, fetches, x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
