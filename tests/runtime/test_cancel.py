"""A call nobody waits for stops computing: cancel flags and deadlines checked between
instructions on both engines, TensorFlow's cancellation reaching the device through the
NeuronOp kernel, and the server's per-thread cancellable calls."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from neuronish import kernel_bridge
from neuronish.cc.compiler import compile_graph
from neuronish.neuron_op import neuron_op_node_def
from neuronish.runtime import Cancelled, DeadlineExceeded, Device, Model
from neuronish.runtime.config import DeviceConfig
from neuronish.runtime.cutoff import Cutoff
from neuronish.runtime.executable import from_bytes
from neuronish.runtime.native import library
from neuronish.runtime.program import LoadedProgram
from neuronish.serving.cancellation import Cancellation
from tests.graphs import dense_relu, trace
from tests.neuronish.test_neuron_op import neuron_function

ENGINES = ["numpy", "native"]


def _model(graph, engine: str, monkeypatch: pytest.MonkeyPatch, **env: str) -> Model:  # noqa: ANN001
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    monkeypatch.setenv("NEURONISH_NATIVE_EXCLUDE", "cumulative")  # the numpy step
    if engine == "native":
        assert library.load() is not None, f"native engine unavailable: {library.why_not()}"
    exe = from_bytes(compile_graph(graph.graph_def, graph.io_config))
    return Model(exe, Device(DeviceConfig.from_env(env)))


@pytest.fixture(scope="module")
def sandwich():
    """matmul, a float16 cumsum (a numpy step on either engine: NEURONISH_NATIVE_EXCLUDE
    leaves cumulative sums to numpy), matmul: a call with a numpy step between native
    instructions."""
    rng = np.random.default_rng(0)
    w1 = tf.constant(rng.standard_normal((16, 16)).astype(np.float32))
    w2 = tf.constant(rng.standard_normal((16, 8)).astype(np.float32))

    def fn(x: tf.Tensor) -> tf.Tensor:
        step = tf.math.cumsum(tf.cast(tf.matmul(x, w1), tf.float16), axis=1)
        return tf.matmul(tf.cast(step, tf.float32), w2)

    return trace(fn, tf.TensorSpec([4, 16], tf.float32, name="x"))


def _only(outputs: dict) -> np.ndarray:
    (value,) = outputs.values()
    return value


def _x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_call_cancelled_before_it_starts_computes_nothing(sandwich, engine: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with _model(sandwich, engine, monkeypatch) as model:
        out = [np.full((4, 8), np.nan, np.float32)]
        with pytest.raises(Cancelled, match="cancelled by its caller before it started"):
            model.run_list([_x()], out=out, cancel=bytearray(b"\1"))
        assert np.isnan(out[0]).all()
        # The flag belongs to one call: the next one runs.
        got = model.run_list([_x()], cancel=bytearray(1))[0]
        np.testing.assert_allclose(got, _only(sandwich.reference({"x:0": _x()})),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_call_cancelled_mid_way_stops_at_the_next_instruction(
        sandwich, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flag is set while the numpy step computes; the instruction after it (a native
    one on the native engine: the engine itself looks) never runs."""
    flag = bytearray(1)
    ran = []
    real = LoadedProgram._run_numpy

    def numpy_step(step, slots, arena) -> None:  # noqa: ANN001
        ran.append(step.kind)
        real(step, slots, arena)
        flag[0] = 1  # the caller gives up now

    monkeypatch.setattr(LoadedProgram, "_run_numpy", staticmethod(numpy_step))
    with _model(sandwich, engine, monkeypatch) as model:
        out = [np.full((4, 8), np.nan, np.float32)]
        with pytest.raises(Cancelled, match="while its instructions ran"):
            model.run_list([_x()], out=out, cancel=flag)
        assert len(ran) == 1  # the first numpy step, and nothing after it
        assert np.isnan(out[0]).all()  # the last matmul never ran


