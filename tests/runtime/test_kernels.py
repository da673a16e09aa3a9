"""Every device kernel against an independent reference, mostly TensorFlow's own ops.

Kernels are called through `evaluate` with the output types the compiler's shape
inference gives, on read-only inputs (so a kernel that writes into its inputs
fails), and their results compared with the reference in shape, dtype and value
(so inference is checked against the reference too).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc import kinds
from neuronish.cc.ir import TensorType
from neuronish.runtime import isa
from neuronish.runtime.errors import ExecutionError
from neuronish.runtime.kernels import KERNELS, evaluate
from neuronish.runtime.native import library
from neuronish.runtime.program import evaluate_one, one_instruction_program

RNG = np.random.default_rng(1234)


def frozen(x: np.ndarray) -> np.ndarray:
    x = np.array(x, order="C")
    x.flags.writeable = False
    return x


@pytest.fixture(autouse=True, params=["numpy", "native"])
def engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every kernel test runs on the numpy reference and on the native engine. The
    engine goes back to numpy afterwards: modules importing `run` (the lane tests)
    mean the reference engine."""
    global ENGINE
    ENGINE = request.param
    if ENGINE == "native":
        assert library.load() is not None, f"native engine unavailable: {library.why_not()}"
    yield ENGINE
    ENGINE = "numpy"


ENGINE = "numpy"
# The weights of matmul-like kinds are program constants, as in compiled models (the
# native engine reorders them at load); everything else arrives with the call.
WEIGHTS = {"conv2d": frozenset({1}), "depthwise_conv2d": frozenset({1}),
           "matmul": frozenset({1})}


def run(kind: str, inputs: list[np.ndarray], attrs: dict) -> np.ndarray:
    """Run one kernel on read-only copies of `inputs` on this test's engine; check they
    were not touched and the output has the inferred type."""
    ins = [frozen(np.array(x)) for x in inputs]
    before = [x.copy() for x in ins]
    types = kinds.infer(kind, [TensorType(x.shape, x.dtype.name) for x in ins], attrs)
    out_types = [(t.shape, t.dtype) for t in types]
    if ENGINE == "numpy":
        outs = evaluate(kind, ins, attrs, out_types)
    else:
        outs, _ = evaluate_one(kind, ins, attrs, out_types, constant=WEIGHTS.get(kind, frozenset()),
                               native=library.load(), threads=2)
    for x, b in zip(ins, before, strict=True):
        np.testing.assert_array_equal(x, b)
    assert outs[0].shape == types[0].shape and outs[0].dtype == np.dtype(types[0].dtype)
    return outs[0]


def randn(*shape: int, dtype: object = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def close(got: np.ndarray, want: object, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    want = want.numpy() if hasattr(want, "numpy") else np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, want)


def same_pads(h: int, w: int, kh: int, kw: int, sh: int, sw: int, dh: int = 1,
              dw: int = 1) -> list[int]:
    """TF's SAME padding as explicit [top, bottom, left, right]."""
    pads = []
    for size, k, s, d in ((h, kh, sh, dh), (w, kw, sw, dw)):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        pads += [total // 2, total - total // 2]
    return pads


# --- the table ------------------------------------------------------------------

def test_every_kind_has_a_kernel_and_vice_versa() -> None:
    assert set(KERNELS) == set(kinds.INFER)


SHAPE_CASES = [
    ("conv2d", [randn(2, 9, 7, 3), randn(3, 2, 3, 5)],
     {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 2, 1], "activation": "none"},
     lambda x, w: tf.nn.conv2d(x, w, [2, 1], [[0, 0], [1, 0], [2, 1], [0, 0]],
                               dilations=[1, 2])),
    ("pool", [randn(1, 5, 6, 2)],
     {"mode": "max", "ksize": [3, 2], "strides": [2, 3], "pads": [1, 1, 0, 1]},
     lambda x: tf.nn.max_pool2d(tf.pad(x, [[0, 0], [1, 1], [0, 1], [0, 0]],
                                       constant_values=-np.inf), [3, 2], [2, 3], "VALID")),
    ("gather", [randn(2, 5, 3), np.array([[0, 4, 1]] * 2)], {"axis": 1, "batch_dims": 1},
     lambda p, i: tf.gather(p, i, axis=1, batch_dims=1)),
    ("strided_slice", [randn(6, 5)], {"begin": [5, 0], "end": [None, 5], "strides": [-2, 2]},
     lambda x: x[5::-2, 0:5:2]),
    ("one_hot", [np.array([[1, 2]])],
     {"depth": 4, "on_value": 1.0, "off_value": 0.0, "axis": 1, "to": "float32"},
     lambda i: tf.one_hot(i, 4, axis=1)),
]


@pytest.mark.parametrize("kind,inputs,attrs,ref", SHAPE_CASES,
                         ids=[c[0] for c in SHAPE_CASES])
def test_inferred_shape_is_the_references_shape(kind: str, inputs: list, attrs: dict,
                                                ref: object) -> None:
    # The kernel writes into a buffer of the inferred shape; the reference (TF/numpy)
    # computes its own shape: they must agree, and so must the values.
    want = kinds.infer(kind, [TensorType(x.shape, x.dtype.name) for x in inputs], attrs)[0]
    expected = np.asarray(ref(*inputs))
    assert want.shape == expected.shape
    close(run(kind, inputs, attrs), expected, rtol=1e-5, atol=1e-5)


# --- elementwise ---------------------------------------------------------------

UNARY_TF = {
    "relu": tf.nn.relu, "relu6": tf.nn.relu6, "elu": tf.nn.elu, "selu": tf.nn.selu,
    "sigmoid": tf.math.sigmoid, "tanh": tf.math.tanh, "softplus": tf.math.softplus,
    "erf": tf.math.erf, "erfc": tf.math.erfc, "exp": tf.math.exp, "log": tf.math.log,
    "sqrt": tf.math.sqrt, "rsqrt": tf.math.rsqrt, "square": tf.math.square,
    "abs": tf.math.abs, "neg": tf.math.negative, "reciprocal": tf.math.reciprocal,
    "floor": tf.math.floor, "sign": tf.math.sign,
    "gelu": lambda x: tf.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: tf.nn.gelu(x, approximate=True),
    "swish": tf.nn.silu,
}
POSITIVE_ONLY = {"log", "sqrt", "rsqrt"}


def unary_input(fn: str, dtype: object) -> np.ndarray:
    x = randn(4, 33, dtype=np.float64) * 4
    x[0, :8] = [0, -0.5, 0.5, 1e-4, -1e-4, 6, 6.5, -20]
    x[1, :6] = [30, -30, 15, -15, 100, -100]  # softplus/sigmoid branches
    if fn in POSITIVE_ONLY:
        x = np.abs(x) + 0.01
    if fn == "exp":
        x = np.clip(x, -30, 30)
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("fn", sorted(UNARY_TF))
def test_unary_matches_tf(fn: str, dtype: object) -> None:
    x = unary_input(fn, dtype)
    tol = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-12}[dtype]
    if fn == "gelu" and dtype == np.float64:
        tol = 1e-8  # TF rewrites its gelu into oneDNN's, accurate to ~5e-9 in float64
    if fn == "gelu_tanh" and dtype == np.float64:
        tol = 1e-6  # likewise its approximate one: ~2e-7 from the formula in float64
    close(run("unary", [x], {"fn": fn}), UNARY_TF[fn](x), rtol=tol, atol=tol)


