"""The NeuronOp custom op end to end: built with g++, loaded into TensorFlow, run on the device.

Real TensorFlow, real compiler, real runtime; fresh subprocesses where import order or
a first build is what is tested.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework.node_def_pb2 import NodeDef
from tensorflow.python.framework import op_def_registry

import neuronish
from neuronish import kernel_bridge, op_library
from neuronish.cc.compiler import compile_graph
from neuronish.neuron_op import neuron_op_node_def, read_signature
from neuronish.runtime import Device, OutOfDeviceMemory, get_device, load
from neuronish.runtime.config import DeviceConfig
from neuronish.runtime.executable import HEADER_SIZE, from_bytes
from neuronish.runtime.program import LoadedProgram
from neuronish.runtime.signature import TensorSignature
from tests.graphs import TracedGraph, dense_relu, trace

REPO = Path(__file__).resolve().parents[2]
LIB = op_library.load()


# -- helpers -----------------------------------------------------------------------------

def wrapper_graph(g: TracedGraph, node: NodeDef) -> tf.compat.v1.GraphDef:
    """A GraphDef with one Placeholder per compiled input feeding `node`."""
    gd = tf.compat.v1.GraphDef()
    for name, (_, dtype, *_) in g.io_config["inputs"].items():
        ph = gd.node.add(name=name.split(":")[0], op="Placeholder")
        ph.attr["dtype"].type = tf.as_dtype(dtype).as_datatype_enum
    gd.node.append(node)
    return gd


def neuron_function(g: TracedGraph, node: NodeDef, specs: list[tf.TensorSpec]) -> Callable:
    """A tf.function running `node` (a NeuronOp NodeDef) imported with an input_map."""
    gd = wrapper_graph(g, node)
    names = list(g.io_config["inputs"])
    outputs = [f"{node.name}:{i}" for i in range(len(node.attr["output_names"].list.s))]

    @tf.function(input_signature=specs, autograph=False)
    def f(*args: tf.Tensor) -> list[tf.Tensor]:
        return tf.graph_util.import_graph_def(gd, input_map=dict(zip(names, args)),
                                              return_elements=outputs, name="")
    return f


def two_in_three_out(batch: int = 4) -> TracedGraph:
    """a: f32[B,8] (batched), b: f32[5] (not batched) -> relu(a @ w + b), argmax(a), tanh(b)."""
    w = tf.constant(np.random.default_rng(3).standard_normal((8, 5)).astype(np.float32))

    def fn(a: tf.Tensor, b: tf.Tensor) -> tuple[tf.Tensor, ...]:
        return tf.nn.relu(tf.matmul(a, w) + b), tf.argmax(a, axis=1), tf.tanh(b) * 2.0

    g = trace(fn, tf.TensorSpec([None, 8], tf.float32, name="a"),
              tf.TensorSpec([5], tf.float32, name="b"), batch=batch)
    g.io_config["inputs"]["b:0"].append(-1)  # a weight-like input: no batch axis
    return g


def python(code: str, env: dict | None = None, timeout: float = 300) -> str:
    """Run `code` in a fresh interpreter; return its stdout, fail with its stderr."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, cwd=REPO, env={**os.environ, **(env or {})}, timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-4000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def dense():
    g = dense_relu(batch=4)
    exe = compile_graph(g.graph_def, g.io_config)
    node = neuron_op_node_def("neuron_op_0", ["x:0"], exe, g.graph_def)
    f = neuron_function(g, node, [tf.TensorSpec(None, tf.float32)])
    return g, exe, node, f


def rows(batch: int, features: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + batch).standard_normal((batch, features)).astype(
        np.float32)


# -- the op and its NodeDef ----------------------------------------------------------------

def test_op_is_registered_with_the_design_attrs() -> None:
    op = op_def_registry.get("NeuronOp")
    attrs = {a.name: a.type for a in op.attr}
    assert attrs == {
        "graph_def": "string", "input_names": "list(string)", "output_names": "list(string)",
        "input_shapes": "list(shape)", "output_shapes": "list(shape)",
        "output_dtypes": "list(type)", "executable": "string", "input_batch_axis": "list(int)",
        "output_batch_axis": "list(int)", "model_config": "list(int)", "Tin": "list(type)",
        "n_external": "int",  # count of external_files: attrs stored in assets/
        "dynamic_shapes": "string"}  # free dims and their bounds (shape_specialize.py)
    assert [a.name for a in op.input_arg] == ["input_tensors", "external_files"]
    assert [a.name for a in op.output_arg] == ["output_tensors"]
    assert not op.is_stateful  # lets CSE work and keeps tf.function from serializing calls
    assert op_library.load() is LIB  # idempotent


