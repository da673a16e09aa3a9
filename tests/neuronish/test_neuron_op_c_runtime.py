"""The Python host's NeuronOp on the C runtime: a model the C runtime loads is run by the
kernel itself (nr_execute_with, without the GIL and without kernel_bridge.run), with the
same results as the Python runtime and TensorFlow; NEURONISH_KERNEL=python keeps the
Python runtime. Real TensorFlow, compiler, op library and C runtime.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tensorflow as tf

from neuronish import kernel_bridge
from neuronish.cc.compiler import compile_graph
from neuronish.neuron_op import neuron_op_node_def
from neuronish.runtime.capi import native_model
from tests.graphs import dense_relu
from tests.neuronish.test_neuron_op import neuron_function, rows


@pytest.fixture(scope="module")
def dense():
    g = dense_relu(batch=4)
    exe = compile_graph(g.graph_def, g.io_config)
    return g, exe


def _handles(node_name: str) -> list[kernel_bridge.Handle]:
    return [h for h in gc.get_objects()
            if isinstance(h, kernel_bridge.Handle) and h.node_name == node_name]


def _c_device_used() -> int:
    device = native_model.shared_device()
    assert device is not None, "the C runtime must build and open here"
    return sum(used for used, _ in device.memory().values())


def test_calls_run_on_the_c_runtime_without_the_bridge(dense, monkeypatch) -> None:
    g, exe = dense
    monkeypatch.delenv("NEURONISH_KERNEL", raising=False)
    node = neuron_op_node_def("c_op", ["x:0"], exe, g.graph_def)
    f = neuron_function(g, node, [tf.TensorSpec(None, tf.float32)])
    f(tf.constant(rows(4)))  # loads
    [handle] = _handles("c_op")
    assert handle.native_entry is not None, handle

    def refuse(*args: object) -> None:
        raise AssertionError("a call on the C runtime went through kernel_bridge.run")

    monkeypatch.setattr(kernel_bridge, "run", refuse)
    for batch in (4, 1, 4 * 2 + 3):  # compiled, padded, split with a padded last chunk
        x = rows(batch)
        np.testing.assert_allclose(f(tf.constant(x))[0].numpy(),
                                   g.reference({"x:0": x})["Identity:0"],
                                   rtol=1e-5, atol=1e-6)


def test_the_python_runtime_gives_the_same_outputs(dense, monkeypatch) -> None:
    """The same op loaded with NEURONISH_KERNEL=python: every call through the bridge,
    equal to the C runtime's to the last bit (one engine under both)."""
    g, exe = dense
    x = tf.constant(rows(4 * 3 + 1))
    got = {}
    calls = []
    run = kernel_bridge.run

    def spy(*args: object) -> None:
        calls.append(1)
        run(*args)

    monkeypatch.setattr(kernel_bridge, "run", spy)
    for kernel in ("native", "python"):
        monkeypatch.setenv("NEURONISH_KERNEL", kernel)
        node = neuron_op_node_def(f"op_{kernel}", ["x:0"], exe, g.graph_def)
        f = neuron_function(g, node, [tf.TensorSpec(None, tf.float32)])
        got[kernel] = f(x)[0].numpy()
        [handle] = _handles(f"op_{kernel}")
        assert (handle.native_entry is not None) == (kernel == "native")
    assert len(calls) == 1  # the Python runtime's call only
    np.testing.assert_allclose(got["native"], got["python"], rtol=1e-6, atol=1e-7)


def test_its_model_is_on_the_c_device_until_the_kernel_goes(dense, monkeypatch) -> None:
    g, exe = dense
    monkeypatch.delenv("NEURONISH_KERNEL", raising=False)
    gc.collect()
    assert kernel_bridge.wait_for_unloads(timeout=30)
    before = _c_device_used()
    node = neuron_op_node_def("held_op", ["x:0"], exe, g.graph_def,
                              model_config=[-1, -1, 2, -1, -1])  # two copies
    f = neuron_function(g, node, [tf.TensorSpec(None, tf.float32)])
    f(tf.constant(rows(4)))
    [handle] = _handles("held_op")
    assert handle.model.duplicates == 2
    held = _c_device_used() - before
    assert held > 0
    # The process's device reports it: one memory report for both runtimes.
    from neuronish.runtime import get_device

    assert sum(c["used"] for c in get_device().memory_report().values()) >= held
    handle = f = None
    gc.collect()
    assert kernel_bridge.wait_for_unloads(timeout=30)
    assert _c_device_used() == before  # the kernel's destructor unloaded it


