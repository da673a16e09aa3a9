"""neuronish-cc as a user runs it: a real subprocess, exit codes, messages, outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc import __version__
from neuronish.cc.identity import source_digest
from neuronish.cc.ops.registry import LOWERINGS
from tests.graphs import dense_relu, trace

BIN = Path(sys.executable).parent


def cc(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "neuronish-cc"), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _write(tmp_path: Path, graph_def: bytes, name: str = "g.pb") -> Path:
    p = tmp_path / name
    p.write_bytes(graph_def)
    return p


def test_version_and_usage() -> None:
    r = cc("--version")
    # The sources' digest is part of the version: what the compile caches of both hosts key on.
    assert r.returncode == 0 and r.stdout.strip() == \
        f"neuronish-cc {__version__} (sources sha256:{source_digest()})"
    assert cc("compile").returncode == 2
    assert cc("frobnicate").returncode == 2


def test_list_operators_is_the_registry() -> None:
    r = cc("list-operators", "--framework", "TENSORFLOW")
    assert r.returncode == 0
    assert r.stdout.split() == sorted(LOWERINGS)
    for op in ("Conv2D", "MatMul", "FusedBatchNormV3", "StridedSlice", "Placeholder", "Const"):
        assert op in r.stdout.split()


def test_a_reader_that_goes_away_is_not_a_crash() -> None:
    """`neuronish-cc list-operators | head -1`: the pipe closes before the output is
    written. Here it is closed before the process starts, so the write always fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([str(BIN / "neuronish-cc"), "list-operators", "--framework",
                            "TENSORFLOW"], stdout=write_end, stderr=subprocess.PIPE, text=True,
                           timeout=120)
    finally:
        os.close(write_end)
    assert r.returncode == 141, r.stderr  # 128 + SIGPIPE, as `ls | head` would end
    assert r.stderr == ""  # no traceback, no "Exception ignored" from the final flush


def test_compile_inspect_run(tmp_path: Path) -> None:
    g = dense_relu(batch=4)
    pb = _write(tmp_path, g.graph_def)
    out = tmp_path / "model.neff"
    r = cc("compile", str(pb), "--framework", "TENSORFLOW", "--io-config",
           json.dumps(g.io_config), "--output", str(out), "--workdir", str(tmp_path / "work"))
    assert r.returncode == 0, r.stderr
    assert out.exists()
    assert (tmp_path / "work" / "dumps" / "000_lowered.txt").exists()
    assert "matmul" in (tmp_path / "work" / "dumps" / "000_lowered.txt").read_text()
    r = cc("inspect", str(out))
    assert r.returncode == 0 and "x:0" in r.stdout and "float32[4, 16]" in r.stdout
    info = json.loads(cc("inspect", str(out), "--json").stdout)
    assert info["inputs"][0]["shape"] == [4, 16]
    assert info["instruction_kinds"] == {"matmul": 1}  # bias and relu fused
    x = np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([str(BIN / "neuronish"), "run", str(out), "--input", f"x:0={tmp_path}/x.npy",
                        "--output-dir", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out" / "Identity_0.npy")
    np.testing.assert_allclose(got, g.reference({"x:0": x})["Identity:0"], rtol=1e-5, atol=1e-6)


def test_list_operators_json_names_the_nodes_the_compiler_refuses(tmp_path: Path) -> None:
    def fn(x):
        y = tf.nn.relu(x)
        pooled = tf.nn.max_pool2d(y, ksize=[1, 1, 1, 2], strides=[1, 1, 1, 2], padding="VALID")
        return tf.nn.max_pool2d(pooled, ksize=2, strides=2, padding="VALID")

    graph = trace(fn, tf.TensorSpec([1, 4, 4, 4], tf.float32, name="x"))
    path = _write(tmp_path, graph.graph_def)
    r = cc("list-operators", "--framework", "TENSORFLOW", "--json", "--check", str(path))
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert set(answer["operators"]) == set(LOWERINGS)
    assert answer["operators"]["MaxPool"]["attribute_checks"] is True
    # Only the pool over channels is refused, with the reason `compile` would give.
    (node, reason), = answer["refused"].items()
    assert node.startswith("MaxPool") and "ksize" in reason and "H and W" in reason, node
    assert cc("list-operators", "--framework", "TENSORFLOW", "--check", str(path)).returncode == 2
    r = cc("list-operators", "--framework", "TENSORFLOW", "--json", "--check", str(tmp_path))
    assert r.returncode == 1 and str(tmp_path) in r.stderr


def _assert_refused(r: subprocess.CompletedProcess, out: Path, *needles: str) -> None:
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert needle in r.stderr, f"{needle!r} not in:\n{r.stderr}"
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}*")), "temporary file left behind"


def test_unsupported_ops_are_all_named(tmp_path: Path) -> None:
    def fn(x: tf.Tensor) -> tf.Tensor:
        y = tf.math.cumulative_logsumexp(x, axis=1, name="running_total")
        y = tf.nn.relu(y)
        return tf.math.bincount(tf.cast(y, tf.int32), minlength=4, name="histogram")

    g = trace(fn, tf.TensorSpec([2, 3], tf.float32, name="x"))
    out = tmp_path / "m.neff"
    r = cc("compile", str(_write(tmp_path, g.graph_def)), "--framework", "TENSORFLOW",
           "--io-config", json.dumps(g.io_config), "--output", str(out),
           "--workdir", str(tmp_path / "w"))
    _assert_refused(r, out, "running_total (CumulativeLogsumexp)", "DenseBincount",
                    "list-operators")
    errors = json.loads((tmp_path / "w" / "errors.json").read_text())
    assert {n["op"] for n in errors["nodes"]} >= {"CumulativeLogsumexp", "DenseBincount"}


def test_nchw_is_refused_with_reason(tmp_path: Path) -> None:
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, 3, 8, 8], name="x")
        w = tf.constant(np.ones((3, 3, 3, 4), np.float32))
        tf.nn.conv2d(x, w, strides=1, padding="SAME", data_format="NCHW", name="conv_nchw")
    io = {"inputs": {"x:0": [[1, 3, 8, 8], "float32"]}, "outputs": ["conv_nchw:0"]}
    out = tmp_path / "m.neff"
    r = cc("compile", str(_write(tmp_path, g.as_graph_def().SerializeToString())), "--framework",
           "TENSORFLOW", "--io-config", json.dumps(io), "--output", str(out))
    _assert_refused(r, out, "conv_nchw (Conv2D)", "NCHW")


