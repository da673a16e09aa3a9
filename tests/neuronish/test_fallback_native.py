"""Runtime fallback when cores fail under a NeuronOp whose model is on the C runtime (issue
25): tests/neuronish/test_fallback.py's cases without NEURONISH_KERNEL=python.

- The Python host's kernel (neuron_op.cc; the model on the C runtime, called without the
  GIL): `get_device().fail_core` reaches the C device; one core failing leaves the op on
  its other copy, both failing moves it to TensorFlow (or, with NEURONISH_FALLBACK=0,
  an error naming the core).
- The Python-free kernel (neuron_op_native.cc) in a process that never imports neuronish:
  the device it opened loses its cores after the first call (nr_device_fail_core, on the
  device a small interposed nr_device_open hands the test); the next calls run on
  TensorFlow, or fail naming the core with the fallback off.
- A C host (examples/c/tf_saved_model.c) with NEURONISH_FAILED_CORES: the op loads on
  the working core, or with none left falls back to TensorFlow; bad text is an error
  naming the variable.

Every case matches TensorFlow on the original SavedModel and runs in a fresh process
(the device is configured from the environment once)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish import native_op_library
from neuronish.runtime.capi import library
from tests.neuronish.test_compile_recovery import small_model
from tests.neuronish.test_op_library_c import _build_program, _signature
from tests.neuronish.test_op_library_c import _run as _run_c_host

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None,
                                reason="gcc and g++ are needed to build the C runtime, the op "
                                       "library and the C programs")

FAILED = "simulated hardware error"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Two dense layers, x [None, 8] -> y [None, 4], compiled at batch 1: one NeuronOp."""
    tmp = tmp_path_factory.mktemp("fallback_native")
    src = small_model(tmp / "src")
    report = neuronish.saved_model.compile(src, str(tmp / "compiled"), batch_size=1)
    assert len(report["NeuronOps"]) == 1 and report["OnNeuronRatio"] == 1.0
    return src, tmp / "compiled"


def _inputs(tmp_path: Path) -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return x


def _expected(src: str, x: np.ndarray) -> dict[str, np.ndarray]:
    fn = tf.saved_model.load(src).signatures["serving_default"]
    return {str(b): fn(x=tf.constant(x[:b]))["y"].numpy() for b in (1, 3)}


def _assert_outputs(got: dict[str, list], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want), got
    for batch, w in want.items():
        np.testing.assert_allclose(np.array(got[batch], np.float32), w, rtol=1e-5, atol=1e-5)


# -- the Python host's kernel, its model on the C runtime --------------------------------

_PYTHON_HOST = r"""
import json, sys, warnings
import numpy as np
import neuronish
import tensorflow as tf
from neuronish import fallback
from neuronish.runtime import get_device
from neuronish.runtime.capi import native_model
model = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
x = np.load(sys.argv[2])
fail_cores = [int(c) for c in sys.argv[3].split(",")]
out = {"outs": {}, "errors": []}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for batch in (1, 3, 1):  # the compiled batch, a split one, and again
        try:
            out["outs"][str(batch)] = model(x=tf.constant(x[:batch]))["y"].numpy().tolist()
        except tf.errors.OpError as e:
            out["errors"].append([type(e).__name__, e.message])
        if fail_cores:
            [c_model] = native_model.loaded_models()  # (the op's model is on the C runtime)
            out["groups_before"] = [list(g) for g in c_model.core_groups]
            for core in fail_cores:
                get_device().fail_core(core, "simulated hardware error")
            out["groups_after"] = [list(g) for g in c_model.core_groups]
            out["used_after"] = {c: r["used"] for c, r in get_device().memory_report().items()}
            fail_cores = None
out["counts"] = fallback.fallback_counts()
out["warnings"] = [str(w.message) for w in caught if w.category is fallback.FallbackWarning]
print(json.dumps(out))
"""