def test_settings_only_the_python_runtime_has_keep_it(dense, monkeypatch) -> None:
    """NEURONISH_ENGINE=numpy (the reference engine) is the Python runtime's: the op
    loads there, and still matches."""
    g, exe = dense
    monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
    monkeypatch.delenv("NEURONISH_KERNEL", raising=False)
    assert "NEURONISH_ENGINE=numpy" in native_model.why_not()
    node = neuron_op_node_def("numpy_op", ["x:0"], exe, g.graph_def)
    x = rows(4)
    f = neuron_function(g, node, [tf.TensorSpec(None, tf.float32)])
    out = f(tf.constant(x))
    [handle] = _handles("numpy_op")
    assert handle.native_entry is None
    np.testing.assert_allclose(out[0].numpy(), g.reference({"x:0": x})["Identity:0"],
                               rtol=1e-5, atol=1e-6)


def test_neuronish_ls_and_top_see_it_with_the_c_runtimes_counters(dense, monkeypatch) -> None:
    """Device telemetry (what `neuronish ls/top` read): the op's model on the C runtime,
    named by its node, with its runs, busy time and memory from nr_model_copy."""
    from neuronish.runtime import telemetry

    g, exe = dense
    monkeypatch.delenv("NEURONISH_KERNEL", raising=False)
    publisher = telemetry.get_telemetry()
    assert publisher is not None, "telemetry is on by default; this test needs it"
    node = neuron_op_node_def("seen_op", ["x:0"], exe, g.graph_def,
                              model_config=[-1, -1, 1, -1, -1])
    f = neuron_function(g, node, [tf.TensorSpec(None, tf.float32)])
    f(tf.constant(rows(4)))
    f(tf.constant(rows(4 * 2 + 1)))  # three runs of the compiled batch
    snapshot = publisher.snapshot()
    [record] = [m for m in snapshot["models"] if m["name"] == "seen_op"]
    assert record["engine"] == "native (C runtime)"
    assert record["calls"] == 4 and record["inferences"] == 16 and record["batch"] == 4
    assert record["busy_seconds"] > 0
    [group] = record["core_groups"]
    assert all(snapshot["cores"][str(c)]["used_bytes"] >= b
               for c, b in zip(group, record["bytes_per_core"]))
    assert sum(record["bytes_per_core"]) > 0
    assert all(snapshot["cores"][str(c)]["busy_seconds"] >= record["busy_seconds"] * 0.999
               for c in group)
    f = None
    gc.collect()
    assert kernel_bridge.wait_for_unloads(timeout=30)
    assert not [m for m in publisher.snapshot()["models"] if m["name"] == "seen_op"]


# Features of the long model: each [4, 96] @ [96, 96] product is past the engine's
# small-matmul bound, so it stays a oneDNN primitive of ~2 us (with 16 features the
# engine's own loop made the whole call of 50,000 chunks shorter than the test's timeout).
DEEP_FEATURES = 96


@pytest.fixture(scope="module")
def deep():
    """40 x (96x96 MatMul + Relu) compiled at batch 4: a call of many rows is thousands of
    chunks, each dozens of instructions, on the C runtime: long enough to give up on."""
    from tests.graphs import trace

    rng = np.random.default_rng(1)
    ws = [tf.constant((rng.standard_normal((DEEP_FEATURES, DEEP_FEATURES)) / 10)
                      .astype(np.float32)) for _ in range(40)]

    def fn(x: tf.Tensor) -> tf.Tensor:
        for w in ws:
            x = tf.nn.relu(tf.matmul(x, w))
        return x

    g = trace(fn, tf.TensorSpec([None, DEEP_FEATURES], tf.float32, name="x"), batch=4)
    return g, compile_graph(g.graph_def, g.io_config)


