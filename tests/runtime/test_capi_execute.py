"""The C runtime executes (issue 25, docs/c-api.md): models compiled by the real
neuronish-cc (a subprocess), loaded and run through the C API (ctypes, no Python in the
loop of a call), give the Python runtime's outputs (bit for bit, or within 1e-6) and
TensorFlow's (within 1e-4) at the compiled batch, a smaller one and a larger
non-multiple; bad calls are refused with NR_INVALID_INPUT naming the input; a program
with an instruction the native engine cannot take is refused at load naming it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neuronish import runtime as py_runtime
from neuronish.runtime.capi import binding
from neuronish.runtime.executable import Executable, Instruction, to_bytes
from neuronish.runtime.signature import TensorSignature

BIN = Path(sys.executable).parent
NR_UNSUPPORTED, NR_INVALID_INPUT = 4, 10

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ is needed to build the C runtime library")


def compile_graph(tmp: Path, name: str, graph_def: bytes, io_config: dict, *options: str) -> bytes:
    """The executable neuronish-cc (a subprocess) writes for `graph_def`."""
    pb = tmp / f"{name}.pb"
    pb.write_bytes(graph_def)
    out = tmp / f"{name}.neff"
    r = subprocess.run([str(BIN / "neuronish-cc"), "compile", str(pb), "--framework",
                        "TENSORFLOW", "--io-config", json.dumps(io_config), "--output",
                        str(out), *options], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out.read_bytes()


@pytest.fixture(scope="module")
def lib() -> object:
    return binding.load_library()


@pytest.fixture(scope="module")
def device(lib: object) -> binding.Device:
    dev = binding.Device(lib)
    yield dev
    dev.close()


def _cases() -> dict[str, tuple]:
    """name -> (graph builder, compiled batch, neuronish-cc options, duplicates)."""
    from tests import graphs

    return {
        "dense": (lambda: graphs.dense_relu(batch=3), 3, (), 1),
        "cnn_2_duplicates": (lambda: graphs.conv_bn_relu(batch=2), 2, (), 2),
        "cnn_pipelined": (lambda: graphs.conv_bn_relu(batch=2), 2,
                          ("--neuroncore-pipeline-cores", "2"), 1),
    }


def _feeds(names: list[str], dtypes: list[str], shapes: list[tuple], batch: int,
           seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for dtype, shape in zip(dtypes, shapes):
        dims = [batch, *shape[1:]]
        out.append(rng.standard_normal(dims).astype(dtype))
    return out


@pytest.mark.parametrize("name", list(_cases()))
def test_outputs_match_python_and_tensorflow(lib: object, device: binding.Device,
                                             tmp_path: Path, name: str) -> None:
    build, compiled, options, duplicates = _cases()[name]
    graph = build()
    data = compile_graph(tmp_path, name, graph.graph_def, graph.io_config, *options)
    model = binding.Model(device, data, duplicates)
    py = py_runtime.load(data, duplicates=duplicates, runtime="python")
    try:
        assert model.batch_size == compiled and len(model.inputs) == 1
        input_name, dtype, shape, _ = model.inputs[0]
        for batch in (compiled, 1, 2 * compiled + 1):
            [x] = _feeds([input_name], [dtype], [shape], batch, seed=batch)
            got = model.run([x])
            want = py.run_list([x])
            tf_out = graph.reference({input_name: x})
            for g, w, t in zip(got, want, tf_out.values() if isinstance(tf_out, dict)
                               else tf_out):
                assert g.shape == w.shape and g.shape[0] == batch, (batch, g.shape, w.shape)
                np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
                np.testing.assert_allclose(g, np.asarray(t), rtol=1e-4, atol=1e-4)
    finally:
        model.unload()
        py.unload()


def test_bert_encoder_matches_python_and_tensorflow(device: binding.Device,
                                                    tmp_path: Path) -> None:
    """The BERT-style encoder of the model zoo (two int32 inputs, two outputs, layer
    norms, attention's batched matmuls, gathers)."""
    from models import cache
    from models.freeze import example_inputs

    frozen = cache.cached_frozen_graph("bert_encoder", None)  # (a dynamic batch)
    io = frozen.io_config()  # with batch axes given: the compiler proves splitting is safe
    io = {"inputs": {n: [[2, *shape[1:]], dtype, 0] for n, (shape, dtype) in io["inputs"].items()},
          "outputs": {n: 0 for n in io["outputs"]}}
    data = compile_graph(tmp_path, "bert", frozen.graph_def, io)
    model = binding.Model(device, data)
    py = py_runtime.load(data, runtime="python")
    try:
        assert model.batch_size == 2 and [i[1] for i in model.inputs] == ["int32", "int32"]
        for batch in (2, 1, 5):
            feeds = example_inputs(frozen, batch, seed=batch)
            xs = [feeds[n] for n, *_ in model.inputs]
            got = model.run(xs)
            want = py.run_list(xs)
            tf_out = frozen.run_tf(feeds)
            for (oname, *_), g, w in zip(model.outputs, got, want):
                assert g.shape == w.shape and g.shape[0] == batch
                np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
                np.testing.assert_allclose(g, tf_out[oname], rtol=1e-4, atol=1e-4)
    finally:
        model.unload()
        py.unload()


def test_bad_calls_are_refused_naming_the_input(device: binding.Device, tmp_path: Path) -> None:
    from tests import graphs

    graph = graphs.dense_relu(batch=3)
    model = binding.Model(device, compile_graph(tmp_path, "dense", graph.graph_def,
                                                graph.io_config))
    x = np.zeros((3, 16), np.float32)
    y = np.zeros((3, 8), np.float32)
    T = binding.Model._tensor

    def refused(ins: list, outs: list) -> str:
        with pytest.raises(binding.CRuntimeError) as e:
            model.raw_run(ins, outs)
        assert e.value.status == NR_INVALID_INPUT, e.value
        return e.value.message

    message = refused([T(x.astype(np.float64), None)], [T(y, None)])
    assert "input 0 'x:0' has dtype float64" in message and "compiled for float32" in message
    message = refused([T(np.zeros((3, 15), np.float32), None)], [T(y, None)])
    assert "'x:0' has shape [3,15]; expected float32[*,16]" in message
    message = refused([T(np.zeros((3, 16, 1), np.float32), None)], [T(y, None)])
    assert "'x:0' has shape [3,16,1]" in message
    message = refused([], [T(y, None)])
    assert "0 input(s)" in message and "'x:0'" in message
    message = refused([T(x, None), T(x, None)], [T(y, None)])
    assert "2 input(s)" in message
    message = refused([T(x, "y:0")], [T(y, None)])
    assert "named 'y:0'" in message and "'x:0'" in message
    message = refused([T(x, None)], [T(np.zeros((2, 8), np.float32), None)])
    assert "output 'Identity:0'" in message and "float32[3,8]" in message
    short = T(x, None)
    short.bytes = 10
    message = refused([short], [T(y, None)])
    assert "'x:0' holds 10 bytes" in message
    model.unload()


def test_inputs_disagreeing_on_the_batch_are_refused(device: binding.Device,
                                                     tmp_path: Path) -> None:
    import tensorflow as tf

    from tests import graphs

    graph = graphs.trace(lambda a, b: tf.nn.relu(a) + b,
                         tf.TensorSpec([None, 4], tf.float32, name="a"),
                         tf.TensorSpec([None, 4], tf.float32, name="b"), batch=2)
    model = binding.Model(device, compile_graph(tmp_path, "two", graph.graph_def,
                                                graph.io_config))
    with pytest.raises(binding.CRuntimeError) as e:
        model.run([np.zeros((3, 4), np.float32), np.zeros((5, 4), np.float32)])
    assert e.value.status == NR_INVALID_INPUT
    assert "disagree on the batch size: 'a:0' has 3, 'b:0' has 5" in e.value.message
    a, b = np.ones((3, 4), np.float32), np.full((3, 4), 2, np.float32)
    np.testing.assert_array_equal(model.run([a, b])[0], np.full((3, 4), 3, np.float32))
    model.unload()


def test_a_fixed_batch_model_takes_only_its_shapes(device: binding.Device) -> None:
    """Batch axes -1 (a graph the compiler could not prove batch-safe without them): a call
    at another batch is refused, as Model._validate refuses it."""
    exe = _one_instruction("unary", {"fn": "relu"}, [((2, 3), "float32")], [((2, 3), "float32")])
    model = binding.Model(device, exe)
    assert model.batch_size == -1
    with pytest.raises(binding.CRuntimeError) as e:
        model.run([np.zeros((4, 3), np.float32)])
    assert e.value.status == NR_INVALID_INPUT and "expected float32[2,3]" in e.value.message
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(model.run([x])[0], np.maximum(x, 0))
    model.unload()


def _one_instruction(kind: str, attrs: dict, ins: list[tuple], outs: list[tuple]) -> bytes:
    n = len(ins)
    return to_bytes(Executable(
        compiler={"name": "test"},
        inputs=[TensorSignature(f"in{k}:0", d, s) for k, (s, d) in enumerate(ins)],
        outputs=[TensorSignature(f"out{k}:0", d, s) for k, (s, d) in enumerate(outs)],
        input_values=list(range(n)), output_values=list(range(n, n + len(outs))),
        constants={}, values={**{k: (s, d) for k, (s, d) in enumerate(ins)},
                              **{n + k: (s, d) for k, (s, d) in enumerate(outs)}},
        arena_bytes=0, offsets={},
        programs=[[Instruction(kind, tuple(range(n)), tuple(range(n, n + len(outs))), attrs,
                               None, ("test/op",))]]))


def test_an_instruction_the_engine_does_not_take_is_refused_at_load(
        device: binding.Device) -> None:
    """An empty operand with a non-empty result (a pad of a [0, 3] tensor): Python runs it
    on its numpy kernel; the C runtime has only the native engine and says so."""
    data = _one_instruction("pad", {"paddings": [[1, 0], [0, 0]]}, [((0, 3), "float32")],
                            [((1, 3), "float32")])
    py = py_runtime.load(data, runtime="python")
    np.testing.assert_array_equal(py.run_list([np.zeros((0, 3), np.float32)])[0],
                                  np.zeros((1, 3), np.float32))
    py.unload()
    before = device.memory()
    with pytest.raises(binding.CRuntimeError) as e:
        binding.Model(device, data)
    assert e.value.status == NR_UNSUPPORTED
    assert "instruction 0 (pad, from TF node(s) test/op) cannot run on the native engine" \
        in e.value.message
    assert device.memory() == before  # a failed load keeps no device memory


def test_device_memory_is_charged_and_released(device: binding.Device, tmp_path: Path) -> None:
    from tests import graphs

    graph = graphs.conv_bn_relu(batch=2)
    data = compile_graph(tmp_path, "cnn", graph.graph_def, graph.io_config)
    before = device.memory()
    model = binding.Model(device, data, duplicates=2)
    during = device.memory()
    charged = [c for c in during if during[c][0] > before[c][0]]
    assert len(charged) == 2, (before, during)
    model.unload()
    assert device.memory() == before


def test_concurrent_calls_give_each_its_own_result(device: binding.Device,
                                                   tmp_path: Path) -> None:
    """8 threads (ctypes lets go of the GIL inside nr_execute) call one pipelined model with
    2 duplicates at once, at batches that split and pad; each gets its own outputs."""
    from concurrent.futures import ThreadPoolExecutor

    from tests import graphs

    graph = graphs.conv_bn_relu(batch=2)
    data = compile_graph(tmp_path, "cnn2", graph.graph_def, graph.io_config,
                         "--neuroncore-pipeline-cores", "2")
    model = binding.Model(device, data, duplicates=2)
    py = py_runtime.load(data, runtime="python")
    xs = [np.random.default_rng(k).standard_normal((1 + k % 5, 8, 8, 3)).astype(np.float32)
          for k in range(32)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda x: model.run([x])[0], xs))
    for x, g in zip(xs, got):
        np.testing.assert_allclose(g, py.run_list([x])[0], rtol=0, atol=1e-6)
    model.unload()
    py.unload()


