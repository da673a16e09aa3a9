"""propagate_strides: a value only stride-s 1x1 convolutions read is computed at stride s.

The case is ResNet's stage boundary: a block ending in conv 3x3 -> conv 1x1 + residual ->
relu, read only by the next stage's stride-2 1x1 and its stride-2 projection shortcut.
After the pass the 3x3 runs at stride 2, the block's 1x1 and the readers at stride 1 on
the subsampled image, the residual is subsampled by a 1x1 max pool, and the numbers are
TensorFlow's (fp32 within 1e-4 on both engines; bf16 and int8 with the engines agreeing).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_executable
from neuronish.runtime import load
from neuronish.runtime.executable import to_bytes
from tests.graphs import trace

RNG = np.random.default_rng(3)


def _w(*shape: int) -> tf.Tensor:
    scale = (2.0 / np.prod(shape[:3])) ** 0.5
    return tf.constant((RNG.standard_normal(shape) * scale).astype(np.float32))


W0, W3, W1, WA, WB, WS = _w(1, 1, 32, 32), _w(3, 3, 16, 16), _w(1, 1, 16, 32), \
    _w(1, 1, 32, 16), _w(1, 1, 16, 32), _w(1, 1, 32, 32)


def _stage_boundary(also_3x3: bool = False, size: int = 15):  # noqa: ANN202
    """b = relu(1x1(x)), 32 channels -> 1x1 (relu) -> 3x3 (relu) -> 1x1 + b (relu) = y;
    y -> 1x1/2 -> 1x1 plus the shortcut 1x1/2 of y. With `also_3x3`, a 3x3 reads y too
    (every pixel is needed). `size` odd: the subsampled image keeps the last row and
    column."""
    wr = _w(3, 3, 32, 32)

    def fn(x: tf.Tensor) -> tuple[tf.Tensor, ...]:
        b = tf.nn.relu(tf.nn.conv2d(x, W0, 1, "SAME"))
        h = tf.nn.relu(tf.nn.conv2d(b, WA, 1, "SAME"))
        h = tf.nn.relu(tf.nn.conv2d(h, W3, 1, "SAME"))
        y = tf.nn.relu(tf.nn.conv2d(h, W1, 1, "SAME") + b)
        z = tf.nn.relu(tf.nn.conv2d(y, WA, 2, "VALID"))
        out = tf.nn.relu(tf.nn.conv2d(z, WB, 1, "SAME") + tf.nn.conv2d(y, WS, 2, "VALID"))
        return (out, tf.nn.conv2d(y, wr, 1, "SAME")) if also_3x3 else (out,)

    return trace(fn, tf.TensorSpec([None, size, size, 32], tf.float32, name="x"), batch=2)


def _convs(exe) -> list:  # noqa: ANN001
    return [i for i in exe.programs[0] if i.kind in ("conv2d", "conv2d_int8")]


def _run(exe, x: np.ndarray, engine: str, monkeypatch: pytest.MonkeyPatch) -> dict:  # noqa: ANN001
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    with load(to_bytes(exe), runtime="python") as model:
        return model.run({"x:0": x})


@pytest.mark.parametrize("size", [15, 16])
def test_the_stage_boundary_computes_only_what_the_strided_1x1s_read(
        size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = _stage_boundary(size=size)
    exe = compile_executable(g.graph_def, g.io_config)
    block_in, first, k3, block_end, down, up, shortcut = _convs(exe)
    assert block_in.attrs["strides"] == first.attrs["strides"] == [1, 1]
    # the stride moved up through the block's 1x1 to its 3x3, and stopped there
    assert k3.attrs["strides"] == [2, 2]
    assert block_end.attrs["strides"] == down.attrs["strides"] == shortcut.attrs["strides"] \
        == [1, 1]
    half = (size - 1) // 2 + 1
    assert exe.values[k3.outputs[0]][0] == (2, half, half, 16)
    assert exe.values[block_end.outputs[0]][0] == (2, half, half, 32)
    pool = next(i for i in exe.programs[0] if i.kind == "pool")  # the residual, subsampled
    assert pool.attrs["ksize"] == [1, 1] and pool.attrs["strides"] == [2, 2]
    assert block_end.inputs[-1] == pool.outputs[0]
    x = RNG.standard_normal((2, size, size, 32)).astype(np.float32)
    want = g.reference({"x:0": x})
    for engine in ("numpy", "native"):
        got = _run(exe, x, engine, monkeypatch)
        for k, v in want.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-4 * np.abs(v).max())


def test_a_value_a_wider_window_reads_keeps_every_pixel() -> None:
    g = _stage_boundary(also_3x3=True)
    exe = compile_executable(g.graph_def, g.io_config)
    assert all(c.attrs["strides"] == [1, 1] for c in _convs(exe)[:4])
    assert "pool" not in [i.kind for i in exe.programs[0]]


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_precision_engines_agree(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 and int8 (rest bf16): the subsampling pool runs in the residual's dtype (8-bit
    in int8, where it passes the shortcut's bytes on), and both engines agree."""
    g = _stage_boundary()
    calib = [[RNG.standard_normal((2, 15, 15, 32)).astype(np.float32)] for _ in range(3)]
    exe = compile_executable(g.graph_def, g.io_config, auto_cast="matmult",
                             calibration=calib if precision == "int8" else None)
    pool = next(i for i in exe.programs[0] if i.kind == "pool")
    want_dtype = "uint8" if precision == "int8" else "bfloat16"
    assert exe.values[pool.outputs[0]][1] == want_dtype
    if precision == "int8":
        assert [i.kind for i in exe.programs[0]].count("quantize") == 1  # the input only
    x = RNG.standard_normal((2, 15, 15, 32)).astype(np.float32)
    want = g.reference({"x:0": x})
    got = {e: _run(exe, x, e, monkeypatch) for e in ("numpy", "native")}
    for k, v in want.items():
        scale = np.abs(v).max()
        assert np.abs(got["numpy"][k] - v).max() / scale < 0.05
        np.testing.assert_allclose(got["native"][k], got["numpy"][k], rtol=1e-2, atol=1e-2 * scale)