def test_node_def_reads_the_signature_from_the_executable(dense) -> None:
    g, exe, node, _ = dense
    assert node.op == "NeuronOp" and node.name == "neuron_op_0" and list(node.input) == ["x"]
    a = node.attr
    assert list(a["Tin"].list.type) == [tf.float32.as_datatype_enum]
    assert list(a["output_dtypes"].list.type) == [tf.float32.as_datatype_enum]
    assert [s.decode() for s in a["input_names"].list.s] == ["x:0"]
    assert [s.decode() for s in a["output_names"].list.s] == ["Identity:0"]
    assert [[d.size for d in s.dim] for s in a["input_shapes"].list.shape] == [[4, 16]]
    assert [[d.size for d in s.dim] for s in a["output_shapes"].list.shape] == [[4, 8]]
    assert list(a["input_batch_axis"].list.i) == [0] and list(a["output_batch_axis"].list.i) == [0]
    assert list(a["model_config"].list.i) == [-1] * 5
    assert a["executable"].s == exe and a["graph_def"].s == g.graph_def
    # Explicit arguments are checked, short model_configs padded, other outputs written k.
    x = TensorSignature("x:0", "float32", (4, 16), 0)
    y = TensorSignature("Identity:0", "float32", (4, 8), 0)
    # A stated dtype may be anything tf.as_dtype takes; shapes any sequence of ints.
    n2 = neuron_op_node_def("n", ["pre/out:1"], exe, g.graph_def,
                            input_signature=[replace(x, dtype=np.float32, shape=[4, 16])],
                            output_signature=[replace(y, dtype=tf.float32)],
                            model_config=[-1, -1, 2])
    assert list(n2.input) == ["pre/out:1"]
    assert list(n2.attr["model_config"].list.i) == [-1, -1, 2, -1, -1]
    assert read_signature(n2) == ([x], [y])  # the attribute reader gives the records back
    with pytest.raises(ValueError, match=r"input 0 is stated as 'x:0' float32\[8,16\] batch "
                                         r"axis 0 but the executable's is 'x:0' float32\[4,16\]"
                                         r" batch axis 0 \(its shape differs\)"):
        neuron_op_node_def("n", ["x"], exe, g.graph_def,
                           input_signature=[replace(x, shape=(8, 16))])
    with pytest.raises(ValueError, match=r"output 0 .* \(its dtype differs\)"):
        neuron_op_node_def("n", ["x"], exe, g.graph_def,
                           output_signature=[replace(y, dtype=tf.int32)])
    with pytest.raises(ValueError, match=r"\(its batch_axis differs\)"):
        neuron_op_node_def("n", ["x"], exe, g.graph_def,
                           input_signature=[replace(x, batch_axis=-1)])
    with pytest.raises(ValueError, match=r"2 inputs stated \['x:0', 'x:0'\] for an executable "
                                         r"with 1"):
        neuron_op_node_def("n", ["x"], exe, g.graph_def, input_signature=[x, x])
    with pytest.raises(ValueError, match="2 input tensor"):
        neuron_op_node_def("n", ["x", "y"], exe, g.graph_def)


def test_shape_function_leaves_the_batch_unknown(dense) -> None:
    *_, f = dense
    out = f.get_concrete_function(tf.TensorSpec([None, 16], tf.float32)).structured_outputs
    assert out[0].shape.as_list() == [None, 8]
    g = two_in_three_out()
    exe = compile_graph(g.graph_def, g.io_config)
    node = neuron_op_node_def("n", ["a", "b"], exe, g.graph_def)
    f2 = neuron_function(g, node, [tf.TensorSpec([None, 8]), tf.TensorSpec([5])])
    assert [o.shape.as_list() for o in f2.get_concrete_function().structured_outputs] == [
        [None, 5], [None], [5]]


