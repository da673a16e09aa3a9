"""`neuronish.runtime.load` is a binding over the C runtime (issue 25, item 4): a model the
C runtime can run loads there, with the Python runtime's Model surface and errors, and
gives TensorFlow's and the numpy engine's outputs at the compiled batch, padded and
split; what it cannot run stays on the Python runtime saying why; the process has one
device with one memory budget across both runtimes, whichever loaded first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neuronish import runtime as rt
from neuronish.runtime.capi.native_model import NativeModel
from tests.runtime.test_capi_execute import compile_graph

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ is needed to build the C runtime library")


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, bytes]:
    from tests import graphs

    graph = graphs.dense_relu(batch=3)
    return graph, compile_graph(tmp_path_factory.mktemp("dense"), "dense", graph.graph_def,
                                graph.io_config)


def test_load_runs_on_the_c_runtime_matching_tensorflow_and_numpy(
        dense: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    graph, blob = dense
    model = rt.load(blob, duplicates=2)
    try:
        assert isinstance(model, NativeModel), getattr(model, "runtime_note", model)
        assert model.batch_size == 3 and model.duplicates == 2
        [sig] = model.inputs
        monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
        with rt.load(blob) as reference:  # the numpy engine: only the Python runtime's
            assert not isinstance(reference, NativeModel) and reference.engine == "numpy"
            assert "NEURONISH_ENGINE=numpy" in reference.runtime_note
            for batch in (3, 2, 7):  # compiled, padded, split over both copies
                x = np.random.default_rng(batch).standard_normal(
                    (batch, *sig.shape[1:])).astype(np.float32)
                got = model.run({sig.name: x})
                want = reference.run({sig.name: x})
                tf_out = graph.reference({sig.name: x})
                assert list(got) == list(want) == list(tf_out)
                for name in got:
                    assert got[name].shape[0] == batch
                    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
                    np.testing.assert_allclose(got[name], tf_out[name], rtol=1e-4, atol=1e-4)
                out = [np.empty_like(got[name]) for name in got]  # into the caller's arrays
                assert model.run_list([x], out=out) is not None
                np.testing.assert_array_equal(out[0], got[next(iter(got))])
    finally:
        model.unload()
    with pytest.raises(rt.DeviceError, match="unloaded"):
        model.run_list([x])


def test_a_bad_call_is_refused_in_the_python_runtimes_words(dense: tuple) -> None:
    _, blob = dense
    with rt.load(blob) as c_model, rt.load(blob, runtime="python") as py_model:
        assert isinstance(c_model, NativeModel) and not isinstance(py_model, NativeModel)
        [sig] = c_model.inputs
        bad = [{}, {sig.name: np.zeros((3, 5), np.float32)},
               {sig.name: np.zeros((3, *sig.shape[1:]), np.int32)},
               {sig.name: [[1.5] * sig.shape[1]] * 3, "y:0": 1}]
        for feeds in bad:
            with pytest.raises(rt.InvalidInput) as py_error:
                py_model.run(feeds)
            with pytest.raises(rt.InvalidInput) as c_error:
                c_model.run(feeds)
            assert str(c_error.value) == str(py_error.value)
        # Lists are read as Python's runtime reads them (float64 narrowed when exact).
        x = [[0.5] * sig.shape[1]] * 3
        np.testing.assert_allclose(next(iter(c_model.run({sig.name: x}).values())),
                                   next(iter(py_model.run({sig.name: x}).values())), atol=1e-6)


def test_what_the_c_runtime_cannot_take_stays_on_python_saying_why(
        dense: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from neuronish.device_tools import format_ls
    from neuronish.runtime import telemetry

    _, blob = dense
    monkeypatch.setenv("NEURONISH_NATIVE_EXCLUDE", "matmul")
    with rt.load(blob) as model:
        assert not isinstance(model, NativeModel)
        assert "NEURONISH_NATIVE_EXCLUDE" in model.runtime_note
        snapshot = telemetry.get_telemetry().snapshot()
        # (other models of this process may be loaded too: a C runtime one has no note)
        [entry] = [m for m in snapshot["models"]
                   if "NEURONISH_NATIVE_EXCLUDE" in (m.get("note") or "")]
        assert entry["engine"] != "native (C runtime)"
        assert "on the Python runtime: NEURONISH_NATIVE_EXCLUDE" in format_ls([snapshot])
    monkeypatch.delenv("NEURONISH_NATIVE_EXCLUDE")
    with pytest.raises(rt.DeviceError, match="cannot load on the C runtime: .*"
                                             "NEURONISH_KERNEL=python"):
        monkeypatch.setenv("NEURONISH_KERNEL", "python")
        rt.load(blob, runtime="c")


BUDGET = """
import json, sys
import neuronish.runtime as rt
from neuronish.runtime.capi.native_model import NativeModel
blob = open(sys.argv[1], "rb").read()
used = lambda: rt.get_device().memory_report()[0]["used"]
out = {}
if sys.argv[2] == "measure":
    with rt.load(blob, runtime="python") as m:
        out["py"] = used()
    with rt.load(blob, runtime="c") as m:
        out["c"] = used()
    print(json.dumps(out)); sys.exit()
py = rt.load(blob, runtime="python")      # the Python device first, the C one opens later
out["py_alone"] = used()
for key in ("c_beside_py", "auto_beside_py"):
    try:
        m = rt.load(blob, runtime="c" if key == "c_beside_py" else None)
        out[key] = "loaded: %s" % type(m).__name__
    except rt.DeviceError as e:
        out[key] = "%s: %s" % (type(e).__name__, e)
py.unload()
out["after_py"] = used()
c = rt.load(blob)
out["c_native"] = isinstance(c, NativeModel)
out["c_alone"] = used()
try:
    rt.load(blob, runtime="python")
    out["py_beside_c"] = "loaded"
except rt.DeviceError as e:
    out["py_beside_c"] = "%s: %s" % (type(e).__name__, e)
c.unload()
out["end"] = used()
print(json.dumps(out))
"""


def test_one_memory_budget_across_both_runtimes(dense: tuple, tmp_path: Path) -> None:
    _, blob = dense
    path = tmp_path / "dense.neff"
    path.write_bytes(blob)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURONISH_")}
    env.update(NEURONISH_NUM_CORES="1", NEURONISH_TELEMETRY="0", PYTHONPATH=str(ROOT))

    def run(mode: str, **more: str) -> dict:
        r = subprocess.run([sys.executable, "-c", BUDGET, str(path), mode], env={**env, **more},
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    sizes = run("measure")
    assert sizes["py"] > 0 and sizes["c"] > 0
    # Room for either model alone, not for both.
    memory = max(sizes.values()) + min(sizes.values()) // 2
    got = run("budget", NEURONISH_CORE_MEMORY=str(memory))
    assert got["py_alone"] == sizes["py"]
    assert got["c_beside_py"].startswith("DeviceError: cannot load on the C runtime"), got
    assert "out of device memory" in got["c_beside_py"], got
    # Refused by the C runtime, the default load tries Python's, which sees the same budget.
    assert got["auto_beside_py"].startswith("OutOfDeviceMemory: out of device memory"), got
    assert got["after_py"] == 0
    assert got["c_native"] and got["c_alone"] == sizes["c"]
    assert got["py_beside_c"].startswith("OutOfDeviceMemory: out of device memory"), got
    assert got["end"] == 0