class _Counters:
    """Compiled-batch chunks each C-runtime model of an op ran (an eager and a session
    kernel each load one), read from the C runtime's own counters (nr_model_copy). The
    models stay loaded until `release`: TensorFlow may drop a session's kernel as soon as
    its run fails, and an unloaded model has no counters left to read."""

    def __init__(self, node_name: str, monkeypatch: pytest.MonkeyPatch):
        self.node_name, self.models, self.deferred = node_name, {}, []
        self.real_unload = native_model.NativeModel.unload
        monkeypatch.setattr(native_model.NativeModel, "unload",
                            lambda m: self.deferred.append(m))

    def runs(self) -> dict[int, int]:
        for h in _handles(self.node_name):
            if isinstance(h.model, native_model.NativeModel):
                self.models.setdefault(id(h.model), h.model)
        return {k: sum(c[2] for c in m.copies()) for k, m in self.models.items()}

    def ran_since(self, before: dict[int, int]) -> int:
        return max([n - before.get(k, 0) for k, n in self.runs().items()] or [0])

    def release(self) -> None:
        for m in self.deferred:
            self.real_unload(m)


CHUNKS = 20_000  # of the compiled batch 4, in the long call (~1.6 s)


@pytest.mark.parametrize("how", ["cancelled", "session timeout"])
def test_tensorflow_giving_up_stops_a_call_on_the_c_runtime(deep, monkeypatch, how) -> None:
    """TensorFlow's cancellation reaches a call the kernel runs on the C runtime itself
    (CancelGuard sets the byte nr_execute_with reads before every chunk and instruction):
    a cancelled call (the server's Cancellation) fails CANCELLED, a session run past its
    RunOptions timeout DEADLINE_EXCEEDED; either stops with most of its chunks never run
    (the C runtime's own run counters), and the op works afterwards."""
    import threading

    from neuronish.serving.cancellation import Cancellation

    g, exe = deep
    monkeypatch.delenv("NEURONISH_KERNEL", raising=False)
    node_name = "long_" + how.replace(" ", "_")
    node = neuron_op_node_def(node_name, ["x:0"], exe, g.graph_def,
                              model_config=[-1, -1, 1, -1, -1])  # one copy: chunks in turn
    f = neuron_function(g, node, [tf.TensorSpec([None, DEEP_FEATURES], tf.float32)])
    f(tf.constant(rows(4, DEEP_FEATURES)))  # loads it, on the C runtime
    [handle] = _handles(node_name)
    assert handle.native_entry is not None, handle

    def refuse(*args: object) -> None:
        raise AssertionError("the call went through kernel_bridge.run")

    monkeypatch.setattr(kernel_bridge, "run", refuse)
    counters = _Counters(node_name, monkeypatch)
    x = rows(4 * CHUNKS, DEEP_FEATURES)
    started = threading.Event()

    def watch(before: dict[int, int], give_up) -> None:  # noqa: ANN001 - once it computes
        while counters.ran_since(before) == 0:
            started.wait(0.002)
        started.set()
        give_up()

    try:
        if how == "cancelled":
            before = counters.runs()
            cancellation = Cancellation()
            threading.Thread(target=watch, args=(before, cancellation.cancel),
                             daemon=True).start()
            with pytest.raises(tf.errors.CancelledError, match=f"NeuronOp '{node_name}'"):
                cancellation.run(lambda: f(tf.constant(x)))
        else:
            graph = tf.Graph()
            with graph.as_default():
                feed = tf.compat.v1.placeholder(tf.float32, [None, DEEP_FEATURES])
                [out] = f(feed)
            with tf.compat.v1.Session(graph=graph) as session:
                session.run(out, {feed: rows(4, DEEP_FEATURES)})  # (its own kernel instance: loads)
                before = counters.runs()
                threading.Thread(target=watch, args=(before, lambda: None),
                                 daemon=True).start()
                with pytest.raises(tf.errors.DeadlineExceededError):
                    session.run(out, {feed: x},
                                options=tf.compat.v1.RunOptions(timeout_in_ms=300))
        ran = counters.ran_since(before)
        assert started.is_set() and 0 < ran < CHUNKS // 2, (ran, CHUNKS)
    finally:
        monkeypatch.undo()
        counters.release()
    got = f(tf.constant(rows(5, DEEP_FEATURES)))[0].numpy()  # the op still works afterwards
    np.testing.assert_allclose(got, g.reference({"x:0": rows(5, DEEP_FEATURES)})["Identity:0"],
                               rtol=1e-4, atol=1e-5)


