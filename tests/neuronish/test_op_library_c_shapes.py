"""Free dimensions in a host without Python (neuronish/ops/neuron_op_shapes.h): a SavedModel
whose signature leaves the sequence length free, compiled with no shape arguments, run by
examples/c/tf_saved_model.c (TensorFlow's C API, the native NeuronOp library).

- The probe shape runs on its executable; a new length is compiled at run time by the
  real neuronish-cc (NEURONISH_CC, a subprocess), at the call's batch rounded up to a
  power of two, and run on the device: the profile names each executable by its shape.
- With the fallback on, a new shape's first call runs on TensorFlow while it compiles, and
  a size outside the bounds runs there too; with it off the size is refused naming the
  input, the dimension and the bound.
- A compiler that cannot start, and a dynamic_shapes attr neuronish did not write, are
  errors naming what to fix.
Every number is compared with TensorFlow on the original SavedModel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish import native_op_library
from tests.neuronish.test_op_library_c import _build_program, _run, _set_neuron_op_attr, _signature
from tests.runtime.test_profiler import spans_by_category

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None,
                                reason="gcc and g++ are needed to build the op library and the "
                                       "C program")

COMPILER = str(Path(sys.executable).parent / "neuronish-cc")


class _Sequence(tf.Module):
    """relu(x @ w) @ v over x [batch, length, 8]: the length is free."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.w = tf.Variable(rng.standard_normal((8, 16)).astype(np.float32) / 3)
        self.v = tf.Variable(rng.standard_normal((16, 4)).astype(np.float32) / 3)

    @tf.function(input_signature=[tf.TensorSpec([None, None, 8], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.matmul(tf.nn.relu(tf.matmul(x, self.w)), self.v)}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("c_shapes")
    src, out = tmp / "src", tmp / "compiled"
    module = _Sequence()
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    report = neuronish.saved_model.compile(str(src), str(out), batch_size=2)
    [free] = report["free_dims"]
    assert (free["axis"], free["low"], free["high"]) == (1, 1, 1024), free
    ins, outs = _signature(out)
    return {"src": src, "out": out, "probe": free["compiled_at"], "x": ins["x"], "y": outs["y"],
            "program": _build_program(tmp / "tf_saved_model"),
            "lib": str(native_op_library.build()),
            "tf": tf.saved_model.load(str(src)).signatures["serving_default"]}


def _call(m: dict[str, Any], tmp_path: Path, batch: int, length: int,
          **env: str) -> tuple[Any, np.ndarray, np.ndarray]:
    """One call of the compiled model through the C host; (the run, its y, TensorFlow's y)."""
    x = np.random.default_rng(batch * 1000 + length).standard_normal(
        (batch, length, 8)).astype(np.float32)
    (tmp_path / "in.bin").write_bytes(x.tobytes())
    r = _run(m["program"], "-l", m["lib"], "-i", str(tmp_path / "in.bin"), "-o",
             str(tmp_path / "out.bin"), str(m["out"]), f"{m['x']}=float32:{batch},{length},8",
             "--", m["y"], **{"NEURONISH_CC": COMPILER, **env})
    want = m["tf"](x=tf.constant(x))["y"].numpy()
    got = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.float32).reshape(want.shape) \
        if r.returncode == 0 else np.zeros(0)
    return r, got, want


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _executables_run(m: dict[str, Any], tmp_path: Path, batch: int, length: int,
                     **env: str) -> set[str]:
    """One call that must succeed and match TensorFlow: the labels of the executables the
    device ran it on (from its profile)."""
    traces = tmp_path / "traces"
    shutil.rmtree(traces, ignore_errors=True)
    r, got, want = _call(m, tmp_path, batch, length, NEURONISH_PROFILE=str(traces),
                         NEURONISH_TELEMETRY="0", **env)
    assert r.returncode == 0, r.stderr[-3000:]
    _close(got, want)
    [path] = traces.iterdir()
    return {e["args"]["model"] for e in spans_by_category(json.loads(path.read_text()))["execute"]}


def test_a_new_length_is_compiled_and_run_on_the_device(compiled: dict[str, Any],
                                                       tmp_path: Path) -> None:
    for batch, length, label in ((2, compiled["probe"], f"neuron_op_0@2x{compiled['probe']}x8"),
                                 (3, 5, "neuron_op_0@4x5x8")):
        # The device ran it, on the executable of the call's length at batch 3 -> 4.
        assert _executables_run(compiled, tmp_path, batch, length) == {label}


def test_a_new_length_compiles_from_the_subgraph_in_the_assets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executable and the subgraph stored as assets (neuronish/external.py): the subgraph
    a new length compiles from is read from its asset, its digest checked."""
    monkeypatch.setenv("NEURONISH_EXTERNAL_THRESHOLD", "1")
    src, out = tmp_path / "src", tmp_path / "compiled"
    module = _Sequence()
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    neuronish.saved_model.compile(str(src), str(out), batch_size=2)
    assert list((out / "assets").glob("*.pb")), "the subgraph was not stored outside"
    ins, outs = _signature(out)
    m = {"src": src, "out": out, "x": ins["x"], "y": outs["y"],
         "program": _build_program(tmp_path / "tf_saved_model"),
         "lib": str(native_op_library.build()),
         "tf": tf.saved_model.load(str(src)).signatures["serving_default"]}
    r, got, want = _call(m, tmp_path, 2, 6)
    assert r.returncode == 0, r.stderr[-3000:]
    _close(got, want)


def test_with_the_fallback_a_new_length_runs_on_tensorflow_while_it_compiles(
        compiled: dict[str, Any], tmp_path: Path) -> None:
    r, got, want = _call(compiled, tmp_path, 2, 7, NEURONISH_FALLBACK="1",
                         TF_CPP_MIN_LOG_LEVEL="1")
    assert r.returncode == 0, r.stderr[-3000:]
    _close(got, want)
    assert "the call's shape neuron_op_0@2x7x8 is new; it runs on TensorFlow until its " \
           "executable is compiled" in r.stderr, r.stderr[-3000:]


def test_a_length_outside_the_bounds_is_refused_or_runs_on_tensorflow(
        compiled: dict[str, Any], tmp_path: Path) -> None:
    r, _, _ = _call(compiled, tmp_path, 1, 1100)
    assert r.returncode == 1 and "[INVALID_ARGUMENT] NeuronOp '" in r.stderr, r.stderr[-3000:]
    assert "input 'x' has size 1100 in dimension 1; the model accepts 1 to 1024 there (bound " \
           "from default" in r.stderr and "--shape-bounds" in r.stderr
    r, got, want = _call(compiled, tmp_path, 1, 1100, NEURONISH_FALLBACK="1",
                         TF_CPP_MIN_LOG_LEVEL="1")
    assert r.returncode == 0, r.stderr[-3000:]
    _close(got, want)
    assert "run on TensorFlow" in r.stderr and "has size 1100 in dimension 1" in r.stderr


def test_a_compiler_that_cannot_start_is_named(compiled: dict[str, Any], tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-neuronish-cc")
    r, _, _ = _call(compiled, tmp_path, 2, 9, NEURONISH_CC=missing)
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"compiling it for the new shape neuron_op_0@2x9x8: cannot start the compiler " \
           f"'{missing}': No such file or directory. Set NEURONISH_CC" in r.stderr, r.stderr[-3000:]
    # The probe's length needs no compiler.
    r, got, want = _call(compiled, tmp_path, 2, compiled["probe"], NEURONISH_CC=missing)
    assert r.returncode == 0, r.stderr[-3000:]
    _close(got, want)


def test_the_environments_compiler_flags_reach_a_run_time_compile(compiled: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    """NEURONISH_CC_FLAGS is appended to the run-time compile as to every compile the Python
    host runs: a flag the compiler refuses fails the new shape, with the compiler's words."""
    r, _, _ = _call(compiled, tmp_path, 2, 11, NEURONISH_CC_FLAGS="--no-such-flag")
    assert r.returncode == 1 and "compiling it for the new shape neuron_op_0@2x11x8: the " \
        "compiler" in r.stderr, r.stderr[-3000:]
    assert "exited with status" in r.stderr and "--no-such-flag" in r.stderr, r.stderr[-3000:]


def test_a_call_waiting_for_its_compile_keeps_its_deadline_and_the_exit_stops_the_compiler(
        compiled: dict[str, Any], tmp_path: Path) -> None:
    """model_config's timeout bounds a call that waits for its new shape's compile (the
    fallback off); the host then exits with the compile still running: the compiler's
    whole process group is killed and its scratch directory removed, not left orphaned."""
    out = tmp_path / "compiled"
    shutil.copytree(compiled["out"], out)

    def one_second(attrs: Any) -> None:  # noqa: ANN401 (a protobuf map)
        attrs["model_config"].list.i[3] = 1  # [.., .., max_num_duplicates, timeout_s, ..]

    assert _set_neuron_op_attr(out, one_second) >= 1
    slow, pid_file, scratch = tmp_path / "slow-cc", tmp_path / "compiler.pid", tmp_path / "tmp"
    slow.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nsleep 60\nexec {COMPILER} \"$@\"\n")
    slow.chmod(0o755)
    scratch.mkdir()
    started = time.monotonic()
    r, _, _ = _call({**compiled, "out": out}, tmp_path, 2, 13, NEURONISH_CC=str(slow),
                    TMPDIR=str(scratch))
    assert r.returncode == 1 and "[DEADLINE_EXCEEDED] NeuronOp '" in r.stderr, r.stderr[-3000:]
    assert "the call's deadline passed while it waited for its new shape neuron_op_0@2x13x8 " \
           "to compile" in r.stderr, r.stderr[-3000:]
    assert time.monotonic() - started < 50, "the host waited for the compiler"
    pid = int(pid_file.read_text())  # (the wrapper; its sleep shared its group)
    assert _gone_within(pid, 10.0), f"the compiler (pid {pid}) outlived its host"
    assert not list(scratch.glob("neuronish-cc-*")), "the compiler's scratch directory was left"


