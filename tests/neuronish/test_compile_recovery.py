"""`neuronish.saved_model.compile` when things go wrong: bad arguments, a compiler that
rejects nodes, crashes or hangs. The result is a working model (recovery) or a clear error,
and `new_model_dir` is never left half-written."""

from __future__ import annotations

import os
import stat
import sys
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish.errors import CompileWarning, SavedModelError, SubgraphCompileError
from tests.neuronish.test_saved_model_compile import assert_matches_original

NEURONISH_CC = str(Path(sys.executable).parent / "neuronish-cc")


def _save(module: tf.Module, fn: object, path: Path) -> str:
    tf.saved_model.save(module, str(path), signatures={"serving_default": fn})
    return str(path)


def one_hot_model(path: Path) -> str:
    """relu -> argmax -> one_hot with an on_value fed at run time -> mask -> tanh -> sum.
    Every shape is static, but the compiler needs OneHot's on_value at compile time, so it
    rejects that node; everything around it can run on the device."""
    module = tf.Module()
    module.w = tf.Variable(np.linspace(-1, 1, 6 * 6).reshape(6, 6).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32, name="x"),
                                  tf.TensorSpec([], tf.float32, name="on_value")])
    def serve(x: tf.Tensor, on_value: tf.Tensor) -> dict[str, tf.Tensor]:
        h = tf.nn.relu(tf.matmul(x, module.w)) * 2.0
        mask = tf.one_hot(tf.argmax(h, axis=1), 6, on_value=on_value, off_value=0.0)
        return {"y": tf.reduce_sum(tf.tanh(h * mask) + 1.0, axis=1)}

    return _save(module, serve, path)


def small_model(path: Path, seq: int | None = 8, split: bool = False) -> str:
    """Two Dense layers, as a plain tf.Module signature with input `x` [None, seq]; with
    `split`, a CumulativeLogsumexp (not on the device) between them makes two clusters."""
    module = tf.Module()
    rng = np.random.default_rng(0)
    module.w1 = tf.Variable(rng.standard_normal((8, 16)).astype(np.float32))
    module.w2 = tf.Variable(rng.standard_normal((16, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, seq], tf.float32, name="x")])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        h = tf.nn.relu(tf.matmul(x, module.w1))
        if split:
            h = tf.math.cumulative_logsumexp(h, axis=1)
        return {"y": tf.matmul(h, module.w2)}

    return _save(module, serve, path)