# -- running it ----------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [4, 1, 13, 0])  # compiled, smaller, 3x+1 (split, padded), empty
def test_matches_tensorflow(dense, batch: int) -> None:
    g, _, _, f = dense
    x = rows(batch)
    got = f(tf.constant(x))[0].numpy()
    assert got.shape == (batch, 8)
    np.testing.assert_allclose(got, g.reference({"x:0": x})["Identity:0"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch", [4, 1, 13])
def test_two_inputs_three_outputs(batch: int) -> None:
    g = two_in_three_out()
    exe = compile_graph(g.graph_def, g.io_config)
    node = neuron_op_node_def("n", ["a", "b"], exe, g.graph_def)
    assert list(node.attr["input_batch_axis"].list.i) == [0, -1]
    assert list(node.attr["output_batch_axis"].list.i) == [0, 0, -1]
    f = neuron_function(g, node, [tf.TensorSpec(None, tf.float32)] * 2)
    a, b = rows(batch, 8), np.linspace(-1, 1, 5, dtype=np.float32)
    got = [t.numpy() for t in f(tf.constant(a), tf.constant(b))]
    want = g.reference({"a:0": a, "b:0": b})
    for out, name in zip(got, g.io_config["outputs"]):
        assert out.dtype == want[name].dtype and out.shape == want[name].shape
        np.testing.assert_allclose(out, want[name], rtol=1e-5, atol=1e-6)


def test_every_device_dtype_crosses_both_ways() -> None:
    def fn(i: tf.Tensor, h: tf.Tensor, d: tf.Tensor, u: tf.Tensor, b: tf.Tensor) -> tuple:
        return (i * 2, i > 1, h * 2, tf.cast(i, tf.int64) + 1, d - 1.0, u + 1,
                tf.logical_not(b), tf.cast(i, tf.int8), tf.cast(i, tf.int16))

    specs = [tf.TensorSpec([None, 3], dt, name=n) for n, dt in [
        ("i", tf.int32), ("h", tf.float16), ("d", tf.float64), ("u", tf.uint8), ("b", tf.bool)]]
    g = trace(fn, *specs, batch=2)
    node = neuron_op_node_def("n", ["i", "h", "d", "u", "b"],
                              compile_graph(g.graph_def, g.io_config), g.graph_def)
    f = neuron_function(g, node, [tf.TensorSpec(None, s.dtype) for s in specs])
    rng = np.random.default_rng(0)
    for batch in (2, 5):
        feeds = {"i:0": rng.integers(-3, 4, (batch, 3)).astype(np.int32),
                 "h:0": rng.standard_normal((batch, 3)).astype(np.float16),
                 "d:0": rng.standard_normal((batch, 3)),
                 "u:0": rng.integers(0, 200, (batch, 3)).astype(np.uint8),
                 "b:0": rng.integers(0, 2, (batch, 3)).astype(bool)}
        got = f(*[tf.constant(feeds[n]) for n in g.io_config["inputs"]])
        want = g.reference(feeds)
        for out, name in zip(got, g.io_config["outputs"]):
            assert out.dtype.as_numpy_dtype == want[name].dtype, name
            np.testing.assert_array_equal(out.numpy(), want[name])


def _buffer_address(t: tf.Tensor) -> int:
    """Where a tensor's bytes really are (DLPack exports the buffer itself, no copy)."""
    capsule = tf.experimental.dlpack.to_dlpack(t)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return ctypes.c_void_p.from_address(get(capsule, b"dltensor")).value  # DLTensor.data


def test_inputs_and_outputs_cross_without_copies(dense, monkeypatch: pytest.MonkeyPatch) -> None:
    # (the Python runtime's path, whose internals this watches; the C runtime's: see
    # test_neuron_op_c_runtime.py)
    monkeypatch.setenv("NEURONISH_KERNEL", "python")
    _, _, node, _ = dense
    seen = {}
    run = kernel_bridge.run

    def spy(handle: kernel_bridge.Handle, inputs: tuple, outputs: tuple,
            cancel: bytearray | None) -> None:
        x, y = np.asarray(inputs[0]), np.asarray(outputs[0])
        seen.update(x=x.ctypes.data, y=y.ctypes.data, x_readonly=not x.flags.writeable)
        run(handle, inputs, outputs, cancel)

    execute = LoadedProgram.execute

    def device_spy(program: LoadedProgram, inputs: list, outputs: list,
                   cutoff: object = None) -> None:
        seen.update(device_x=inputs[0].ctypes.data, device_y=outputs[0].ctypes.data)
        execute(program, inputs, outputs, cutoff)

    monkeypatch.setattr(kernel_bridge, "run", spy)
    monkeypatch.setattr(LoadedProgram, "execute", device_spy)
    x = tf.constant(rows(4))  # the compiled batch: no split, so no copy anywhere
    (y,) = LIB.neuron_op([x], **_eager_attrs(node))
    xa, ya = _buffer_address(x), _buffer_address(y)
    assert seen == {"x": xa, "y": ya, "x_readonly": True, "device_x": xa, "device_y": ya}
    g = dense[0]
    want = g.reference({"x:0": rows(4)})[g.io_config["outputs"][0]]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)


def test_eight_threads_match_serial(dense) -> None:
    *_, f = dense
    xs = [tf.constant(rows(b)) for b in (4, 1, 13, 4, 7, 4, 2, 9)]
    serial = [f(x)[0].numpy() for x in xs]
    results: list[list[np.ndarray]] = [[] for _ in xs]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(20):
                results[i].append(f(xs[i])[0].numpy())
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for want, got in zip(serial, results):
        for r in got:
            np.testing.assert_array_equal(r, want)


def _device_used() -> int:
    return sum(m["used"] for m in get_device().memory_report().values())


def test_a_kernel_collected_by_a_thread_holding_a_runtime_lock_does_not_hang(
        dense, monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorFlow destroys kernels wherever their function is garbage-collected. Seen:
    the telemetry thread, mid-snapshot under its lock, collected a NeuronOp function; the
    kernel's unload wanted that lock again (a hang), and every thread then waited for
    TensorFlow's function-library lock. Unloads are now queued."""
    # (the Python runtime's telemetry lock and device memory; the C runtime's own lock is
    # not held by Python code)
    monkeypatch.setenv("NEURONISH_KERNEL", "python")
    from neuronish.runtime import telemetry

    g, _, node, _ = dense
    publisher = telemetry.get_telemetry()
    assert publisher is not None, "telemetry is on by default; this test needs it"
    f = neuron_function(g, node, [tf.TensorSpec([None, 16], tf.float32)])
    f(tf.constant(rows(2)))  # loaded, so tracked by telemetry
    gc.collect()
    assert kernel_bridge.wait_for_unloads(timeout=30)  # (earlier tests' queued unloads)
    before_drop = _device_used()
    holder: list = [f]
    f = None

    def collect_under_the_lock() -> None:
        with publisher._lock:  # as snapshot() holds it when a collection strikes
            holder.clear()
            gc.collect()

    thread = threading.Thread(target=collect_under_the_lock, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "collecting a NeuronOp under telemetry's lock hung"
    assert kernel_bridge.wait_for_unloads(timeout=30)
    assert _device_used() < before_drop  # and the model was still unloaded


def test_loads_once_per_op_even_when_first_called_concurrently_and_unloads(
        dense, monkeypatch: pytest.MonkeyPatch) -> None:
    # (the Python runtime's path, whose internals this watches; the C runtime's: see
    # test_neuron_op_c_runtime.py)
    monkeypatch.setenv("NEURONISH_KERNEL", "python")
    g, exe, node, _ = dense
    gc.collect()  # earlier tests' functions (and their loaded models) go first
    assert kernel_bridge.wait_for_unloads(timeout=30)  # (queued unloads too)
    before = _device_used()
    f = neuron_function(g, node, [tf.TensorSpec([None, 16], tf.float32)])
    barrier = threading.Barrier(8)

    def first_call() -> None:
        barrier.wait()
        f(tf.constant(rows(4)))

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    one_load = load(exe, duplicates=4, device=Device(get_device().config))
    expected = sum(sum(r.bytes_per_core) for r in one_load._reservations)
    one_load.unload()
    assert _device_used() - before == expected  # exactly one model, 4 duplicates
    f = None  # drops the function, its graph and its kernels
    gc.collect()
    assert kernel_bridge.wait_for_unloads(timeout=30)
    assert _device_used() == before  # the kernel's destructor unloaded it


# -- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, message", [
    ((4, 15), r"NeuronOp 'neuron_op_0': input 'x:0' has shape \[4,15\]; expected "
              r"float32\[\*,16\] \(any size on batch axis 0\)"),
    ((4, 16, 1), r"input 'x:0' has shape \[4,16,1\]; expected float32\[\*,16\]"),
])
def test_wrong_shape_names_the_tensor(dense, shape: tuple, message: str) -> None:
    *_, f = dense
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        f(tf.zeros(shape))
    assert f(tf.zeros((4, 16)))[0].shape == (4, 8)  # the op still works


def _eager_attrs(node: NodeDef) -> dict:
    a = node.attr
    return dict(
        external_files=[], graph_def=a["graph_def"].s, executable=a["executable"].s,
        input_names=list(a["input_names"].list.s), output_names=list(a["output_names"].list.s),
        input_shapes=[[d.size for d in s.dim] for s in a["input_shapes"].list.shape],
        output_shapes=[[d.size for d in s.dim] for s in a["output_shapes"].list.shape],
        output_dtypes=list(a["output_dtypes"].list.type),
        input_batch_axis=list(a["input_batch_axis"].list.i),
        output_batch_axis=list(a["output_batch_axis"].list.i),
        model_config=list(a["model_config"].list.i))


def test_eager_call_and_wrong_dtype_names_the_tensor(dense) -> None:
    g, _, node, _ = dense
    attrs = _eager_attrs(node)
    x = rows(5)
    (y,) = LIB.neuron_op([tf.constant(x)], **attrs)
    np.testing.assert_allclose(y.numpy(), g.reference({"x:0": x})["Identity:0"], rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input 'x:0' has dtype int32; the model was compiled for float32"):
        LIB.neuron_op([tf.zeros((4, 16), tf.int32)], **attrs)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input 'x:0' has dtype string, which the device does not have"):
        LIB.neuron_op([tf.constant([["a"] * 16] * 4)], **attrs)


@pytest.mark.parametrize("damage, message", [
    (lambda e: e[:HEADER_SIZE] + bytes([e[HEADER_SIZE] ^ 0xFF]) + e[HEADER_SIZE + 1:],
     r"NeuronOp 'bad': ExecutableError: executable checksum mismatch"),
    (lambda e: e[:100], r"ExecutableError: executable is truncated"),
    (lambda e: b"garbage", r"ExecutableError: executable is truncated: 7 bytes"),
])
def test_corrupt_executable_is_a_tf_error_and_the_process_survives(
        dense, damage: Callable[[bytes], bytes], message: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # With the runtime fallback on, the op would run its graph_def on TensorFlow instead
    # (tests/neuronish/test_fallback.py); off, the device's error must reach the caller.
    monkeypatch.setenv("NEURONISH_FALLBACK", "0")
    g, exe, node, f = dense
    bad = NodeDef()
    bad.CopyFrom(node)
    bad.name = "bad"
    bad.attr["executable"].s = damage(exe)
    with pytest.raises(tf.errors.InternalError, match=message):
        neuron_function(g, bad, [tf.TensorSpec([None, 16], tf.float32)])(tf.zeros((4, 16)))
    assert f(tf.zeros((4, 16)))[0].shape == (4, 8)


def test_attrs_that_disagree_with_the_executable_are_refused(dense) -> None:
    g, _, node, _ = dense
    bad = NodeDef()
    bad.CopyFrom(node)
    bad.attr["output_shapes"].list.shape[0].dim[1].size = 9
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"output 0 is 'Identity:0' float32\[4,9\] .* but 'Identity:0' "
                             r"float32\[4,8\] .* in its executable"):
        neuron_function(g, bad, [tf.TensorSpec([None, 16], tf.float32)])(tf.zeros((4, 16)))


# -- the bridge's duplicates policy ----------------------------------------------------------

def test_duplicates_fall_back_to_what_fits(dense) -> None:
    _, exe, _, _ = dense
    parsed = from_bytes(exe)

    def device(**env: str) -> Device:
        return Device(DeviceConfig.from_env(env))

    def duplicates(config: list[int], dev: Device) -> int:
        return kernel_bridge.load_model(parsed, kernel_bridge.ModelConfig.from_list(config),
                                        dev).duplicates

    assert duplicates([], device(NEURONISH_NUM_CORES="8")) == 4  # the default cap
    assert duplicates([-1, -1, -1], device(NEURONISH_NUM_CORES="2")) == 2  # two core groups
    assert duplicates([-1, -1, 3], device(NEURONISH_NUM_CORES="8")) == 3  # model_config's bound
    # Memory for one copy per core, and three of the four cores full: one duplicate,
    # then the runtime's own error once none fits.
    probe = device(NEURONISH_NUM_CORES="1")
    load(exe, device=probe)
    need = probe.memory_report()[0]["used"]
    tight = device(NEURONISH_NUM_CORES="4", NEURONISH_CORE_MEMORY=str(need))
    tight.reserve(1, [need], 3)
    assert duplicates([], tight) == 1
    with pytest.raises(OutOfDeviceMemory, match="out of device memory"):
        duplicates([], tight)


# -- import hooks, SavedModel, concurrent first build: fresh processes -----------------------

def test_compiler_and_runtime_stay_free_of_tensorflow(dense, tmp_path: Path) -> None:
    # A whole compile, load and run, not just the imports: a lazy `import tensorflow`
    # inside a pass or a kernel would show up only here.
    g, _, _, _ = dense
    (tmp_path / "graph.pb").write_bytes(g.graph_def)
    x = rows(4)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "want.npy", g.reference({"x:0": x})["Identity:0"])
    python(f"""
        import json, sys
        import numpy as np
        import neuronish.kernel_bridge
        from neuronish.cc.cli import main
        from neuronish.runtime import load
        d = {str(tmp_path)!r}
        status = main(["compile", d + "/graph.pb", "--framework", "TENSORFLOW", "--io-config",
                       {json.dumps(json.dumps(g.io_config))}, "--output", d + "/m.neff",
                       "--workdir", d + "/work"])
        assert status == 0, status
        out = load(d + "/m.neff").run({{"x:0": np.load(d + "/x.npy")}})["Identity:0"]
        np.testing.assert_allclose(out, np.load(d + "/want.npy"), rtol=1e-5, atol=1e-6)
        assert 'tensorflow' not in sys.modules, 'neuronish imported tensorflow'
    """)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        neuronish.nope  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        neuronish.nope  # noqa: B018


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, dense):
    g, _, node, _ = dense
    f = neuron_function(g, node, [tf.TensorSpec([None, 16], tf.float32)])
    module = tf.Module()
    module.f = f
    path = tmp_path_factory.mktemp("sm") / "model"
    tf.saved_model.save(module, str(path))
    xs = {f"b{b}": rows(b, seed=7) for b in (4, 1, 13)}
    np.savez(path.parent / "data.npz", **xs,
             **{f"want_{k}": g.reference({"x:0": x})["Identity:0"] for k, x in xs.items()})
    return path


