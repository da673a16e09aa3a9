"""The NeuronOp library for hosts without Python (neuronish/ops/neuron_op_native.cc):
it has no Python symbol to resolve, and a plain C program on TensorFlow's C API
(examples/c/tf_saved_model.c, built with gcc against the TF wheel's libraries) loads it
with TF_LoadLibrary, loads a SavedModel the real compiler compiled, and runs its
serving signature at the compiled batch and at another one, giving TensorFlow's
numbers on the original model; with the executable inline and stored in the assets."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import neuronish.saved_model
from neuronish import native_op_library
from tests.runtime import c_programs

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None,
                                reason="gcc and nm (binutils) are needed to build and inspect "
                                       "the C program and the op library")


def test_library_has_no_python_symbols() -> None:
    lib = native_op_library.build()
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], check=True,
                               capture_output=True, text=True).stdout.split()
    python = [s for s in undefined if s.startswith(("Py", "_Py"))]
    assert not python, f"{lib} needs Python symbols: {python[:10]}"
    # What it does need: the C runtime, for every call.
    assert "nr_execute_with" in undefined and "nr_model_load_bytes" in undefined
    needed = subprocess.run(["readelf", "-d", str(lib)], check=True, capture_output=True,
                            text=True).stdout
    assert "libneuronish_runtime" in needed and "libpython" not in needed


def test_cli_prints_the_library() -> None:
    r = subprocess.run([sys.executable, "-m", "neuronish.cli", "op-library"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(native_op_library.build())


class _TwoInputs(tf.Module):
    """relu(x @ w) @ v + z: two inputs (their order in the raw file matters), a batch axis."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.w = tf.Variable(rng.standard_normal((16, 32)).astype(np.float32))
        self.v = tf.Variable(rng.standard_normal((32, 8)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x"),
                                  tf.TensorSpec([None, 8], tf.float32, name="z")])
    def __call__(self, x: tf.Tensor, z: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.matmul(tf.nn.relu(tf.matmul(x, self.w)), self.v) + z}