def test_softplus_branches_relative() -> None:
    # TF switches formulas at log(eps) + 2 and its negation; tiny outputs compared
    # relatively (an absolute tolerance would hide the wrong branch).
    x = np.linspace(-20, 20, 401, dtype=np.float32)
    close(run("unary", [x], {"fn": "softplus"}), tf.math.softplus(x), rtol=1e-5, atol=0)


@pytest.mark.parametrize("fn", [fn for fn in isa.UNARY_FNS if fn != "logical_not"])
def test_unary_in_place_is_the_same(fn: str) -> None:
    """A conv's or matmul's fused activation runs in place on its output (`y is x`): every
    function gives what it gives into another buffer, at both ends of its range."""
    from neuronish.runtime.kernels.elementwise import UNARY

    x = np.linspace(-40, 40, 321, dtype=np.float32)
    apart = np.empty_like(x)
    UNARY[fn](x, apart, 0.2)
    same = x.copy()
    UNARY[fn](same, same, 0.2)
    np.testing.assert_array_equal(same, apart)


@pytest.mark.parametrize("alpha", [0.2, 0.01, 1.5])
def test_leaky_relu(alpha: float) -> None:
    x = randn(3, 17)
    close(run("unary", [x], {"fn": "leaky_relu", "alpha": alpha}),
          tf.nn.leaky_relu(x, alpha=alpha))


def test_unary_on_integers_and_bool() -> None:
    x = np.array([-7, -1, 0, 1, 2, 9], np.int32)
    for fn, ref in [("abs", tf.math.abs), ("neg", tf.math.negative), ("relu", tf.nn.relu),
                    ("sign", tf.math.sign), ("square", tf.math.square)]:
        close(run("unary", [x], {"fn": fn}), ref(x))
    b = np.array([True, False, True])
    close(run("unary", [b], {"fn": "logical_not"}), tf.math.logical_not(b))


def test_round_bf16_and_fp16_match_tf_casts() -> None:
    x = randn(1000) * 1e3
    # Exact ties to even and the carry into the exponent.
    ties = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0x7F800000, 0x00000001],
                    np.uint32).view(np.float32)
    x = np.concatenate([x, ties, [np.float32(65520.0), np.float32(1e-8)]]).astype(np.float32)
    bf = tf.cast(tf.cast(x, tf.bfloat16), tf.float32)
    close(run("unary", [x], {"fn": "round_bf16"}), bf, rtol=0, atol=0)
    close(run("unary", [x], {"fn": "round_fp16"}), tf.cast(tf.cast(x, tf.float16), tf.float32),
          rtol=0, atol=0)
    nan = run("unary", [np.array([np.nan, -np.nan], np.float32)], {"fn": "round_bf16"})
    assert np.isnan(nan).all()


def test_round_bf16_of_a_scalar() -> None:
    # A 0-d constant (LayerNorm's epsilon, say) is rounded at compile time under
    # --auto-cast all; numpy's shifts turn 0-d arrays into scalars.
    x = np.array(1.0 + 2.0 ** -10, np.float32)
    got = run("unary", [x], {"fn": "round_bf16"})
    assert got.shape == () and got == tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy()


BINARY_TF = {
    "add": tf.math.add, "sub": tf.math.subtract, "mul": tf.math.multiply,
    "div": tf.math.divide, "maximum": tf.math.maximum, "minimum": tf.math.minimum,
    "squared_difference": tf.math.squared_difference, "pow": tf.math.pow,
    "greater": tf.math.greater, "greater_equal": tf.math.greater_equal,
    "less": tf.math.less, "less_equal": tf.math.less_equal, "equal": tf.math.equal,
    "not_equal": tf.math.not_equal,
}


@pytest.mark.parametrize("fn", sorted(BINARY_TF))
@pytest.mark.parametrize("shapes", [((4, 5), (4, 5)), ((2, 1, 5), (3, 1)), ((), (3, 2))])
def test_binary_matches_tf(fn: str, shapes: tuple) -> None:
    a, b = randn(*shapes[0]), randn(*shapes[1])
    if fn == "pow":
        a = np.abs(a) + 0.1
    if fn in ("equal", "not_equal", "greater_equal", "less_equal"):
        b = np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)).copy()
        b.reshape(-1)[::2] += 1  # half equal, half not
        a = np.broadcast_to(a, b.shape).copy()
    close(run("binary", [a, b], {"fn": fn}), BINARY_TF[fn](a, b), rtol=2e-6)