@pytest.mark.parametrize("imports", ["import neuronish\nimport tensorflow as tf",
                                     "import tensorflow as tf\nimport neuronish"])
def test_saved_model_runs_in_a_fresh_process_in_either_import_order(saved_model: Path,
                                                                    imports: str) -> None:
    out = python(imports + f"""
import sys
import numpy as np
assert not [f for f in sys.meta_path if type(f).__name__ == "_TensorFlowImportHook"]
data = np.load({str(saved_model.parent / "data.npz")!r})
m = tf.saved_model.load({str(saved_model)!r})
for k in ("b4", "b1", "b13"):
    got = m.f(tf.constant(data[k]))[0].numpy()
    np.testing.assert_allclose(got, data["want_" + k], rtol=1e-5, atol=1e-6)
print("ok", len(data["b13"]))
""")
    assert out.split() == ["ok", "13"]


@pytest.mark.slow
def test_concurrent_first_build_in_two_processes(tmp_path: Path) -> None:
    cache = tmp_path / "ops"
    go = tmp_path / "go"
    code = f"""
        import os, pathlib, sys, time
        import tensorflow as tf
        print("ready", flush=True)
        while not os.path.exists({str(go)!r}):
            time.sleep(0.01)
        # `import neuronish` with TensorFlow loaded builds the library: both at once.
        from neuronish import op_library
        lib = op_library.load()
        assert hasattr(lib, "neuron_op")
        print(op_library.library_path())
    """
    env = {**os.environ, "NEURONISH_OP_CACHE": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:  # both past `import tensorflow`, then both build at once
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    go.touch()
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for _, e in outs]
    paths = {o.strip() for o, _ in outs}
    assert len(paths) == 1
    assert sorted(p.suffix for p in cache.iterdir()) == [".lock", ".so"]  # no temp files left