_THREADED_HOST = r"""
import json, sys, threading
import numpy as np
import tensorflow as tf
assert "neuronish" not in sys.modules  # (the native op library alone: no Python runtime)
tf.load_op_library(sys.argv[1])
compiled = tf.saved_model.load(sys.argv[2]).signatures["serving_default"]
original = tf.saved_model.load(sys.argv[3]).signatures["serving_default"]
shapes = [(b, t) for t in (3, 5, 9) for b in (1, 3)]  # six executables (batch 3 -> 4)
worst, errors = [0.0], []

def call(k):
    for b, t in shapes[k % 6:] + shapes[:k % 6]:
        x = tf.constant(np.random.default_rng(k * 100 + t).standard_normal((b, t, 8)), tf.float32)
        try:
            got = compiled(x=x)["y"].numpy()
        except tf.errors.OpError as e:
            errors.append(e.message)
            continue
        want = original(x=x)["y"].numpy()
        worst[0] = max(worst[0], float(np.abs(got - want).max() / np.abs(want).max()))

threads = [threading.Thread(target=call, args=(k,)) for k in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"worst": worst[0], "errors": errors}))
"""


def test_callers_on_many_threads_at_new_lengths(compiled: dict[str, Any]) -> None:
    """Eight threads of a TensorFlow process that loaded only the native op library call
    six new shapes each, in different orders, the fallback off, at most three executables
    kept: compiles queue one at a time, callers wait for theirs, the least recently used
    executable not running is unloaded (and compiled again when wanted), and every call
    gives TensorFlow's numbers."""
    r = subprocess.run([sys.executable, "-c", _THREADED_HOST, compiled["lib"], str(compiled["out"]),
                        str(compiled["src"])], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "NEURONISH_CC": COMPILER, "NEURONISH_FALLBACK": "0",
                            "NEURONISH_MAX_SHAPES": "3", "TF_CPP_MIN_LOG_LEVEL": "2",
                            "OMP_WAIT_POLICY": "passive"})
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["errors"] == [] and got["worst"] <= 1e-4, got


