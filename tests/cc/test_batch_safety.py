"""A compiled model gives TensorFlow's numbers at every batch size, or says why a part stays
on TensorFlow: the batch is split into chunks only where the compiler proves
every sample is computed on its own (cc/batch.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from neuronish.cc.ops.registry import LOWERINGS
from tests.cc import batch_fuzz as bf


def test_every_device_op_declares_how_it_treats_the_batch() -> None:
    undeclared = sorted(op for op, lowering in LOWERINGS.items() if lowering.batch is None)
    assert undeclared == []


def _frozen(fn: object) -> tuple[bytes, str]:
    f = tf.function(fn).get_concrete_function(tf.TensorSpec([None, *bf.SHAPE], tf.float32,
                                                            name="x"))
    frozen = convert_variables_to_constants_v2(f)
    return frozen.graph.as_graph_def().SerializeToString(), frozen.outputs[0].op.name


def _compile(tmp_path: Path, fn: object, batch: int = 2) -> subprocess.CompletedProcess:
    graph, out = _frozen(fn)
    (tmp_path / "g.pb").write_bytes(graph)
    io = {"inputs": {"x:0": [[batch, *bf.SHAPE], "float32", 0]}, "outputs": [f"{out}:0"]}
    return subprocess.run(
        [sys.executable, "-m", "neuronish.cc.cli", "compile", str(tmp_path / "g.pb"),
         "--framework", "TENSORFLOW", "--io-config", json.dumps(io), "--output",
         str(tmp_path / "g.neff")], capture_output=True, text=True, timeout=300)


MIXING = {  # case -> the op type the compiler must name
    "times_batch": "Mul", "size_value": "RealDiv", "cumsum_batch": "Cumsum",
    "reverse_batch": "ReverseV2", "slice_reverse": "StridedSlice", "roll_batch": "Roll",
    "softmax_batch": "Softmax", "shift_pad": "Pad", "gram_matmul": "MatMul",
    "gather_rows": "GatherV2", "mean_batch": "Mean", "take_two": "StridedSlice",
    "range_offsets": "AddV2",
}


@pytest.mark.parametrize("case", sorted(MIXING))
def test_compiler_names_the_node_that_mixes_samples(tmp_path: Path, case: str) -> None:
    done = _compile(tmp_path, bf._ops()[case].fn, batch=1 if case == "take_two" else 2)
    assert done.returncode == 1, done.stderr
    line = next(ln for ln in done.stderr.splitlines() if "mixes samples" in ln)
    assert f"({MIXING[case]})" in line
    assert "keep this node on TensorFlow" in done.stderr


@pytest.mark.parametrize("case", ["zeros_state", "positions", "feature_count", "flatten_roundtrip",
                                  "batched_gram", "full_slice", "softmax_axis1", "conv1d"])
def test_per_sample_graphs_compile_and_split_into_chunks(tmp_path: Path, case: str) -> None:
    from neuronish.runtime import load

    fn = bf._ops()[case].fn
    done = _compile(tmp_path, fn, batch=2)
    assert done.returncode == 0, done.stderr
    model = load((tmp_path / "g.neff").read_bytes())
    try:
        for b in (1, 3, 5):
            x = np.random.default_rng(b).normal(size=(b, *bf.SHAPE)).astype(np.float32)
            (got,) = model.run({"x:0": x}).values()
            np.testing.assert_allclose(got, fn(tf.constant(x)).numpy(), rtol=1e-5, atol=1e-5)
    finally:
        model.unload()


def test_fuzzed_graphs_match_tensorflow_at_every_batch(tmp_path: Path) -> None:
    # Every op alone (the classes that used to give wrong numbers silently among them),
    # then random chains: compiled at batch 1 and 2, called at 1, 2, 3 and 5. The long
    # run is `python -m tests.cc.batch_fuzz --graphs 2000`.
    ops = bf._ops()
    report = bf.Report()
    bf.run(bf.cases(len(ops) + 26, seed=11), tmp_path, report, per_model=26)
    print(report.summary())
    assert report.silent == []
    assert report.errors == []
    # Not a fix by sending everything to TensorFlow: per-sample ops alone stay whole on
    # the device, mixing ones do not.
    per_sample = {f"single:{n}" for n, op in ops.items() if op.per_sample}
    assert per_sample and not per_sample & set(report.on_tensorflow)
    mixing = {f"single:{n}" for n, op in ops.items() if not op.per_sample}
    assert mixing <= set(report.on_tensorflow)


def test_straight_line_tensor_array_compiles_whole(tmp_path: Path) -> None:
    # keras_hub's RWKV7 fills a TensorArray in a Python loop: TensorListReserve, SetItem
    # and Stack with no While. They stayed on TensorFlow as "a loop" before.
    import neuronish

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 5, 3], tf.float32)])
        def serve(self, x: tf.Tensor) -> dict:
            ta = tf.TensorArray(tf.float32, size=5)
            for t in range(5):
                ta = ta.write(t, tf.tanh(x[:, t]) * float(t + 1))
            return {"y": tf.transpose(ta.stack(), [1, 0, 2])}

    m = Model()
    tf.saved_model.save(m, str(tmp_path / "m"), signatures={"serving_default": m.serve})
    report = neuronish.saved_model.compile(str(tmp_path / "m"), str(tmp_path / "c"),
                                           batch_size=2)
    assert report["OnNeuronRatio"] == 1.0, report["OnTensorFlow"]
    compiled = tf.saved_model.load(str(tmp_path / "c")).signatures["serving_default"]
    x = np.random.default_rng(0).normal(size=(3, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(compiled(tf.constant(x))["y"].numpy(),
                               m.serve(tf.constant(x))["y"].numpy(), rtol=1e-5, atol=1e-6)


@dataclass
class _Subgraph:
    """The fields of a partitioned subgraph verification reads."""

    name: str
    graph_def: bytes
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_batch_axes: tuple[int, ...]
    node_names: tuple[str, ...]

    def serialize(self) -> bytes:
        return self.graph_def


@dataclass
class _Result:
    executable: bytes


def test_verify_runs_a_second_batch_that_is_not_a_multiple(tmp_path: Path) -> None:
    # An executable that is right at its compiled batch 1 and wrong at any other: it
    # computes x while the graph it stands for computes cumsum(x, 0) (equal at batch 1).
    # Checked at the compiled batch only it passes; at batch 3 it must fail.
    from neuronish.verification import verify_compiled

    done = _compile(tmp_path, lambda x: x * 1.0 + 0.0, batch=1)
    assert done.returncode == 0, done.stderr
    cumsum, out = _frozen(lambda x: tf.cumsum(x, 0))
    sg = _Subgraph("neuron_op_0", cumsum, ("x:0",), (f"{out}:0",), ("x:0",), (f"{out}:0",),
                   (0,), (out,))
    placeholders = {"x:0": ((1, *bf.SHAPE), "float32")}
    result = _Result((tmp_path / "g.neff").read_bytes())
    once, verdicts = verify_compiled(cumsum, placeholders, None, [(sg, result)], {}, batch=1)
    assert len(once) == 1 and verdicts[0].passed  # no batched input: compiled batch only
    excluded: dict[str, str] = {}
    kept, verdicts = verify_compiled(cumsum, placeholders, None, [(sg, result)], excluded,
                                     batch=1, batched={"x:0"})
    assert kept == [] and not verdicts[0].passed
    assert "verify at batch 3" in verdicts[0].reason
    assert excluded[out] == verdicts[0].reason


def test_report_says_which_node_stays_on_tensorflow_and_why(tmp_path: Path) -> None:
    # Keeping a mixing node on TensorFlow is the designed path: no compile failure, no
    # warning, and the report names the node with the compiler's reason.
    import warnings

    import neuronish

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, *bf.SHAPE], tf.float32)])
        def serve(self, x: tf.Tensor) -> dict:
            return {"y": bf._ops()["times_batch"].fn(x)}

    m = Model()
    tf.saved_model.save(m, str(tmp_path / "m"), signatures={"serving_default": m.serve})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = neuronish.saved_model.compile(str(tmp_path / "m"), str(tmp_path / "c"),
                                               batch_size=2, minimum_segment_size=1)
    assert report["compile_failures"] == []
    assert "reads the batch size as a value" in report["OnTensorFlowNodes"]["mul"]
    assert report["OnTensorFlowNodes"]["mul"].startswith("mixes samples across the batch")
    assert report["operations_on_neuron"] > 0  # tanh stays on the device