def test_build_failure_shows_the_command_and_the_compiler_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-g++"
    fake.write_text("#!/bin/sh\necho 'neuron_op.cc:1: error: the fake compiler refuses' >&2\n"
                    "exit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("NEURONISH_OP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(fake))
    with pytest.raises(op_library.OpLibraryError) as e:
        op_library.build()
    text = str(e.value)
    assert "exit status 3" in text and "the fake compiler refuses" in text
    assert f"command: {fake} -std=c++17 -shared -fPIC -O2" in text and "neuron_op.cc" in text
    assert [p.suffix for p in (tmp_path / "cache").iterdir()] == [".lock"]  # no temp file
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(op_library.OpLibraryError, match="cannot run the C.. compiler"):
        op_library.build()


# -- measured, not asserted --------------------------------------------------------------------

def test_measure_kernel_overhead(record_property: Callable) -> None:
    """Per-call cost of a NeuronOp in a graph minus a direct `run_list` call, from a chain of
    N NeuronOps (so tf.function's own dispatch is paid once). Printed with `pytest -s`."""
    n = 30
    g = trace(lambda x: tf.nn.relu(x * 0.5 + 0.1), tf.TensorSpec([None, 16], tf.float32,
                                                                 name="x"), batch=4)
    exe = compile_graph(g.graph_def, g.io_config)
    gd = wrapper_graph(g, neuron_op_node_def("n0", ["x"], exe, g.graph_def))
    for i in range(1, n):
        gd.node.append(neuron_op_node_def(f"n{i}", [f"n{i - 1}"], exe, g.graph_def,
                                          model_config=[-1, -1, 1]))

    def chain(last: str) -> Callable:
        return tf.function(lambda x: tf.graph_util.import_graph_def(
            gd, input_map={"x:0": x}, return_elements=[last], name="")[0],
            input_signature=[tf.TensorSpec([4, 16], tf.float32)])

    long, short = chain(f"n{n - 1}:0"), chain("n0:0")
    x = rows(4)
    model = load(exe)

    def direct() -> np.ndarray:
        y = x
        for _ in range(n):
            y = model.run_list([y])[0]
        return y

    np.testing.assert_allclose(long(tf.constant(x)).numpy(), direct(), rtol=1e-6)

    def median_seconds(fn: Callable, reps: int = 25) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    xt = tf.constant(x)
    per_op = (median_seconds(lambda: long(xt)) - median_seconds(lambda: short(xt))) / (n - 1)
    per_direct = median_seconds(direct) / n
    model.unload()
    record_property("neuron_op_us_per_call", round(per_op * 1e6, 1))
    record_property("runtime_us_per_call", round(per_direct * 1e6, 1))
    print(f"\nNeuronOp in a graph: {per_op * 1e6:.1f} us/call; neuronish.runtime run_list: "
          f"{per_direct * 1e6:.1f} us/call; kernel overhead {(per_op - per_direct) * 1e6:.1f} us")