def test_binary_integer_division_truncates_like_tf() -> None:
    a = np.array([7, -7, 7, -7, 6, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3, 5], np.int32)
    close(run("binary", [a, b], {"fn": "div"}), tf.raw_ops.Div(x=a, y=b))  # TF Div on integers


def test_binary_logical() -> None:
    a = np.array([[True, False, True, False]])
    b = np.array([[True], [False]])
    close(run("binary", [a, b], {"fn": "logical_and"}), tf.math.logical_and(a, b))
    close(run("binary", [a, b], {"fn": "logical_or"}), tf.math.logical_or(a, b))


def test_select_broadcasts_like_selectv2() -> None:
    cond = randn(3, 1, 4) > 0
    a, b = randn(2, 4), randn(3, 2, 1)
    close(run("select", [cond, a, b], {}), tf.where(cond, a, b))


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("float32", "int64"),
                                     ("float32", "uint8"), ("float32", "bool"),
                                     ("int32", "float32"), ("bool", "float32"),
                                     ("float64", "float16"), ("int64", "int32"),
                                     ("float16", "int32")])
def test_cast_matches_tf(src: str, dst: str) -> None:
    x = (randn(5, 7) * 50)
    if dst == "uint8" or src == "bool":
        x = np.abs(x)
    x = x.astype(src) if src != "bool" else x > 40
    x.reshape(-1)[:3] = [0, 2, 3] if src != "bool" else False
    close(run("cast", [x], {"to": dst}), tf.cast(x, dst), rtol=0, atol=0)


def test_copy() -> None:
    x = randn(3, 4)
    close(run("copy", [x], {}), x, rtol=0, atol=0)


# --- matmul --------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb,ta,tb", [
    ((5, 7), (7, 3), False, False), ((7, 5), (7, 3), True, False),
    ((5, 7), (3, 7), False, True), ((2, 7, 5), (1, 3, 7), True, True),
    ((4, 2, 5, 6), (2, 6, 3), False, False),
])
def test_matmul_matches_tf(sa: tuple, sb: tuple, ta: bool, tb: bool) -> None:
    a, b = randn(*sa), randn(*sb)
    want = tf.linalg.matmul(a, b, transpose_a=ta, transpose_b=tb)
    attrs = {"transpose_a": ta, "transpose_b": tb, "activation": "none"}
    close(run("matmul", [a, b], attrs), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matmul_bias_activation(dtype: object) -> None:
    a, b, bias = randn(6, 9, dtype=dtype), randn(9, 4, dtype=dtype), randn(4, dtype=dtype)
    want = tf.nn.relu6(tf.nn.bias_add(tf.linalg.matmul(a, b), bias))
    tol = 1e-2 if dtype == np.float16 else 1e-5
    got = run("matmul", [a, b, bias], {"activation": "relu6"})
    close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("sa,sb,bias", [
    ((6, 9), (9, 4), True), ((2, 5, 9), (9, 4), True), ((2, 5, 9), (9, 4), False),
    ((3, 5, 9), (3, 9, 4), True),
])
def test_matmul_residual_is_added_after_the_bias_before_the_activation(
        sa: tuple, sb: tuple, bias: bool) -> None:
    # [B, S, K] @ [K, N]: the native engine runs it as one [B*S, K] product, the
    # residual included; the batched case ([3, 9, 4]) keeps its batch dims.
    a, b, c = randn(*sa), randn(*sb), randn(sb[-1])
    y_shape = tuple(np.broadcast_shapes(sa[:-2], sb[:-2])) + (sa[-2], sb[-1])
    r = randn(*y_shape)
    want = tf.linalg.matmul(a, b) + (c if bias else 0) + r
    want = tf.nn.relu(want)
    inputs = [a, b, c, r] if bias else [a, b, r]
    outs, ran = evaluate_one("matmul", [frozen(x) for x in inputs],
                             {"activation": "relu", "residual": True},
                             [(y_shape, "float32")], constant=frozenset({1}),
                             native=library.load() if ENGINE == "native" else None, threads=2)
    assert ran == ENGINE, f"ran on {ran}, expected {ENGINE}"
    close(outs[0], want, rtol=1e-5, atol=1e-5)


def test_matmul_residual_of_another_type_is_refused() -> None:
    a, b = randn(4, 3), randn(3, 2)
    with pytest.raises(Exception, match="residual must have the output's type"):
        run("matmul", [a, b, randn(4, 3)], {"residual": True})


# --- convolutions ---------------------------------------------------------------

def tf_conv(x: np.ndarray, w: np.ndarray, strides: list, dilations: list, padding: object,
            depthwise: bool = False) -> tf.Tensor:
    if depthwise:
        return tf.nn.depthwise_conv2d(x, w, [1, *strides, 1], padding, dilations=dilations)
    return tf.nn.conv2d(x, w, strides, padding, dilations=dilations)


def explicit_pads(padding: object, x: np.ndarray, w: np.ndarray, strides: list,
                  dilations: list) -> list[int]:
    if padding == "VALID":
        return [0, 0, 0, 0]
    if padding == "SAME":
        return same_pads(x.shape[1], x.shape[2], w.shape[0], w.shape[1], *strides, *dilations)
    return [p for pair in padding[1:3] for p in pair]  # TF explicit [[0,0],[t,b],[l,r],[0,0]]


CONV_CASES = [
    # x shape, w shape, strides, dilations, padding
    ((2, 8, 8, 16), (1, 1, 16, 8), [1, 1], [1, 1], "VALID"),     # direct GEMM
    ((2, 9, 9, 16), (1, 1, 16, 8), [2, 2], [1, 1], "VALID"),     # strided 1x1
    ((2, 9, 9, 4), (1, 1, 4, 8), [2, 2], [1, 1], "SAME"),
    ((2, 10, 11, 5), (3, 3, 5, 7), [1, 1], [1, 1], "SAME"),
    ((2, 10, 11, 5), (3, 3, 5, 7), [2, 2], [1, 1], "SAME"),      # asymmetric SAME pads
    ((1, 15, 15, 3), (7, 7, 3, 8), [2, 2], [1, 1], "SAME"),      # ResNet stem
    ((2, 12, 10, 4), (3, 2, 4, 6), [1, 2], [1, 1], "VALID"),
    ((2, 12, 12, 4), (3, 3, 4, 6), [1, 1], [2, 3], "SAME"),      # dilated
    ((1, 12, 12, 4), (3, 3, 4, 6), [1, 1], [2, 2], "VALID"),
    ((1, 7, 8, 3), (2, 3, 3, 4), [1, 1], [1, 1], [[0, 0], [2, 1], [0, 3], [0, 0]]),
]


@pytest.mark.parametrize("xs,ws,strides,dilations,padding", CONV_CASES)
def test_conv2d_matches_tf(xs: tuple, ws: tuple, strides: list, dilations: list,
                           padding: object) -> None:
    x, w = randn(*xs), randn(*ws)
    attrs = {"strides": strides, "dilations": dilations, "activation": "none",
             "pads": explicit_pads(padding, x, w, strides, dilations)}
    close(run("conv2d", [x, w], attrs), tf_conv(x, w, strides, dilations, padding),
          rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation,ref", [("relu", tf.nn.relu), ("relu6", tf.nn.relu6),
                                            ("sigmoid", tf.math.sigmoid),
                                            ("none", lambda t: t)])