def test_failure_keeps_an_existing_output(tmp_path: Path) -> None:
    g = dense_relu()
    out = tmp_path / "m.neff"
    out.write_bytes(b"previous")
    io = {"inputs": g.io_config["inputs"], "outputs": ["nope:0"]}
    r = cc("compile", str(_write(tmp_path, g.graph_def)), "--framework", "TENSORFLOW",
           "--io-config", json.dumps(io), "--output", str(out))
    assert r.returncode == 1 and "nope:0" in r.stderr and "does not exist" in r.stderr
    assert out.read_bytes() == b"previous"


def _every_kind_of_problem() -> tuple[bytes, dict, dict[str, str]]:
    """One graph, one io-config, every kind of problem: the expected {node: op} named."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, 3, 8, 8], name="x")
        v = tf.compat.v1.placeholder(tf.float32, [2, 3], name="v")
        s = tf.compat.v1.placeholder(tf.int32, [2], name="s")
        y = tf.compat.v1.placeholder(tf.float32, [None, 4], name="y")
        z = tf.compat.v1.placeholder(tf.float32, [3], name="z")
        tf.math.cumulative_logsumexp(v, axis=1, name="running_total")      # op type
        tf.nn.conv2d(x, tf.ones([3, 3, 3, 4]), strides=1, padding="SAME",
                     data_format="NCHW", name="conv_nchw")                   # attribute value
        tf.reshape(v, s, name="reshaped")                                   # computed operand
        tf.tanh(y, name="from_unknown")                                     # below a bad input
        tf.identity(z, name="from_z")
        tf.nn.relu(v, name="ok")
    io = {"inputs": {"x:0": [[1, 3, 8, 8], "float32"], "v:0": [[2, 3], "float32"],
                     "s:0": [[2], "int32"],
                     "y:0": [[-1, 4], "float32"],      # unknown shape
                     "z:1": [[3], "float32"]},         # an output the Placeholder lacks
          "outputs": ["running_total:0", "conv_nchw:0", "reshaped:0", "from_unknown:0",
                      "from_z:0", "ok:2",              # an output Relu lacks
                      "ghost:0"]}                      # a node that does not exist
    named = {"y": "Placeholder", "z": "Placeholder", "ok": "Relu", "ghost": "",
             "running_total": "CumulativeLogsumexp", "conv_nchw": "Conv2D", "reshaped": "Reshape"}
    return g.as_graph_def().SerializeToString(), io, named


def test_every_problem_is_named_in_one_compile(tmp_path: Path) -> None:
    """io-config names, unknown shapes, op types, attribute values and computed operands,
    all in one message and one errors.json: the user fixes everything in one round."""
    graph_def, io, named = _every_kind_of_problem()
    out, work = tmp_path / "m.neff", tmp_path / "w"
    r = cc("compile", str(_write(tmp_path, graph_def)), "--framework", "TENSORFLOW",
           "--io-config", json.dumps(io), "--output", str(out), "--workdir", str(work))
    _assert_refused(r, out, "7 problem(s)", "y (Placeholder): io-config input 'y:0' has shape "
                    "[-1, 4]", "'z:1'", "ghost:0", "'ok:2'",
                    "running_total (CumulativeLogsumexp)", "conv_nchw (Conv2D)", "NCHW",
                    "reshaped (Reshape)", "compile-time constant",
                    str(work / "errors.json"))
    assert "internal compiler error" not in r.stderr
    assert "NEURONISH_DUMP_DIR" not in r.stderr  # nothing was lowered, so nothing to dump
    errors = json.loads((work / "errors.json").read_text())
    assert errors["error"] == "UnsupportedNodes"
    assert {n["node"]: n["op"] for n in errors["nodes"]} == named
    assert all(set(n) == {"node", "op", "reason", "hint"} and n["reason"]
               for n in errors["nodes"])
    # Nodes below a failed one are explained by it, not listed again.
    assert not {"from_unknown", "from_z"} & {n["node"] for n in errors["nodes"]}
    assert not (work / "dumps").exists()


def test_feeding_an_output_a_placeholder_lacks(tmp_path: Path) -> None:
    """"x:1" on a Placeholder (one output) is a user error with a fix, not a KeyError."""
    g = dense_relu()
    out = tmp_path / "m.neff"
    io = {"inputs": {"x:1": [[4, 16], "float32"]}, "outputs": ["Identity:0"]}
    r = cc("compile", str(_write(tmp_path, g.graph_def)), "--framework", "TENSORFLOW",
           "--io-config", json.dumps(io), "--output", str(out))
    _assert_refused(r, out, "x (Placeholder): io-config input 'x:1'", "has 1 output(s) (x:0)",
                    "feed x:0 instead")
    assert "internal compiler error" not in r.stderr and "KeyError" not in r.stderr
    assert "--workdir DIR to get DIR/errors.json" in r.stderr


@pytest.mark.parametrize("io, needle", [
    ({"inputs": {"x:0": [[-1, 16], "float32"]}, "outputs": ["Identity:0"]}, "not fully known"),
    ({"inputs": {"x:0": [[4, 16], "float32"]}, "outputs": ["missing:0"]}, "missing:0"),
    ({"inputs": {"ghost:0": [[4, 16], "float32"]}, "outputs": ["Identity:0"]}, "ghost:0"),
    ({"inputs": {}, "outputs": ["Identity:0"]}, "x (Placeholder): this input is not fed"),
    ({"inputs": {"x:0": [[4, 16], "int32"]}, "outputs": ["Identity:0"]}, "dtype float32"),
    ({"inputs": {"x:0": [[4, 16], "float32"]}, "outputs": ["Identity:3"]}, "has 1 output(s)"),
    ({"inputs": {"x:0": [[4, 17], "float32"]}, "outputs": ["Identity:0"]}, "shape [-1, 16]"),
    ({"inputs": {"x:0": [[4, 16], "string"]}, "outputs": ["Identity:0"]}, "does not hold"),
    ({"inputs": {"x:0": [[4, 16], "float32", 2]}, "outputs": ["Identity:0"]}, "batch axis 2"),
    ({"inputs": {"x:0": [[4, 16], "float32"]}, "outputs": {"Identity:0": 5}},
     "output 'Identity:0' has batch axis 5, outside its shape [4, 8]"),
])
def test_io_config_that_does_not_fit_is_refused(tmp_path: Path, io: dict, needle: str) -> None:
    g = dense_relu()
    out = tmp_path / "m.neff"
    r = cc("compile", str(_write(tmp_path, g.graph_def)), "--framework", "TENSORFLOW",
           "--io-config", json.dumps(io), "--output", str(out))
    _assert_refused(r, out, needle)


def test_a_scalar_input_cannot_have_a_batch_axis(tmp_path: Path) -> None:
    g = trace(lambda s: s * 2.0, tf.TensorSpec([], tf.float32, name="s"))
    out = tmp_path / "m.neff"
    io = {"inputs": {"s:0": [[], "float32", 0]}, "outputs": g.io_config["outputs"]}
    r = cc("compile", str(_write(tmp_path, g.graph_def)), "--framework", "TENSORFLOW",
           "--io-config", json.dumps(io), "--output", str(out))
    _assert_refused(r, out, "has batch axis 0, outside its shape []")


@pytest.mark.parametrize("io, needle", [
    ('{"inputs": {"x:0": [[4, 16], "float32"]}, "outputs": ["Identity:0"]',
     "not valid JSON"),
    ("no/such/io-config.json", "neither JSON nor a readable file"),
    ('["x:0"]', "top level"),
    ('{"inputs": {"x:0": [[4, 16], "float32"]}}', '"outputs"'),
    ('{"inputs": {"x:0": [[4, 16], "float32"]}, "outputs": ["Identity"]}', "'y:0'"),
    ('{"inputs": {"x": [[4, 16], "float32"]}, "outputs": ["Identity:0"]}', "'x:0'"),
    ('{"inputs": {"x:0": [["4", 16], "float32"]}, "outputs": ["Identity:0"]}', "list of ints"),
    ('{"inputs": {"x:0": [[4, 16]]}, "outputs": ["Identity:0"]}', "[shape, dtype]"),
])
def test_malformed_io_config_is_bad_usage(tmp_path: Path, io: str, needle: str) -> None:
    """An io-config that is not well-formed is a usage error (exit 2, docs/contracts.md), named."""
    g = dense_relu()
    out = tmp_path / "m.neff"
    r = cc("compile", str(_write(tmp_path, g.graph_def)), "--framework", "TENSORFLOW",
           "--io-config", io, "--output", str(out), "--workdir", str(tmp_path / "w"))
    assert r.returncode == 2, r.stderr
    assert "bad --io-config" in r.stderr and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not out.exists()
    assert json.loads((tmp_path / "w" / "errors.json").read_text())["error"] == "BadIOConfig"


def test_unreadable_graph(tmp_path: Path) -> None:
    out = tmp_path / "m.neff"
    bad = tmp_path / "bad.pb"
    bad.write_bytes(b"\x0a\xff\xff")
    r = cc("compile", str(bad), "--framework", "TENSORFLOW", "--io-config",
           '{"inputs": {}, "outputs": ["y:0"]}', "--output", str(out))
    _assert_refused(r, out, "cannot parse")


def test_dump_dir_from_environment(tmp_path: Path) -> None:
    import os

    g = dense_relu()
    env = {**os.environ, "NEURONISH_DUMP_DIR": str(tmp_path / "dumps")}
    r = cc("compile", str(_write(tmp_path, g.graph_def)), "--framework", "TENSORFLOW",
           "--io-config", json.dumps(g.io_config), "--output", str(tmp_path / "dense.neff"),
           env=env)
    assert r.returncode == 0, r.stderr
    files = sorted(p.name for p in (tmp_path / "dumps" / "dense").iterdir())
    from neuronish.cc.pipeline import build_pipeline

    names = [p.name for p in build_pipeline()]  # NNN counts from the lowered graph (000)
    assert files[0] == "000_lowered.txt"
    for i, name in enumerate(names, start=1):
        assert f"{i:03d}_{name}.txt" in files, (name, files)
    fused = (tmp_path / "dumps" / "dense" /
             f"{names.index('fuse_activation') + 1:03d}_fuse_activation.txt").read_text()
    assert "activation=relu" in fused and "# tf: MatMul, BiasAdd, Relu" in fused


def test_internal_error_exits_cleanly_with_errors_json(tmp_path: Path, monkeypatch,
                                                       capsys) -> None:
    """A compiler bug must not escape as a bare traceback: exit 1, a message that says it is
    a bug, errors.json for the partitioner, and nothing written to --output."""
    import neuronish.cc.compiler as compiler
    from neuronish.cc.cli import main

    def broken(*args: object, **kwargs: object) -> object:
        raise IndexError("list index out of range")

    monkeypatch.setattr(compiler, "compile_executable", broken)
    g = dense_relu()
    out, work = tmp_path / "m.neff", tmp_path / "work"
    code = main(["compile", str(_write(tmp_path, g.graph_def)), "--framework", "TENSORFLOW",
                 "--io-config", json.dumps(g.io_config), "--output", str(out),
                 "--workdir", str(work)])
    assert code == 1 and not out.exists()
    assert "internal compiler error: IndexError" in capsys.readouterr().err
    assert json.loads((work / "errors.json").read_text())["error"] == "InternalCompilerError"