NR_CANCELLED, NR_DEADLINE_EXCEEDED = 12, 13


def test_deadlines_and_cancellation(device: binding.Device, tmp_path: Path) -> None:
    """nr_execute_with stops a call at its deadline or once its cancel byte is set: before
    it starts, while it waits for the model's only copy (busy with a long call), and in
    the middle of a long split call, which stops with NR_CANCELLED; the model then runs
    the next call normally."""
    import threading
    import time

    from tests import graphs

    small = graphs.dense_relu(batch=64, features=1024, units=1024)
    model = binding.Model(device, compile_graph(tmp_path, "wide", small.graph_def,
                                                small.io_config))
    x = np.random.default_rng(0).standard_normal((64 * 200, 1024)).astype(np.float32)
    with pytest.raises(binding.CRuntimeError) as e:
        model.run([x[:64]], cancel=bytearray(b"\x01"))
    assert e.value.status == NR_CANCELLED and "before it started" in e.value.message
    with pytest.raises(binding.CRuntimeError) as e:
        model.run([x[:64]], timeout=-1.0)
    assert e.value.status == NR_DEADLINE_EXCEEDED and "before it started" in e.value.message

    def in_thread(fn: object) -> tuple[threading.Thread, dict]:
        result: dict = {}

        def body() -> None:
            try:
                fn()
                result["status"] = 0
            except binding.CRuntimeError as err:
                result["status"], result["message"] = err.status, err.message

        thread = threading.Thread(target=body)
        thread.start()
        return thread, result

    # A split call of 200 chunks, cancelled once it runs.
    flag = bytearray(1)
    thread, result = in_thread(lambda: model.run([x], cancel=flag))
    time.sleep(0.05)
    flag[0] = 1
    thread.join(120)
    assert result.get("status") == NR_CANCELLED, result
    assert "cancelled by its caller" in result["message"]
    out = model.run([x[:64]], timeout=60.0)[0]  # the model goes on
    np.testing.assert_array_equal(out, model.run([x[:64]])[0])
    model.unload()

    # One long call holds the only copy of a big model; another call's deadline passes
    # while it waits for it.
    big = graphs.dense_relu(batch=4096, features=2048, units=2048)
    model = binding.Model(device, compile_graph(tmp_path, "big", big.graph_def,
                                                big.io_config))
    xb = np.ones((4096, 2048), np.float32)
    thread, result = in_thread(lambda: model.run([xb]))
    time.sleep(0.02)
    with pytest.raises(binding.CRuntimeError) as e:
        model.run([xb], timeout=0.05)
    thread.join(120)
    assert result.get("status") == 0, result
    assert e.value.status == NR_DEADLINE_EXCEEDED
    assert "while it waited for" in e.value.message, e.value.message
    model.unload()