def test_conv2d_bias_and_activation(activation: str, ref: object) -> None:
    x, w, b = randn(2, 6, 6, 4), randn(3, 3, 4, 5), randn(5)
    attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1],
             "activation": activation}
    want = ref(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b))
    close(run("conv2d", [x, w, b], attrs), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups,xs,ws,strides,pads", [
    (2, (2, 7, 7, 8), (3, 3, 4, 6), [1, 1], [1, 1, 1, 1]),
    (4, (1, 9, 8, 8), (3, 3, 2, 8), [2, 2], [0, 1, 0, 1]),
    (8, (2, 5, 5, 8), (1, 1, 1, 16), [1, 1], [0, 0, 0, 0]),   # depthwise-like, M = 2
])
def test_grouped_conv2d_matches_tf_per_group(groups: int, xs: tuple, ws: tuple, strides: list,
                                             pads: list) -> None:
    # TF's CPU Conv2D has no grouped kernel (Keras runs it under XLA), so the reference
    # is TF's plain conv on each group's channels, concatenated.
    x, w, b, r = randn(*xs), randn(*ws), randn(ws[3]), None
    explicit = [[0, 0], pads[:2], pads[2:], [0, 0]]
    cg, og = xs[3] // groups, ws[3] // groups
    want = tf.concat([tf.nn.conv2d(x[..., k * cg:(k + 1) * cg], w[..., k * og:(k + 1) * og],
                                   strides, explicit) for k in range(groups)], axis=-1)
    r = randn(*want.shape)
    attrs = {"strides": strides, "dilations": [1, 1], "pads": pads, "groups": groups,
             "activation": "relu", "residual": True}
    close(run("conv2d", [x, w, b, r], attrs), tf.nn.relu(want + b + r), rtol=1e-4, atol=1e-4)


def test_grouped_conv2d_channels_must_divide() -> None:
    with pytest.raises(Exception, match="group"):
        kinds.infer("conv2d", [TensorType((1, 4, 4, 6), "float32"),
                               TensorType((1, 1, 4, 4), "float32")],
                    {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "groups": 2})


def test_conv2d_in_many_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tiny blocks: bands of a few rows inside an image, and several images per block.
    x, w, b = randn(3, 13, 9, 4), randn(3, 3, 4, 6), randn(6)
    want = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, [2, 1], "SAME"), b))
    for min_rows in (9, 20, 45):
        monkeypatch.setattr(isa, "GEMM_BLOCK_BYTES", 1)
        monkeypatch.setattr(isa, "GEMM_MIN_ROWS", min_rows)
        attrs = {"strides": [2, 1], "dilations": [1, 1], "activation": "relu",
                 "pads": same_pads(13, 9, 3, 3, 2, 1)}
        close(run("conv2d", [x, w, b], attrs), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-2), (np.float64, 1e-10)])
def test_conv2d_other_float_dtypes(dtype: object, tol: float) -> None:
    for ws in [(3, 3, 4, 5), (1, 1, 4, 5)]:
        x, w = randn(2, 7, 7, 4, dtype=dtype), randn(*ws, dtype=dtype)
        pads = same_pads(7, 7, ws[0], ws[1], 1, 1)
        attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": pads, "activation": "none"}
        close(run("conv2d", [x, w], attrs), tf.nn.conv2d(x, w, 1, "SAME"), rtol=tol, atol=tol)


DEPTHWISE_CASES = [
    ((2, 9, 9, 6), (3, 3, 6, 1), [1, 1], [1, 1], "SAME"),
    ((2, 9, 10, 6), (3, 3, 6, 1), [2, 2], [1, 1], "SAME"),
    ((2, 9, 9, 3), (3, 3, 3, 2), [1, 1], [1, 1], "VALID"),       # channel multiplier
    ((1, 11, 12, 4), (5, 5, 4, 3), [2, 2], [1, 1], "SAME"),
    ((1, 11, 11, 4), (3, 3, 4, 1), [1, 1], [2, 2], "SAME"),      # dilated
    ((1, 13, 14, 5), (3, 3, 5, 1), [3, 3], [1, 1], "SAME"),      # stride 3, ragged groups
    ((2, 10, 10, 3), (2, 2, 3, 1), [2, 2], [1, 1], "VALID"),     # no copy of the input
    ((2, 10, 10, 3), (3, 3, 3, 2), [2, 2], [1, 1], "SAME"),
]