def _python_host(model_dir: Path, tmp_path: Path, fail: str, **env: str) -> dict:
    r = subprocess.run([sys.executable, "-c", _PYTHON_HOST, str(model_dir),
                        str(tmp_path / "x.npy"), fail], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "NEURONISH_NUM_CORES": "2", **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_python_host_one_core_failing_leaves_the_op_on_its_other_copy(
        compiled: tuple[str, Path], tmp_path: Path) -> None:
    src, model_dir = compiled
    x = _inputs(tmp_path)
    got = _python_host(model_dir, tmp_path, "1", NEURONISH_KERNEL="")
    _assert_outputs(got["outs"], _expected(src, x))
    assert sorted(got["groups_before"]) == [[0], [1]] and got["groups_after"] == [[0]]
    assert got["used_after"]["1"] == 0 and got["used_after"]["0"] > 0
    assert got["errors"] == [] and got["counts"] == {} and got["warnings"] == []


def test_python_host_both_cores_failing_fall_back_to_tensorflow(
        compiled: tuple[str, Path], tmp_path: Path) -> None:
    src, model_dir = compiled
    x = _inputs(tmp_path)
    got = _python_host(model_dir, tmp_path, "1,0", NEURONISH_KERNEL="")
    _assert_outputs(got["outs"], _expected(src, x))
    assert got["groups_after"] == [] and got["errors"] == []
    ((_, count),) = got["counts"].items()
    assert count["calls"] == 2, count  # the split call and the last one
    assert f"core 1 failed ({FAILED}); core 0 failed ({FAILED})" in count["reason"], count
    assert len(got["warnings"]) == 1 and "core 0 failed" in got["warnings"][0]


def test_python_host_both_cores_failing_with_fallback_off_is_an_error(
        compiled: tuple[str, Path], tmp_path: Path) -> None:
    src, model_dir = compiled
    x = _inputs(tmp_path)
    got = _python_host(model_dir, tmp_path, "1,0", NEURONISH_KERNEL="", NEURONISH_FALLBACK="0")
    _assert_outputs(got["outs"], {"1": _expected(src, x)["1"]})  # before the failure
    assert got["counts"] == {} and got["warnings"] == []
    assert [e[0] for e in got["errors"]] == ["InternalError", "InternalError"]
    for _, message in got["errors"]:
        assert f"core 0 failed ({FAILED})" in message and "NEURONISH_FALLBACK=0" in message


# -- the Python-free kernel (neuron_op_native.cc) -----------------------------------------

# Hands the test the device the op library opens: an nr_device_open, loaded before the op
# library with RTLD_GLOBAL so that the op library's calls bind to it, that calls the C
# runtime's own and keeps the handle; and counts the op's calls of nr_execute_with.
_SHIM = r"""
#include <dlfcn.h>
#include "neuronish_runtime.h"

static nr_device *opened;

nr_status nr_device_open(nr_device **out, char *error, size_t error_size) {
  void *runtime = dlopen(RUNTIME, RTLD_NOW);
  nr_status (*open)(nr_device **, char *, size_t) =
      (nr_status (*)(nr_device **, char *, size_t))dlsym(runtime, "nr_device_open");
  nr_status status = open(out, error, error_size);
  if (status == NR_OK) opened = *out;
  return status;
}

nr_device *shim_opened_device(void) { return opened; }

static int executes;

nr_status nr_execute_with(nr_model *model, const nr_tensor *inputs, size_t num_inputs,
                          const nr_tensor *outputs, size_t num_outputs,
                          const nr_execute_options *options, char *error, size_t error_size) {
  static nr_status (*execute)(nr_model *, const nr_tensor *, size_t, const nr_tensor *, size_t,
                              const nr_execute_options *, char *, size_t);
  if (!execute) {
    execute = (nr_status (*)(nr_model *, const nr_tensor *, size_t, const nr_tensor *, size_t,
                             const nr_execute_options *, char *, size_t))dlsym(
        dlopen(RUNTIME, RTLD_NOW), "nr_execute_with");
  }
  ++executes;
  return execute(model, inputs, num_inputs, outputs, num_outputs, options, error, error_size);
}

int shim_executes(void) { return executes; }
"""

_NATIVE_HOST = r"""
import ctypes, json, sys
shim = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # (before the op library binds)
shim.shim_opened_device.restype = ctypes.c_void_p
import numpy as np
import tensorflow as tf
assert "neuronish" not in sys.modules
tf.load_op_library(sys.argv[2])
runtime = ctypes.CDLL(sys.argv[3])  # (the op library's own copy: the same file)
model = tf.saved_model.load(sys.argv[4]).signatures["serving_default"]
x = np.load(sys.argv[5])
fail_cores = [int(c) for c in sys.argv[6].split(",")]
out = {"outs": {}, "errors": []}
for batch in (1, 3, 1):
    try:
        out["outs"][str(batch)] = model(x=tf.constant(x[:batch]))["y"].numpy().tolist()
    except tf.errors.OpError as e:
        out["errors"].append([type(e).__name__, e.message])
    if fail_cores:
        device = shim.shim_opened_device()
        assert device, "the op library did not open its device through the shim"
        error = ctypes.create_string_buffer(512)
        for core in fail_cores:
            status = runtime.nr_device_fail_core(ctypes.c_void_p(device), core,
                                                 b"simulated hardware error", error, 512)
            assert status == 0, error.value
        fail_cores = None
out["executes"] = shim.shim_executes()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def native_host(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the shim, the Python-free op library, the C runtime library it links)."""
    tmp = tmp_path_factory.mktemp("shim")
    runtime = library.build()
    (tmp / "shim.c").write_text(_SHIM)
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-shared", "-fPIC",
                    f"-I{library.INCLUDE}", f'-DRUNTIME="{runtime}"', str(tmp / "shim.c"),
                    "-o", str(tmp / "shim.so"), "-ldl"], check=True, capture_output=True,
                   text=True)
    return tmp / "shim.so", native_op_library.build(), runtime


