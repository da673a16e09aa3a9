"""Instructions the native engine runs with loops of its own (engine_loops.cc, engine_any_dtype.cc):
each is really taken by the engine (not left to numpy), matches TensorFlow as closely as
the reference engine does, and the compiler says which instructions numpy will run."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from neuronish.runtime.errors import ExecutionError
from neuronish.runtime.executable import from_bytes
from neuronish.runtime.native import library
from tests.graphs import trace
from tests.helpers import run_reporting_numpy

RNG = np.random.default_rng(11)
raw = tf.raw_ops


def _f32(*shape: int, lo: float = -3.0, hi: float = 3.0) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def _i32(*shape: int, lo: int = -9, hi: int = 9) -> np.ndarray:
    return RNG.integers(lo, hi, shape).astype(np.int32)


def _bool(*shape: int) -> np.ndarray:
    return RNG.uniform(size=shape) < 0.5


# (id, fn, inputs, rtol): float tolerances are TF's own ulps (libm vs Eigen), not looser.
CASES = [
    *[(f"unary-{name}", fn, [x], 2e-6) for name, fn, x in [
        ("erf", tf.math.erf, _f32(4, 33)), ("erfc", tf.math.erfc, _f32(4, 33)),
        ("log", tf.math.log, _f32(4, 33, lo=1e-3, hi=50)),
        ("softplus", tf.math.softplus, _f32(4, 33, lo=-30, hi=30)),
        ("log1p", tf.math.log1p, _f32(4, 33, lo=-0.9, hi=4)),
        ("expm1", tf.math.expm1, _f32(4, 33)), ("floor", tf.math.floor, _f32(4, 33)),
        ("sign", tf.math.sign, np.array([-2, 0, 3, -0.0], np.float32)),
        ("round", tf.math.round, np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.7], np.float32)),
        ("sin", tf.math.sin, _f32(4, 33, lo=-7, hi=7)),
        ("cos", tf.math.cos, _f32(4, 33, lo=-7, hi=7)),
        ("tan", tf.math.tan, _f32(4, 33, lo=-1.2, hi=1.2)),
        ("atan", tf.math.atan, _f32(4, 33, lo=-5, hi=5))]],
    ("logical_not", tf.math.logical_not, [_bool(3, 5)], 0),
    *[(f"unary-i32-{name}", fn, [np.array([-2**31, -7, -1, 0, 1, 5, 9, 2**31 - 1], np.int32)],
       0) for name, fn in [("abs", tf.math.abs), ("neg", tf.math.negative),
                           ("relu", tf.nn.relu), ("relu6", tf.nn.relu6),
                           ("sign", tf.math.sign), ("square", tf.math.square)]],
    ("pow-tensor", lambda a, b: tf.pow(a, b), [_f32(2, 3, 4, lo=0.1, hi=3), _f32(4)], 2e-6),
    ("pow-left-broadcast", lambda a, b: tf.pow(a, b), [_f32(4, lo=0.1, hi=3), _f32(2, 4)],
     2e-6),
    ("sub-left-broadcast", lambda a, b: a - b, [_f32(1, 4), _f32(3, 4)], 0),
    ("both-broadcast", lambda a, b: a * b, [_f32(3, 1), _f32(1, 4)], 0),
    ("floor_div-f32", tf.math.floordiv, [_f32(3, 4), _f32(4, lo=0.5, hi=2)], 0),
    ("floor_mod-f32", tf.math.floormod, [_f32(3, 4), _f32(4, lo=0.5, hi=2)], 1e-6),
    ("floor_div-i32", tf.math.floordiv, [_i32(3, 4), _i32(4, lo=1, hi=4) * -1], 0),
    ("floor_mod-i32", tf.math.floormod, [_i32(3, 4), _i32(4, lo=1, hi=4)], 0),
    ("add-i32", lambda a, b: a + b, [_i32(3, 4), _i32(4)], 0),
    ("mul-i32", lambda a, b: a * b, [_i32(3, 4), _i32(3, 4)], 0),
    ("max-i32", tf.math.maximum, [_i32(3, 4), _i32(1, 4)], 0),
    ("less-i32", tf.math.less, [_i32(3, 4), _i32(4)], 0),
    ("squared_difference-i32", tf.math.squared_difference, [_i32(3, 4), _i32(4)], 0),
    ("logical_and", tf.math.logical_and, [_bool(3, 4), _bool(4)], 0),
    ("logical_or", tf.math.logical_or, [_bool(3, 4), _bool(3, 4)], 0),
    # BERT's attention mask: a bool [B, 1, 1, S] picks scores [B, H, S, S] or a constant.
    ("select-mask", lambda m, s: tf.where(m, s, -1e9), [_bool(2, 1, 1, 8), _f32(2, 3, 8, 8)],
     0),
    ("select-i32", lambda m, a, b: tf.where(m, a, b), [_bool(3, 1), _i32(3, 4), _i32(4)], 0),
    ("gather-rows", lambda i: tf.gather(tf.constant(_f32(50, 16)), i), [_i32(2, 7, lo=0, hi=50)],
     0),
    ("gather-axis1", lambda p, i: tf.gather(p, i, axis=1), [_f32(3, 6, 5), _i32(4, lo=0, hi=6)],
     0),
    ("strided_slice", lambda x: x[:, 1:7:2, ::-1], [_f32(3, 8, 5)], 0),
    ("first-token", lambda x: x[:, 0, :], [_f32(4, 9, 16)], 0),
    ("broadcast_to", lambda x: tf.broadcast_to(x, [3, 4, 5]), [_f32(4, 1)], 0),
    ("tile", lambda x: tf.tile(x, [2, 3]), [_i32(3, 4)], 0),
    ("pad-f32", lambda x: tf.pad(x, [[1, 2], [0, 3]], constant_values=-1.5), [_f32(3, 4)], 0),
    ("pad-i32", lambda x: tf.pad(x, [[0, 1], [2, 0], [1, 1]]), [_i32(2, 3, 4)], 0),
    ("log_softmax", tf.nn.log_softmax, [_f32(5, 33, lo=-20, hi=20)], 1e-6),
    ("log_softmax-axis1", lambda x: tf.nn.log_softmax(x, axis=1), [_f32(3, 17, 6, lo=-20,
                                                                        hi=20)], 1e-6),
    ("cast-f32-i32", lambda x: tf.cast(x, tf.int32), [_f32(3, 7, lo=-50, hi=50)], 0),
    ("cast-i32-bool", lambda x: tf.cast(x, tf.bool), [_i32(3, 7, lo=-2, hi=2)], 0),
    ("cast-f32-bool", lambda x: tf.cast(x, tf.bool),
     [np.array([0.0, -0.0, 1.5, np.nan], np.float32)], 0),
    # The kinds of engine.cc's last loop section (op codes 20-25).
    ("argmax-i64", lambda x: tf.math.argmax(x, axis=1), [_f32(3, 7, 5)], 0),
    ("argmin-i32", lambda x: tf.math.argmin(x, axis=2, output_type=tf.int32),
     [_i32(3, 4, 9, lo=-3, hi=3)], 0),  # ties: the first extreme
    ("argmax-last", lambda x: tf.math.argmax(x, axis=-1, output_type=tf.int32),
     [_f32(6, 1000)], 0),
    # (-0.0 and 0.0 tie: the first. With a NaN TF skips it, numpy and this engine pick it.)
    ("argmin-zeros-inf", lambda x: tf.math.argmin(x, axis=1, output_type=tf.int32),
     [np.array([[0.0, -0.0, 1, 0], [2, 1, 1, -np.inf], [1, -0.0, 0.0, 5]], np.float32)], 0),
    ("cumsum", lambda x: tf.math.cumsum(x, axis=1), [_f32(3, 50, 4)], 0),
    ("cumsum-exclusive-reverse", lambda x: tf.math.cumsum(x, axis=0, exclusive=True,
                                                          reverse=True), [_f32(9, 5)], 0),
    ("cumprod", lambda x: tf.math.cumprod(x, axis=-1), [_f32(4, 12, lo=0.5, hi=1.5)], 0),
    ("cumsum-i32-wraps", lambda x: tf.math.cumsum(x, axis=1),
     [np.array([[2**31 - 1, 1, 5], [-7, 3, 2]], np.int32)], 0),
    ("cumprod-i32-exclusive", lambda x: tf.math.cumprod(x, axis=1, exclusive=True),
     [_i32(3, 6, lo=-4, hi=4)], 0),
    ("one_hot", lambda i: tf.one_hot(i, 6), [_i32(4, 3, lo=-1, hi=7)], 0),
    ("one_hot-axis0-i32", lambda i: tf.one_hot(i, 5, on_value=7, off_value=-2, axis=0,
                                               dtype=tf.int32), [_i32(3, 4, lo=0, hi=6)], 0),
    ("one_hot-i64-indices", lambda i: tf.one_hot(tf.cast(i, tf.int64), 4, axis=1),
     [_i32(3, 2, lo=0, hi=4)], 0),
    ("top_k-values", lambda x: tf.math.top_k(x, 5).values, [_f32(3, 40)], 0),
    ("top_k-indices-ties", lambda x: tf.math.top_k(x, 6).indices, [_i32(4, 20, lo=0, hi=4)], 0),
    ("top_k-both", lambda x: tf.math.top_k(x, 3), [_f32(2, 3, 9)], 0),
    ("mirror-pad-reflect", lambda x: tf.pad(x, [[1, 2], [3, 0], [0, 2]], mode="REFLECT"),
     [_f32(3, 5, 4)], 0),
    ("mirror-pad-symmetric", lambda x: tf.pad(x, [[2, 2], [0, 3]], mode="SYMMETRIC"),
     [_i32(3, 4)], 0),
    ("resize-bilinear", lambda x: tf.compat.v1.image.resize_bilinear(x, [11, 7]),
     [_f32(2, 5, 4, 3)], 0),
    ("resize-bilinear-half-pixel", lambda x: tf.image.resize(x, [9, 13]), [_f32(1, 4, 6, 5)],
     0),
    ("resize-bilinear-align", lambda x: tf.compat.v1.image.resize_bilinear(
        x, [8, 3], align_corners=True), [_f32(2, 3, 5, 2)], 0),
    ("resize-nearest", lambda x: tf.image.resize(x, [10, 7], method="nearest"),
     [_f32(2, 4, 3, 3)], 0),
    ("resize-nearest-align-i32", lambda x: tf.compat.v1.image.resize_nearest_neighbor(
        x, [7, 9], align_corners=True), [_i32(1, 3, 4, 2)], 0),
    # int64 values beyond int32: cast back to int32 they keep their low 32 bits.
    ("cast-f32-i64-i32", lambda x: tf.cast(tf.cast(x, tf.int64), tf.int32),
     [_f32(3, 7, lo=-1e12, hi=1e12)], 0),
    ("cast-i32-i64-f32", lambda x: tf.cast(tf.cast(x, tf.int64), tf.float32),
     [_i32(4, 5, lo=-2**31, hi=2**31 - 1)], 0),
    ("reduce-sum-i32", lambda x: tf.reduce_sum(x, axis=[0, 2]),
     [np.full((3, 4, 5), 2**30, np.int32) + _i32(3, 4, 5)], 0),  # wraps
    ("reduce-mean-i32", lambda x: tf.reduce_mean(x, axis=1), [_i32(3, 7, lo=-50, hi=50)], 0),
    ("reduce-max-i32", lambda x: tf.reduce_max(x, axis=0, keepdims=True), [_i32(4, 6)], 0),
    ("reduce-min-prod-i32", lambda x: tf.reduce_min(x, axis=1) + tf.reduce_prod(x, axis=1),
     [_i32(5, 3, lo=-6, hi=6)], 0),
    ("reduce-any", lambda x: tf.reduce_any(x, axis=1), [_bool(4, 3, 2)], 0),
    ("reduce-all", lambda x: tf.reduce_all(x, axis=[0, 2]), [_bool(4, 3, 2) | _bool(4, 3, 2)],
     0),
    ("gather-i64-indices", lambda p, i: tf.gather(p, tf.cast(i, tf.int64), axis=1),
     [_f32(3, 6, 5), _i32(4, lo=0, hi=6)], 0),
    ("pow-i32", lambda a, b: tf.pow(a, b), [_i32(3, 5, lo=-9, hi=9), _i32(5, lo=0, hi=12)], 0),
    ("int64-arithmetic", lambda a, b: tf.cast(
        tf.maximum(tf.cast(a, tf.int64) * (2**40) - tf.cast(b, tf.int64), 7), tf.float32),
     [_i32(3, 4), _i32(4)], 0),
    ("int64-compare", lambda a, b: tf.cast(a, tf.int64) < tf.cast(b, tf.int64),
     [_i32(3, 4), _i32(3, 4)], 0),
    ("conv3d", lambda x: tf.nn.conv3d(x, tf.constant(_f32(3, 2, 3, 4, 5)), [1, 1, 2, 1, 1],
                                      "SAME"), [_f32(2, 5, 6, 7, 4)], 2e-5),
    ("conv3d-dilated-valid", lambda x, w: tf.nn.conv3d(x, w, [1] * 5, "VALID",
                                                       dilations=[1, 2, 1, 2, 1]),
     [_f32(1, 6, 5, 7, 3), _f32(2, 2, 2, 3, 2)], 2e-5),
    ("max_pool3d", lambda x: tf.nn.max_pool3d(x, [1, 2, 3, 2, 1], [1, 2, 2, 1, 1], "SAME"),
     [_f32(2, 5, 6, 7, 3)], 0),
    ("avg_pool3d", lambda x: tf.nn.avg_pool3d(x, [1, 3, 2, 2, 1], [1, 1, 2, 2, 1], "SAME"),
     [_f32(1, 4, 5, 7, 3)], 1e-6),
    ("cast-f32-f16-f32", lambda x: tf.cast(tf.cast(x, tf.float16), tf.float32),
     [np.concatenate([_f32(20, lo=-7e4, hi=7e4), np.array([1 + 2**-11, 1 + 3 * 2**-11, 7e4,
                                                          1e-8, np.nan], np.float32)])], 0),
    ("gather-batch_dims", lambda p, i: tf.gather(p, i, axis=2, batch_dims=1),
     [_f32(3, 2, 6, 4), _i32(3, 5, lo=0, hi=6)], 0),
    ("gather-batch_dims2-i64", lambda p, i: tf.gather(p, tf.cast(i, tf.int64), axis=2,
                                                      batch_dims=2),
     [_i32(2, 3, 7), _i32(2, 3, 4, lo=0, hi=7)], 0),
    *[(f"f16-{name}", fn, [np.concatenate([_f32(30, lo=-300, hi=300), np.array(
        [6e4, -6e4, 1e-5, -3e-7, 0.0, np.nan, np.inf], np.float32)]).astype(np.float16),
        np.concatenate([_f32(30, lo=-3, hi=3), np.array([2.0, 3.0, 7e-3, 0.5, -0.0, 1.0, 1.0],
                                                         np.float32)]).astype(np.float16)], 0)
      for name, fn in [("add", tf.add), ("sub", tf.subtract), ("mul", tf.multiply),
                       ("div", tf.divide), ("max", tf.maximum), ("min", tf.minimum),
                       ("greater", tf.greater), ("equal", tf.equal)]],
    ("f16-transpose-concat-reshape", lambda a, b: tf.reshape(tf.concat(
        [tf.transpose(a, [1, 0, 2]), b], axis=2), [4, -1]),
     [_f32(3, 4, 5).astype(np.float16), _f32(4, 3, 2).astype(np.float16)], 0),
    ("select-i64", lambda m, a: tf.where(m, tf.cast(a, tf.int64), tf.constant(-1, tf.int64)),
     [_bool(3, 4), _i32(3, 4)], 0),
    # engine_any_dtype.cc's loops (op codes 50-59), against TensorFlow: float64 in
    # double, 16-bit floats computed in float32 and rounded once, integers wrapping.
    ("f64-erf-exp-log", lambda x: tf.math.erf(x) + tf.exp(x) * tf.math.log(x + 4.0),
     [_f32(3, 17, lo=-2, hi=3).astype(np.float64)], 1e-14),
    # (TF's float64 approximate gelu differs from the formula in double by ~1e-10: the
    # reference engine and this one agree with each other bit for bit or nearly.)
    ("f64-gelu-softmax", lambda x: tf.nn.softmax(tf.nn.gelu(x, approximate=True)),
     [_f32(4, 9).astype(np.float64)], 1e-8),
    ("f64-matmul-bias-relu", lambda a: tf.nn.relu(tf.matmul(a, tf.constant(
        _f32(7, 5).astype(np.float64))) + 1.0), [_f32(3, 7).astype(np.float64)], 1e-13),
    ("f64-conv2d", lambda x: tf.nn.conv2d(x, tf.constant(_f32(3, 3, 4, 6).astype(np.float64)),
                                          [1, 2, 2, 1], "SAME"),
     [_f32(2, 7, 6, 4).astype(np.float64)], 1e-13),
    ("f64-reduce-mean-max", lambda x: tf.reduce_mean(x, axis=1) + tf.reduce_max(x, axis=1),
     [_f32(5, 11).astype(np.float64)], 1e-14),
    ("f16-exp-tanh", lambda x: tf.exp(x) + tf.tanh(x), [_f32(4, 33).astype(np.float16)], 1e-3),
    ("f16-softmax", tf.nn.softmax, [_f32(4, 33).astype(np.float16)], 1e-3),
    ("f16-matmul", lambda a, b: tf.matmul(a, b),
     [_f32(8, 16).astype(np.float16), _f32(16, 5).astype(np.float16)], 2e-3),
    ("f16-conv2d", lambda x: tf.nn.conv2d(x, tf.constant(_f32(3, 3, 4, 8).astype(np.float16)),
                                          1, "SAME"),
     [_f32(1, 6, 6, 4).astype(np.float16)], 2e-3),
    # (TF's half pooling and sums round more often than once: 2-4 half ulps apart)
    ("f16-pools", lambda x: (tf.nn.max_pool2d(x, 3, 2, "SAME"),
                             tf.nn.avg_pool2d(x, 3, 2, "SAME")),
     [_f32(2, 7, 7, 3).astype(np.float16)], 4e-3),
    ("f16-reduce-sum", lambda x: tf.reduce_sum(x, axis=-1), [_f32(4, 50).astype(np.float16)],
     4e-3),
    ("f16-cumsum-argmax", lambda x: tf.cast(tf.math.argmax(tf.math.cumsum(x, axis=1), axis=1),
                                            tf.float16), [_f32(3, 9).astype(np.float16)], 0),
    ("i64-floor_div-mod", lambda a, b: tf.math.floordiv(tf.cast(a, tf.int64), tf.cast(
        b, tf.int64)) + tf.math.floormod(tf.cast(a, tf.int64) * 3, tf.cast(b, tf.int64)),
     [_i32(3, 4, lo=-100, hi=100), _i32(4, lo=1, hi=9) * np.array([1, -1, 1, -1], np.int32)],
     0),
    ("i64-reduce-sum-prod", lambda x: tf.reduce_sum(tf.cast(x, tf.int64), axis=1) +
     tf.reduce_prod(tf.cast(x, tf.int64), axis=1), [_i32(3, 6, lo=-9, hi=9)], 0),
    ("i64-concat-top_k", lambda a: tf.math.top_k(tf.concat([tf.cast(a, tf.int64),
                                                            tf.cast(a, tf.int64) * 3], axis=1),
                                                  4).values, [_i32(3, 5)], 0),
    ("i8-u8-arithmetic", lambda a, b: tf.cast(tf.cast(a, tf.int8) * tf.cast(b, tf.int8) -
                                              tf.cast(b, tf.int8), tf.int32) +
     tf.cast(tf.maximum(tf.cast(a, tf.uint8), tf.cast(b, tf.uint8)), tf.int32),
     [_i32(3, 7, lo=-128, hi=128), _i32(7, lo=-128, hi=128)], 0),
    ("i16-abs-sub", lambda a: tf.cast(tf.abs(tf.cast(a, tf.int16) - 7), tf.int32),
     [_i32(4, 6, lo=-30000, hi=30000)], 0),
    ("i32-matmul", lambda a, b: tf.matmul(a, b), [_i32(4, 6), _i32(6, 3)], 0),
    # softplus after a product (keras_hub's Qwen3.5 linear attention): not fused into it,
    # where it would leave the product to numpy; TF's thresholds at large |x|.
    # A concat's empty operands (sliced off to nothing) are left out by the compiler.
    ("concat-empty-operands", lambda x: tf.concat([x[:, 5:], x, x[:, :0] - 1.0, x * 2.0],
                                                  axis=1), [_f32(3, 5)], 0),
    ("concat-one-full-operand", lambda x: tf.concat([x[:, 5:], x + 1.0], axis=1),
     [_f32(3, 5)], 0),
    ("dense-softplus", lambda a: tf.nn.softplus(tf.matmul(a, tf.constant(_f32(6, 5))) * 8.0),
     [_f32(4, 6)], 1e-5),  # (the products' sums in another order: a few ulp)
    ("conv-bias-softplus", lambda x: tf.nn.softplus(tf.nn.conv2d(
        x, tf.constant(_f32(3, 3, 4, 6)), [1, 1, 1, 1], "SAME") + 0.5), [_f32(2, 5, 6, 4)],
     1e-5),
    ("resize-bilinear-u8", lambda x: tf.compat.v1.image.resize_bilinear(
        tf.cast(x, tf.uint8), [9, 7]), [_i32(2, 4, 5, 3, lo=0, hi=256)], 0),
    ("cast-f64-f16-i8", lambda x: tf.cast(tf.cast(x, tf.float16), tf.float32) +
     tf.cast(tf.cast(x, tf.int8), tf.float32), [_f32(4, 9, lo=-100, hi=100).astype(np.float64)],
     0),
]

# Cases (engine.cc's op codes 20-29 and int64) also compared with the numpy reference
# engine: bit for bit where rtol is 0.
VS_REFERENCE = {c[0] for c in CASES[CASES.index(next(
    c for c in CASES if c[0] == "argmax-i64")):]}


def _trace(fn: object, inputs: list[np.ndarray]):  # noqa: ANN202
    specs = [tf.TensorSpec(x.shape, tf.as_dtype(x.dtype), name=f"in{i}")
             for i, x in enumerate(inputs)]
    return trace(fn, *specs)


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", "native")
    assert library.load() is not None, f"native engine unavailable: {library.why_not()}"


@pytest.mark.parametrize("case_id,fn,inputs,rtol", CASES, ids=[c[0] for c in CASES])
def test_runs_natively_and_matches_tf(native: None, monkeypatch: pytest.MonkeyPatch,
                                      case_id: str, fn: object, inputs: list[np.ndarray],
                                      rtol: float) -> None:
    g = _trace(fn, inputs)
    exe = compile_graph(g.graph_def, g.io_config)
    assert from_bytes(exe).stats["numpy_instructions"] == []
    feeds = {f"in{i}:0": x for i, x in enumerate(inputs)}
    got, left = run_reporting_numpy(exe, feeds)
    assert left == [], f"left to numpy: {left}"
    if case_id in VS_REFERENCE:  # bit for bit where rtol is 0
        monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
        with load(exe) as model:
            ref = model.run(feeds)
        for key, want in ref.items():
            if rtol == 0:
                np.testing.assert_array_equal(got[key], want, err_msg=f"vs numpy: {key}")
                continue
            # (sums in another order: within rtol of the tensor's largest magnitude)
            scale = float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0))
            np.testing.assert_allclose(got[key], want, rtol=rtol, atol=rtol * scale,
                                       err_msg=f"vs the numpy engine: {key}")
    for key, want in g.reference(feeds).items():
        want = np.asarray(want)
        assert got[key].dtype == want.dtype and got[key].shape == want.shape
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got[key], want, rtol=rtol, atol=rtol * 1e-1)
        else:
            np.testing.assert_array_equal(got[key], want)


def test_a_gather_index_out_of_range_is_an_error_naming_it(native: None) -> None:
    g = _trace(lambda i: tf.gather(tf.constant(_f32(5, 3)), i), [_i32(4, lo=0, hi=5)])
    exe = compile_graph(g.graph_def, g.io_config)
    with load(exe) as model:
        with pytest.raises(ExecutionError, match="gather index 7 is out of range"):
            model.run({"in0:0": np.array([0, 7, 1, 2], np.int32)})
        ok = model.run({"in0:0": np.array([4, 0, 1, 2], np.int32)})  # still usable after
    assert next(iter(ok.values())).shape == (4, 3)


def test_an_integer_power_with_a_negative_exponent_is_an_error(native: None) -> None:
    g = _trace(lambda a, b: tf.pow(a, b), [_i32(4, lo=1, hi=5), _i32(4, lo=0, hi=3)])
    exe = compile_graph(g.graph_def, g.io_config)
    with load(exe) as model:
        with pytest.raises(ExecutionError, match="negative integer powers.*exponent -2"):
            model.run({"in0:0": np.array([1, 2, 3, 4], np.int32),
                       "in1:0": np.array([0, 1, -2, 3], np.int32)})
        ok = model.run({"in0:0": np.array([1, 2, 3, -4], np.int32),
                        "in1:0": np.array([0, 31, 2, 3], np.int32)})
    np.testing.assert_array_equal(next(iter(ok.values())), [1, -2**31, 9, -64])


def test_the_compiler_lists_what_numpy_will_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every instruction has a native kernel; one left to numpy (NEURONISH_NATIVE_EXCLUDE)
    is named in the executable's stats (the compile report warns with them); the
    cumulative sum after it is native and not listed."""
    monkeypatch.setenv("NEURONISH_NATIVE_EXCLUDE", "matmul")
    g = _trace(lambda a, b: tf.math.cumsum(tf.cast(tf.matmul(a, b), tf.float32), axis=1),
               [_f32(3, 4).astype(np.float16), _f32(4, 5).astype(np.float16)])
    slow = from_bytes(compile_graph(g.graph_def, g.io_config)).stats["numpy_instructions"]
    assert [(s["kind"], s["dtypes"]) for s in slow] == [
        ("matmul", ["float16", "float16"])], slow
    assert slow[0]["tf"] and "MatMul" in slow[0]["tf"][0]