@pytest.mark.parametrize("xs,ws,strides,dilations,padding", DEPTHWISE_CASES)
def test_depthwise_matches_tf(xs: tuple, ws: tuple, strides: list, dilations: list,
                              padding: str) -> None:
    x, w = randn(*xs), randn(*ws)
    attrs = {"strides": strides, "dilations": dilations, "activation": "none",
             "pads": explicit_pads(padding, x, w, strides, dilations)}
    close(run("depthwise_conv2d", [x, w], attrs),
          tf_conv(x, w, strides, dilations, padding, depthwise=True), rtol=1e-4, atol=1e-5)


def test_depthwise_bias_activation_blocks_and_float16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isa, "TAP_BLOCK_BYTES", 1)  # one output row per block
    x, w, b = randn(2, 8, 7, 4), randn(3, 3, 4, 2), randn(8)
    attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1],
             "activation": "relu6"}
    want = tf.nn.relu6(tf.nn.bias_add(tf.nn.depthwise_conv2d(x, w, [1] * 4, "SAME"), b))
    close(run("depthwise_conv2d", [x, w, b], attrs), want, rtol=1e-4, atol=1e-5)
    h = [tf.constant(a.astype(np.float16)) for a in (x, w, b)]
    for stride in (1, 2):
        attrs["strides"] = [stride, stride]
        attrs["pads"] = same_pads(8, 7, 3, 3, stride, stride)
        want16 = tf.nn.relu6(tf.nn.bias_add(
            tf.nn.depthwise_conv2d(h[0], h[1], [1, stride, stride, 1], "SAME"), h[2]))
        close(run("depthwise_conv2d", [a.numpy() for a in h], attrs), want16, rtol=1e-2,
              atol=1e-2)


# --- pooling -------------------------------------------------------------------

POOL_CASES = [
    ((2, 8, 8, 3), [2, 2], [2, 2], "VALID"),
    ((2, 9, 9, 3), [3, 3], [2, 2], "SAME"),
    ((2, 112 // 8, 112 // 8, 4), [3, 3], [2, 2], "SAME"),
    ((1, 7, 10, 2), [3, 2], [1, 3], "SAME"),
    ((1, 7, 10, 2), [4, 4], [1, 1], "SAME"),  # windows with several padded rows
    ((1, 6, 6, 2), [3, 3], [3, 3], "VALID"),
]


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("xs,ksize,strides,padding", POOL_CASES)
def test_pool_matches_tf(mode: str, xs: tuple, ksize: list, strides: list,
                         padding: str) -> None:
    x = randn(*xs) - 2  # mostly negative: padding must not win the max
    pads = (same_pads(xs[1], xs[2], *ksize, *strides) if padding == "SAME" else [0] * 4)
    attrs = {"mode": mode, "ksize": ksize, "strides": strides, "pads": pads}
    ref = tf.nn.max_pool2d if mode == "max" else tf.nn.avg_pool2d
    close(run("pool", [x], attrs), ref(x, ksize, strides, padding))


def test_pool_float16_int_and_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isa, "POOL_BLOCK_BYTES", 1)  # one output row per block
    x = randn(2, 9, 9, 3)
    pads = same_pads(9, 9, 3, 3, 2, 2)
    for mode, ref in [("max", tf.nn.max_pool2d), ("avg", tf.nn.avg_pool2d)]:
        attrs = {"mode": mode, "ksize": [3, 3], "strides": [2, 2], "pads": pads}
        close(run("pool", [x], attrs), ref(x, 3, 2, "SAME"))
        h = x.astype(np.float16)
        # (tf.constant: TF's eager op cache would run a numpy float16 array as float32)
        close(run("pool", [h], attrs), ref(tf.constant(h), 3, 2, "SAME"), rtol=2e-3, atol=2e-3)
    i = (x * 10).astype(np.int32)
    attrs = {"mode": "max", "ksize": [3, 3], "strides": [2, 2], "pads": pads}
    close(run("pool", [i], attrs), tf.nn.max_pool2d(tf.constant(i), 3, 2, "SAME"))


# --- reductions ----------------------------------------------------------------

REDUCE_TF = {"sum": tf.reduce_sum, "mean": tf.reduce_mean, "max": tf.reduce_max,
             "min": tf.reduce_min, "prod": tf.reduce_prod}


@pytest.mark.parametrize("fn", sorted(REDUCE_TF))
@pytest.mark.parametrize("axes,keepdims", [([1, 2], False), ([0], True), ([2], False),
                                           ([0, 1, 2], True)])
def test_reduce_matches_tf(fn: str, axes: list, keepdims: bool) -> None:
    x = randn(3, 4, 5) * (0.5 if fn == "prod" else 1)
    close(run("reduce", [x], {"fn": fn, "axes": axes, "keepdims": keepdims}),
          REDUCE_TF[fn](x, axis=axes, keepdims=keepdims), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", sorted(REDUCE_TF))
def test_reduce_over_innermost_axes_matches_tf_with_nan_and_inf(fn: str) -> None:
    # Rows longer than a vector and not a multiple of one (the native engine's own loop
    # reduces innermost axes: vector body and tail), with NaN and +-inf in some rows.
    x = randn(6, 1000) * (0.01 if fn == "prod" else 1) + (1 if fn == "prod" else 0)
    x[1, 999] = np.nan
    x[2, 0] = np.inf
    x[3, 500] = -np.inf
    x[4, [3, 700]] = [np.inf, -np.inf]
    for axes in ([1], [0, 1]):
        with np.errstate(invalid="ignore"):  # inf - inf, as intended
            got = run("reduce", [x], {"fn": fn, "axes": axes, "keepdims": True})
        close(got, REDUCE_TF[fn](x, axis=axes, keepdims=True), rtol=1e-5, atol=1e-6)
    if ENGINE == "native":  # ...and did take that loop, not oneDNN's slow kernel there
        program, ins = one_instruction_program(
            "reduce", [x], {"fn": fn, "axes": [1], "keepdims": True}, [((6, 1), "float32")],
            native=library.load())
        assert program.implementations() == {0: "neuronish:inner_reduce"}


@pytest.mark.parametrize("shape,epsilon", [((6, 40), 1e-3), ((2, 3, 5, 16), 1e-6),
                                           ((7,), 1e-5), ((3, 1), 0.5)])
def test_layer_norm_matches_tf(shape: tuple, epsilon: float) -> None:
    # Off-centre: the mean must really be subtracted. (One channel with a small epsilon
    # would compare against TF's cancellation noise: it computes x*inv + (beta - mean*inv).)
    x = randn(*shape) * 3 + 5
    scale, shift = randn(shape[-1]), randn(shape[-1])
    mean, var = tf.nn.moments(tf.constant(x), axes=[-1], keepdims=True)
    want = tf.nn.batch_normalization(x, mean, var, shift, scale, epsilon)
    close(run("layer_norm", [x, scale, shift], {"epsilon": epsilon}), want,
          rtol=1e-5, atol=2e-5)


def test_reduce_integers_bool_float16_and_empty_axes() -> None:
    i = np.array([[-7, 2, 1], [5, 5, -1]], np.int32)
    for fn in ("sum", "mean", "max", "prod"):
        close(run("reduce", [i], {"fn": fn, "axes": [1], "keepdims": False}),
              REDUCE_TF[fn](i, axis=1))
    b = randn(3, 4) > 0.5
    close(run("reduce", [b], {"fn": "any", "axes": [1], "keepdims": False}),
          tf.reduce_any(b, axis=1))
    close(run("reduce", [b], {"fn": "all", "axes": [0], "keepdims": True}),
          tf.reduce_all(b, axis=0, keepdims=True))
    h = randn(64, 50).astype(np.float16)
    close(run("reduce", [h], {"fn": "mean", "axes": [0], "keepdims": False}),
          tf.reduce_mean(h, axis=0), rtol=1e-3, atol=1e-3)
    # float16 sums accumulate in float32, so they are the exact sum rounded once; TF's
    # half reducer keeps less (a few ulps of the running sum, ~0.008 at 8..16), which a
    # sum that cancels to near zero shows, depending on the draw.
    got = run("reduce", [h], {"fn": "sum", "axes": [0], "keepdims": False})
    close(got, h.astype(np.float64).sum(axis=0).astype(np.float16), rtol=1e-3, atol=1e-3)
    close(got, tf.reduce_sum(h, axis=0), rtol=1e-2, atol=4e-2)
    x = randn(2, 3)
    close(run("reduce", [x], {"fn": "sum", "axes": [], "keepdims": False}), x)


def test_reduce_integers_and_bool_over_outer_and_inner_axes() -> None:
    # The native loop reduces x's last axis a run at a time, folded into one slot of y or
    # added onto a row of y: both, with a kept axis between reduced ones.
    i = RNG.integers(-1000, 1000, (3, 4, 300)).astype(np.int32)
    b = RNG.random((3, 4, 300)) < 0.02
    for axes in ([0, 2], [0, 1], [2]):
        for fn in ("sum", "mean", "max", "min"):
            close(run("reduce", [i], {"fn": fn, "axes": axes, "keepdims": False}),
                  REDUCE_TF[fn](i, axis=axes))
        close(run("reduce", [b], {"fn": "any", "axes": axes, "keepdims": True}),
              tf.reduce_any(b, axis=axes, keepdims=True))
        close(run("reduce", [~b], {"fn": "all", "axes": axes, "keepdims": False}),
              tf.reduce_all(~b, axis=axes))


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float16, 2e-3)])
def test_softmax_along_an_outer_axis_of_wide_rows(dtype: type, tol: float) -> None:
    # 300 positions beside the axis: the native loop takes them in blocks of 256 (one
    # whole, one part).
    x = randn(5, 2, 300, dtype=dtype) * 8
    for log in (False, True):
        ref = tf.nn.log_softmax if log else tf.nn.softmax
        close(run("softmax", [x], {"axis": 0, "log": log}), ref(x, axis=0), rtol=tol,
              atol=tol)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_matches_tf(log: bool, axis: int) -> None:
    x = randn(3, 4, 5) * 30  # large logits: needs the max subtraction
    ref = tf.nn.log_softmax if log else tf.nn.softmax
    close(run("softmax", [x], {"axis": axis, "log": log}), ref(x, axis=axis),
          rtol=1e-5, atol=1e-5)