def _bridge_columns(exe: bytes, **changed: list) -> dict[str, list]:
    """The attributes neuron_op_node_def writes for `exe`, as the kernel hands them to
    kernel_bridge.load (column by column), any of them replaced by `changed`."""
    from neuronish.runtime.executable import from_bytes

    parsed = from_bytes(exe)
    columns = {}
    for kind, sigs in (("input", parsed.inputs), ("output", parsed.outputs)):
        columns[f"{kind}_names"] = [s.name for s in sigs]
        columns[f"{kind}_dtypes"] = [s.dtype for s in sigs]
        columns[f"{kind}_shapes"] = [list(s.shape) for s in sigs]
        columns[f"{kind}_batch_axis"] = [s.batch_axis for s in sigs]
    columns.update(changed)
    return columns


def _load_through_the_bridge(node_name: str, exe: bytes, columns: dict[str, list]
                             ) -> kernel_bridge.Handle:
    # (no graph_def: a refusal raises instead of falling back to TensorFlow)
    return kernel_bridge.load(node_name, exe, model_config=[-1, -1, 1, -1, -1], **columns)


def test_the_c_runtime_alone_reads_and_hashes_the_executable(dense, monkeypatch) -> None:
    """The NeuronOp's executable attr (bytes) goes to the C runtime as is: Python neither
    hashes nor parses it when the C runtime takes it (both did, then C again); on the
    Python runtime (NEURONISH_KERNEL=python) Python parses it, once."""
    import types

    from neuronish.runtime import executable as executable_module
    from tests.runtime.test_capi_load_file import _CountingSha256

    g, exe = dense
    monkeypatch.delenv("NEURONISH_KERNEL", raising=False)
    monkeypatch.setattr(executable_module, "hashlib",
                        types.SimpleNamespace(sha256=_CountingSha256))
    parsed = []
    real_from_bytes = kernel_bridge.from_bytes
    monkeypatch.setattr(kernel_bridge, "from_bytes",
                        lambda data: parsed.append(1) or real_from_bytes(data))
    body = len(exe) - executable_module.HEADER_SIZE
    columns = _bridge_columns(exe)
    x = rows(4)
    for kernel, hashed in (("native", 0), ("python", body)):
        monkeypatch.setenv("NEURONISH_KERNEL", kernel)
        _CountingSha256.hashed.clear()
        parsed.clear()
        handle = _load_through_the_bridge(f"hash_{kernel}", exe, columns)
        try:
            assert (handle.native_entry is not None) == (kernel == "native")
            assert sum(_CountingSha256.hashed) == hashed, (kernel, _CountingSha256.hashed)
            assert len(parsed) == (kernel == "python")
            out = handle.model.run({"x:0": x})["Identity:0"]
            np.testing.assert_allclose(out, g.reference({"x:0": x})["Identity:0"],
                                       rtol=1e-5, atol=1e-6)
        finally:
            kernel_bridge.unload(handle)
    assert kernel_bridge.wait_for_unloads(timeout=30)


@pytest.mark.parametrize("kernel", ["native", "python"])
def test_attributes_at_odds_with_the_executable_are_refused_alike(dense, monkeypatch,
                                                                  kernel: str) -> None:
    """Checked against the model the C runtime loaded (or the parsed executable): the
    same words on both runtimes, and a refused model leaves nothing on the device."""
    from neuronish.runtime.errors import InvalidInput

    _, exe = dense
    monkeypatch.setenv("NEURONISH_KERNEL", kernel)
    gc.collect()
    assert kernel_bridge.wait_for_unloads(timeout=30)
    before = _c_device_used()
    with pytest.raises(kernel_bridge.AttrMismatch,
                       match=r"output 0 is 'Identity:0' float32\[4,9\] batch axis 0 in the op's "
                             r"attributes but 'Identity:0' float32\[4,8\] batch axis 0 in its "
                             r"executable; rebuild the node"):
        _load_through_the_bridge("odd_shape", exe, _bridge_columns(exe, output_shapes=[[4, 9]]))
    with pytest.raises(kernel_bridge.AttrMismatch, match=r"the op has 2 inputs \['x:0', 'y:0'\] "
                       r"but the executable has 1: \['x:0'\]"):
        _load_through_the_bridge("odd_count", exe, _bridge_columns(
            exe, input_names=["x:0", "y:0"], input_dtypes=["float32"] * 2,
            input_shapes=[[4, 16]] * 2, input_batch_axis=[0, 0]))
    with pytest.raises(InvalidInput, match="input 'x:0' has dtype float64; the model was "
                       "compiled for float32. Cast it to float32 before the NeuronOp"):
        _load_through_the_bridge("odd_dtype", exe, _bridge_columns(exe, input_dtypes=["float64"]))
    assert _c_device_used() == before
