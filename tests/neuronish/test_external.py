"""Executables outside the graph (neuronish/external.py, export.py): above a threshold,
or when the graph would pass protobuf's 2 GiB, NeuronOp attributes are stored in the
SavedModel's assets/ under their hash; the kernel, the fallback, the model server and
`neuronish-cc inspect` read them. CI uses a tiny threshold; the >2 GiB model is
benchmarks/external_2gib.py."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import neuronish.saved_model
from neuronish import external
from tests.neuronish.test_compile_recovery import small_model
from tests.neuronish.test_fallback import _check_fell_back, _run
from tests.neuronish.test_saved_model_compile import assert_matches_original
from tests.serving.harness import copy_version, predict_request, running_server

NEURONISH_CC = str(Path(sys.executable).parent / "neuronish-cc")


def _neuron_op_attrs(model_dir: Path) -> list[tuple[bytes, bytes, int]]:
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((model_dir / "saved_model.pb").read_bytes())
    graph = saved.meta_graphs[0].graph_def
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return [(n.attr["executable"].s, n.attr["graph_def"].s, n.attr["n_external"].i)
            for n in nodes if n.op == "NeuronOp"]


@pytest.fixture(scope="module")
def external_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    tmp = tmp_path_factory.mktemp("external")
    src = small_model(tmp / "src")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEURONISH_EXTERNAL_THRESHOLD", "1KiB")
        neuronish.saved_model.compile(src, str(tmp / "compiled"), batch_size=2)
    return src, tmp / "compiled"


def test_large_attributes_go_to_assets_by_hash(external_model: tuple[str, Path],
                                               tmp_path: Path) -> None:
    src, compiled = external_model
    ((exe_ref, graph_ref, n_external),) = _neuron_op_attrs(compiled)
    assert n_external == 2
    files = {p.name: p.read_bytes() for p in (compiled / "assets").iterdir()}
    for ref, suffix in ((exe_ref, ".neff"), (graph_ref, ".pb")):
        digest, size = external.parse_reference(ref)
        data = files[digest + suffix]
        assert len(data) == size and hashlib.sha256(data).hexdigest() == digest
    # Runs on the device, from wherever the model is moved to (asset paths follow it).
    moved = tmp_path / "moved"
    shutil.move(str(compiled), moved)
    try:
        assert_matches_original(src, moved, tmp_path)
    finally:
        shutil.move(str(moved), compiled)


def test_small_attributes_stay_inline(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    neuronish.saved_model.compile(src, str(tmp_path / "out"))
    ((exe, graph, n_external),) = _neuron_op_attrs(tmp_path / "out")
    assert n_external == 0 and exe.startswith(b"NRNISHEX")
    assert external.parse_reference(exe) is None and external.parse_reference(graph) is None
    ((info, stored),) = _inspect_dir(tmp_path / "out")
    assert stored == "inline" and info["bytes"] == len(exe)


def test_a_megabyte_attribute_goes_to_assets_by_default(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The default threshold is 1 MiB: a 2 MiB weight's executable and subgraph are files
    (inline, each would cost a TensorFlow process ~11x its size while loaded)."""
    monkeypatch.delenv("NEURONISH_EXTERNAL_THRESHOLD", raising=False)
    assert external.threshold_from_env() == 1 << 20
    module = tf.Module()
    module.w = tf.Variable(np.random.default_rng(1).standard_normal((64, 8192)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.nn.relu(tf.matmul(x, module.w))}

    src = str(tmp_path / "src")
    tf.saved_model.save(module, src, signatures={"serving_default": serve})
    neuronish.saved_model.compile(src, str(tmp_path / "out"), batch_size=2)
    ((exe_ref, graph_ref, n_external),) = _neuron_op_attrs(tmp_path / "out")
    assert n_external == 2
    for ref in (exe_ref, graph_ref):
        digest, size = external.parse_reference(ref)
        assert 2 << 20 <= size < 3 << 20
    assert (tmp_path / "out" / "saved_model.pb").stat().st_size < 1 << 20
    assert_matches_original(src, tmp_path / "out", tmp_path)


def _inspect_dir(model_dir: Path) -> list[tuple[dict, str]]:
    r = subprocess.run([NEURONISH_CC, "inspect", str(model_dir), "--json"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    infos = json.loads(r.stdout)
    assert all([s["name"] for s in i["inputs"]] == ["x:0"] for i in infos)
    return [(i, i["stored"]) for i in infos]


def test_a_damaged_asset_falls_back_or_is_named(external_model: tuple[str, Path],
                                               tmp_path: Path) -> None:
    src, compiled = external_model
    damaged = tmp_path / "damaged"
    shutil.copytree(compiled, damaged)
    (neff,) = (damaged / "assets").glob("*.neff")
    data = bytearray(neff.read_bytes())
    data[100] ^= 1
    neff.write_bytes(bytes(data))
    _check_fell_back(_run(damaged, tmp_path), src, tmp_path, "sha256 mismatch")
    errors = _errors(_run(damaged, tmp_path, NEURONISH_FALLBACK="0"))
    assert errors and all(neff.name in e and "sha256 mismatch" in e for e in errors), errors
    neff.unlink()
    errors = _errors(_run(damaged, tmp_path, NEURONISH_FALLBACK="0"))
    assert errors and all("copy the whole SavedModel directory" in e for e in errors), errors


def _errors(r: subprocess.CompletedProcess[str]) -> list[str]:
    """The messages of the calls that failed in a fallback._RUN process (which goes on)."""
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert not got["outs"], got
    return [message for _, message in got["errors"]]


def test_model_server_serves_external_executables(external_model: tuple[str, Path],
                                                  tmp_path: Path) -> None:
    import tensorflow as tf

    src, compiled = external_model
    copy_version(str(compiled), tmp_path / "models" / "ext", 1)
    x = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    want = tf.saved_model.load(src).signatures["serving_default"](x=tf.constant(x))["y"]
    with running_server(["--model_name=ext", f"--model_base_path={tmp_path / 'models' / 'ext'}"],
                        tmp_path, {"ext": [1]}) as server:
        response = server.predictions.Predict(predict_request("ext", {"x": x}), timeout=60)
    got = tf.make_ndarray(response.outputs["y"])
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


def test_inspect_reads_an_asset(external_model: tuple[str, Path], tmp_path: Path) -> None:
    _, compiled = external_model
    (neff,) = (compiled / "assets").glob("*.neff")
    r = subprocess.run([NEURONISH_CC, "inspect", str(neff)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "x:0" in r.stdout, r.stderr
    # The SavedModel itself: the op's executable found through its reference.
    ((info, stored),) = _inspect_dir(compiled)
    assert stored == str(neff) and info["bytes"] == neff.stat().st_size
    damaged = tmp_path / "damaged"
    shutil.copytree(compiled, damaged)
    (bad,) = (damaged / "assets").glob("*.neff")
    data = bad.read_bytes()
    bad.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    r = subprocess.run([NEURONISH_CC, "inspect", str(damaged)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "sha256 mismatch" in r.stderr and "Traceback" not in r.stderr


def test_plan_keeps_the_graph_under_the_limit() -> None:
    # Over the threshold: outside. Then the largest, until the rest fits.
    assert external.plan([10, 500, 300, 5], rest=50, threshold=400, limit=1000) == \
        [False, True, False, False]
    assert external.plan([10, 500, 300, 5], rest=50, threshold=10**9, limit=300) == \
        [False, True, True, False]
    assert external.plan([1], rest=0, threshold=10**9) == [False]


def test_assets_are_the_compilers_files_linked_not_copied(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The executable neuronish-cc wrote and the subgraph it read become the assets
    themselves (hard links: the same file, never read and written again), byte for byte
    what the references name; the model runs from them; the scratch directory the
    compile worked in next to the new model is gone."""
    src = small_model(tmp_path / "src")
    monkeypatch.setenv("NEURONISH_EXTERNAL_THRESHOLD", "1KiB")
    monkeypatch.setenv("NEURONISH_COMPILE_CACHE", "off")  # a cache hit has no compiler file
    report = neuronish.saved_model.compile(src, str(tmp_path / "out"), batch_size=2,
                                           compiler_workdir=str(tmp_path / "work"))
    (op,) = report["NeuronOps"]
    ((exe_ref, graph_ref, _),) = _neuron_op_attrs(tmp_path / "out")
    job = tmp_path / "work" / op["name"]
    for ref, asset_suffix, job_file in ((exe_ref, ".neff", job / f"{op['name']}.neff"),
                                        (graph_ref, ".pb", job / "graph.pb")):
        digest, size = external.parse_reference(ref)
        asset = tmp_path / "out" / "assets" / (digest + asset_suffix)
        assert asset.samefile(job_file)
        data = asset.read_bytes()
        assert len(data) == size and hashlib.sha256(data).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src", "work"]
    assert_matches_original(src, tmp_path / "out", tmp_path)


def test_an_interrupted_compile_leaves_nothing(tmp_path: Path) -> None:
    """Stopped while its compiler runs (here: the progress callback raises): no new model,
    no scratch, staging or temporary files next to where it would have been."""
    src = small_model(tmp_path / "src")

    def interrupt(done: int, total: int, result: object) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        neuronish.saved_model.compile(src, str(tmp_path / "out"), progress=interrupt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_bad_threshold_is_refused_before_the_compile(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Named before any compiler runs (it was read only when the model was written)."""
    src = small_model(tmp_path / "src")
    monkeypatch.setenv("NEURONISH_EXTERNAL_THRESHOLD", "lots")
    ran = tmp_path / "compiler-ran"
    monkeypatch.setenv("NEURONISH_CC", f"sh -c 'touch {ran}; exit 1'")
    monkeypatch.setenv("NEURONISH_COMPILE_CACHE", "off")
    with pytest.raises(ValueError, match="NEURONISH_EXTERNAL_THRESHOLD='lots'"):
        neuronish.saved_model.compile(src, str(tmp_path / "out"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