def test_softmax_float16() -> None:
    x = randn(4, 10).astype(np.float16)
    close(run("softmax", [x], {"axis": 1, "log": False}), tf.nn.softmax(x), rtol=2e-3,
          atol=2e-3)


@pytest.mark.parametrize("fn", ["argmax", "argmin"])
@pytest.mark.parametrize("to", ["int32", "int64"])
@pytest.mark.parametrize("axis", [0, 2])
def test_argminmax_first_occurrence(fn: str, to: str, axis: int) -> None:
    x = np.round(randn(4, 3, 6)).astype(np.float32)  # many ties
    ref = tf.math.argmax if fn == "argmax" else tf.math.argmin
    close(run("argminmax", [x], {"fn": fn, "axis": axis, "to": to}),
          ref(x, axis=axis, output_type=to))


# --- data movement ---------------------------------------------------------------

def test_reshape_transpose_concat() -> None:
    x = randn(2, 3, 4)
    close(run("reshape", [x], {"shape": [4, 6]}), tf.reshape(x, [4, 6]))
    close(run("transpose", [x], {"perm": [2, 0, 1]}), tf.transpose(x, [2, 0, 1]))
    parts = [randn(2, k, 4) for k in (1, 3, 2)]
    close(run("concat", parts, {"axis": 1}), tf.concat(parts, axis=1))
    ints = [np.arange(6, dtype=np.int32).reshape(2, 3)] * 2
    close(run("concat", ints, {"axis": 0}), tf.concat(ints, 0))