def wrapper_compiler(tmp_path: Path, behaviour: str) -> str:
    """A compiler that misbehaves on the subgraph holding the second MatMul and runs the real
    neuronish-cc on every other one. `behaviour` is shell code."""
    script = tmp_path / "bad-neuronish-cc"
    script.write_text(f"""#!/bin/sh
if [ "$1" = compile ] && grep -q MatMul_1 "$2"; then
    {behaviour}
fi
exec {NEURONISH_CC} "$@"
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_compiler_rejection_is_partitioned_around(tmp_path: Path) -> None:
    src = one_hot_model(tmp_path / "src")
    out = tmp_path / "out"
    with pytest.warns(CompileWarning, match="rejected; partitioning again without one_hot"):
        report = neuronish.saved_model.compile(src, str(out), batch_size=4)
    (failure,) = report["compile_failures"]
    assert failure["outcome"] == "rejected" and failure["nodes_left_on_tensorflow"] == ["one_hot"]
    assert report["OnTensorFlow"]["OneHot"]["count"] == 1
    (reason,) = report["OnTensorFlow"]["OneHot"]["reasons"]
    assert "on_value" in reason and "compile-time constant" in reason
    # The mask's consumers cannot join its producers' cluster without a cycle.
    assert len(report["NeuronOps"]) == 2
    fn = tf.saved_model.load(str(out)).signatures["serving_default"]
    ref = tf.saved_model.load(src).signatures["serving_default"]
    for batch in (4, 9):
        x = tf.constant(np.random.default_rng(batch).standard_normal((batch, 6)), tf.float32)
        on = tf.constant(0.7)
        np.testing.assert_allclose(fn(x=x, on_value=on)["y"], ref(x=x, on_value=on)["y"],
                                   rtol=1e-5)


def batch_sum_model(path: Path) -> str:
    """Two Dense layers, then a cumulative sum over the batch beside a per-sample tanh:
    the partitioner's batch axes let the sum onto the device, and the compiler's batch
    check (cc/batch.py) refuses it there, so the signature is partitioned again."""
    module = tf.Module()
    module.w = tf.Variable(np.linspace(-1, 1, 16 * 16).reshape(16, 16).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        h = tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, module.w)), module.w))
        return {"y": tf.cumsum(h, 0) + tf.tanh(h)}

    return _save(module, serve, path)


def test_a_recovery_round_reuses_the_graph_and_its_shapes(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The signature's one Graph, built at freezing, is what the rewrites, every
    partitioning round, the constant holding and splice are given; and shape inference
    (each an import of the whole graph into TensorFlow, a second or more for ResNet50)
    runs in the first round only: the second partitions the same Graph at the same
    shapes, with the refused node excluded."""
    import neuronish.freeze
    from neuronish.graph import Graph
    from neuronish.shape_inference import shapes

    sm = neuronish.saved_model
    imports: list[int] = []
    real_import = shapes._import_shapes
    monkeypatch.setattr(shapes, "_import_shapes",
                        lambda *a: imports.append(1) or real_import(*a))
    frozen: list[Graph] = []
    real_freeze = neuronish.freeze._freeze

    def freeze(*a, **k):  # noqa: ANN002, ANN003, ANN202
        signature = real_freeze(*a, **k)
        frozen.append(signature.graph)
        return signature

    monkeypatch.setattr(neuronish.freeze, "_freeze", freeze)
    given: dict[str, list] = {}  # stage -> the graph each call was given
    per_round: list[int] = []  # shape-inference imports during each partition call

    def watch(stage: str) -> None:
        real = getattr(sm, stage)

        def wrapper(graph, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
            given.setdefault(stage, []).append(graph)
            before = len(imports)
            try:
                return real(graph, *a, **k)
            finally:
                if stage == "partition":
                    per_round.append(len(imports) - before)
        monkeypatch.setattr(sm, stage, wrapper)

    for stage in ("rewrite_for_device", "partition", "hold_constants", "splice"):
        watch(stage)
    src = batch_sum_model(tmp_path / "src")
    report = sm.compile(src, str(tmp_path / "out"), batch_size=2)
    assert report["OnTensorFlow"]["Cumsum"]["count"] == 1 and report["NeuronOps"]
    (graph,) = frozen
    assert isinstance(graph, Graph)
    assert {stage: [g is graph for g in calls] for stage, calls in given.items()} == {
        "rewrite_for_device": [True], "partition": [True, True], "hold_constants": [True],
        "splice": [True]}
    # At the batch and one larger (the batch axes), in the first round; none after.
    assert per_round == [2, 0]
    assert_matches_original(src, tmp_path / "out", tmp_path)


def test_attribute_values_the_compiler_refuses_stay_on_tensorflow_without_recovery(
        tmp_path: Path) -> None:
    """A max pool over channels: MaxPool is a supported op type, but not with a window over
    the channel axis. The partitioner learns that from the compiler before compiling, so
    nothing is rejected and no round of re-partitioning runs."""
    module = tf.Module()

    @tf.function(input_signature=[tf.TensorSpec([None, 4, 4, 4], tf.float32, name="x")])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        y = tf.nn.relu(x) * 2.0
        y = tf.nn.max_pool2d(y, ksize=[1, 1, 1, 2], strides=[1, 1, 1, 2], padding="VALID")
        return {"y": tf.tanh(y) + 1.0}

    src = _save(module, serve, tmp_path / "src")
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)  # a rejection would warn
        report = neuronish.saved_model.compile(src, str(out), batch_size=2,
                                               minimum_segment_size=1)
    assert not report["compile_failures"]
    (reason,) = report["OnTensorFlow"]["MaxPool"]["reasons"]
    assert "attribute values neuronish-cc refuses" in reason and "ksize" in reason, reason
    (node,) = [n for n in report["OnTensorFlowNodes"] if "MaxPool" in n]
    assert "H and W" in report["OnTensorFlowNodes"][node]
    assert len(report["NeuronOps"]) == 2
    assert_matches_original(src, out, tmp_path)


@pytest.mark.parametrize("behaviour, outcome", [
    ("kill -SEGV $$", "crashed"),
    ("echo 'neuronish-cc: error: out of ideas' >&2; exit 1", "failed"),
    ("sleep 60", "timeout"),
])
def test_failing_compiler_with_recovery_leaves_a_working_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, behaviour: str, outcome: str) -> None:
    src = small_model(tmp_path / "src", split=True)
    monkeypatch.setenv("NEURONISH_CC", wrapper_compiler(tmp_path, behaviour))
    out = tmp_path / "out"
    with pytest.warns(CompileWarning, match=rf"neuron_op_\d.*{outcome}.*stay on TensorFlow"):
        report = neuronish.saved_model.compile(src, str(out), batch_size=2, compiler_timeout=10,
                                               compiler_workdir=str(tmp_path / "work"),
                                               minimum_segment_size=1)
    (failure,) = report["compile_failures"]
    assert failure["outcome"] == outcome
    # The first layer still runs on the device, the second on TensorFlow.
    assert len(report["NeuronOps"]) == 1 and report["OnTensorFlow"]["MatMul"]["count"] == 1
    assert_matches_original(src, out, tmp_path)