def _native_host(native_host: tuple[Path, Path, Path], model_dir: Path, tmp_path: Path,
                 fail: str, **env: str) -> tuple[dict, str]:
    shim, op_library, runtime = native_host
    r = subprocess.run([sys.executable, "-c", _NATIVE_HOST, str(shim), str(op_library),
                        str(runtime), str(model_dir), str(tmp_path / "x.npy"), fail],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "NEURONISH_NUM_CORES": "2",
                            "OMP_WAIT_POLICY": "passive", "TF_CPP_MIN_LOG_LEVEL": "1", **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_native_kernel_one_core_failing_stays_on_the_device(
        compiled: tuple[str, Path], native_host: tuple[Path, Path, Path],
        tmp_path: Path) -> None:
    src, model_dir = compiled
    x = _inputs(tmp_path)
    got, stderr = _native_host(native_host, model_dir, tmp_path, "1", NEURONISH_FALLBACK="0")
    assert got["errors"] == [], got["errors"]  # (the fallback is off: all ran on the device)
    _assert_outputs(got["outs"], _expected(src, x))


def test_native_kernel_falls_back_to_tensorflow_when_its_cores_fail(
        compiled: tuple[str, Path], native_host: tuple[Path, Path, Path],
        tmp_path: Path) -> None:
    src, model_dir = compiled
    x = _inputs(tmp_path)
    got, stderr = _native_host(native_host, model_dir, tmp_path, "1,0")
    assert got["errors"] == [], got["errors"]
    _assert_outputs(got["outs"], _expected(src, x))
    assert stderr.count("it runs on TensorFlow instead") == 1, stderr[-3000:]
    assert f"core 1 failed ({FAILED}); core 0 failed ({FAILED})" in stderr
    # The device ran the first call and refused the second (no copy left); the third went
    # straight to TensorFlow: a model without a working core is not asked again.
    assert got["executes"] == 2, got["executes"]


def test_native_kernel_with_fallback_off_names_the_failed_cores(
        compiled: tuple[str, Path], native_host: tuple[Path, Path, Path],
        tmp_path: Path) -> None:
    src, model_dir = compiled
    x = _inputs(tmp_path)
    got, _ = _native_host(native_host, model_dir, tmp_path, "1,0", NEURONISH_FALLBACK="0")
    _assert_outputs(got["outs"], {"1": _expected(src, x)["1"]})  # before the failure
    assert [e[0] for e in got["errors"]] == ["InternalError", "InternalError"]
    for _, message in got["errors"]:
        assert "NeuronOp '" in message and "(device error)" in message, message
        assert f"no copy left on a working core: core 1 failed ({FAILED}); core 0 failed " \
               f"({FAILED})" in message


# -- a C host: NEURONISH_FAILED_CORES -----------------------------------------------------

def test_c_host_with_failed_cores_in_its_environment(compiled: tuple[str, Path],
                                                      tmp_path: Path) -> None:
    src, model_dir = compiled
    x = _inputs(tmp_path)[:3]
    want = _expected(src, x)["3"]
    ins, outs = _signature(model_dir)
    program = _build_program(tmp_path / "tf_saved_model")
    (tmp_path / "in.bin").write_bytes(x.tobytes())
    args = ("-l", str(native_op_library.build()), "-i", str(tmp_path / "in.bin"), "-o",
            str(tmp_path / "out.bin"), str(model_dir), f"{ins['x']}=float32:3,8", "--",
            outs["y"])

    def output() -> np.ndarray:
        return np.frombuffer((tmp_path / "out.bin").read_bytes(), np.float32).reshape(3, 4)

    # One core failed: the op loads on the other (the fallback is off: it ran there).
    r = _run_c_host(program, *args, NEURONISH_NUM_CORES="2", NEURONISH_FAILED_CORES="0:ECC")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(output(), want, rtol=1e-5, atol=1e-5)
    # Both: no core group left, the op runs on TensorFlow...
    both = {"NEURONISH_NUM_CORES": "2", "NEURONISH_FAILED_CORES": "0:ECC,1"}
    (tmp_path / "out.bin").unlink()
    r = _run_c_host(program, *args, NEURONISH_FALLBACK="1", TF_CPP_MIN_LOG_LEVEL="1", **both)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("it runs on TensorFlow instead") == 1, r.stderr
    np.testing.assert_allclose(output(), want, rtol=1e-5, atol=1e-5)
    # ... or with the fallback off, the load's error names the cores.
    r = _run_c_host(program, *args, **both)
    assert r.returncode == 1 and "[INTERNAL] NeuronOp '" in r.stderr, r.stderr
    assert "cannot load its executable" in r.stderr
    assert "failed: core 0 failed (ECC), core 1 failed (named in NEURONISH_FAILED_CORES)" \
        in r.stderr
    # Bad text: an error naming the variable, fallback or not (the device does not open).
    r = _run_c_host(program, *args, NEURONISH_FALLBACK="1", NEURONISH_NUM_CORES="2",
                    NEURONISH_FAILED_CORES="core 1")
    assert r.returncode == 1, r.stderr
    assert "cannot open the neuronish device: NEURONISH_FAILED_CORES='core 1': expected " \
           "visible cores separated by commas" in r.stderr
    assert "got 'core 1' (invalid configuration)" in r.stderr


# -- failed cores took every copy, other cores work: the model is loaded again there ------

@pytest.fixture(scope="module")
def one_copy(compiled: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled model with model_config's max_num_duplicates = 1: on a 2-core device its
    one copy leaves a core free."""
    from tests.neuronish.test_op_library_c import _set_neuron_op_attr

    out = tmp_path_factory.mktemp("one_copy") / "compiled"
    shutil.copytree(compiled[1], out)

    def one(attrs: Any) -> None:  # noqa: ANN401 (a protobuf map)
        attrs["model_config"].list.i[2] = 1  # [.., .., max_num_duplicates, timeout_s, ..]

    assert _set_neuron_op_attr(out, one) == 1
    return out


_PYTHON_HOST_LOAD_AGAIN = r"""
import gc, json, logging, sys, warnings
import numpy as np
import neuronish
import tensorflow as tf
from neuronish import fallback, kernel_bridge
from neuronish.runtime import get_device
logged = []
class Keep(logging.Handler):
    def emit(self, record):
        logged.append(record.getMessage())
logging.getLogger("neuronish.kernel_bridge").addHandler(Keep())
model = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
x = np.load(sys.argv[2])
out = {"outs": {}, "errors": [], "groups": []}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for step, batch in enumerate((1, 3, 1)):
        try:
            out["outs"][f"{step}:{batch}"] = model(x=tf.constant(x[:batch]))["y"].numpy().tolist()
        except tf.errors.OpError as e:
            out["errors"].append([type(e).__name__, e.message])
        [handle] = [h for h in gc.get_objects() if isinstance(h, kernel_bridge.Handle)]
        live = [handle.model] if handle.model is not None else []
        out["runtime"] = type(handle.model).__name__ if live else out.get("runtime")
        out["groups"].append([list(g) for m in live for g in m.core_groups])
        if step < 2 and live:  # the core under the op's one copy fails
            [[core]] = live[0].core_groups
            get_device().fail_core(core, "simulated hardware error")
out["counts"] = fallback.fallback_counts()
out["warnings"] = [str(w.message) for w in caught if w.category is fallback.FallbackWarning]
out["logged"] = logged
print(json.dumps(out))
"""


@pytest.mark.parametrize("kernel,runtime", [("", "NativeModel"), ("python", "Model")],
                         ids=["c-runtime", "python-runtime"])
def test_python_host_loads_the_model_again_on_the_core_left(
        compiled: tuple[str, Path], one_copy: Path, tmp_path: Path, kernel: str,
        runtime: str) -> None:
    """One copy on a 2-core device; its core fails: the next call loads the model on the
    other core and runs there (no fallback); that core fails too: TensorFlow. On either
    runtime."""
    src, _ = compiled
    x = _inputs(tmp_path)
    r = subprocess.run([sys.executable, "-c", _PYTHON_HOST_LOAD_AGAIN, str(one_copy),
                        str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "NEURONISH_NUM_CORES": "2", "NEURONISH_KERNEL": kernel})
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["runtime"] == runtime, got
    want = _expected(src, x)
    assert got["errors"] == [], got["errors"]
    for key, values in got["outs"].items():
        np.testing.assert_allclose(np.array(values, np.float32), want[key.split(":")[1]],
                                   rtol=1e-5, atol=1e-5)
    first, second, third = got["groups"]
    assert len(first) == 1 and second == [[1 - first[0][0]]], got["groups"]
    assert third == [], got["groups"]  # (the last call ran on TensorFlow)
    assert len(got["logged"]) == 2, got["logged"]
    assert "failed cores took every copy of its model; loaded it again on core group(s) " \
           f"[({second[0][0]},)]" in got["logged"][0]
    assert "loading it again failed" in got["logged"][1]
    ((_, count),) = got["counts"].items()
    assert count["calls"] == 1, count  # only the last call: the split one ran on the device
    assert len(got["warnings"]) == 1


def test_native_kernel_loads_the_model_again_on_the_core_left(
        compiled: tuple[str, Path], one_copy: Path, native_host: tuple[Path, Path, Path],
        tmp_path: Path) -> None:
    """The Python-free kernel, fallback off: its one copy's core fails after the first call
    (core 0 or core 1: both runs, so one of them hits it); the next calls load it on the
    other core and run there, matching TensorFlow."""
    src, _ = compiled
    x = _inputs(tmp_path)
    seen = set()
    for core in ("0", "1"):
        got, stderr = _native_host(native_host, one_copy, tmp_path, core, NEURONISH_FALLBACK="0")
        assert got["errors"] == [], got["errors"]
        _assert_outputs(got["outs"], _expected(src, x))
        if "failed cores took every copy of its model; loaded it again on core group(s) " \
                f"[{1 - int(core)}]" in stderr:
            seen.add(core)
            # call 1, call 2 refused (no copy left), call 2 again on the new copy, call 3
            assert got["executes"] == 4, got["executes"]
        else:
            assert "loaded it again" not in stderr and got["executes"] == 3, stderr[-2000:]
    assert len(seen) == 1, seen  # (the copy was on exactly one of the two cores)


# -- the same for an op with free dimensions: a shape's executable loaded again ------------

_SHAPES_HOST = r"""
import ctypes, gc, json, logging, os, sys
if sys.argv[1] != "-":  # the Python-free kernel, its device handed over by the shim
    shim = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
    shim.shim_opened_device.restype = ctypes.c_void_p
import numpy as np
import tensorflow as tf
if sys.argv[1] != "-":
    assert "neuronish" not in sys.modules
    tf.load_op_library(sys.argv[2])
    runtime = ctypes.CDLL(sys.argv[3])
    def fail(core):
        error = ctypes.create_string_buffer(512)
        device = ctypes.c_void_p(shim.shim_opened_device())
        assert runtime.nr_device_fail_core(device, core, b"simulated hardware error", error,
                                           512) == 0, error.value
else:
    import neuronish
    from neuronish import kernel_bridge
    from neuronish.runtime import get_device
    logged = []
    class Keep(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage())
    logging.getLogger("neuronish.kernel_bridge").addHandler(Keep())
    def fail(core):
        get_device().fail_core(core, "simulated hardware error")
model = tf.saved_model.load(sys.argv[4]).signatures["serving_default"]
x = np.random.default_rng(0).standard_normal((2, 7, 8)).astype(np.float32)
out = {"outs": [], "errors": []}
for step in range(3):
    try:
        out["outs"].append(model(x=tf.constant(x))["y"].numpy().tolist())
    except tf.errors.OpError as e:
        out["errors"].append([type(e).__name__, e.message])
    if step == 0:
        for core in map(int, sys.argv[5].split(",")):
            fail(core)
if sys.argv[1] == "-":
    out["logged"] = logged
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def free_length(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(original, compiled) of a model whose sequence length is free; max_num_duplicates 1,
    so each shape's executable has one copy and a 2-core device a free core."""
    from tests.neuronish.test_op_library_c import _set_neuron_op_attr
    from tests.neuronish.test_op_library_c_shapes import _Sequence

    tmp = tmp_path_factory.mktemp("free_length")
    src, out = tmp / "src", tmp / "compiled"
    module = _Sequence()
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    neuronish.saved_model.compile(str(src), str(out), batch_size=2)

    def one(attrs: Any) -> None:  # noqa: ANN401 (a protobuf map)
        attrs["model_config"].list.i[2] = 1

    assert _set_neuron_op_attr(out, one) == 1
    return src, out


@pytest.mark.parametrize("host", ["python", "native"])
def test_a_shapes_executable_is_loaded_again_on_the_core_left(
        free_length: tuple[Path, Path], native_host: tuple[Path, Path, Path], host: str) -> None:
    """A new length (compiled at run time, one copy), the fallback off: after the first
    call one core fails, then the other is tried too. Whichever core the copy was on, the
    calls go on matching TensorFlow: the shape's executable is loaded on the core left."""
    src, out = free_length
    x = np.random.default_rng(0).standard_normal((2, 7, 8)).astype(np.float32)
    want = tf.saved_model.load(str(src)).signatures["serving_default"](x=tf.constant(x))["y"]
    shim, op_library, runtime = native_host
    reloaded = 0
    for core in ("0", "1"):
        args = [str(shim), str(op_library), str(runtime)] if host == "native" else ["-", "", ""]
        r = subprocess.run([sys.executable, "-c", _SHAPES_HOST, *args, str(out), core],
                           capture_output=True, text=True, timeout=600,
                           env={**os.environ, "NEURONISH_NUM_CORES": "2",
                                "NEURONISH_FALLBACK": "0", "OMP_WAIT_POLICY": "passive",
                                "TF_CPP_MIN_LOG_LEVEL": "1",
                                "NEURONISH_CC": str(Path(sys.executable).parent / "neuronish-cc")})
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["errors"] == [], got["errors"]
        assert len(got["outs"]) == 3
        for values in got["outs"]:
            np.testing.assert_allclose(np.array(values, np.float32), want.numpy(), rtol=1e-4,
                                       atol=1e-4)
        said = "\n".join(got.get("logged", [])) + r.stderr
        if "failed cores took every copy of the executable of" in said:
            # (Python prints the groups [(1,)], C [1])
            again = re.search(r"loaded it again on core group\(s\) \[\(?(\d)\b", said)
            assert again and int(again.group(1)) == 1 - int(core), said[-2000:]
            reloaded += 1
    assert reloaded == 1, "the shape's one copy was on exactly one of the two cores"