@pytest.mark.parametrize("begin,end,strides", [
    ([1, 0, 0], [3, 4, 5], [1, 2, 1]),
    ([3, 0, 4], [0, None, None], [-1, 1, -2]),
    ([0, 1, 0], [None, -1, None], [2, 1, 3]),
])
def test_strided_slice(begin: list, end: list, strides: list) -> None:
    x = randn(4, 5, 6)
    want = x[tuple(slice(b, e, s) for b, e, s in zip(begin, end, strides, strict=True))]
    close(run("strided_slice", [x], {"begin": begin, "end": end, "strides": strides}), want)
    tf_end = [e if e is not None else (d if s > 0 else -d - 1)
              for e, d, s in zip(end, x.shape, strides, strict=True)]
    close(run("strided_slice", [x], {"begin": begin, "end": end, "strides": strides}),
          tf.strided_slice(x, begin, tf_end, strides))


@pytest.mark.parametrize("mode", ["constant", "reflect", "symmetric"])
def test_pad_matches_tf(mode: str) -> None:
    x = randn(2, 4, 5)
    paddings = [[0, 1], [2, 3], [1, 0]]
    attrs = {"paddings": paddings, "mode": mode, "value": 1.5}
    want = tf.pad(x, paddings, mode=mode.upper(), constant_values=1.5)
    close(run("pad", [x], attrs), want)


def test_tile_and_broadcast_to() -> None:
    x = randn(2, 1, 3)
    close(run("tile", [x], {"multiples": [2, 3, 1]}), tf.tile(x, [2, 3, 1]))
    close(run("broadcast_to", [x], {"shape": [4, 2, 5, 3]}), tf.broadcast_to(x, [4, 2, 5, 3]))


@pytest.mark.parametrize("ps,idx_shape,axis,bd", [
    ((5, 3), (4,), 0, 0), ((5, 3), (2, 2), 1, 0), ((2, 6, 3), (2, 4), 1, 1),
    ((2, 3, 6, 2), (2, 3, 5), 2, 2), ((2, 3, 6, 2), (2, 4), 2, 1), ((7, 2), (3,), 1, 0),
    ((7,), (), 0, 0),
])
def test_gather_matches_tf(ps: tuple, idx_shape: tuple, axis: int, bd: int) -> None:
    params = randn(*ps)
    idx = RNG.integers(0, ps[axis], size=idx_shape).astype(np.int32)
    close(run("gather", [params, idx], {"axis": axis, "batch_dims": bd}),
          tf.gather(params, idx, axis=axis, batch_dims=bd))
    close(run("gather", [params, idx.astype(np.int64)], {"axis": axis, "batch_dims": bd}),
          tf.gather(params, idx, axis=axis, batch_dims=bd))


@pytest.mark.parametrize("bad", [5, -1])
def test_gather_out_of_range_raises(bad: int) -> None:
    # numpy raises IndexError; inside a program it reaches the caller as ExecutionError.
    with pytest.raises((IndexError, ExecutionError), match=f"{bad}.*out of range"):
        run("gather", [randn(5, 2), np.array([0, bad], np.int32)], {"axis": 0, "batch_dims": 0})


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_matches_tf(axis: int) -> None:
    idx = np.array([[0, 3, 5], [-1, 2, 1]], np.int32)  # 5 and -1: all-off rows
    attrs = {"depth": 4, "on_value": 2.0, "off_value": -1.0, "axis": axis, "to": "float32"}
    close(run("one_hot", [idx], attrs),
          tf.one_hot(idx, 4, on_value=2.0, off_value=-1.0, axis=axis))
    attrs = {"depth": 3, "on_value": 1, "off_value": 0, "axis": axis, "to": "int32"}
    close(run("one_hot", [idx], attrs), tf.one_hot(idx, 3, 1, 0, axis=axis, dtype=tf.int32))


# --- resize --------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("align_corners,half_pixel", [(False, False), (True, False),
                                                      (False, True)])
@pytest.mark.parametrize("size", [(9, 14), (3, 2), (5, 5), (1, 1), (8, 1)])
def test_resize_matches_tf(mode: str, align_corners: bool, half_pixel: bool,
                           size: tuple) -> None:
    x = randn(2, 5, 7, 3)
    op = tf.raw_ops.ResizeBilinear if mode == "bilinear" else tf.raw_ops.ResizeNearestNeighbor
    want = op(images=x, size=size, align_corners=align_corners,
              half_pixel_centers=half_pixel)
    attrs = {"mode": mode, "size": list(size), "align_corners": align_corners,
             "half_pixel_centers": half_pixel}
    close(run("resize", [x], attrs), want)


def test_resize_integer_input() -> None:
    x = RNG.integers(0, 255, size=(1, 4, 6, 2)).astype(np.uint8)
    for mode, op in [("bilinear", tf.raw_ops.ResizeBilinear),
                     ("nearest", tf.raw_ops.ResizeNearestNeighbor)]:
        attrs = {"mode": mode, "size": [7, 3], "align_corners": False,
                 "half_pixel_centers": True}
        close(run("resize", [x], attrs),
              op(images=x, size=[7, 3], align_corners=False, half_pixel_centers=True))


def test_tf_image_resize_default_is_half_pixel_bilinear() -> None:
    x = randn(1, 6, 6, 2)
    attrs = {"mode": "bilinear", "size": [10, 4], "align_corners": False,
             "half_pixel_centers": True}
    close(run("resize", [x], attrs), tf.image.resize(x, [10, 4]))


# --- reduced-precision compute (--auto-cast) ----------------------------------------