@pytest.mark.parametrize("engine", ENGINES)
def test_a_deadline_passing_mid_way_stops_at_the_next_instruction(
        sandwich, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = LoadedProgram._run_numpy

    def slow_numpy_step(step, slots, arena) -> None:  # noqa: ANN001
        real(step, slots, arena)
        time.sleep(0.3)  # past the call's 0.1 s

    monkeypatch.setattr(LoadedProgram, "_run_numpy", staticmethod(slow_numpy_step))
    with _model(sandwich, engine, monkeypatch) as model:
        out = [np.full((4, 8), np.nan, np.float32)]
        with pytest.raises(DeadlineExceeded, match="while its instructions ran"):
            model.run_list([_x()], out=out, timeout=0.1)
        assert np.isnan(out[0]).all()


def test_the_native_engine_checks_before_every_instruction(monkeypatch) -> None:  # noqa: ANN001
    """Straight to the engine (the Python side checks first otherwise): a set flag or a
    passed deadline stops it before its first instruction, and its outputs stay unwritten."""
    g = dense_relu(batch=4)
    with _model(g, "native", monkeypatch) as model:
        program = model._idle.get()
        stage = program.stages[0]
        x, out = _x(), np.full((4, 8), np.nan, np.float32)
        arena = program._arenas.get()
        stage.native.set_call_buffers([arena.address, x.ctypes.data, out.ctypes.data])
        n = max(stage.native.engine_index.values()) + 1
        with pytest.raises(Cancelled):
            stage.native.run(0, n, program._first_call_slot, Cutoff(None, bytearray(b"\1")))
        with pytest.raises(DeadlineExceeded):
            stage.native.run(0, n, program._first_call_slot, Cutoff(time.monotonic() - 1))
        assert np.isnan(out).all()
        stage.native.run(0, n, program._first_call_slot, Cutoff(time.monotonic() + 60,
                                                                 bytearray(1)))
        np.testing.assert_allclose(out, _only(g.reference({"x:0": x})), rtol=1e-5,
                                   atol=1e-5)
        program._arenas.put(arena)
        model._idle.put(program)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_call_waiting_for_busy_cores_gives_up_when_cancelled(
        engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g = dense_relu(batch=4)
    with _model(g, engine, monkeypatch) as model:
        busy = model._idle.get()  # the only copy: every call now waits for it
        flag, raised = bytearray(1), []

        def call() -> None:
            try:
                model.run_list([_x()], cancel=flag)
            except Cancelled as e:
                raised.append(str(e))

        waiter = threading.Thread(target=call)
        waiter.start()
        time.sleep(0.1)
        flag[0] = 1
        waiter.join(10)
        assert not waiter.is_alive() and raised, "the cancelled call still waits"
        assert "while it waited for the model's cores" in raised[0]
        model._idle.put(busy)


def test_a_cancel_flag_must_be_a_writable_byte() -> None:
    with pytest.raises(TypeError, match="writable one-byte buffer"):
        Cutoff(None, b"\0")  # type: ignore[arg-type]


# -- through TensorFlow ---------------------------------------------------------------


def test_tensorflow_cancelling_a_call_reaches_the_device(monkeypatch) -> None:  # noqa: ANN001
    """The NeuronOp kernel registers with the call's CancellationManager: cancelling the
    TF call sets the flag the device reads, and the call fails CANCELLED. (On the Python
    runtime, whose kernel_bridge.run this holds; the C runtime's call reads the same flag.)"""
    monkeypatch.setenv("NEURONISH_KERNEL", "python")
    g = dense_relu(batch=4)
    exe = compile_graph(g.graph_def, g.io_config)
    f = neuron_function(g, neuron_op_node_def("neuron_op_0", ["x:0"], exe, g.graph_def),
                        [tf.TensorSpec([None, 16], tf.float32)])
    f(tf.constant(_x()))  # loads the executable
    entered, seen = threading.Event(), {}
    real = kernel_bridge.run

    def held_run(handle, inputs, outputs, cancel=None) -> None:  # noqa: ANN001
        seen["flag given"] = cancel is not None
        entered.set()
        for _ in range(1000):  # a long computation, until cancelled (10 s at most)
            if cancel is not None and cancel[0]:
                break
            time.sleep(0.01)
        seen["flag set"] = bool(cancel is not None and cancel[0])
        try:
            real(handle, inputs, outputs, cancel)
        except Exception as e:
            seen["device raised"] = type(e).__name__
            raise

    monkeypatch.setattr(kernel_bridge, "run", held_run)
    cancellation = Cancellation()
    threading.Thread(target=lambda: entered.wait(30) and cancellation.cancel()).start()
    with pytest.raises(tf.errors.CancelledError, match="cancelled by its caller"):
        cancellation.run(lambda: f(tf.constant(_x())))
    assert seen == {"flag given": True, "flag set": True, "device raised": "Cancelled"}
    monkeypatch.setattr(kernel_bridge, "run", real)
    got = f(tf.constant(_x()))[0].numpy()  # the op still works afterwards
    np.testing.assert_allclose(got, _only(g.reference({"x:0": _x()})), rtol=1e-5, atol=1e-5)


@tf.function(input_signature=[tf.TensorSpec([], tf.int64)])
def _count_to(n: tf.Tensor) -> tf.Tensor:
    _, count = tf.while_loop(lambda i, c: i < n, lambda i, c: (i + 1, c + 1),
                             [tf.constant(0, tf.int64), tf.constant(0, tf.int64)])
    return count


def test_cancellations_belong_to_their_own_threads() -> None:
    """TensorFlow keeps the active CancellationManager in a process global; two calls at
    once must each get their own, so cancelling one leaves the other be."""
    _count_to(tf.constant(1, tf.int64))
    doomed, kept = Cancellation(), Cancellation()
    results: dict[str, object] = {}
    started = threading.Barrier(3)

    def call(name: str, cancellation: Cancellation, n: int) -> None:
        started.wait()
        try:
            results[name] = int(cancellation.run(lambda: _count_to(tf.constant(n, tf.int64))))
        except tf.errors.CancelledError:
            results[name] = "cancelled"

    threads = [threading.Thread(target=call, args=("doomed", doomed, 10**12)),
               threading.Thread(target=call, args=("kept", kept, 200_000))]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.2)
    doomed.cancel()
    for t in threads:
        t.join(60)
    assert results == {"doomed": "cancelled", "kept": 200_000}
    assert doomed.cancelled and not kept.cancelled
