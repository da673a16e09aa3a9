"""The simulated device: memory, duplicates, batch splitting, concurrency, input checks."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import (
    DeadlineExceeded,
    Device,
    DeviceError,
    ExecutionError,
    InvalidInput,
    OutOfDeviceMemory,
    OutputBufferError,
    load,
)
from neuronish.runtime.config import ConfigError, DeviceConfig, default_host_parallelism
from neuronish.runtime.program import LoadedProgram
from tests.graphs import conv_bn_relu, dense_relu, trace


def _device(**env: str) -> Device:
    return Device(DeviceConfig.from_env(env))


@pytest.fixture(scope="module")
def dense():
    g = dense_relu(batch=4)
    return g, compile_graph(g.graph_def, g.io_config)


def test_runs_and_matches_tensorflow(dense) -> None:
    g, exe = dense
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    with load(exe, device=_device()) as model:
        got = model.run({"x:0": x})
    want = g.reference({"x:0": x})
    np.testing.assert_allclose(got["Identity:0"], want["Identity:0"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch", [1, 3, 4, 5, 9, 13])
def test_other_batch_sizes_are_split_and_padded(dense, batch: int) -> None:
    g, exe = dense
    x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
    with load(exe, duplicates=2, device=_device()) as model:
        got = model.run({"x:0": x})["Identity:0"]
    assert got.shape == (batch, 8)
    np.testing.assert_allclose(got, g.reference({"x:0": x})["Identity:0"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch", [4, 6])
def test_results_go_into_the_arrays_given(dense, batch: int) -> None:
    g, exe = dense
    x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
    out = [np.full((batch, 8), np.nan, np.float32)]
    with load(exe, device=_device()) as model:
        got = model.run_list([x], out=out)
        assert got is out
        np.testing.assert_allclose(out[0], g.reference({"x:0": x})["Identity:0"], rtol=1e-5,
                                   atol=1e-6)
        for bad, needle in [([np.empty((batch, 8), np.float64)], r"is float64\[\d+, 8\]"),
                            ([np.empty((batch + 1, 8), np.float32)], r"float32\[\d+, 8\]"),
                            ([np.empty((8, batch), np.float32).T], "C-contiguous"),
                            ([], "out has 0 arrays")]:
            with pytest.raises(OutputBufferError, match=needle):
                model.run_list([x], out=bad)


def test_empty_batch(dense) -> None:
    _, exe = dense
    with load(exe, device=_device()) as model:
        got = model.run({"x:0": np.zeros((0, 16), np.float32)})["Identity:0"]
    assert got.shape == (0, 8)


def test_out_of_memory_names_need_and_free(dense) -> None:
    _, exe = dense
    device = _device(NEURONISH_CORE_MEMORY="100", NEURONISH_NUM_CORES="2")
    with pytest.raises(OutOfDeviceMemory, match=r"needs .* MiB .* free of"):
        load(exe, device=device)
    assert all(m["used"] == 0 for m in device.memory_report().values())  # nothing leaked


def test_memory_is_charged_and_freed(dense) -> None:
    _, exe = dense
    device = _device(NEURONISH_NUM_CORES="2")
    model = load(exe, duplicates=2, device=device)
    used = [m["used"] for m in device.memory_report().values()]
    assert all(u > 0 for u in used) and used[0] == used[1]
    model.unload()
    assert all(m["used"] == 0 for m in device.memory_report().values())
    with pytest.raises(DeviceError, match="unloaded"):
        model.run({"x:0": np.zeros((4, 16), np.float32)})


def test_fills_device_then_refuses(dense) -> None:
    _, exe = dense
    device = _device(NEURONISH_NUM_CORES="2")
    per_core = None
    m1 = load(exe, device=device)
    per_core = max(m["used"] for m in device.memory_report().values())
    m1.unload()
    tight = _device(NEURONISH_NUM_CORES="2", NEURONISH_CORE_MEMORY=str(per_core))
    a, b = load(exe, device=tight), load(exe, device=tight)
    assert {a.core_groups[0], b.core_groups[0]} == {(0,), (1,)}  # spread over cores
    with pytest.raises(OutOfDeviceMemory):
        load(exe, device=tight)
    a.unload()
    load(exe, device=tight).unload()  # room again after an unload
    b.unload()


def test_a_failed_core_retires_one_duplicate_and_the_model_runs_on(dense) -> None:
    """Two copies on cores 0 and 1: core 1 failing takes its copy out (memory freed,
    no call starts there again); calls, split ones too, run on core 0 alone. When
    core 0 fails as well, nothing is left and calls fail naming the core."""
    g, exe = dense
    device = _device(NEURONISH_NUM_CORES="2")
    x = np.random.default_rng(2).standard_normal((9, 16)).astype(np.float32)
    want = g.reference({"x:0": x})["Identity:0"]
    with load(exe, duplicates=2, device=device) as model:
        assert sorted(model.core_groups) == [(0,), (1,)]
        device.fail_core(1, "test")
        assert model.core_groups == [(0,)] and model.duplicates == 1
        assert device.memory_report()[1]["used"] == 0
        ran_on = []
        real = LoadedProgram.execute

        def spy(program: LoadedProgram, *args: object) -> None:
            ran_on.append(program)
            real(program, *args)

        LoadedProgram.execute = spy  # type: ignore[method-assign]
        try:
            for _ in range(3):  # more calls than copies: the retired one never comes back
                got = model.run({"x:0": x})["Identity:0"]
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        finally:
            LoadedProgram.execute = real  # type: ignore[method-assign]
        assert len(set(ran_on)) == 1 and len(ran_on) == 9  # 3 calls x 3 chunks, one copy
        device.fail_core(0, "test again")
        with pytest.raises(DeviceError, match=r"core 0 failed \(test again\)"):
            model.run({"x:0": x})


def test_a_failed_core_fails_the_models_on_it_and_loads_avoid_it(dense) -> None:
    g, exe = dense
    device = _device(NEURONISH_NUM_CORES="2")
    a, b = load(exe, device=device), load(exe, device=device)
    assert {a.core_groups[0], b.core_groups[0]} == {(0,), (1,)}
    hit, spared = (a, b) if a.core_groups[0] == (1,) else (b, a)
    x = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    device.fail_core(1, "test")
    with pytest.raises(DeviceError, match=r"core 1 failed \(test\)"):
        hit.run({"x:0": x})
    np.testing.assert_allclose(spared.run({"x:0": x})["Identity:0"],  # core 0 still works
                               g.reference({"x:0": x})["Identity:0"], rtol=1e-5, atol=1e-6)
    assert device.memory_report()[1]["used"] == 0  # the failed model was released
    with load(exe, device=device) as again:  # a new load goes to the working core
        assert again.core_groups == [(0,)]
    with pytest.raises(DeviceError, match=r"failed: core 1 failed \(test\)"):
        load(exe, duplicates=2, device=device)
    with pytest.raises(DeviceError, match="not one of the visible cores"):
        device.fail_core(7)
    spared.unload()


def test_duplicates_need_core_groups(dense) -> None:
    _, exe = dense
    device = _device(NEURONISH_NUM_CORES="4", NEURONISH_CORE_GROUP_SIZES="2,2")
    with load(exe, duplicates=2, device=device) as model:
        assert model.core_groups == [(0,), (2,)] or sorted(model.core_groups) == [(0,), (2,)]
    with pytest.raises(DeviceError, match="core group"):
        load(exe, duplicates=3, device=device)


def test_eight_threads_match_serial(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 threads × 5 calls on 4 duplicates with room for 4 programs at once on the host:
    every call's result equals the serial one. The first 4 programs to start wait for
    each other, so the calls provably overlap (a device that ran one program at a time
    would never fill the barrier)."""
    g = conv_bn_relu(batch=2)
    exe = compile_graph(g.graph_def, g.io_config)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((b, 8, 8, 3)).astype(np.float32) for b in (2, 1, 5, 2, 3, 2, 7, 2)]
    device = _device(NEURONISH_HOST_PARALLELISM="4")
    with load(exe, duplicates=4, device=device) as model:
        serial = [model.run({"x:0": x})["Identity:0"] for x in xs]
        together = threading.Barrier(4, timeout=30)
        started, lock = 0, threading.Lock()
        real_execute = LoadedProgram.execute

        def execute(self: LoadedProgram, inputs: list, outputs: list,
                    deadline: float | None = None) -> None:
            nonlocal started
            with lock:
                started += 1
                first = started <= 4
            if first:
                together.wait()  # BrokenBarrierError if 4 programs never run at once
            real_execute(self, inputs, outputs, deadline)

        monkeypatch.setattr(LoadedProgram, "execute", execute)
        results: list[list[np.ndarray]] = [[] for _ in xs]
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                for _ in range(5):
                    results[i].append(model.run({"x:0": xs[i]})["Identity:0"])
            except BaseException as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert started >= 8 * 5
    for i, (s, rs) in enumerate(zip(serial, results)):
        assert len(rs) == 5
        for k, r in enumerate(rs):
            np.testing.assert_array_equal(s, r, err_msg=f"thread {i}, call {k}")