def _through(x: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(x).astype(dtype).astype(np.float32)


@pytest.mark.parametrize("compute", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["conv2d", "depthwise_conv2d", "matmul"])
def test_reduced_precision_compute_matches_tf_on_rounded_operands(kind: str,
                                                                  compute: str) -> None:
    # The device reads both operands in 16 bits and accumulates in float32: TF's float32
    # op on the rounded operands is the reference, up to summation order.
    b = randn(6)
    if kind == "matmul":
        x, w = randn(5, 7), randn(7, 6)
        want = tf.nn.relu(tf.matmul(_through(x, compute), _through(w, compute)) + b)
    else:
        x, w = randn(2, 9, 9, 3), randn(3, 3, 3, 2 if kind == "depthwise_conv2d" else 6)
        want = tf.nn.relu(tf_conv(_through(x, compute), _through(w, compute), [1, 1], [1, 1],
                                  "SAME", depthwise=kind == "depthwise_conv2d") + b)
    attrs = {"activation": "relu", "compute": compute}
    if kind != "matmul":
        attrs |= {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1]}
    got = run(kind, [x, w.astype(compute), b], attrs)
    close(got, want, rtol=1e-5, atol=1e-5)
    # ...and it is not what float32 operands give: the rounding really happens.
    attrs.pop("compute")
    assert np.abs(got - run(kind, [x, w, b], attrs)).max() > 1e-4


def test_native_engine_takes_the_hot_instructions() -> None:
    """The kinds whole models spend their time in run on oneDNN, not on the numpy
    fallback (which would still pass every value comparison, only slowly)."""
    lib = library.load()
    assert lib is not None, library.why_not()
    conv = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "activation": "relu"}
    x4, w, b = randn(2, 6, 6, 8), randn(3, 3, 8, 8), randn(8)
    cases = [
        ("conv2d", [x4, w, b], conv, {1}),
        ("conv2d", [x4, w.astype("bfloat16"), b], conv | {"compute": "bfloat16"}, {1}),
        ("conv2d", [x4, randn(3, 3, 2, 8), b], conv | {"groups": 4}, {1}),
        ("conv2d", [x4, w, b, randn(2, 6, 6, 8)], conv | {"residual": True}, {1}),
        ("depthwise_conv2d", [x4, randn(3, 3, 8, 1), b], conv, {1}),
        ("matmul", [randn(4, 8), randn(8, 5), randn(5)], {"activation": "none"}, {1}),
        ("matmul", [randn(2, 3, 4, 8), randn(2, 3, 5, 8)], {"transpose_b": True}, set()),
        ("matmul", [randn(2, 4, 8), randn(2, 5, 8)], {"transpose_b": True,
                                                     "compute": "bfloat16"}, set()),
        ("pool", [x4], {"mode": "max", "ksize": [3, 3], "strides": [2, 2],
                        "pads": [1, 1, 1, 1]}, set()),
        ("unary", [x4], {"fn": "relu6"}, set()),
        ("binary", [randn(2, 5), randn(5)], {"fn": "add"}, set()),
        ("binary", [randn(5), randn(2, 5)], {"fn": "sub"}, set()),  # the engine's own loop
        ("softmax", [randn(2, 5)], {"axis": 1}, set()),
        ("reduce", [x4], {"fn": "mean", "axes": [1, 2], "keepdims": False}, set()),
        ("reduce", [randn(3, 7)], {"fn": "sum", "axes": [1], "keepdims": True}, set()),
        ("concat", [randn(2, 3), randn(2, 4)], {"axis": 1}, set()),
        ("transpose", [randn(2, 3, 4)], {"perm": [2, 0, 1]}, set()),
        ("layer_norm", [randn(2, 3, 16), randn(16), randn(16)], {"epsilon": 1e-3}, {1, 2}),
    ]
    ran = {}
    for i, (kind, ins, attrs, const) in enumerate(cases):
        types = kinds.infer(kind, [TensorType(x.shape, x.dtype.name) for x in ins], attrs)
        _, ran[i] = evaluate_one(kind, ins, attrs, [(t.shape, t.dtype) for t in types],
                                 constant=frozenset(const), native=lib)
    assert {i for i, e in ran.items() if e == "numpy"} == set(), ran


@pytest.mark.parametrize("compute", ["bfloat16", "float16"])
def test_reduced_precision_matmul_of_two_activations(compute: str) -> None:
    # Attention's scores: neither operand is a constant, both are rounded by the instruction.
    q, k = randn(2, 4, 8), randn(2, 5, 8)
    want = tf.matmul(_through(q, compute), _through(k, compute), transpose_b=True)
    types = kinds.infer("matmul", [TensorType(q.shape, "float32"), TensorType(k.shape, "float32")],
                        {"transpose_b": True})
    attrs = {"transpose_b": True, "compute": compute}
    out_types = [(t.shape, t.dtype) for t in types]
    if ENGINE == "numpy":
        got = evaluate("matmul", [q, k], attrs, out_types)[0]
    else:
        (got,), _ = evaluate_one("matmul", [q, k], attrs, out_types, native=library.load())
    close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_floor_div_floors_the_quotient_rounded_to_its_dtype(dtype: str) -> None:
    """TF floors a/b after rounding it to float16/bfloat16; flooring the float32
    quotient differs from TF in ~2% (float16) and ~10% (bfloat16) of these operands."""
    rng = np.random.default_rng(7)
    a = (rng.standard_normal(4096) * 50).astype(np.float32)
    b = (rng.standard_normal(4096) * 2).astype(np.float32) + 0.25
    a16, b16 = tf.cast(a, dtype), tf.cast(b, dtype)
    want = tf.math.floordiv(a16, b16).numpy()
    got = run("binary", [a16.numpy(), b16.numpy()], {"fn": "floor_div"})
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32"])
def test_integer_mean_truncates_a_sum_that_wrapped_to_the_minimum(dtype: str) -> None:
    """TF sums an integer mean in its own dtype: a sum that wraps to the type's minimum
    (whose negation is itself) still divides toward zero."""
    low = np.iinfo(dtype).min
    x = np.array([[low // 2, low // 2, 0, 0, 0, 0, 0, 0], [low, 3, 0, 0, 0, 0, 0, 0],
                  [low, -1, 5, 0, 0, 0, 0, 0]], dtype)
    want = tf.reduce_mean(tf.constant(x), axis=1, keepdims=True).numpy()
    got = run("reduce", [x], {"fn": "mean", "axes": [1], "keepdims": True})
    np.testing.assert_array_equal(got, want)
