"""The host's CPUs shared by running programs (runtime/host.py), and the width each
loaded program takes."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime.config import DeviceConfig
from neuronish.runtime.device import Device
from neuronish.runtime.executable import from_bytes
from neuronish.runtime.host import HostCPUs
from neuronish.runtime.model import Model
from neuronish.runtime.native import native_library
from tests.graphs import dense_relu, trace


def _in_thread(fn) -> threading.Thread:  # noqa: ANN001
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_narrow_programs_share_the_host_and_a_wide_one_waits_for_all_of_it() -> None:
    host = HostCPUs(2)
    a, b, wide = host.take(1), host.take(1), host.take(2)
    assert a.acquire() and b.acquire()  # two one-thread programs at once
    assert not wide.acquire(timeout=0.05)  # no room for a two-thread team
    a.release()
    assert not wide.acquire(timeout=0.05)  # still one CPU short
    b.release()
    assert wide.acquire(timeout=1)
    assert not host.take(1).acquire(blocking=False)
    wide.release()
    assert host.free == 2


def test_waiters_are_served_in_arrival_order() -> None:
    """A wide program waiting is not overtaken by narrow ones arriving after it."""
    host = HostCPUs(2)
    first = host.take(1)
    first.acquire()
    order: list[str] = []
    wide_waiting = threading.Event()

    def wide() -> None:
        wide_waiting.set()
        with host.take(2):
            order.append("wide")

    def narrow() -> None:
        with host.take(1):
            order.append("narrow")

    t_wide = _in_thread(wide)
    assert wide_waiting.wait(5)
    while not host._waiting:  # (wait until it queued)
        pass
    t_narrow = _in_thread(narrow)  # one CPU is free, but the wide one came first
    t_narrow.join(0.2)
    assert order == [] and t_narrow.is_alive()
    first.release()
    t_wide.join(5)
    t_narrow.join(5)
    assert order == ["wide", "narrow"]


def test_a_waiter_that_may_give_up_keeps_its_place_in_line() -> None:
    """A call with a cancel flag asks give_up() while it waits; it must not lose its
    turn by doing so, and it leaves the line as soon as give_up() says so."""
    import time

    host = HostCPUs(1)
    assert host.acquire(1)
    order: list[str] = []
    first_in_line = threading.Event()
    cancelled = threading.Event()

    def patient_polling() -> None:
        first_in_line.set()
        if host.acquire(1, give_up=lambda: False):  # polls every GIVE_UP_POLL seconds
            order.append("polling")
            host.release(1)

    a = _in_thread(patient_polling)
    first_in_line.wait(5)
    time.sleep(0.1)  # several polls: the waiter is first in line all along
    b = _in_thread(lambda: host.acquire(1) and (order.append("plain"), host.release(1)))
    time.sleep(0.1)
    host.release(1)
    a.join(5)
    b.join(5)
    assert order == ["polling", "plain"]
    assert host.acquire(1)
    result: list[bool] = []
    c = _in_thread(lambda: result.append(host.acquire(1, give_up=cancelled.is_set)))
    time.sleep(0.05)
    cancelled.set()
    c.join(5)
    assert result == [False] and host.free == 0
    host.release(1)
    assert host.free == 1


def test_a_width_above_the_host_is_clamped() -> None:
    host = HostCPUs(2)
    with host.take(8) as slot:
        assert slot.width == 2 and host.free == 0
    assert host.free == 2


@pytest.mark.skipif(native_library() is None, reason="the native engine is not available")
def test_a_program_of_small_instructions_takes_one_cpu_and_a_large_one_all(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """(numpy steps count as one thread, unless they spread over threads themselves.)"""
    monkeypatch.setenv("NEURONISH_NATIVE_EXCLUDE", "cumulative")  # the numpy step below
    config = DeviceConfig(num_cores=2, core_memory=1 << 30, visible_cores=(0, 1),
                          core_groups=((0,), (1,)), host_parallelism=1, kernel_threads=2,
                          core_threads=2)
    device = Device(config)
    small = dense_relu(batch=2)  # every instruction far below the one-thread threshold
    w = tf.constant(np.random.default_rng(0).standard_normal((3, 3, 64, 64), np.float32))
    large = trace(lambda x: tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME")),  # 0.3 GFLOP
                  tf.TensorSpec([4, 32, 32, 64], tf.float32, name="x"))
    # A cumsum left to numpy (every kind has a native kernel now; the variable above
    # excludes this one) runs inside the program, on the calling thread.
    with_numpy_step = trace(lambda x: tf.cast(tf.math.cumsum(tf.cast(x, tf.float16), axis=1),
                                              tf.float32) * 2.0,
                            tf.TensorSpec([2, 16], tf.float32, name="x"))
    for graph, width in ((small, 1), (large, 2), (with_numpy_step, 1)):
        exe = from_bytes(compile_graph(graph.graph_def, graph.io_config))
        model = Model(exe, device)
        program = model._idle.get()
        model._idle.put(program)
        assert [stage.host.width for stage in program.stages] == [width]
        if graph is with_numpy_step:
            assert program.stages[0].native.rejected  # (it really has a numpy step)
        feeds = {s.name: np.ones(s.shape, s.dtype) for s in exe.inputs}
        want = {n: v for n, v in graph.reference(feeds).items()}
        got = model.run(feeds)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-4)
        model.unload()


def test_an_explicit_host_parallelism_fixes_the_number_of_programs() -> None:
    assert DeviceConfig.from_env({}).share_by_width
    config = DeviceConfig.from_env({"NEURONISH_HOST_PARALLELISM": "1"})
    assert not config.share_by_width
    host = Device(config).host_cpus
    narrow = host.take(1)
    assert narrow.width == config.core_threads  # counted at full width: one at a time
    with narrow:
        assert not host.take(1).acquire(blocking=False)


@pytest.mark.skipif(native_library() is None, reason="the native engine is not available")
def test_a_wide_programs_small_instructions_use_its_team_too() -> None:
    """A program that holds every CPU for one large instruction runs its instructions down
    to TINY_WORK on the whole team (spec.team_size); alone, the same small instruction
    runs on one thread and the program takes one CPU."""
    from neuronish.runtime.native.spec import SMALL_WORK, TINY_WORK

    config = DeviceConfig(num_cores=1, core_memory=1 << 30, visible_cores=(0,),
                          core_groups=((0,),), host_parallelism=1, kernel_threads=2,
                          core_threads=2)
    w = tf.constant(np.random.default_rng(0).standard_normal((3, 3, 64, 64), np.float32))
    pool = lambda x: tf.nn.avg_pool2d(x, 3, 1, "SAME")  # noqa: E731 - 2.4 MFLOP
    spec = tf.TensorSpec([4, 32, 32, 64], tf.float32, name="x")
    wide = trace(lambda x: pool(tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME"))), spec)  # 0.3 GFLOP
    narrow = trace(pool, spec)
    for graph, teams in ((wide, [2, 2]), (narrow, [1])):
        exe = from_bytes(compile_graph(graph.graph_def, graph.io_config))
        assert [i.kind for i in exe.programs[0]] == ["conv2d", "pool"][-len(teams):]
        model = Model(exe, Device(config))
        program = model._idle.get()
        model._idle.put(program)
        native = program.stages[0].native
        assert [native.teams[i] for i in sorted(native.teams)] == teams
        assert program.stages[0].host.width == max(teams)
        feeds = {s.name: np.ones(s.shape, s.dtype) for s in exe.inputs}
        for name, value in graph.reference(feeds).items():
            np.testing.assert_allclose(model.run(feeds)[name], value, rtol=1e-5, atol=1e-5)
    assert TINY_WORK < 4 * 32 * 32 * 64 * 9 < SMALL_WORK