@pytest.mark.parametrize("feeds, message", [
    ({}, r"missing input\(s\) 'x:0' \(float32\[\*,16\]\)"),
    ({"x:0": np.zeros((4, 16), np.float32), "y:0": 1}, r"unknown input\(s\) 'y:0'"),
    ({"x:0": np.zeros((4, 16), np.float64)}, r"'x:0' has dtype float64; .* float32"),
    ({"x:0": np.zeros((4, 15), np.float32)},
     r"'x:0' has shape \[4, 15\]; expected float32\[\*,16\]"),
    ({"x:0": np.zeros((4, 16, 1), np.float32)}, r"'x:0' has shape \[4, 16, 1\]"),
])
def test_wrong_inputs_are_named(dense, feeds: dict, message: str) -> None:
    _, exe = dense
    with load(exe, device=_device()) as model:
        with pytest.raises(InvalidInput, match=message):
            model.run(feeds)
        model.run({"x:0": np.zeros((4, 16), np.float32)})  # still fine afterwards


def test_python_values_are_converted_only_when_no_value_changes() -> None:
    """A list is read by numpy first, then held to the compiled dtype: floats fed to an
    int32 input are refused (never truncated), as are ints that do not fit."""
    import tensorflow as tf

    table = tf.constant(np.arange(10, dtype=np.float32))
    g = trace(lambda i, x: (tf.gather(table, i), x * 2.0),
              tf.TensorSpec([3], tf.int32, name="i"), tf.TensorSpec([2], tf.float32, name="x"))
    with load(compile_graph(g.graph_def, g.io_config), device=_device()) as model:
        got = model.run({"i:0": [1, 2, 9], "x:0": [0.25, 1.5]})
        np.testing.assert_array_equal(got["Identity:0"], [1, 2, 9])
        np.testing.assert_array_equal(got["Identity_1:0"], np.float32([0.5, 3.0]))
        for feeds, message in [
            ({"i:0": [1.5, 2.7, 9.0]}, r"'i:0' has dtype float64 \(numpy's reading of a list\);"
                                       r" the model was compiled for int32"),
            ({"i:0": [1, 2, 2**40]}, r"'i:0' has dtype int64 .* compiled for int32"),
            ({"i:0": (True, False, True)}, r"'i:0' has dtype bool .* compiled for int32"),
            ({"x:0": [1e300, 0.0]}, r"'x:0' has dtype float64 .* compiled for float32"),
            ({"x:0": [[0.5], [1]]}, r"'x:0' has shape \[2, 1\]"),
            ({"x:0": [[0.5], [1, 2]]}, r"'x:0' is not an array"),
        ]:
            with pytest.raises(InvalidInput, match=message):
                model.run({"i:0": np.int32([0, 1, 2]), "x:0": np.float32([1, 2]), **feeds})