def test_model_config_timeout_is_each_calls_deadline(dense, monkeypatch) -> None:
    """timeout_s in model_config bounds a call on the device: past it, the call ends with
    TensorFlow's DEADLINE_EXCEEDED (never a fallback to TensorFlow), and the op keeps
    working for calls that fit."""
    # (the Python runtime's path, whose internals this watches; the C runtime's: see
    # test_neuron_op_c_runtime.py)
    monkeypatch.setenv("NEURONISH_KERNEL", "python")
    from neuronish.runtime.program import LoadedProgram

    g, exe, *_ = dense
    node = neuron_op_node_def("timed_op", ["x:0"], exe, g.graph_def,
                              model_config=[-1, -1, 1, 1, -1])  # one copy, 1 s per call
    f = neuron_function(g, node, [tf.TensorSpec(None, tf.float32)])
    real = LoadedProgram._run_stage

    def slow(self: LoadedProgram, *args: object) -> None:
        time.sleep(0.4)
        real(self, *args)

    monkeypatch.setattr(LoadedProgram, "_run_stage", slow)
    with pytest.raises(tf.errors.DeadlineExceededError, match="deadline"):
        f(rows(4 * 6))  # six chunks of 0.4 s on one copy
    monkeypatch.setattr(LoadedProgram, "_run_stage", real)
    np.testing.assert_allclose(f(rows(4))[0].numpy(), g.reference({"x:0": rows(4)})["Identity:0"],
                               rtol=1e-5, atol=1e-6)