@pytest.mark.parametrize("behaviour, outcome", [
    ("kill -SEGV $$", "crashed"),
    ("echo 'neuronish-cc: error: out of ideas' >&2; exit 1", "failed"),
    ("sleep 60", "timeout"),
])
def test_failing_compiler_without_recovery_raises_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, behaviour: str, outcome: str) -> None:
    src = small_model(tmp_path / "src")
    monkeypatch.setenv("NEURONISH_CC", wrapper_compiler(tmp_path, behaviour))
    out = tmp_path / "out"
    with pytest.raises(SubgraphCompileError) as e:
        neuronish.saved_model.compile(src, str(out), batch_size=2, compiler_recovery=False,
                                      compiler_workdir=str(tmp_path / "work"),
                                      compiler_timeout=10, minimum_segment_size=1)
    message = str(e.value)
    assert "neuron_op_0" in message and outcome in message
    assert "bad-neuronish-cc compile" in message and str(tmp_path / "work") in message
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")], "temp dir left"


def test_a_failure_while_writing_leaves_nothing(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    src = small_model(tmp_path / "src")

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tf.saved_model, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        neuronish.saved_model.compile(src, str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["src"]  # neither out nor a temporary directory


def test_bad_directories_are_refused(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    with pytest.raises(SavedModelError, match="is model_dir"):
        neuronish.saved_model.compile(src, src)
    (tmp_path / "exists").mkdir()
    with pytest.raises(SavedModelError, match="already exists"):
        neuronish.saved_model.compile(src, str(tmp_path / "exists"))
    with pytest.raises(SavedModelError, match="not a SavedModel"):
        neuronish.saved_model.compile(str(tmp_path / "exists"), str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()


def test_unknown_dims_name_the_input_and_the_argument(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src", seq=None)
    with pytest.raises(SavedModelError, match=r"'x'.*model_shape_feed_dict"):
        neuronish.saved_model.compile(src, str(tmp_path / "a"))
    with pytest.raises(SavedModelError, match=r"names \['z'\]"):
        neuronish.saved_model.compile(src, str(tmp_path / "a"),
                                      model_shape_feed_dict={"z": [1, 8]})
    report = neuronish.saved_model.compile(src, str(tmp_path / "b"),
                                           model_shape_feed_dict={"x": [3, 8]})
    (op,) = report["NeuronOps"]
    assert list(op["inputs"].values())[0][0] == [3, 8]
    example = np.zeros((5, 8), np.float32)
    report = neuronish.saved_model.compile(src, str(tmp_path / "c"),
                                           model_feed_dict={"x": example})
    assert list(report["NeuronOps"][0]["inputs"].values())[0][0] == [5, 8]


def test_keras_model_export(tmp_path: Path) -> None:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="gelu"),
                              keras.layers.Dense(3, activation="softmax")])
    src = str(tmp_path / "exported")
    model.export(src)
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), batch_size=4)
    assert report["OnNeuronRatio"] >= 0.95
    assert_matches_original(src, out, tmp_path)


def test_input_model_is_never_modified(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    before = {p: p.stat().st_mtime_ns for p in Path(src).rglob("*")}
    neuronish.saved_model.compile(src, str(tmp_path / "out"))
    assert before == {p: p.stat().st_mtime_ns for p in Path(src).rglob("*")}
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]  # no temporary directory left
