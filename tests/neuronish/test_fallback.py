"""Runtime fallback (neuronish/fallback.py): a NeuronOp whose executable the device cannot
load, or whose call the device fails at run time (a core failing in service), runs its own
subgraph on TensorFlow, warns once per op and counts it; with NEURONISH_FALLBACK=0 the
device's error reaches the caller. A call TensorFlow refuses too (a bad input) gets
TensorFlow's error and leaves the op on the device. Each case runs the compiled
SavedModel in a fresh process (the device is configured from the environment once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import neuronish.saved_model
from neuronish.fallback import GraphRunner
from neuronish.runtime import Cancelled, DeadlineExceeded
from neuronish.runtime.cutoff import Cutoff
from tests.neuronish.test_compile_recovery import small_model

_RUN = r"""
import json, sys, warnings
import numpy as np
import neuronish
import tensorflow as tf
from neuronish import fallback
from neuronish.runtime import get_device
model = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
x = np.load(sys.argv[2])
# cores to fail after the first call, comma-separated
fail_cores = [int(c) for c in sys.argv[3].split(",")] if len(sys.argv) > 3 else None
outs, errors, before_failure, used = {}, [], None, None
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for batch in (1, 3, 1):  # the compiled batch, a split one, and again
        try:
            outs[str(batch)] = model(x=tf.constant(x[:batch]))["y"].numpy().tolist()
        except tf.errors.OpError as e:
            errors.append([type(e).__name__, e.message])
        if fail_cores is not None:
            before_failure = fallback.fallback_counts()
            used = {c: r["used"] for c, r in get_device().memory_report().items()}
            for core in fail_cores:
                get_device().fail_core(core, "simulated hardware error")
            fail_cores = None
print(json.dumps({"outs": outs, "errors": errors, "before_failure": before_failure,
                  "used_before_failure": used if before_failure is not None else None,
                  "counts": fallback.fallback_counts(),
                  "warnings": [str(w.message) for w in caught
                               if w.category is fallback.FallbackWarning],
                  "metrics": fallback.prometheus_lines()}))
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    tmp = tmp_path_factory.mktemp("fallback")
    src = small_model(tmp / "src")
    report = neuronish.saved_model.compile(src, str(tmp / "compiled"), batch_size=1)
    assert len(report["NeuronOps"]) == 1 and report["OnNeuronRatio"] == 1.0
    return src, tmp / "compiled"