def _signature(model_dir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """serving_default's input and output graph tensor names, by key."""
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((model_dir / "saved_model.pb").read_bytes())
    [meta] = [m for m in sm.meta_graphs if "serve" in m.meta_info_def.tags]
    sig = meta.signature_def["serving_default"]
    return ({k: v.name for k, v in sig.inputs.items()},
            {k: v.name for k, v in sig.outputs.items()})


def _build_program(out: Path) -> Path:
    return c_programs.build(ROOT / "examples" / "c" / "tf_saved_model.c", out,
                            cflags=("-pedantic",), tensorflow=True)


def _run(program: Path, *args: str, **env_vars: str) -> subprocess.CompletedProcess[str]:
    # No Python anywhere near it: a clean environment, no PYTHONPATH; the test's own compile
    # cache (tests/conftest.py), not the user's.
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
           "NEURONISH_COMPILE_CACHE": os.environ.get("NEURONISH_COMPILE_CACHE", "off"),
           "NEURONISH_FALLBACK": "0", "OMP_WAIT_POLICY": "passive",
           "TF_CPP_MIN_LOG_LEVEL": "2", **env_vars}
    return subprocess.run([str(program), *args], capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.mark.parametrize("external", [False, True], ids=["inline", "assets"])
def test_c_program_runs_the_compiled_model_as_tensorflow_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, external: bool) -> None:
    src, out = tmp_path / "src", tmp_path / "compiled"
    module = _TwoInputs()
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    if external:  # every executable and subgraph goes to assets/ (neuronish/external.py)
        monkeypatch.setenv("NEURONISH_EXTERNAL_THRESHOLD", "1")
    report = neuronish.saved_model.compile(str(src), str(out), batch_size=2)
    assert [op["outcome"] for op in report["NeuronOps"]] == ["compiled"]
    if external:
        assert list((out / "assets").glob("*.neff")), "the executable was not stored outside"
    ins, outs = _signature(out)
    src_ins, src_outs = _signature(src)
    assert ins == src_ins
    program = _build_program(tmp_path / "tf_saved_model")
    lib = str(native_op_library.build())
    original = tf.saved_model.load(str(src)).signatures["serving_default"]
    for batch in (2, 5):
        rng = np.random.default_rng(batch)
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        z = rng.standard_normal((batch, 8)).astype(np.float32)
        (tmp_path / "in.bin").write_bytes(x.tobytes() + z.tobytes())
        r = _run(program, "-l", lib, "-i", str(tmp_path / "in.bin"), "-o",
                 str(tmp_path / "out.bin"), str(out), f"{ins['x']}=float32:{batch},16",
                 f"{ins['z']}=float32:{batch},8", "--", outs["y"])
        assert r.returncode == 0, r.stderr
        want = original(x=tf.constant(x), z=tf.constant(z))["y"].numpy()
        [line] = r.stdout.splitlines()
        assert line.split()[:3] == [outs["y"], "float32", f"[{batch},8]"]
        got = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.float32).reshape(want.shape)
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert err <= 1e-4, f"batch {batch}: relative error {err:.1e}"
    # A shape the executable was not compiled for: the kernel's InvalidArgument, naming it.
    r = _run(program, "-l", lib, str(out), f"{ins['x']}=float32:2,17",
             f"{ins['z']}=float32:2,8", "--", outs["y"])
    assert r.returncode == 1 and "[INVALID_ARGUMENT] NeuronOp '" in r.stderr, r.stderr
    assert "input 'x:0' has shape [2,17]; expected float[*,16]" in r.stderr
    # Without the library TensorFlow does not know the op: the NeuronOp is what ran.
    r = _run(program, str(out), f"{ins['x']}=float32:2,16", f"{ins['z']}=float32:2,8", "--",
             outs["y"])
    assert r.returncode == 1 and "NeuronOp" in r.stderr, r.stderr
    if external:  # an asset cut short: refused before the device reads it
        [neff] = (out / "assets").glob("*.neff")
        size = neff.stat().st_size
        neff.write_bytes(neff.read_bytes()[:100])
        r = _run(program, "-l", lib, str(out), f"{ins['x']}=float32:2,16",
                 f"{ins['z']}=float32:2,8", "--", outs["y"])
        assert r.returncode == 1 and "NeuronOp '" in r.stderr, r.stderr
        assert f"has 100 bytes; the reference says {size}" in r.stderr
        # ... unless the fallback is on: then the subgraph (its own asset) computes it.
        x, z = np.full((2, 16), 0.5, np.float32), np.full((2, 8), -0.25, np.float32)
        (tmp_path / "in.bin").write_bytes(x.tobytes() + z.tobytes())
        r = _run(program, "-l", lib, "-i", str(tmp_path / "in.bin"), "-o",
                 str(tmp_path / "out.bin"), str(out), f"{ins['x']}=float32:2,16",
                 f"{ins['z']}=float32:2,8", "--", outs["y"], NEURONISH_FALLBACK="1",
                 TF_CPP_MIN_LOG_LEVEL="1")
        assert r.returncode == 0 and "it runs on TensorFlow instead" in r.stderr, r.stderr
        want = original(x=tf.constant(x), z=tf.constant(z))["y"].numpy()
        got = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.float32).reshape(2, 8)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_an_asset_replaced_by_another_valid_executable_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The asset's SHA-256 is checked, as the Python host checks it: an executable that is
    valid in itself (its own header checksum resealed) but not the one the op was compiled
    with, of the same size, is refused naming the file, not run."""
    from neuronish.runtime.executable import from_bytes, to_bytes

    src, out = tmp_path / "src", tmp_path / "compiled"
    module = _TwoInputs()
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    monkeypatch.setenv("NEURONISH_EXTERNAL_THRESHOLD", "1")
    neuronish.saved_model.compile(str(src), str(out), batch_size=2)
    ins, outs = _signature(out)
    [neff] = (out / "assets").glob("*.neff")
    exe = from_bytes(neff.read_bytes())
    vid = max(exe.constants, key=lambda v: exe.constants[v].size)  # a weight matrix
    exe.constants[vid] = exe.constants[vid] + 1
    forged = to_bytes(exe)
    assert len(forged) == neff.stat().st_size and forged != neff.read_bytes()
    from_bytes(forged)  # valid on its own: only the reference's digest tells it apart
    neff.write_bytes(forged)
    program = _build_program(tmp_path / "tf_saved_model")
    lib = str(native_op_library.build())
    r = _run(program, "-l", lib, str(out), f"{ins['x']}=float32:2,16",
             f"{ins['z']}=float32:2,8", "--", outs["y"])
    assert r.returncode == 1 and "[DATA_LOSS] NeuronOp '" in r.stderr, r.stderr
    assert f"{neff} does not hash to the executable the op was compiled with (sha256 " \
           "mismatch" in r.stderr, r.stderr
    assert "the file is damaged or was replaced" in r.stderr


class _Deep(tf.Module):
    """LAYERS x (16x16 MatMul + Relu): a call of many rows takes a while on the device."""

    LAYERS = 40

    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self.ws = [tf.Variable(rng.standard_normal((16, 16)).astype(np.float32) / 4)
                   for _ in range(self.LAYERS)]

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        for w in self.ws:
            x = tf.nn.relu(tf.matmul(x, w))
        return {"y": x}


def _set_neuron_op_attr(model_dir: Path, edit: Callable[[Any], None]) -> int:
    """Apply `edit` to the attrs of every NeuronOp in the SavedModel (its functions too)."""
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((model_dir / "saved_model.pb").read_bytes())
    count = 0
    for meta in sm.meta_graphs:
        nodes = [*meta.graph_def.node,
                 *(n for f in meta.graph_def.library.function for n in f.node_def)]
        for node in nodes:
            if node.op == "NeuronOp":
                edit(node.attr)
                count += 1
    (model_dir / "saved_model.pb").write_bytes(sm.SerializeToString())
    return count


def test_model_config_timeout_is_the_calls_deadline(tmp_path: Path) -> None:
    """timeout_s = 1 on an op, and a call of many rows (split into that many chunks):
    DeadlineExceeded naming the op; the same op at the compiled batch runs."""
    src, out = tmp_path / "src", tmp_path / "compiled"
    module = _Deep()
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    report = neuronish.saved_model.compile(str(src), str(out), batch_size=1)
    assert [op["outcome"] for op in report["NeuronOps"]] == ["compiled"]

    def one_second(attrs: Any) -> None:  # noqa: ANN401 (a protobuf map)
        attrs["model_config"].list.i[3] = 1  # [.., .., max_num_duplicates, timeout_s, ..]

    assert _set_neuron_op_attr(out, one_second) == 1
    ins, outs = _signature(out)
    program = _build_program(tmp_path / "tf_saved_model")
    lib = str(native_op_library.build())
    r = _run(program, "-l", lib, str(out), f"{ins['x']}=float32:1,16", "--", outs["y"])
    assert r.returncode == 0, r.stderr
    # 400k chunks of 40 instructions each: far more than a second on any CPU here.
    r = _run(program, "-l", lib, str(out), f"{ins['x']}=float32:400000,16", "--", outs["y"])
    assert r.returncode == 1 and "[DEADLINE_EXCEEDED] NeuronOp '" in r.stderr, r.stderr

    # Attrs that disagree with the executable (a broken rewrite): refused at load.
    def rename_output(attrs: Any) -> None:  # noqa: ANN401 (a protobuf map)
        attrs["output_names"].list.s[0] = b"renamed:0"

    _set_neuron_op_attr(out, rename_output)
    r = _run(program, "-l", lib, str(out), f"{ins['x']}=float32:1,16", "--", outs["y"])
    assert r.returncode == 1 and "[INVALID_ARGUMENT] NeuronOp '" in r.stderr, r.stderr
    assert "is 'renamed:0' (float) in the op's attrs but" in r.stderr


@pytest.mark.parametrize("external", [False, True], ids=["inline", "assets"])
def test_fallback_runs_the_subgraph_on_tensorflow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, external: bool) -> None:
    """A device too small for the executable: the op computes its graph_def on TensorFlow
    (split into compiled-size chunks, the last padded, at another batch) and says so once;
    with NEURONISH_FALLBACK=0 the device's error (ResourceExhausted) reaches the caller."""
    src, out = tmp_path / "src", tmp_path / "compiled"
    module = _TwoInputs()
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    if external:  # the subgraph too is an asset (<sha256>.pb)
        monkeypatch.setenv("NEURONISH_EXTERNAL_THRESHOLD", "1")
    neuronish.saved_model.compile(str(src), str(out), batch_size=2)
    if external:
        assert list((out / "assets").glob("*.pb")), "the subgraph was not stored outside"
    ins, outs = _signature(out)
    program = _build_program(tmp_path / "tf_saved_model")
    lib = str(native_op_library.build())
    original = tf.saved_model.load(str(src)).signatures["serving_default"]
    tiny = {"NEURONISH_CORE_MEMORY": "1KiB", "TF_CPP_MIN_LOG_LEVEL": "1"}
    for batch in (2, 5):
        rng = np.random.default_rng(batch)
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        z = rng.standard_normal((batch, 8)).astype(np.float32)
        (tmp_path / "in.bin").write_bytes(x.tobytes() + z.tobytes())
        args = ("-l", lib, "-i", str(tmp_path / "in.bin"), "-o", str(tmp_path / "out.bin"),
                str(out), f"{ins['x']}=float32:{batch},16", f"{ins['z']}=float32:{batch},8",
                "--", outs["y"])
        r = _run(program, *args, NEURONISH_FALLBACK="1", **tiny)
        assert r.returncode == 0, r.stderr
        assert r.stderr.count("it runs on TensorFlow instead") == 1, r.stderr
        assert "out of device memory" in r.stderr
        want = original(x=tf.constant(x), z=tf.constant(z))["y"].numpy()
        got = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.float32).reshape(want.shape)
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert err <= 1e-4, f"batch {batch}: relative error {err:.1e}"
        r = _run(program, *args, NEURONISH_FALLBACK="0", **tiny)
        assert r.returncode == 1 and "[RESOURCE_EXHAUSTED] NeuronOp '" in r.stderr, r.stderr
