"""`--auto-cast` to bf16 end to end (cc/passes/dtypes.py): values between bf16-capable
instructions are bfloat16, conversions sit only at region edges, both engines compute
the same numbers, and the error against TensorFlow's float32 stays at bf16's scale."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from neuronish.runtime.executable import from_bytes
from tests.graphs import trace

RNG = np.random.default_rng(5)


def _w(*shape: int) -> tf.Tensor:
    scale = (2 / np.prod(shape[:-1])) ** 0.5  # He initialisation: activations stay O(1)
    return tf.constant((RNG.standard_normal(shape) * scale).astype(np.float32))


W1, W2, W3, B2 = _w(3, 3, 3, 16), _w(3, 3, 16, 16), _w(1, 1, 16, 16), tf.constant(
    RNG.standard_normal(16).astype(np.float32) * 0.1)
DW = _w(3, 3, 16, 1)
FC = _w(16, 10)


def _resnet_block(x: tf.Tensor) -> tf.Tensor:
    """conv-relu, max pool, residual block (conv+bias+add+relu), depthwise, global mean,
    dense, softmax: a ResNet/MobileNet in miniature."""
    h = tf.nn.relu(tf.nn.conv2d(x, W1, 1, "SAME"))
    h = tf.nn.max_pool2d(h, 2, 2, "VALID")
    r = tf.nn.relu(tf.nn.conv2d(h, W2, 1, "SAME") + B2 + h)
    r = tf.nn.relu6(tf.nn.depthwise_conv2d(r, DW, [1, 1, 1, 1], "SAME"))
    r = tf.nn.avg_pool2d(tf.nn.conv2d(r, W3, 1, "SAME"), 2, 2, "VALID")
    return tf.nn.softmax(tf.reduce_mean(r, axis=[1, 2]) @ FC)


@pytest.fixture(scope="module")
def compiled() -> tuple:
    g = trace(_resnet_block, tf.TensorSpec([2, 16, 16, 3], tf.float32, name="x"))
    return g, compile_graph(g.graph_def, g.io_config, auto_cast="matmult")


def _program(exe: bytes) -> list:
    return [i for p in from_bytes(exe).programs for i in p]


def test_values_between_convolutions_are_bf16_and_cast_only_at_the_edges(compiled) -> None:
    _, exe = compiled
    e = from_bytes(exe)
    kinds = [(i.kind, e.values[i.outputs[0]][1]) for i in _program(exe)]
    casts = [dtype for kind, dtype in kinds if kind == "cast"]
    # One region: in, the image; out, after the softmax (bf16 too), for the output.
    assert casts == ["bfloat16", "float32"], kinds
    for kind, dtype in kinds:
        if kind in ("conv2d", "depthwise_conv2d", "pool", "reduce", "matmul"):
            assert dtype == "bfloat16", kinds


@pytest.mark.parametrize("engine", ["numpy", "native"])
def test_both_engines_match_tf_within_bf16_error(compiled, engine: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    g, exe = compiled
    x = RNG.standard_normal((2, 16, 16, 3)).astype(np.float32)
    with load(exe, runtime="python") as model:
        got = model.run({"x:0": x})
        program = model._idle.get()
        model._idle.put(program)
        if engine == "native":  # every instruction, bf16 ones included, on oneDNN
            assert not [st.native.rejected for st in program.stages if st.native.rejected]
    for key, want in g.reference({"x:0": x}).items():
        assert got[key].dtype == np.float32
        err = np.max(np.abs(got[key] - want)) / np.max(np.abs(want))
        assert 0 < err < 2e-2, err  # bf16 rounding happened, and no more than bf16's scale


def test_the_engines_agree_with_each_other(compiled, monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy reference defines the bf16 semantics (round once after the epilogue); the
    native engine's oneDNN primitives must land on the same numbers up to summation order."""
    _, exe = compiled
    x = RNG.standard_normal((2, 16, 16, 3)).astype(np.float32)
    out = {}
    for engine in ("numpy", "native"):
        monkeypatch.setenv("NEURONISH_ENGINE", engine)
        with load(exe) as model:
            out[engine] = model.run({"x:0": x})
    for key in out["numpy"]:
        np.testing.assert_allclose(out["native"][key], out["numpy"][key], rtol=1e-2, atol=2e-3)


def test_fp32_and_fp16_keep_float32_values() -> None:
    g = trace(_resnet_block, tf.TensorSpec([2, 16, 16, 3], tf.float32, name="x"))
    for options in ({}, {"auto_cast": "matmult", "auto_cast_type": "fp16"}):
        exe = compile_graph(g.graph_def, g.io_config, **options)
        e = from_bytes(exe)
        assert all(e.values[i.outputs[0]][1] != "bfloat16" for i in _program(exe))
        assert "cast" not in [i.kind for i in _program(exe)]


def test_inspect_shows_the_value_dtypes(compiled, tmp_path) -> None:  # noqa: ANN001
    import subprocess
    import sys
    from pathlib import Path

    _, exe = compiled
    path = tmp_path / "model.neff"
    path.write_bytes(exe)
    cli = Path(sys.executable).parent / "neuronish-cc"
    r = subprocess.run([str(cli), "inspect", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "values written, by dtype" in x)
    assert "bfloat16 x" in line and "float32 x" in line, line