def _gone_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` ends (or is a zombie its new parent has not reaped yet)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_lengths_compiled_ahead_run_from_the_savedmodel_without_a_compiler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """shape_buckets: each length's executable is stored in the SavedModel's assets and listed
    in the op's attr, so a host with no compiler (NEURONISH_CC names none) and no compile cache
    runs those lengths on the device, at the compiled batch and at another (split or padded);
    a damaged stored executable fails its own length, by name, and no other."""
    monkeypatch.setenv("NEURONISH_COMPILE_CACHE", "off")
    src, out = tmp_path / "src", tmp_path / "compiled"
    module = _Sequence()
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    report = neuronish.saved_model.compile(str(src), str(out), batch_size=2,
                                           shape_buckets={"x": {1: [5, 12]}})
    assert report["shapes_compiled_ahead"] == ["'x' dimension 1=5", "'x' dimension 1=12"]
    stored = sorted((out / "assets").glob("*.neff"))
    assert len(stored) == 2, stored  # (the probe's executable is inline: small)
    moved = tmp_path / "moved"  # (the assets are found wherever the model is loaded from)
    out.rename(moved)
    ins, outs = _signature(moved)
    m = {"out": moved, "x": ins["x"], "y": outs["y"],
         "program": _build_program(tmp_path / "tf_saved_model"),
         "lib": str(native_op_library.build()),
         "tf": tf.saved_model.load(str(src)).signatures["serving_default"]}
    none = str(tmp_path / "no-compiler-here")
    for batch, length, label in ((2, 5, "neuron_op_0@2x5x8"), (2, 12, "neuron_op_0@2x12x8"),
                                 (3, 5, "neuron_op_0@2x5x8")):
        assert _executables_run(m, tmp_path, batch, length, NEURONISH_CC=none,
                                NEURONISH_FALLBACK="0") == {label}
    # A length not compiled ahead needs the compiler, which is not there.
    r, _, _ = _call(m, tmp_path, 2, 6, NEURONISH_CC=none, NEURONISH_FALLBACK="0")
    assert r.returncode == 1 and "cannot start the compiler" in r.stderr, r.stderr[-3000:]
    # One stored executable damaged (same size): its length fails naming it; the other runs.
    victim = stored[0]
    data = bytearray((moved / "assets" / victim.name).read_bytes())
    data[-1] ^= 0xFF
    (moved / "assets" / victim.name).write_bytes(bytes(data))
    results = {length: _call(m, tmp_path, 2, length, NEURONISH_CC=none,
                             NEURONISH_FALLBACK="0")[0] for length in (5, 12)}
    failed = [n for n, r in results.items() if r.returncode != 0]
    assert len(failed) == 1, {n: r.stderr[-2000:] for n, r in results.items()}
    err = results[failed[0]].stderr
    assert f"loading its stored shape neuron_op_0@2x{failed[0]}x8 failed: " in err, err[-3000:]
    assert f"{victim.name} does not hash to the executable the op was compiled with" in err, \
        err[-3000:]


@pytest.mark.parametrize("attr, says", [
    (b'{"version": 2}', "version 1 expected"),
    (b'{"version": 1, "inputs": [], "compiler_args": []}', "'inputs' must list the op's 1 input"),
    (b'{"version": 1, "compiler_args": [], "inputs": [{"label": "x", "free": {"3": [1, 9, ""]}}]}',
     "inputs[0] free axis '3' must map an axis below 3"),
    (b'{"version": 1, "inputs": [', "not JSON"),
    (b'{"version": 1, "compiler_args": [], "inputs": [{"label": "x", "free": {}}], '
     b'"stored": [{"shapes": [[2, 5]], "executable": "neuronish-external:v1:00:1"}]}',
     "stored[0] 'shapes' must give each of the op's 1 input(s) a shape of its rank"),
    (b'{"version": 1, "compiler_args": [], "inputs": [{"label": "x", "free": {}}], '
     b'"stored": [{"shapes": [[2, 5, 8]], "executable": "assets/x.neff"}]}',
     "stored[0] needs an 'executable' external reference"),
])
def test_a_dynamic_shapes_attr_neuronish_did_not_write_is_refused(
        compiled: dict[str, Any], tmp_path: Path, attr: bytes, says: str) -> None:
    out = tmp_path / "compiled"
    shutil.copytree(compiled["out"], out)

    def damage(attrs: Any) -> None:  # noqa: ANN401 (a protobuf map)
        attrs["dynamic_shapes"].s = attr

    assert _set_neuron_op_attr(out, damage) >= 1
    r, _, _ = _call({**compiled, "out": out}, tmp_path, 2, compiled["probe"])
    assert r.returncode == 1 and "NeuronOp '" in r.stderr, r.stderr[-3000:]
    assert "its dynamic_shapes attr is not what neuronish writes (" in r.stderr, r.stderr[-3000:]
    assert says in r.stderr, r.stderr[-3000:]


def test_a_keras_hub_text_model_serves_any_length_without_python(tmp_path: Path) -> None:
    """A keras_hub BERT with a Dense head, exported with token_ids, segment_ids and
    padding_mask of [None, None] and compiled with no shape arguments: the C host runs it at
    lengths it was not compiled for, each compiled at run time, as TensorFlow computes it."""
    from tests.neuronish.test_free_dims import MAX_LENGTH, _free_text_model

    src, out = _free_text_model(tmp_path / "src"), tmp_path / "compiled"
    report = neuronish.saved_model.compile(src, str(out))
    assert report["OnNeuronRatio"] == 1.0 and report["free_dims"]
    ins, outs = _signature(Path(out))
    program, lib = _build_program(tmp_path / "tf_saved_model"), str(native_op_library.build())
    original = tf.saved_model.load(src).signatures["serving_default"]
    keys = sorted(ins)  # (the raw file holds the inputs in the order they are named)
    traces = tmp_path / "traces"
    for batch, length in ((1, 7), (3, MAX_LENGTH)):
        rng = np.random.default_rng(length)
        mask = np.ones((batch, length), np.int32)
        mask[0, length // 2 + 1:] = 0
        feeds = {"token_ids": rng.integers(0, 50, (batch, length)).astype(np.int32),
                 "segment_ids": rng.integers(0, 2, (batch, length)).astype(np.int32),
                 "padding_mask": mask}
        (tmp_path / "in.bin").write_bytes(b"".join(feeds[k].tobytes() for k in keys))
        shutil.rmtree(traces, ignore_errors=True)
        r = _run(program, "-l", lib, "-i", str(tmp_path / "in.bin"), "-o",
                 str(tmp_path / "out.bin"), str(out),
                 *(f"{ins[k]}=int32:{batch},{length}" for k in keys), "--", outs["output_0"],
                 NEURONISH_CC=COMPILER, NEURONISH_PROFILE=str(traces), NEURONISH_TELEMETRY="0")
        assert r.returncode == 0, r.stderr[-3000:]
        want = original(**{k: tf.constant(v) for k, v in feeds.items()})["output_0"].numpy()
        got = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.float32).reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        [path] = traces.iterdir()
        models = {e["args"]["model"] for e in
                  spans_by_category(json.loads(path.read_text()))["execute"]}
        assert any(m.endswith(f"x{length}") and "@" in m for m in models), models


def test_a_shape_compiled_at_run_time_holds_one_copy_as_in_the_python_host(
        compiled: dict[str, Any], tmp_path: Path) -> None:
    """model_config unbound: the op's own executable loads with up to four copies, each
    other shape's with one, as kernel_bridge.load loads them (each shape's executable holds
    its own weights). The C host loaded four of every shape: up to 4x the device memory.
    Read from the host's telemetry (what `neuronish ls` shows) while it calls in a loop."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    batch, length = 2, 5
    env = {**{k: v for k, v in os.environ.items() if k in ("PATH", "HOME")},
           "NEURONISH_COMPILE_CACHE": os.environ.get("NEURONISH_COMPILE_CACHE", "off"),
           "NEURONISH_FALLBACK": "0", "OMP_WAIT_POLICY": "passive", "TF_CPP_MIN_LOG_LEVEL": "2",
           "NEURONISH_CC": COMPILER, "NEURONISH_NUM_CORES": "4",
           "NEURONISH_RUN_DIR": str(run_dir), "NEURONISH_TELEMETRY": "1"}
    proc = subprocess.Popen([str(compiled["program"]), "-l", compiled["lib"], "-T", "1", "-S",
                             "0.3", str(compiled["out"]),
                             f"{compiled['x']}=float32:{batch},{length},8", "--",
                             compiled["y"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    probe, new = (f"neuron_op_0@{batch}x{n}x8" for n in (compiled["probe"], length))
    groups: dict[str, int] = {}
    held: dict[str, int] = {}
    try:
        while proc.poll() is None and new not in groups:
            time.sleep(0.1)
            for path in run_dir.glob("*.json"):
                try:
                    snapshot = json.loads(path.read_text())
                except (OSError, ValueError):  # (replaced while read: the next one)
                    continue
                groups = {m["name"]: len(m["core_groups"]) for m in snapshot["models"]}
                held = {m["name"]: sum(m["bytes_per_core"]) * len(m["core_groups"])
                        for m in snapshot["models"]}
    finally:
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    print(f"device memory held (bytes, all copies): {held}")
    assert groups == {probe: 4, new: 1}, groups