def _run(model_dir: Path, tmp_path: Path, *args: str,
         **env: str) -> subprocess.CompletedProcess[str]:
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return subprocess.run([sys.executable, "-c", _RUN, str(model_dir), str(tmp_path / "x.npy"),
                           *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def _expected(src: str, tmp_path: Path) -> dict[str, np.ndarray]:
    x = np.load(tmp_path / "x.npy")
    fn = tf.saved_model.load(src).signatures["serving_default"]
    return {str(b): fn(x=tf.constant(x[:b]))["y"].numpy() for b in (1, 3)}


def _check_fell_back(r: subprocess.CompletedProcess[str], src: str, tmp_path: Path,
                     reason: str, calls: int = 3) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    want = _expected(src, tmp_path)
    for batch, w in want.items():
        np.testing.assert_allclose(np.array(got["outs"][batch], np.float32), w, rtol=1e-5,
                                   atol=1e-5)
    ((op_id, count),) = got["counts"].items()
    assert reason in count["reason"] and count["calls"] == calls, count
    op, executable = count["op"], count["executable"]
    assert op_id == f"{op}@{executable}" and len(executable) == 12, count
    assert len(got["warnings"]) == 1 and op in got["warnings"][0]  # once per op
    assert (f':neuronish:neuron_op:fallback_calls{{op="{op}",executable="{executable}"}} '
            f'{calls}') in got["metrics"]


def test_device_too_small_falls_back_to_tensorflow(compiled: tuple[str, Path],
                                                    tmp_path: Path) -> None:
    src, model_dir = compiled
    r = _run(model_dir, tmp_path, NEURONISH_CORE_MEMORY="64B")
    _check_fell_back(r, src, tmp_path, "OutOfDeviceMemory")


def test_fallback_off_is_an_error(compiled: tuple[str, Path], tmp_path: Path) -> None:
    _, model_dir = compiled
    r = _run(model_dir, tmp_path, NEURONISH_CORE_MEMORY="64B", NEURONISH_FALLBACK="0")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["outs"] == {} and got["counts"] == {} and len(got["errors"]) == 3
    for kind, message in got["errors"]:
        assert kind == "ResourceExhaustedError", message
        assert "OutOfDeviceMemory" in message and "NEURONISH_FALLBACK=0" in message


def _damage_executables(src: Path, dst: Path) -> int:
    """Copy a compiled SavedModel, flipping one byte in the body of every executable."""
    import shutil

    shutil.copytree(src, dst)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((dst / "saved_model.pb").read_bytes())
    damaged = 0
    for graph in (m.graph_def for m in saved.meta_graphs):
        for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]:
            if node.op == "NeuronOp":
                exe = bytearray(node.attr["executable"].s)
                exe[len(exe) // 2] ^= 0x55
                node.attr["executable"].s = bytes(exe)
                damaged += 1
    (dst / "saved_model.pb").write_bytes(saved.SerializeToString())
    return damaged


def test_damaged_executable_falls_back_to_tensorflow(compiled: tuple[str, Path],
                                                     tmp_path: Path) -> None:
    src, model_dir = compiled
    assert _damage_executables(model_dir, tmp_path / "damaged") == 1
    r = _run(tmp_path / "damaged", tmp_path)
    _check_fell_back(r, src, tmp_path, "ExecutableError")


def test_one_core_failing_leaves_the_op_on_its_other_duplicate(compiled: tuple[str, Path],
                                                                tmp_path: Path) -> None:
    """Two duplicates (on cores 0 and 1): core 1 failing retires one; every call still
    runs on the device, nothing falls back."""
    src, model_dir = compiled
    # (failing a core is the Python runtime's simulation: get_device().fail_core)
    r = _run(model_dir, tmp_path, "1", NEURONISH_NUM_CORES="2", NEURONISH_KERNEL="python")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for batch, want in _expected(src, tmp_path).items():
        np.testing.assert_allclose(np.array(got["outs"][batch], np.float32), want,
                                   rtol=1e-5, atol=1e-5)
    assert got["errors"] == [] and got["counts"] == {} and got["warnings"] == []
    used = got["used_before_failure"]
    assert used["0"] > 0 and used["1"] > 0  # (a copy really was on the core that failed)


def test_core_failing_at_run_time_falls_back_to_tensorflow(compiled: tuple[str, Path],
                                                           tmp_path: Path) -> None:
    """The first call runs on the device; then the cores under both duplicates fail, and
    the next calls (a split batch, then the compiled one) are computed on TensorFlow."""
    src, model_dir = compiled
    r = _run(model_dir, tmp_path, "1,0", NEURONISH_NUM_CORES="2", NEURONISH_KERNEL="python")
    _check_fell_back(r, src, tmp_path, "core 0 failed (simulated hardware error)", calls=2)
    assert json.loads(r.stdout.strip().splitlines()[-1])["before_failure"] == {}


def test_core_failing_at_run_time_with_fallback_off_is_an_error(
        compiled: tuple[str, Path], tmp_path: Path) -> None:
    _, model_dir = compiled
    r = _run(model_dir, tmp_path, "1,0", NEURONISH_NUM_CORES="2", NEURONISH_FALLBACK="0",
             NEURONISH_KERNEL="python")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert list(got["outs"]) == ["1"] and got["counts"] == {} and not got["warnings"]
    assert [e[0] for e in got["errors"]] == ["InternalError", "InternalError"]
    assert all("core 0 failed" in e[1] and "NEURONISH_FALLBACK=0" in e[1]
               for e in got["errors"])


def gather_model(path: Path) -> str:
    """y = (x @ w) * table[idx]: a Gather whose indices are fed, so a bad index is found
    only at run time, by the device and by TensorFlow alike."""
    module = tf.Module()
    rng = np.random.default_rng(0)
    module.w = tf.Variable(rng.standard_normal((8, 4)).astype(np.float32))
    module.table = tf.Variable(rng.standard_normal((5, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x"),
                                  tf.TensorSpec([None], tf.int32, name="idx")])
    def serve(x: tf.Tensor, idx: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.matmul(x, module.w) * tf.gather(module.table, idx)}

    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return str(path)


_RUN_BAD_INDEX = r"""
import json, sys
import numpy as np
import neuronish
import tensorflow as tf
from neuronish import fallback
model = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
x = np.ones((2, 8), np.float32)
out = {"errors": []}
for idx in ([1, 7], [1, 2]):  # 7 is out of range for the 5-row table; then a good call
    try:
        y = model(x=tf.constant(x), idx=tf.constant(idx, tf.int32))["y"].numpy()
        out["y"] = y.tolist()
    except tf.errors.OpError as e:
        out["errors"].append([type(e).__name__, e.message])
out["counts"] = fallback.fallback_counts()
print(json.dumps(out))
"""


def test_bad_input_at_run_time_gets_tensorflows_error_and_stays_on_device(
        tmp_path: Path) -> None:
    """The device fails the call, TensorFlow refuses it too: the caller gets TensorFlow's
    INVALID_ARGUMENT, and one bad request does not move the op off the device."""
    src = gather_model(tmp_path / "src")
    report = neuronish.saved_model.compile(src, str(tmp_path / "compiled"), batch_size=2)
    assert report["OnNeuronRatio"] == 1.0 and len(report["NeuronOps"]) == 1, report
    r = subprocess.run([sys.executable, "-c", _RUN_BAD_INDEX, str(tmp_path / "compiled")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    ((kind, message),) = got["errors"]
    assert kind == "InvalidArgumentError", got
    assert "7" in message and "device" in message and "out of range" in message, message
    assert got["counts"] == {}  # the good call ran on the device
    fn = tf.saved_model.load(src).signatures["serving_default"]
    want = fn(x=tf.ones((2, 8)), idx=tf.constant([1, 2], tf.int32))["y"].numpy()
    np.testing.assert_allclose(np.array(got["y"], np.float32), want, rtol=1e-5, atol=1e-5)


def _long_loop_runner() -> GraphRunner:
    """A subgraph that computes for minutes: 10^7 steps of a 64x64 matmul."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, 64], name="x")
        w = tf.constant(np.eye(64, dtype=np.float32))
        _, y = tf.while_loop(lambda i, v: i < 10_000_000,
                             lambda i, v: (i + 1, tf.tanh(tf.matmul(v, w))), (0, x))
        tf.identity(y, name="y")
    return GraphRunner("loop_op", graph.as_graph_def().SerializeToString(), ["x:0"], ["y:0"],
                       [[1, 64]], [0], [0])


def test_fallback_call_past_its_deadline_stops_inside_tensorflow() -> None:
    """On TensorFlow, too, a call's deadline ends the computation: DEADLINE_EXCEEDED,
    the output left unwritten (without the cutoff the loop runs for minutes)."""
    runner = _long_loop_runner()
    out = np.full((1, 64), 7.0, np.float32)
    with pytest.raises(DeadlineExceeded, match="loop_op.*on TensorFlow.*deadline"):
        runner.run([np.ones((1, 64), np.float32)], [out], Cutoff(time.monotonic() + 0.3))
    assert (out == 7.0).all()
    runner.close()


def test_fallback_call_cancelled_by_its_caller_does_not_start() -> None:
    runner = _long_loop_runner()
    out = np.full((3, 64), 7.0, np.float32)
    with pytest.raises(Cancelled, match="cancelled by its caller before TensorFlow"):
        runner.run([np.ones((3, 64), np.float32)], [out], Cutoff(None, bytearray(b"\x01")))
    assert (out == 7.0).all()
    runner.close()


def test_ops_of_two_models_sharing_a_node_name_are_counted_apart() -> None:
    """Served models are partitioned alike, so their ops share node names
    (`PartitionedCall/model/neuron_op_0`): the counters tell them apart by executable."""
    from neuronish import fallback

    node = "PartitionedCall/model/neuron_op_test_shared_name"
    first, second = fallback.op_id(node, "a" * 64), fallback.op_id(node, "b" * 64)
    assert first != second
    with pytest.warns(fallback.FallbackWarning):
        fallback.record_fallback(first, "first model's device failed")
    with pytest.warns(fallback.FallbackWarning):
        fallback.record_fallback(second, "second model's device failed")
    fallback.count_call(first)
    for _ in range(2):
        fallback.count_call(second)
    counts = fallback.fallback_counts()
    assert counts[first] == {"op": node, "executable": "a" * 12, "calls": 1,
                             "reason": "first model's device failed"}
    assert counts[second]["calls"] == 2 and counts[second]["executable"] == "b" * 12
    lines = fallback.prometheus_lines()
    assert f':neuronish:neuron_op:fallback_calls{{op="{node}",executable="{"a" * 12}"}} 1' in lines
    assert f':neuronish:neuron_op:fallback_calls{{op="{node}",executable="{"b" * 12}"}} 2' in lines