def test_int8_model_matches_python(device: binding.Device, tmp_path: Path) -> None:
    """A CNN quantized by neuronish-cc (--quantize int8 with a calibration file: quantize,
    conv2d_int8 with a residual, matmul_int8) gives the Python runtime's outputs, and
    TensorFlow's within what int8 costs, at batches 4, 1 and 9."""
    from tests.runtime.test_int8 import _small_cnn

    graph = _small_cnn()
    calib = np.random.default_rng(1).standard_normal((6, 4, 8, 8, 3)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", **{"x:0": calib})
    data = compile_graph(tmp_path, "int8", graph.graph_def, graph.io_config, "--quantize",
                         "int8", "--calibration", str(tmp_path / "calib.npz"))
    model = binding.Model(device, data)
    py = py_runtime.load(data, runtime="python")
    kinds = {i.kind for p in py.exe.programs for i in p}
    assert {"quantize", "conv2d_int8", "matmul_int8"} <= kinds, kinds
    for batch in (4, 1, 9):
        x = np.random.default_rng(batch).standard_normal((batch, 8, 8, 3)).astype(np.float32)
        [got] = model.run([x])
        [want] = py.run_list([x])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        tf_out = next(iter(graph.reference({"x:0": x}).values()))
        assert np.abs(got - tf_out).max() <= 0.05 * np.abs(tf_out).max()
    model.unload()
    py.unload()
