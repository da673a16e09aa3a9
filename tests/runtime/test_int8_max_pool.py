"""int8 through a max pool (docs/int8.md): ResNet's stem, conv -> relu -> max pool ->
the first block's convolutions, passes uint8 from the stem to the block, with no
`quantize` after the pool; the pool runs natively on 8-bit values and both engines agree.
A max pool that a float instruction reads keeps the float edge.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_executable
from neuronish.runtime import load
from neuronish.runtime.executable import to_bytes
from neuronish.runtime.native import library
from neuronish.runtime.program import evaluate_one, one_instruction_program
from tests.graphs import trace

RNG = np.random.default_rng(5)


def _stem(pool_read_by_mean: bool = False):  # noqa: ANN202
    """3x3/2 conv + relu -> 3x3/2 max pool (SAME: padded windows) -> a 1x1 conv + relu and
    a 1x1 projection shortcut, added (the bottleneck's first and last convolutions); with
    `pool_read_by_mean`, the pool's mean is a second output (a float reader)."""
    w0 = tf.constant(RNG.standard_normal((3, 3, 3, 16)).astype(np.float32) * 0.3)
    w1 = tf.constant(RNG.standard_normal((1, 1, 16, 16)).astype(np.float32) * 0.2)
    w2 = tf.constant(RNG.standard_normal((1, 1, 16, 16)).astype(np.float32) * 0.2)
    w3 = tf.constant(RNG.standard_normal((1, 1, 16, 16)).astype(np.float32) * 0.2)

    def fn(x: tf.Tensor) -> tuple[tf.Tensor, ...]:
        y = tf.nn.relu(tf.nn.conv2d(x, w0, 2, "SAME"))
        p = tf.nn.max_pool2d(y, 3, 2, "SAME")
        h = tf.nn.relu(tf.nn.conv2d(p, w1, 1, "SAME"))
        out = tf.nn.relu(tf.nn.conv2d(h, w2, 1, "SAME") + tf.nn.conv2d(p, w3, 1, "SAME"))
        return (out, tf.reduce_mean(p, axis=[1, 2])) if pool_read_by_mean else (out,)

    return trace(fn, tf.TensorSpec([None, 16, 16, 3], tf.float32, name="x"), batch=2)


def _calibration() -> list[list[np.ndarray]]:
    return [[RNG.standard_normal((2, 16, 16, 3)).astype(np.float32)] for _ in range(3)]


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("auto_cast", ["none", "matmult"])
def test_the_stem_writes_uint8_through_its_max_pool(auto_cast: str, monkeypatch) -> None:  # noqa: ANN001
    g = _stem()
    exe = compile_executable(g.graph_def, g.io_config, calibration=_calibration(),
                             auto_cast=auto_cast)
    prog = exe.programs[0]
    kinds = [i.kind for i in prog]
    assert kinds.count("quantize") == 1 and kinds[0] == "quantize", kinds  # the image only
    stem = prog[1]
    pool = next(i for i in prog if i.kind == "pool")
    assert stem.kind == "conv2d_int8" and stem.attrs["out"] == "uint8"
    assert exe.values[pool.inputs[0]][1] == exe.values[pool.outputs[0]][1] == "uint8"
    readers = [i for i in prog if i.kind == "conv2d_int8" and pool.outputs[0] in i.inputs]
    assert len(readers) == 2  # both read the pool's bytes at the stem's step
    assert all(r.attrs["x_scale"] == stem.attrs["y_scale"] for r in readers), readers
    x = RNG.standard_normal((2, 16, 16, 3)).astype(np.float32)
    want = g.reference({"x:0": x})
    results = {}
    for engine in ("numpy", "native"):
        monkeypatch.setenv("NEURONISH_ENGINE", engine)
        with load(to_bytes(exe), runtime="python") as model:
            results[engine] = model.run({"x:0": x})
    for k, v in want.items():
        assert _rel(results["numpy"][k], v) < 0.05, _rel(results["numpy"][k], v)
        np.testing.assert_allclose(results["native"][k], results["numpy"][k], rtol=1e-2,
                                   atol=1e-2 * np.abs(v).max())


def test_a_max_pool_read_by_a_float_instruction_keeps_its_float_edge() -> None:
    g = _stem(pool_read_by_mean=True)
    exe = compile_executable(g.graph_def, g.io_config, calibration=_calibration())
    prog = exe.programs[0]
    pool = next(i for i in prog if i.kind == "pool")
    assert prog[1].kind == "conv2d_int8" and prog[1].attrs["out"] == "float32"
    assert exe.values[pool.outputs[0]][1] == "float32"
    assert [i.kind for i in prog].count("quantize") == 2  # the image, the pool's output


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("shape, window", [((2, 17, 17, 64), (3, 2, [1, 1, 1, 1])),
                                           ((1, 9, 8, 24), (2, 2, [0, 1, 0, 0])),
                                           # a subsample (cc/passes/strides.py): the last
                                           # row and column are never read
                                           ((2, 14, 14, 32), (1, 2, [0, 0, 0, 0]))])
def test_8_bit_max_pool_natively_matches_numpy(dtype: str, shape: tuple, window: tuple) -> None:
    """Exactly: a max over 8-bit values, padding ignored (the native engine runs it as
    oneDNN's int8 pooling)."""
    lib = library.load()
    assert lib is not None, library.why_not()
    k, s, pads = window
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, shape).astype(dtype)
    attrs = {"mode": "max", "ksize": [k, k], "strides": [s, s], "pads": pads}
    oh = (shape[1] + pads[0] + pads[1] - k) // s + 1
    ow = (shape[2] + pads[2] + pads[3] - k) // s + 1
    out = ((shape[0], oh, ow, shape[3]), dtype)
    want, engine = evaluate_one("pool", [x], attrs, [out])
    assert engine == "numpy"
    program, call_inputs = one_instruction_program("pool", [x], attrs, [out], native=lib,
                                                   threads=2)
    got = np.empty(*out)
    program.execute(call_inputs, [got])
    assert program.implementations()[0].startswith("jit"), program.implementations()
    np.testing.assert_array_equal(got, want[0])
