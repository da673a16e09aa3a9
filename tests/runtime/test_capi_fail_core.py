"""Cores failing in service on the C runtime (nr_device_fail_core, NEURONISH_FAILED_CORES),
as the Python runtime simulates them (runtime/device.py's fail_core): a copy on a failed
core retires (its memory given back, no call starts there again) and calls run on the
model's other copies with the numpy engine's and TensorFlow's outputs; with no copy left a
call fails with NR_DEVICE_ERROR naming each failed core and why; loads avoid failed cores,
refused in the Python runtime's words when too few are left; calls in flight while cores
fail each end with the right outputs or that error, never hang. From Python,
`get_device().fail_core` and NEURONISH_FAILED_CORES reach the C device (a fresh process
each: the process's device is configured once)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from neuronish import runtime as rt
from neuronish.runtime.capi import binding
from neuronish.runtime.config import ConfigError, DeviceConfig
from neuronish.runtime.device import Device, failed_cores_from_env
from tests.runtime import c_programs
from tests.runtime.test_capi_execute import compile_graph

NR_INVALID_ARGUMENT, NR_INVALID_CONFIG, NR_DEVICE_ERROR = 1, 7, 8
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ is needed to build the C runtime library")


@pytest.fixture(scope="module")
def lib() -> object:
    return binding.load_library()


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, bytes]:
    """A 16 -> 8 dense + relu layer compiled at batch 4."""
    from tests import graphs

    graph = graphs.dense_relu(batch=4)
    return graph, compile_graph(tmp_path_factory.mktemp("dense"), "dense", graph.graph_def,
                                graph.io_config)


@pytest.fixture
def two_cores(lib: object, monkeypatch: pytest.MonkeyPatch) -> binding.Device:
    """A C device of two cores, one group each."""
    for var in ("NEURONISH_VISIBLE_CORES", "NEURONISH_CORE_GROUP_SIZES", "NEURONISH_CORE_MEMORY",
                "NEURONISH_FAILED_CORES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NEURONISH_NUM_CORES", "2")
    device = binding.Device(lib)
    yield device
    device.close()


def _reference(graph: object, blob: bytes, x: np.ndarray, monkeypatch: pytest.MonkeyPatch
               ) -> np.ndarray:
    """TensorFlow's output, checked against the numpy engine's (the reference engine)."""
    want = graph.reference({"x:0": x})["Identity:0"]  # type: ignore[attr-defined]
    with monkeypatch.context() as env:
        env.setenv("NEURONISH_ENGINE", "numpy")
        with rt.load(blob, device=Device(DeviceConfig.from_env({}))) as numpy_model:
            assert numpy_model.engine == "numpy"
            np.testing.assert_allclose(numpy_model.run({"x:0": x})["Identity:0"], want,
                                       rtol=1e-5, atol=1e-5)
    return want


def test_a_failed_core_retires_its_copy_and_calls_run_on_the_other(
        two_cores: binding.Device, dense: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    graph, blob = dense
    x = np.random.default_rng(2).standard_normal((9, 16)).astype(np.float32)
    want = _reference(graph, blob, x, monkeypatch)
    model = binding.Model(two_cores, blob, duplicates=2)
    try:
        assert sorted(c[0] for c in model.copies()) == [[0], [1]]
        held = two_cores.memory()
        assert held[0][0] > 0 and held[1][0] > 0
        two_cores.fail_core(1, "test")
        assert two_cores.failed_cores() == {1: "core 1 failed (test)"}
        assert two_cores.memory()[1][0] == 0 and two_cores.memory()[0][0] == held[0][0]
        runs_before = {tuple(c[0]): c[2] for c in model.copies()}
        for _ in range(3):  # 3 chunks a call: more than the copies left
            np.testing.assert_allclose(model.run([x])[0], want, rtol=1e-5, atol=1e-5)
        runs_after = {tuple(c[0]): c[2] for c in model.copies()}
        assert runs_after[(1,)] == runs_before[(1,)]  # the retired copy never ran again
        assert runs_after[(0,)] == runs_before[(0,)] + 9
        two_cores.fail_core(1, "again")  # a failed core failing again changes nothing
        two_cores.fail_core(0, "test again")
        with pytest.raises(binding.CRuntimeError) as e:
            model.run([x])
        assert e.value.status == NR_DEVICE_ERROR
        assert e.value.message == ("the model has no copy left on a working core: core 1 "
                                   "failed (test); core 0 failed (test again)")
        assert all(used == 0 for used, _ in two_cores.memory().values())
    finally:
        model.unload()
    assert all(used == 0 for used, _ in two_cores.memory().values())  # nothing given back twice


def test_loads_avoid_failed_cores_in_the_python_runtimes_words(
        two_cores: binding.Device, dense: tuple) -> None:
    _, blob = dense
    python_device = Device(DeviceConfig.from_env({"NEURONISH_NUM_CORES": "2"}))
    for device in (two_cores, python_device):
        device.fail_core(1, "test")
    model = binding.Model(two_cores, blob)  # the working core takes it
    assert [c[0] for c in model.copies()] == [[0]]
    model.unload()
    with pytest.raises(binding.CRuntimeError) as c_error:
        binding.Model(two_cores, blob, duplicates=2)
    with pytest.raises(rt.DeviceError) as py_error:
        rt.load(blob, duplicates=2, device=python_device)
    assert c_error.value.status == NR_DEVICE_ERROR
    assert "failed: core 1 failed (test)" in c_error.value.message
    assert c_error.value.message == str(py_error.value)
    for device in (two_cores, python_device):
        device.fail_core(0)  # the default reason
    assert two_cores.failed_cores() == python_device.failed_cores() == {
        1: "core 1 failed (test)", 0: "core 0 failed (hardware error)"}
    with pytest.raises(binding.CRuntimeError) as c_error:
        binding.Model(two_cores, blob)
    assert "the device has 0 such core group(s)" in c_error.value.message
    assert "failed: core 1 failed (test), core 0 failed (hardware error)" in c_error.value.message
    with pytest.raises(binding.CRuntimeError) as c_error:
        two_cores.fail_core(7)
    with pytest.raises(rt.DeviceError) as py_error:
        python_device.fail_core(7)
    assert c_error.value.status == NR_INVALID_ARGUMENT
    assert c_error.value.message == str(py_error.value) == \
        "core 7 is not one of the visible cores [0, 1]"


def test_calls_in_flight_while_cores_fail_end_right_or_name_the_cores(
        two_cores: binding.Device, dense: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads call a model of two copies (so calls also wait for a copy) while core
    1 and then core 0 fail: every call gives the right outputs or, once no copy is left,
    NR_DEVICE_ERROR naming both cores; none hangs, none fails while a copy is left."""
    graph, blob = dense
    x = np.random.default_rng(3).standard_normal((13, 16)).astype(np.float32)
    want = _reference(graph, blob, x, monkeypatch)
    model = binding.Model(two_cores, blob, duplicates=2)
    results: list[list[str]] = [[] for _ in range(8)]
    stop = threading.Event()

    def caller(k: int) -> None:
        while not stop.is_set():
            try:
                np.testing.assert_allclose(model.run([x])[0], want, rtol=1e-5, atol=1e-5)
                results[k].append("ok")
            except binding.CRuntimeError as e:
                results[k].append(f"{e.status}: {e.message}")

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    try:
        def served(n: int) -> None:  # until every caller has had n more calls
            counts = [len(r) + n for r in results]
            while any(len(r) < c for r, c in zip(results, counts)):
                threading.Event().wait(0.01)

        served(3)
        two_cores.fail_core(1, "first")
        served(3)
        assert all(set(r) == {"ok"} for r in results), results  # core 0 served them all
        two_cores.fail_core(0, "second")
        served(2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a call hung"
    refused = f"{NR_DEVICE_ERROR}: the model has no copy left on a working core: core 1 " \
              "failed (first); core 0 failed (second)"
    for r in results:
        assert r[-1] == refused and set(r) == {"ok", refused}
        assert "ok" not in r[r.index(refused):]  # once refused, never served again
    model.unload()


def test_failed_cores_from_the_environment(lib: object, dense: tuple,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _, blob = dense
    monkeypatch.setenv("NEURONISH_NUM_CORES", "3")
    monkeypatch.setenv("NEURONISH_FAILED_CORES", " 2:ECC error , 0")
    device = binding.Device(lib)
    try:
        assert device.failed_cores() == {2: "core 2 failed (ECC error)",
                                         0: "core 0 failed (named in NEURONISH_FAILED_CORES)"}
        model = binding.Model(device, blob)
        assert [c[0] for c in model.copies()] == [[1]]
        model.unload()
        with pytest.raises(binding.CRuntimeError, match="failed: core 2 failed .ECC error.,"):
            binding.Model(device, blob, duplicates=2)
    finally:
        device.close()


BAD = ["x", "1,", "3", "1,1", "1:a,,0", "0-1", "-1", "1;2", "１"]


@pytest.mark.parametrize("text", BAD + ["", " ", "1:why: with a colon", "0,1,2"])
def test_the_environment_is_read_as_python_reads_it(lib: object, monkeypatch: pytest.MonkeyPatch,
                                                    text: str) -> None:
    """The C device and runtime/device.py accept the same values and refuse the rest in the
    same words, naming the variable, what it expects and what came."""
    monkeypatch.setenv("NEURONISH_NUM_CORES", "3")
    monkeypatch.setenv("NEURONISH_FAILED_CORES", text)
    try:
        want = failed_cores_from_env([0, 1, 2])
    except ConfigError as e:
        assert text in BAD
        assert str(e).startswith(f"NEURONISH_FAILED_CORES='{text}': ")
        with pytest.raises(binding.CRuntimeError) as c:
            binding.Device(lib)
        assert c.value.status == NR_INVALID_CONFIG
        assert c.value.message == str(e)
        return
    assert text not in BAD
    device = binding.Device(lib)
    assert device.failed_cores() == {c: f"core {c} failed ({why})" for c, why in want.items()}
    device.close()


def test_bad_environment_text_says_what_it_expects() -> None:
    with pytest.raises(ConfigError) as e:
        failed_cores_from_env([0, 1], {"NEURONISH_FAILED_CORES": "1,x"})
    assert str(e.value) == ("NEURONISH_FAILED_CORES='1,x': expected visible cores separated by "
                            "commas, each with an optional reason after ':' (e.g. '1' or "
                            "'0:ECC error,1'); got 'x'")
    with pytest.raises(ConfigError, match=r"core 5 is not one of the visible cores \[0, 1\]"):
        failed_cores_from_env([0, 1], {"NEURONISH_FAILED_CORES": "5"})


_PROCESS = r"""
import json, sys
import numpy as np
from neuronish import runtime as rt
from neuronish.runtime import get_device
from neuronish.runtime.capi import native_model
blob = open(sys.argv[1], "rb").read()
x = np.load(sys.argv[2])
out = {}
model = rt.load(blob, duplicates=int(sys.argv[3]))
out["native"] = isinstance(model, native_model.NativeModel)
out["groups"] = [list(g) for g in model.core_groups]
out["c_failed"] = {str(k): v for k, v in native_model.opened_device().failed_cores().items()}
out["y"] = model.run_list([x])[0].tolist()
if len(sys.argv) > 4:
    get_device().fail_core(int(sys.argv[4]), "in service")
    out["after"] = {"groups": [list(g) for g in model.core_groups],
                    "duplicates": model.duplicates,
                    "used": {str(c): r["used"] for c, r in get_device().memory_report().items()},
                    "c_failed": {str(k): v for k, v in
                                 native_model.opened_device().failed_cores().items()}}
    try:
        out["after"]["y"] = model.run_list([x])[0].tolist()
    except rt.DeviceError as e:
        out["after"]["error"] = [type(e).__name__, str(e)]
print(json.dumps(out))
"""


def _process(tmp_path: Path, blob: bytes, x: np.ndarray, *args: str, **env: str) -> dict:
    (tmp_path / "model.neff").write_bytes(blob)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([sys.executable, "-c", _PROCESS, str(tmp_path / "model.neff"),
                        str(tmp_path / "x.npy"), *args], capture_output=True, text=True,
                       timeout=300, cwd=ROOT,
                       env={**os.environ, "NEURONISH_NUM_CORES": "2", **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_python_fail_core_reaches_the_c_device(dense: tuple, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`get_device().fail_core` in a Python process fails the core on the C device too: the
    C model's copy there retires (its memory given back in the one budget) and it runs on;
    its last core failing fails its calls with the Python runtime's DeviceError."""
    graph, blob = dense
    x = np.random.default_rng(4).standard_normal((6, 16)).astype(np.float32)
    want = _reference(graph, blob, x, monkeypatch)
    got = _process(tmp_path, blob, x, "2", "1")
    assert got["native"] and sorted(got["groups"]) == [[0], [1]] and got["c_failed"] == {}
    after = got["after"]
    assert after["groups"] == [[0]] and after["duplicates"] == 1
    assert after["used"]["1"] == 0 and after["used"]["0"] > 0
    assert after["c_failed"] == {"1": "core 1 failed (in service)"}
    for y in (got["y"], after["y"]):
        np.testing.assert_allclose(np.array(y, np.float32), want, rtol=1e-5, atol=1e-5)
    got = _process(tmp_path, blob, x, "1", "0", NEURONISH_FAILED_CORES="1:at start")
    assert got["native"] and got["groups"] == [[0]]  # the environment's failure, in C too
    assert got["c_failed"] == {"1": "core 1 failed (at start)"}
    assert got["after"]["groups"] == [] and got["after"]["duplicates"] == 0
    kind, message = got["after"]["error"]
    assert kind == "DeviceError"
    assert message == ("the model has no copy left on a working core: core 0 failed "
                       "(in service)")


def test_cores_failing_under_calls_and_loads_in_flight_under_thread_sanitizer(
        tmp_path: Path) -> None:
    """tests/c_api/nr_fail_core_threads.c, built with -fsanitize=thread against the TSan
    build of the C runtime: six threads calling a pipelined model of two duplicates (core
    groups [0, 1] and [2, 3]) and one loading and unloading another copy, while core 1 and
    then core 2 fail. Every call gives its result alone or, once both have failed, the
    refusal naming both; TSan reports nothing on the runtime's locking (a core failing
    reaches models, their idle copies, the device's memory)."""
    from tests import graphs

    program = c_programs.build("nr_fail_core_threads.c", tmp_path / "nr_fail_core_threads",
                               c_programs.TSAN, std="c11")
    graph = graphs.conv_bn_relu(batch=2)
    model = tmp_path / "cnn2.neff"
    model.write_bytes(compile_graph(tmp_path, "cnn2", graph.graph_def, graph.io_config,
                                    "--neuroncore-pipeline-cores", "2"))
    r = subprocess.run([str(program), str(model), "1", "2"], capture_output=True, text=True,
                       timeout=900, env={**os.environ, "TSAN_OPTIONS": "halt_on_error=1",
                                         "OMP_WAIT_POLICY": "passive",
                                         "NEURONISH_NUM_CORES": "4",
                                         "NEURONISH_CORE_GROUP_SIZES": "2,2"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    assert "ThreadSanitizer" not in r.stderr
