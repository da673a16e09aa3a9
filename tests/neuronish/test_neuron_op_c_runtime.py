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
    assert not native_model.wanted()
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