def test_run_time_error_names_tf_node() -> None:
    import tensorflow as tf

    table = tf.constant(np.arange(10, dtype=np.float32))
    g = trace(lambda i: tf.gather(table, i, name="lookup"),
              tf.TensorSpec([3], tf.int32, name="i"))
    with load(compile_graph(g.graph_def, g.io_config), device=_device()) as model:
        np.testing.assert_array_equal(model.run({"i:0": np.int32([1, 2, 9])})["Identity:0"],
                                      [1, 2, 9])
        with pytest.raises(ExecutionError, match="lookup"):
            model.run({"i:0": np.int32([1, 2, 10])})


@pytest.mark.parametrize("env, message", [
    ({"NEURONISH_NUM_CORES": "zero"}, "NEURONISH_NUM_CORES"),
    ({"NEURONISH_NUM_CORES": "2", "NEURONISH_VISIBLE_CORES": "1-3"}, "NEURONISH_VISIBLE_CORES"),
    ({"NEURONISH_CORE_GROUP_SIZES": "3,3"}, "NEURONISH_CORE_GROUP_SIZES"),
    ({"NEURONISH_CORE_MEMORY": "lots"}, "NEURONISH_CORE_MEMORY"),
    ({"NEURONISH_HOST_PARALLELISM": "0"}, "NEURONISH_HOST_PARALLELISM"),
    ({"NEURONISH_KERNEL_THREADS": "-1"}, "NEURONISH_KERNEL_THREADS"),
])
def test_bad_environment_is_named(env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DeviceConfig.from_env(env)


def test_environment_layout() -> None:
    c = DeviceConfig.from_env({"NEURONISH_NUM_CORES": "8", "NEURONISH_VISIBLE_CORES": "2-5",
                               "NEURONISH_CORE_GROUP_SIZES": "2x2"})
    assert c.visible_cores == (2, 3, 4, 5)
    assert c.core_groups == ((2, 3), (4, 5))


def test_kernel_threads_default_to_each_running_programs_share_of_the_cpus() -> None:
    cpus = len(os.sched_getaffinity(0))
    assert DeviceConfig.from_env({"NEURONISH_HOST_PARALLELISM": "1"}).kernel_threads == cpus
    assert DeviceConfig.from_env({"NEURONISH_HOST_PARALLELISM": str(cpus * 2)}
                                 ).kernel_threads == 1
    assert DeviceConfig.from_env({"NEURONISH_KERNEL_THREADS": "3"}).kernel_threads == 3


@pytest.mark.parametrize("env, cpus, want", [
    ({}, 2, 1),                                     # BLAS takes every CPU: one at a time
    ({"OPENBLAS_NUM_THREADS": "1"}, 8, 8),
    ({"OMP_NUM_THREADS": "2"}, 8, 4),
    ({"OPENBLAS_NUM_THREADS": "4", "OMP_NUM_THREADS": "1"}, 8, 2),  # OpenBLAS's own first
    ({"OPENBLAS_NUM_THREADS": "16"}, 8, 1),
    ({"OMP_NUM_THREADS": "many"}, 4, 1),
])
def test_default_host_parallelism_follows_blas_threads(env: dict, cpus: int, want: int) -> None:
    assert default_host_parallelism(env, cpus) == want


@pytest.mark.parametrize("parallelism", [1, 3])
def test_host_runs_at_most_host_parallelism_programs_at_once(
        parallelism: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = conv_bn_relu(batch=2)
    exe = compile_graph(g.graph_def, g.io_config)
    running, peak, lock = 0, 0, threading.Lock()
    real_run_stage = LoadedProgram._run_stage  # what runs while a host slot is held

    def run_stage(self: LoadedProgram, *args: object) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)  # long enough for every waiting call to pile up
        try:
            real_run_stage(self, *args)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(LoadedProgram, "_run_stage", run_stage)
    device = _device(NEURONISH_HOST_PARALLELISM=str(parallelism))
    x = np.random.default_rng(0).standard_normal((8, 8, 8, 3)).astype(np.float32)
    with load(exe, duplicates=4, device=device) as model:
        threads = [threading.Thread(target=model.run, args=({"x:0": x},)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # 3 calls of 4 chunks each on 4 duplicates: the host is the only limit.
        assert peak == parallelism
        np.testing.assert_allclose(model.run({"x:0": x})["Identity:0"],
                                   g.reference({"x:0": x})["Identity:0"], rtol=1e-5, atol=1e-6)


def test_pipeline_cores_split_the_program_over_a_core_group() -> None:
    g = conv_bn_relu(batch=2)
    exe = compile_graph(g.graph_def, g.io_config, pipeline_cores=2)
    x = np.random.default_rng(0).standard_normal((3, 8, 8, 3)).astype(np.float32)
    device = _device(NEURONISH_NUM_CORES="4")
    with load(exe, device=device) as model:
        assert model.exe.num_cores == 2 and all(len(p) >= 1 for p in model.exe.programs)
        assert model.core_groups == [(0, 1)] or model.core_groups == [(2, 3)]
        used = {c: m["used"] for c, m in device.memory_report().items()}
        assert all(used[c] > 0 for c in model.core_groups[0])
        np.testing.assert_allclose(model.run({"x:0": x})["Identity:0"],
                                   g.reference({"x:0": x})["Identity:0"], rtol=1e-5, atol=1e-6)
    with pytest.raises(DeviceError, match="core group"):
        load(exe, device=_device(NEURONISH_NUM_CORES="1"))


def test_a_call_past_its_deadline_is_abandoned(dense, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks still queued when the deadline passes are dropped: DeadlineExceeded, and the
    device is free again for the next call."""
    g, exe = dense
    real_run_stage = LoadedProgram._run_stage
    started = []

    def slow_stage(self: LoadedProgram, *args: object) -> None:
        started.append(time.monotonic())
        time.sleep(0.2)
        real_run_stage(self, *args)

    monkeypatch.setattr(LoadedProgram, "_run_stage", slow_stage)
    x = np.random.default_rng(0).standard_normal((4 * 10, 16)).astype(np.float32)
    with load(exe, device=_device(NEURONISH_NUM_CORES="1")) as model:
        begin = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="deadline"):
            model.run({"x:0": x}, timeout=0.3)  # 10 chunks of 0.2 s on one core
        assert len(started) <= 3 and time.monotonic() - begin < 1.5
        monkeypatch.setattr(LoadedProgram, "_run_stage", real_run_stage)
        np.testing.assert_allclose(model.run({"x:0": x[:4]}, timeout=30)["Identity:0"],
                                   g.reference({"x:0": x[:4]})["Identity:0"], rtol=1e-5)
