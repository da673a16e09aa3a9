"""Conformance of the nn / math / linalg / basic lowerings against TensorFlow.

Every op type registered by `cc/ops/{basic,math,nn,linalg}.py` has cases here over
several shapes, dtypes and attribute values (`test_every_op_has_a_case` checks).
Inputs are fed through placeholders so the ops are really compiled, not
constant-folded; operands TF needs constant (axes, ksize) are `tf.constant`s.

Tolerances: float32 rtol 1e-5 by default. Ops that sum many products (conv,
matmul, einsum, pooling averages) get atol 1e-5: the device accumulates in a
different order than Eigen, so results near zero differ by ~K·eps·|terms|.
float16 cases use rtol 1e-3 (11-bit mantissa, results rounded once more).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.errors import UnsupportedNodes
from neuronish.cc.ops import basic, linalg, math, nn
from neuronish.cc.ops.registry import LOWERINGS
from tests.cc.conformance import Case, both_engines, run_case  # noqa: F401 (fixture)
from tests.helpers import compile_and_run

# Every case on the numpy reference engine and on the native one.
pytestmark = pytest.mark.usefixtures("both_engines")

raw = tf.raw_ops
_rng = np.random.default_rng(1234)
SUM_ATOL = 1e-5  # see the module docstring
F16 = {"rtol": 1e-3, "atol": 1e-3}


def rand(*shape: int, dtype: str = "float32", lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    """Uniform values in [lo, hi) (integers: rounded; bool: fair coin), fixed seed."""
    if dtype == "bool":
        return np.asarray(_rng.uniform(size=shape) < 0.5)
    x = _rng.uniform(lo, hi, shape)
    if np.dtype(dtype).kind in "iu":
        x = np.round(x)
    return np.asarray(x).astype(dtype)


def nonzero(*shape: int, dtype: str = "float32") -> np.ndarray:
    """Values with |x| in [0.5, 2): safe divisors and reciprocals."""
    return (rand(*shape, lo=0.5, hi=2.0) * np.where(rand(*shape) < 0, -1, 1)).astype(dtype)


CASES: list[Case] = []


def case(op_type: str, fn: object, inputs: list[np.ndarray], id: str, **kw: object) -> None:
    CASES.append(Case(op_type, fn, inputs, id, **kw))


# --- basic -----------------------------------------------------------------------

for dt in ("float32", "int32", "bool", "float16"):
    case("Identity", lambda x: raw.Identity(input=x), [rand(2, 3, dtype=dt)], dt)
    case("Placeholder", lambda x: raw.Identity(input=x), [rand(4, dtype=dt)], dt)
for op in ("StopGradient", "Snapshot", "PreventGradient"):
    case(op, lambda x, op=op: getattr(raw, op)(input=x) * 2.0, [rand(3, 4)], "f32")
for op in ("StopGradient", "Snapshot"):
    for dt, shape in (("float64", (2, 1, 5)), ("float16", (6,)), ("int32", (3, 2)),
                      ("int64", ()), ("uint8", (4, 4))):
        case(op, lambda x, op=op: getattr(raw, op)(input=x) + x,
             [rand(*shape, dtype=dt, lo=0, hi=5)], f"{dt}-rank{len(shape)}",
             **(F16 if dt == "float16" else {}))
    case(op, lambda x, op=op: raw.LogicalNot(x=getattr(raw, op)(input=x)),
         [rand(2, 3, dtype="bool")], "bool")
    # Straight to the graph's output: the device must still hand back a copy.
    case(op, lambda x, op=op: getattr(raw, op)(input=x), [rand(1, 2, 3, 2)], "f32-output")
case("IdentityN", lambda x, y: raw.IdentityN(input=[x * 2.0, y]),
     [rand(2, 3), rand(5, dtype="int32")], "f32-i32")
case("IdentityN", lambda x: raw.IdentityN(input=[x + 1.0]), [rand(4)], "single")
case("PlaceholderWithDefault",
     lambda x: raw.PlaceholderWithDefault(input=x * 3.0, shape=[2, 3]) + 1.0, [rand(2, 3)],
     "not-fed")


def _add_const(c: np.ndarray) -> object:
    # (a closure: tf.function would turn an array default argument into an input)
    return lambda x: x + tf.constant(c)


for dt in ("float32", "float64", "int32", "int64", "float16", "uint8"):
    case("Const", _add_const(rand(2, 3, dtype=dt, lo=0, hi=5)), [rand(2, 3, dtype=dt, lo=0, hi=5)],
         dt)
case("Const", lambda x: (x * 2.0, tf.constant([True, False]), tf.constant(7, tf.int64)),
     [rand(3)], "const-outputs")
case("Const", lambda x: x * tf.constant(2.5, shape=[2, 3]), [rand(2, 3)], "splat")


def _after_noop(x: tf.Tensor) -> tf.Tensor:
    with tf.control_dependencies([raw.NoOp()]):
        return raw.Identity(input=x) + 1.0


case("NoOp", _after_noop, [rand(2, 2)], "control-dep")


def _two_outputs_after_noop(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    with tf.control_dependencies([raw.NoOp()]):
        return raw.Identity(input=x) + x, raw.LogicalNot(x=y)


def _noop_after_work(x: tf.Tensor) -> tf.Tensor:
    y = x * x
    with tf.control_dependencies([y.op]):
        done = raw.NoOp()
    with tf.control_dependencies([done]):
        return raw.Identity(input=y) - x


case("NoOp", _two_outputs_after_noop, [rand(3, 1, 2, dtype="int32"), rand(4, dtype="bool")],
     "i32-bool-two-outputs")
case("NoOp", _noop_after_work, [rand(5, dtype="float64")], "f64-gated-by-work")
case("NoOp", _noop_after_work, [rand(2, 3, dtype="float16")], "f16-gated-by-work", **F16)

# --- math: unary ------------------------------------------------------------------

_POSITIVE = {"Log", "Sqrt", "Rsqrt"}
for op in ("Abs", "Neg", "Sign", "Square", "Reciprocal", "Inv", "Floor", "Ceil", "Sqrt",
           "Rsqrt", "Exp", "Log", "Erf", "Erfc"):
    for dt, shape in (("float32", (7,)), ("float32", (2, 3, 4)), ("float64", (3, 5)),
                      ("float16", (6,))):
        if op in _POSITIVE:
            x = rand(*shape, dtype=dt, lo=0.1, hi=5.0)
        elif op in ("Reciprocal", "Inv"):
            x = nonzero(*shape, dtype=dt)
        else:
            x = rand(*shape, dtype=dt, lo=-3.0, hi=3.0)
        kw = F16 if dt == "float16" else {}
        case(op, lambda x, op=op: getattr(raw, op)(x=x), [x], f"{dt}-{'x'.join(map(str, shape))}",
             **kw)
for op in ("Abs", "Neg", "Sign", "Square"):
    for dt in ("int32", "int64", "int8"):
        case(op, lambda x, op=op: getattr(raw, op)(x=x), [rand(3, 4, dtype=dt, lo=-9, hi=9)], dt)
case("Square", lambda x: raw.Square(x=x), [rand(5, dtype="uint8", lo=0, hi=15)], "uint8")
case("Sign", lambda x: raw.Sign(x=x), [np.array([-1.5, 0.0, 2.0, -0.0], np.float32)], "zeros")
case("Floor", lambda x: raw.Floor(x=x), [np.array([-1.5, -1.0, 0.0, 0.5, 2.0], np.float32)],
     "edges")
case("Ceil", lambda x: raw.Ceil(x=x), [np.array([-1.5, -1.0, -0.2, 0.5, 2.0], np.float32)],
     "edges")
# Rotary embeddings (Sin, Cos) and the rest of TF's float math a model may use.
for op, lo, hi in (("Sin", -7.0, 7.0), ("Cos", -7.0, 7.0), ("Tan", -1.2, 1.2),
                   ("Atan", -5.0, 5.0), ("Log1p", -0.9, 4.0), ("Expm1", -3.0, 3.0),
                   ("Round", -4.0, 4.0)):
    for dt, shape in (("float32", (2, 3, 4)), ("float64", (3, 5)), ("float16", (6,))):
        case(op, lambda x, op=op: getattr(raw, op)(x=x), [rand(*shape, dtype=dt, lo=lo, hi=hi)],
             f"{dt}-{'x'.join(map(str, shape))}", **(F16 if dt == "float16" else {}))
case("Round", lambda x: raw.Round(x=x),
     [np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997], np.float32)], "halves-to-even")
_SPECIAL = np.array([0.0, -1.5, np.inf, -np.inf, np.nan, 6e4, -0.0], np.float32)
for op in ("IsNan", "IsInf", "IsFinite"):
    for dt in ("float32", "float64", "float16"):
        case(op, lambda x, op=op: getattr(raw, op)(x=x), [_SPECIAL.astype(dt)], dt)
case("IsFinite", lambda x: tf.reduce_logsumexp(x, axis=-1), [rand(3, 5)], "logsumexp", atol=1e-5)
case("LogicalNot", lambda x: raw.LogicalNot(x=x), [rand(3, 4, dtype="bool")], "bool")
case("LogicalNot", lambda x: raw.LogicalNot(x=x), [rand(7, dtype="bool")], "bool-1d")

# --- math: binary --------------------------------------------------------------------

_SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((), (2, 3)),
           ((2, 1, 5), (3, 1))]


def _shape_id(sa: tuple, sb: tuple) -> str:
    return f"{'x'.join(map(str, sa)) or 'scalar'}-{'x'.join(map(str, sb)) or 'scalar'}"


def _floor_cases() -> None:
    for op in ("FloorDiv", "FloorMod"):
        for sa, sb in _SHAPES[:3]:
            case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b),
                 [rand(*sa, lo=-6, hi=6), nonzero(*sb)], f"f32-{_shape_id(sa, sb)}")
        for dt in ("int32", "int64"):  # negative operands: rounding toward -inf matters
            b = rand(2, 3, dtype=dt, lo=1, hi=4) * np.where(rand(2, 3) < 0, -1, 1).astype(dt)
            case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b),
                 [rand(2, 3, dtype=dt, lo=-9, hi=9), b], dt)
        case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b),
             [rand(5, dtype="float64", lo=-6, hi=6), nonzero(5, dtype="float64")], "float64")


_floor_cases()

for op in ("Add", "AddV2", "Sub", "Mul", "Maximum", "Minimum", "SquaredDifference",
           "Greater", "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual"):
    for sa, sb in _SHAPES:
        case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b), [rand(*sa), rand(*sb)],
             f"f32-{_shape_id(sa, sb)}")
    for dt in ("float64", "int32", "int64"):
        lo, hi = (-5, 5) if dt.startswith("int") else (-2, 2)
        case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b),
             [rand(2, 3, dtype=dt, lo=lo, hi=hi), rand(3, dtype=dt, lo=lo, hi=hi)], dt)
    case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b),
         [rand(4, dtype="float16"), rand(4, dtype="float16")], "float16", **F16)
for op in ("Add", "Sub", "Mul", "Maximum", "Minimum", "Greater", "Equal"):
    for dt in ("int8", "uint8", "int16"):
        case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b),
             [rand(6, dtype=dt, lo=0, hi=9), rand(6, dtype=dt, lo=0, hi=9)], dt)
for op in ("Equal", "NotEqual"):
    case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b),
         [rand(3, 4, dtype="bool"), rand(4, dtype="bool")], "bool")
    # ties must compare equal: both operands share values
    v = rand(6, dtype="int32", lo=0, hi=3)
    case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b), [v, v[::-1].copy()], "ties")
for op in ("Div", "RealDiv"):
    for sa, sb in _SHAPES:
        case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b), [rand(*sa), nonzero(*sb)],
             f"f32-{_shape_id(sa, sb)}")
    case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b),
         [rand(3, 4, dtype="float64"), nonzero(4, dtype="float64")], "float64")
for sa, sb in _SHAPES[:4]:
    case("Pow", lambda a, b: raw.Pow(x=a, y=b), [rand(*sa, lo=0.1, hi=3.0), rand(*sb)],
         f"f32-{_shape_id(sa, sb)}")
case("Pow", lambda a, b: raw.Pow(x=a, y=b),
     [rand(3, 4, dtype="float64", lo=0.1, hi=3), rand(4, dtype="float64")], "float64")
case("Pow", lambda a, b: raw.Pow(x=a, y=b),
     [rand(2, 3, dtype="int32", lo=-4, hi=4), rand(3, dtype="int32", lo=0, hi=4)], "int32")
case("Pow", lambda a: raw.Pow(x=a, y=tf.constant(2.0)), [rand(5)], "const-exponent")
# Constant operands fold at compile time (with the device kernels): scalars and tensors.
case("AddV2", lambda x: x * raw.AddV2(x=tf.constant(2.0), y=tf.constant(3.0)), [rand(3)],
     "fold-scalar-consts")
case("Mul", lambda x: x + raw.Mul(x=tf.constant(rand(2, 3)), y=tf.constant(rand(3))),
     [rand(2, 3)], "fold-tensor-consts")
for op in ("LogicalAnd", "LogicalOr"):
    for sa, sb in _SHAPES[:4]:
        case(op, lambda a, b, op=op: getattr(raw, op)(x=a, y=b),
             [rand(*sa, dtype="bool"), rand(*sb, dtype="bool")], _shape_id(sa, sb))

case("ClipByValue", lambda t: raw.ClipByValue(t=t, clip_value_min=tf.constant(-0.5),
                                              clip_value_max=tf.constant(1.0)),
     [rand(3, 4)], "scalar-bounds")
case("ClipByValue", lambda t, lo, hi: raw.ClipByValue(t=t, clip_value_min=lo, clip_value_max=hi),
     [rand(2, 3), rand(2, 3, lo=-2, hi=0), rand(2, 3, lo=0, hi=2)], "tensor-bounds")
case("ClipByValue", lambda t: raw.ClipByValue(t=t, clip_value_min=tf.constant(0),
                                              clip_value_max=tf.constant(3)),
     [rand(6, dtype="int32", lo=-5, hi=6)], "int32")

case("AddN", lambda a, b, c: raw.AddN(inputs=[a, b, c]), [rand(2, 3), rand(2, 3), rand(2, 3)],
     "three-f32")
case("AddN", lambda a: raw.AddN(inputs=[a]), [rand(4)], "one")
case("AddN", lambda a, b: raw.AddN(inputs=[a, b]),
     [rand(3, dtype="int32", lo=-9, hi=9), rand(3, dtype="int32", lo=-9, hi=9)], "int32")
case("AddN", lambda a, b: raw.AddN(inputs=[a, b, a, b]),
     [rand(2, 2, 2, dtype="float64"), rand(2, 2, 2, dtype="float64")], "four-f64")

# --- select and cast ----------------------------------------------------------------

case("Select", lambda c, a, b: raw.Select(condition=c, x=a, y=b),
     [rand(2, 3, dtype="bool"), rand(2, 3), rand(2, 3)], "same-shape")
case("Select", lambda c, a, b: raw.Select(condition=c, x=a, y=b),
     [rand(4, dtype="bool"), rand(4, 2, 3), rand(4, 2, 3)], "rank1-cond-rows")
case("Select", lambda c, a, b: raw.Select(condition=c, x=a, y=b),
     [rand(3, dtype="bool"), rand(3, 5, dtype="int32"), rand(3, 5, dtype="int32")],
     "rank1-cond-int32")
case("Select", lambda c, a, b: raw.Select(condition=c, x=a, y=b),
     [rand(dtype="bool"), rand(2, 2), rand(2, 2)], "scalar-cond")
case("Select", lambda c, a, b: raw.Select(condition=c, x=a, y=b),
     [rand(5, dtype="bool"), rand(5, dtype="bool"), rand(5, dtype="bool")], "vector-bool")
case("SelectV2", lambda c, a, b: raw.SelectV2(condition=c, t=a, e=b),
     [rand(3, 1, dtype="bool"), rand(1, 4), rand()], "broadcast")
case("SelectV2", lambda c, a, b: raw.SelectV2(condition=c, t=a, e=b),
     [rand(2, 3, dtype="bool"), rand(2, 3, dtype="int64"), rand(2, 3, dtype="int64")], "int64")
case("SelectV2", lambda c, a, b: raw.SelectV2(condition=c, t=a, e=b),
     [rand(4, dtype="bool"), rand(3, 4, dtype="float64"), rand(4, dtype="float64")], "float64")

for src, dst, x in (
        ("float32", "int32", rand(3, 4, lo=-9, hi=9)),
        ("float32", "bool", np.array([0.0, -0.0, 0.5, -2.0, 0.0], np.float32)),
        ("int32", "float32", rand(5, dtype="int32", lo=-99, hi=99)),
        ("bool", "float32", rand(2, 3, dtype="bool")),
        ("bool", "int32", rand(4, dtype="bool")),
        ("float64", "float16", rand(6, dtype="float64")),
        ("float64", "float32", rand(6, dtype="float64")),
        ("float16", "float32", rand(6, dtype="float16")),
        ("int64", "int32", rand(4, dtype="int64", lo=-99, hi=99)),
        ("int32", "int64", rand(4, dtype="int32", lo=-99, hi=99)),
        ("uint8", "float32", rand(4, dtype="uint8", lo=0, hi=255)),
        ("float32", "uint8", rand(4, lo=0, hi=250)),
        ("int32", "bool", np.array([0, 3, -1, 0], np.int32)),
        ("float32", "float32", rand(3))):
    case("Cast", lambda x, dst=dst: raw.Cast(x=x, DstT=tf.as_dtype(dst)), [x], f"{src}-{dst}")
case("Cast", lambda x: raw.Cast(x=x, DstT=tf.int32, Truncate=True), [rand(4, lo=-5, hi=5)],
     "truncate-attr")

# --- reductions --------------------------------------------------------------------------

for op in ("Sum", "Mean", "Max", "Min", "Prod"):
    for axes, keep, shape in (([1], False, (2, 3, 4)), ([-1], True, (2, 3, 4)),
                              ([0, 2], False, (2, 3, 4)), (-2, True, (3, 5)),
                              ([0, 1, 2], False, (2, 3, 2)), ([0, -1], True, (2, 2, 3)),
                              ([], False, (3, 2))):
        x = rand(*shape, lo=0.5, hi=1.5) if op == "Prod" else rand(*shape)
        case(op, lambda x, op=op, axes=axes, keep=keep: getattr(raw, op)(
            input=x, axis=tf.constant(axes, tf.int32), keep_dims=keep), [x],
            f"axes{axes}-keep{int(keep)}-{'x'.join(map(str, shape))}")
    for dt in ("int32", "float64", "int64"):
        case(op, lambda x, op=op: getattr(raw, op)(input=x, axis=tf.constant([1])),
             [rand(3, 4, dtype=dt, lo=-3, hi=3)], dt)
    case(op, lambda x, op=op: getattr(raw, op)(input=x, axis=tf.constant([0], tf.int64)),
         [rand(3, 2)], "int64-axes")
    case(op, lambda x, op=op: getattr(raw, op)(input=x, axis=tf.constant([1])),
         [rand(2, 8, dtype="float16", lo=0.5, hi=1.5)], "float16", **F16)
case("Mean", lambda x: raw.Mean(input=x, axis=tf.constant([1])),
     [np.array([[-3, -4, 5], [1, 2, 2]], np.int32)], "int32-truncates")
for op in ("Any", "All"):
    for axes, keep in (([1], False), ([0], True), ([-1, 0], False)):
        case(op, lambda x, op=op, axes=axes, keep=keep: getattr(raw, op)(
            input=x, axis=tf.constant(axes), keep_dims=keep),
            [rand(3, 4, dtype="bool")], f"axes{axes}-keep{int(keep)}")
    case(op, lambda x, op=op: getattr(raw, op)(input=x, axis=tf.constant(1)),
         [np.array([[True, True], [False, True], [False, False]])], "rows")

for op in ("ArgMax", "ArgMin"):
    for axis, out, shape in ((1, tf.int64, (3, 5)), (-1, tf.int32, (2, 3, 4)),
                             (0, tf.int32, (4, 3)), (2, tf.int64, (2, 2, 6))):
        case(op, lambda x, op=op, axis=axis, out=out: getattr(raw, op)(
            input=x, dimension=tf.constant(axis), output_type=out), [rand(*shape)],
            f"axis{axis}-{out.name}-{'x'.join(map(str, shape))}")
    case(op, lambda x, op=op: getattr(raw, op)(input=x, dimension=tf.constant(1)),
         [rand(4, 6, dtype="int32", lo=0, hi=2)], "int32-ties-first")
    case(op, lambda x, op=op: getattr(raw, op)(input=x, dimension=tf.constant(0)),
         [rand(5, 2, dtype="float64")], "float64")
    case(op, lambda x, op=op: getattr(raw, op)(input=x, dimension=tf.constant(1)),
         [rand(3, 4, dtype="bool")], "bool")

# --- nn: convolution -------------------------------------------------------------------


def _conv(op: str, w: np.ndarray | None, **attrs: object) -> object:
    """A conv fn; w=None means the filter is the second (placeholder) input."""
    fn = getattr(raw, op)
    if w is None:
        return lambda x, f: fn(input=x, filter=f, **attrs)
    return lambda x: fn(input=x, filter=tf.constant(w), **attrs)


_CONV = [  # (id, input shape, filter shape, attrs)
    ("same-3x3-s1", (2, 8, 8, 3), (3, 3, 3, 4), dict(strides=[1, 1, 1, 1], padding="SAME")),
    ("valid-3x3-s1", (1, 7, 9, 2), (3, 3, 2, 5), dict(strides=[1, 1, 1, 1], padding="VALID")),
    ("same-3x3-s2-odd", (1, 9, 7, 3), (3, 3, 3, 4), dict(strides=[1, 2, 2, 1], padding="SAME")),
    ("same-4x4-s2-even", (1, 8, 8, 2), (4, 4, 2, 3), dict(strides=[1, 2, 2, 1], padding="SAME")),
    ("valid-s2x1", (2, 9, 6, 3), (3, 2, 3, 4), dict(strides=[1, 2, 1, 1], padding="VALID")),
    ("same-3x1", (1, 6, 6, 4), (3, 1, 4, 2), dict(strides=[1, 1, 1, 1], padding="SAME")),
    ("same-1x5", (1, 5, 9, 2), (1, 5, 2, 3), dict(strides=[1, 1, 1, 1], padding="SAME")),
    ("1x1", (2, 4, 4, 8), (1, 1, 8, 6), dict(strides=[1, 1, 1, 1], padding="VALID")),
    ("same-dil2", (1, 9, 9, 3), (3, 3, 3, 2),
     dict(strides=[1, 1, 1, 1], padding="SAME", dilations=[1, 2, 2, 1])),
    ("valid-dil2x3", (1, 10, 11, 2), (3, 2, 2, 3),
     dict(strides=[1, 1, 1, 1], padding="VALID", dilations=[1, 2, 3, 1])),
    ("same-dil2-s2", (1, 9, 9, 2), (3, 3, 2, 2),
     dict(strides=[1, 2, 2, 1], padding="SAME", dilations=[1, 2, 2, 1])),
    ("explicit", (1, 6, 7, 3), (3, 3, 3, 4),
     dict(strides=[1, 1, 1, 1], padding="EXPLICIT", explicit_paddings=[0, 0, 1, 2, 0, 3, 0, 0])),
    ("explicit-s2", (2, 8, 8, 2), (2, 3, 2, 3),
     dict(strides=[1, 2, 2, 1], padding="EXPLICIT", explicit_paddings=[0, 0, 2, 0, 1, 1, 0, 0])),
    ("kernel-larger-than-input-same", (1, 2, 3, 2), (5, 5, 2, 2),
     dict(strides=[1, 1, 1, 1], padding="SAME")),
]
for name, xs, ws, attrs in _CONV:
    w = rand(*ws)
    case("Conv2D", _conv("Conv2D", w, **attrs), [rand(*xs)], f"const-w-{name}", atol=SUM_ATOL)
    case("Conv2D", _conv("Conv2D", None, **attrs), [rand(*xs), rand(*ws)], f"fed-w-{name}",
         atol=SUM_ATOL)
# Grouped Conv2D (Keras Conv2D(groups=G)): the filter's C is input C / G.  One channel
# per group is depthwise convolution in disguise (ConvNeXt's 7x7 layers).
_GROUPED = [
    ("g-eq-c-m1", (2, 9, 9, 4), (7, 7, 1, 4), dict(strides=[1, 1, 1, 1], padding="SAME")),
    ("g-eq-c-m2-s2", (1, 8, 7, 3), (3, 3, 1, 6), dict(strides=[1, 2, 2, 1], padding="SAME")),
    ("g2", (2, 6, 6, 4), (3, 3, 2, 6), dict(strides=[1, 1, 1, 1], padding="SAME")),
    ("g3-valid-s2", (1, 9, 8, 6), (3, 2, 2, 3), dict(strides=[1, 2, 2, 1], padding="VALID")),
]
for name, xs, ws, attrs in _GROUPED:
    case("Conv2D", _conv("Conv2D", rand(*ws), **attrs), [rand(*xs)], f"grouped-{name}",
         atol=SUM_ATOL)
case("Conv2D", _conv("Conv2D", None, strides=[1, 1, 1, 1], padding="SAME"),
     [rand(1, 5, 5, 4), rand(3, 3, 2, 4)], "grouped-fed-w", atol=SUM_ATOL)
case("Conv2D", _conv("Conv2D", rand(3, 3, 3, 4, dtype="float64"), strides=[1, 1, 1, 1],
                     padding="SAME"), [rand(1, 5, 5, 3, dtype="float64")], "float64")
case("Conv2D", _conv("Conv2D", rand(3, 3, 3, 4, dtype="float16"), strides=[1, 1, 1, 1],
                     padding="SAME"), [rand(1, 5, 5, 3, dtype="float16")], "float16",
     rtol=1e-2, atol=2e-2)  # 27-term float16 sums: TF rounds partial sums differently


def _conv_bn_relu(x: tf.Tensor) -> tf.Tensor:
    """Conv2D → FusedBatchNormV3 → Relu: exercises fold_scale_shift + fusion."""
    y = raw.Conv2D(input=x, filter=tf.constant(_BN_W), strides=[1, 1, 1, 1], padding="SAME")
    y = raw.FusedBatchNormV3(x=y, scale=tf.constant(_BN_P[0]), offset=tf.constant(_BN_P[1]),
                             mean=tf.constant(_BN_P[2]), variance=tf.constant(_BN_P[3]),
                             epsilon=1e-3, is_training=False)[0]
    return raw.Relu(features=y)


_BN_W = rand(3, 3, 3, 4)
_BN_P = [rand(4, lo=0.5, hi=1.5), rand(4), rand(4), rand(4, lo=0.1, hi=2.0)]
case("Conv2D", _conv_bn_relu, [rand(2, 6, 6, 3)], "conv-bn-relu", atol=SUM_ATOL)

_DW = [
    ("same-m1", (2, 7, 7, 3), (3, 3, 3, 1), dict(strides=[1, 1, 1, 1], padding="SAME")),
    ("valid-m2", (1, 8, 6, 4), (3, 3, 4, 2), dict(strides=[1, 1, 1, 1], padding="VALID")),
    ("same-s2-m1", (1, 9, 9, 2), (3, 3, 2, 1), dict(strides=[1, 2, 2, 1], padding="SAME")),
    ("same-5x3-m3", (1, 6, 6, 2), (5, 3, 2, 3), dict(strides=[1, 1, 1, 1], padding="SAME")),
    ("explicit", (1, 5, 5, 3), (3, 3, 3, 2),
     dict(strides=[1, 1, 1, 1], padding="EXPLICIT", explicit_paddings=[0, 0, 1, 0, 2, 1, 0, 0])),
]
for name, xs, ws, attrs in _DW:
    w = rand(*ws)
    case("DepthwiseConv2dNative", _conv("DepthwiseConv2dNative", w, **attrs), [rand(*xs)],
         f"const-w-{name}", atol=SUM_ATOL)
    case("DepthwiseConv2dNative", _conv("DepthwiseConv2dNative", None, **attrs),
         [rand(*xs), rand(*ws)], f"fed-w-{name}", atol=SUM_ATOL)
case("DepthwiseConv2dNative", _conv("DepthwiseConv2dNative", rand(3, 3, 2, 2, dtype="float64"),
                                    strides=[1, 1, 1, 1], padding="SAME"),
     [rand(1, 4, 4, 2, dtype="float64")], "float64")

# --- nn: pooling ----------------------------------------------------------------------------

_POOL = [
    ("2x2-s2-valid", (2, 8, 8, 3), [1, 2, 2, 1], [1, 2, 2, 1], "VALID"),
    ("2x2-s2-same-odd", (1, 7, 7, 2), [1, 2, 2, 1], [1, 2, 2, 1], "SAME"),
    ("3x3-s2-same", (1, 8, 9, 2), [1, 3, 3, 1], [1, 2, 2, 1], "SAME"),
    ("3x3-s1-same", (1, 5, 5, 3), [1, 3, 3, 1], [1, 1, 1, 1], "SAME"),
    ("3x3-s2-valid", (2, 9, 9, 1), [1, 3, 3, 1], [1, 2, 2, 1], "VALID"),
    ("1x3-s1x2-same", (1, 4, 7, 2), [1, 1, 3, 1], [1, 1, 2, 1], "SAME"),
    ("global-valid", (2, 5, 5, 4), [1, 5, 5, 1], [1, 1, 1, 1], "VALID"),
]
def _pool_call(op: str, x: tf.Tensor, k: list, s: list, pad: str) -> tf.Tensor:
    if op == "MaxPool":
        return raw.MaxPool(input=x, ksize=k, strides=s, padding=pad)
    return raw.AvgPool(value=x, ksize=k, strides=s, padding=pad)


for op in ("MaxPool", "AvgPool"):
    for name, shape, k, s, pad in _POOL:
        case(op, lambda x, op=op, k=k, s=s, pad=pad: _pool_call(op, x, k, s, pad),
             [rand(*shape)], name, atol=SUM_ATOL)
    case(op, lambda x, op=op: _pool_call(op, x, [1, 2, 2, 1], [1, 2, 2, 1], "SAME"),
         [rand(1, 5, 5, 2, dtype="float64")], "float64")
    case(op, lambda x, op=op: _pool_call(op, x, [1, 2, 2, 1], [1, 2, 2, 1], "SAME"),
         [rand(1, 5, 5, 2, dtype="float16")], "float16", **F16)


case("MaxPool", lambda x: raw.MaxPool(input=x, ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1],
                                      padding="EXPLICIT",
                                      explicit_paddings=[0, 0, 1, 1, 0, 2, 0, 0]),
     [rand(1, 6, 6, 2, lo=-5, hi=-1)], "explicit-negative-values")
case("MaxPoolV2", lambda x: raw.MaxPoolV2(input=x, ksize=tf.constant([1, 3, 3, 1]),
                                          strides=tf.constant([1, 2, 2, 1]), padding="SAME"),
     [rand(2, 7, 7, 3)], "3x3-s2-same")
case("MaxPoolV2", lambda x: raw.MaxPoolV2(input=x, ksize=tf.constant([1, 2, 2, 1]),
                                          strides=tf.constant([1, 2, 2, 1]), padding="VALID"),
     [rand(1, 6, 6, 1)], "2x2-s2-valid")

# --- nn: batch norm, bias ----------------------------------------------------------------

_BN_OPS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")


def _bn(op: str, const: bool, eps: float = 1e-3) -> object:
    """(y, batch_mean, batch_variance); reserve_space_* are undefined in TF."""
    params = [rand(4, lo=0.5, hi=1.5), rand(4), rand(4), rand(4, lo=0.1, hi=2.0)]
    names = ("scale", "offset", "mean", "variance")
    if const:
        return lambda x: getattr(raw, op)(
            x=x, epsilon=eps, is_training=False,
            **{n: tf.constant(p) for n, p in zip(names, params, strict=True)})[:3]
    return lambda x, s, o, m, v: getattr(raw, op)(
        x=x, scale=s, offset=o, mean=m, variance=v, epsilon=eps, is_training=False)[:3]


for op in _BN_OPS:
    case(op, _bn(op, True), [rand(2, 4, 4, 4)], "const-params")
    case(op, _bn(op, True, eps=1e-5), [rand(1, 3, 5, 4, lo=-10, hi=10)], "const-eps1e-5",
         atol=1e-5)  # |x| up to 10: x*a+b cancels a few ulps of TF's (x-mean)*a+offset
    case(op, _bn(op, False), [rand(2, 3, 3, 4), rand(4, lo=0.5, hi=1.5), rand(4), rand(4),
                              rand(4, lo=0.1, hi=2.0)], "fed-params")
for op in ("FusedBatchNormV2", "FusedBatchNormV3"):
    case(op, _bn(op, True), [rand(1, 3, 3, 4, dtype="float16")], "float16-x", **F16)
case("FusedBatchNormV3", lambda x: raw.FusedBatchNormV3(
    x=x, scale=tf.ones([4]), offset=tf.zeros([4]), mean=tf.zeros([4]), variance=tf.ones([4]),
    is_training=False)[0], [rand(2, 2, 2, 4)], "default-eps")

case("BiasAdd", lambda x, b: raw.BiasAdd(value=x, bias=b), [rand(2, 4, 4, 3), rand(3)], "nhwc")
case("BiasAdd", lambda x: raw.BiasAdd(value=x, bias=tf.constant(rand(5))), [rand(3, 5)],
     "const-2d")
case("BiasAdd", lambda x, b: raw.BiasAdd(value=x, bias=b),
     [rand(2, 3, dtype="int32", lo=-9, hi=9), rand(3, dtype="int32", lo=-9, hi=9)], "int32")
case("BiasAdd", lambda x, b: raw.BiasAdd(value=x, bias=b),
     [rand(2, 2, 3, dtype="float64"), rand(3, dtype="float64")], "float64")
case("BiasAddV1", lambda x, b: raw.BiasAddV1(value=x, bias=b), [rand(3, 4), rand(4)], "2d")
case("BiasAddV1", lambda x, b: raw.BiasAddV1(value=x, bias=b), [rand(2, 3, 3, 2), rand(2)],
     "4d")

# --- nn: softmax, activations -----------------------------------------------------------

for op in ("Softmax", "LogSoftmax"):
    for shape in ((2, 5), (2, 3, 7), (10,)):
        case(op, lambda x, op=op: getattr(raw, op)(logits=x), [rand(*shape, lo=-5, hi=5)],
             "x".join(map(str, shape)))
    case(op, lambda x, op=op: getattr(raw, op)(logits=x), [rand(3, 4, lo=-50, hi=50)],
         "large-logits")
    case(op, lambda x, op=op: getattr(raw, op)(logits=x), [rand(3, 4, dtype="float64")],
         "float64")
    case(op, lambda x, op=op: getattr(raw, op)(logits=x), [rand(2, 8, dtype="float16")],
         "float16", **F16)



def _activation(op: str, x: tf.Tensor) -> tf.Tensor:
    fn = getattr(raw, op)
    return fn(x=x) if op in ("Sigmoid", "Tanh") else fn(features=x)


for op in ("Relu", "Relu6", "LeakyRelu", "Elu", "Selu", "Sigmoid", "Tanh", "Softplus",
           "Softsign"):
    for dt, shape in (("float32", (2, 3, 4)), ("float32", (9,)), ("float64", (3, 3)),
                      ("float16", (8,))):
        case(op, lambda x, op=op: _activation(op, x),
             [rand(*shape, dtype=dt, lo=-8, hi=8)], f"{dt}-{'x'.join(map(str, shape))}",
             **(F16 if dt == "float16" else {}))
for op in ("Relu", "Relu6"):
    for dt in ("int32", "int64", "uint8"):
        case(op, lambda x, op=op: getattr(raw, op)(features=x),
             [rand(8, dtype=dt, lo=0 if dt == "uint8" else -9, hi=9)], dt)
case("LeakyRelu", lambda x: raw.LeakyRelu(features=x, alpha=0.01), [rand(3, 4)], "alpha0.01")
case("LeakyRelu", lambda x: raw.LeakyRelu(features=x, alpha=1.5), [rand(3, 4)], "alpha1.5")
case("Softplus", lambda x: raw.Softplus(features=x), [rand(6, lo=-60, hi=60)], "large")
case("Sigmoid", lambda x: raw.Sigmoid(x=x), [rand(6, lo=-60, hi=60)], "large")

# --- linalg -------------------------------------------------------------------------------

for ta in (False, True):
    for tb in (False, True):
        a = rand(4, 3) if ta else rand(3, 4)
        b = rand(5, 4) if tb else rand(4, 5)
        case("MatMul", lambda a, b, ta=ta, tb=tb: raw.MatMul(a=a, b=b, transpose_a=ta,
                                                            transpose_b=tb),
             [a, b], f"ta{int(ta)}-tb{int(tb)}", atol=SUM_ATOL)
case("MatMul", lambda a: raw.MatMul(a=a, b=tf.constant(rand(16, 8))), [rand(2, 16)],
     "const-weights", atol=SUM_ATOL)
case("MatMul", lambda a: raw.MatMul(a=a, b=tf.constant(rand(8, 16)), transpose_b=True),
     [rand(2, 16)], "const-weights-tb", atol=SUM_ATOL)
case("MatMul", lambda a, b: raw.MatMul(a=a, b=b), [rand(1, 1), rand(1, 1)], "1x1")
for dt in ("float64", "int32", "int64"):
    case("MatMul", lambda a, b: raw.MatMul(a=a, b=b),
         [rand(3, 4, dtype=dt, lo=-5, hi=5), rand(4, 2, dtype=dt, lo=-5, hi=5)], dt)
case("MatMul", lambda a, b: raw.MatMul(a=a, b=b),
     [rand(2, 8, dtype="float16", lo=0, hi=1), rand(8, 3, dtype="float16", lo=0, hi=1)],
     "float16", rtol=2e-3, atol=2e-3)

for op, xs, ys in (("BatchMatMul", (2, 3, 4), (2, 4, 5)),
                   ("BatchMatMul", (2, 2, 3, 4), (2, 2, 4, 2)),
                   ("BatchMatMulV2", (2, 3, 4), (2, 4, 5)),
                   ("BatchMatMulV2", (2, 1, 3, 4), (5, 4, 6)),
                   ("BatchMatMulV2", (3, 4), (2, 4, 2)),
                   ("BatchMatMulV2", (3, 4), (4, 2)),
                   ("BatchMatMulV3", (2, 3, 4), (1, 4, 5))):
    for adj_x in (False, True):
        for adj_y in (False, True):
            x = rand(*xs[:-2], xs[-1], xs[-2]) if adj_x else rand(*xs)
            y = rand(*ys[:-2], ys[-1], ys[-2]) if adj_y else rand(*ys)
            kw = {"Tout": tf.float32} if op == "BatchMatMulV3" else {}
            case(op, lambda x, y, op=op, ax=adj_x, ay=adj_y, kw=kw: getattr(raw, op)(
                x=x, y=y, adj_x=ax, adj_y=ay, **kw), [x, y],
                f"{'x'.join(map(str, xs))}@{'x'.join(map(str, ys))}-adj{int(adj_x)}{int(adj_y)}",
                atol=SUM_ATOL)
case("BatchMatMulV2", lambda x, y: raw.BatchMatMulV2(x=x, y=y),
     [rand(2, 3, 4, dtype="int32", lo=-3, hi=3), rand(2, 4, 2, dtype="int32", lo=-3, hi=3)],
     "int32")
case("BatchMatMulV2", lambda x, y: raw.BatchMatMulV2(x=x, y=y),
     [rand(2, 3, 4, dtype="float64"), rand(4, 2, dtype="float64")], "float64")
case("BatchMatMulV3", lambda x, y: raw.BatchMatMulV3(x=x, y=y, Tout=tf.int32),
     [rand(2, 3, 4, dtype="int8", lo=-9, hi=9), rand(2, 4, 2, dtype="int8", lo=-9, hi=9)],
     "int8-to-int32")

_EINSUM = [  # (equation, operand shapes)
    ("abc,cde->abde", [(2, 5, 8), (8, 2, 4)]),        # MHA query/key/value projection
    ("abcd,cde->abe", [(2, 5, 2, 4), (2, 4, 8)]),     # MHA output projection
    ("aecd,abcd->acbe", [(2, 6, 2, 4), (2, 5, 2, 4)]),  # MHA attention scores
    ("acbe,aecd->abcd", [(2, 2, 5, 6), (2, 6, 2, 4)]),  # MHA attention combine
    ("ab,bc->ac", [(3, 4), (4, 5)]),
    ("ba,bc->ac", [(4, 3), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ijk->kij", [(2, 3, 4)]),
    ("ij->i", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),      # ellipsis broadcasting
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (3, 4, 2)]),  # and size-1 ellipsis dims
    ("a...,a...->a...", [(2, 3, 4), (2, 4)]),
    ("...,...->...", [(2, 3), (3,)]),
    ("bi,bj->bji", [(2, 3), (2, 4)]),                 # batched outer product
    ("bi,bij->bj", [(2, 3), (2, 3, 4)]),
    ("abc,bd->ad", [(2, 3, 4), (3, 5)]),              # c only in the first operand: summed
]
for eq, shapes in _EINSUM:
    case("Einsum", lambda *xs, eq=eq: raw.Einsum(inputs=list(xs), equation=eq),
         [rand(*s) for s in shapes], f"{eq}-{'@'.join('x'.join(map(str, s)) for s in shapes)}",
         atol=SUM_ATOL)
case("Einsum", lambda a, b: raw.Einsum(inputs=[a, b], equation="abc,cde->abde"),
     [rand(2, 3, 4, dtype="float64"), rand(4, 2, 3, dtype="float64")], "float64")
case("Einsum", lambda a, b: raw.Einsum(inputs=[a, b], equation="ij,jk->ik"),
     [rand(2, 3, dtype="int32", lo=-4, hi=4), rand(3, 2, dtype="int32", lo=-4, hi=4)], "int32")
case("Einsum", lambda a: raw.Einsum(inputs=[a, tf.constant(rand(8, 2, 4))],
                                    equation="abc,cde->abde"),
     [rand(1, 3, 8)], "const-kernel", atol=SUM_ATOL)


# --- the tests ---------------------------------------------------------------------------

MODULES = (basic, math, nn, linalg)


def _registered_here() -> set[str]:
    names = {m.__name__ for m in MODULES}
    return {op for op, low in LOWERINGS.items() if low.fn.__module__ in names}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_conformance(case: Case) -> None:
    run_case(case)


def test_every_op_has_a_case() -> None:
    missing = _registered_here() - {c.op_type for c in CASES}
    assert not missing, f"ops registered without a conformance case: {sorted(missing)}"


def test_case_ids_are_unique() -> None:
    ids = [str(c) for c in CASES]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})


# --- refusals name the node and say what to do ---------------------------------------------

def _compile_error(fn: object, *specs: tf.TensorSpec) -> UnsupportedNodes:
    concrete = tf.function(fn, autograph=False).get_concrete_function(*specs)
    io = {"inputs": {t.name: [t.shape.as_list(), t.dtype.name] for t in concrete.inputs},
          "outputs": [t.name for t in concrete.outputs]}
    with pytest.raises(UnsupportedNodes) as info:
        compile_and_run(concrete.graph.as_graph_def().SerializeToString(), io, {})
    return info.value


_NHWC = tf.TensorSpec([1, 4, 4, 2], tf.float32)


@pytest.mark.parametrize("fn, specs, op, words", [
    (lambda x: raw.Conv2D(input=x, filter=tf.ones([3, 3, 4, 2]), strides=[1, 1, 1, 1],
                          padding="SAME", data_format="NCHW"),
     [tf.TensorSpec([1, 4, 5, 5], tf.float32)], "Conv2D", ["NCHW", "channels_last"]),
    (lambda x: raw.FusedBatchNormV3(x=x, scale=tf.ones([2]), offset=tf.zeros([2]),
                                    mean=tf.zeros([2]), variance=tf.ones([2]),
                                    is_training=True)[0],
     [_NHWC], "FusedBatchNormV3", ["is_training=True", "training=False"]),
    (lambda x: raw.MaxPool(input=x, ksize=[1, 2, 2, 2], strides=[1, 1, 1, 2], padding="VALID"),
     [_NHWC], "MaxPool", ["ksize", "H and W"]),
    (lambda x: raw.Relu(features=raw.Cast(x=x, DstT=tf.bfloat16)),
     [_NHWC], "Relu", ["bfloat16", "auto-cast"]),
    (lambda x: raw.Div(x=x, y=x), [tf.TensorSpec([3], tf.int32)], "Div", ["int32", "float"]),
    (lambda x: raw.Sum(input=x, axis=raw.Cast(x=x[0], DstT=tf.int32)),
     [tf.TensorSpec([3], tf.float32)], "Sum", ["compile-time constant"]),
])
def test_refusals_say_why(fn: object, specs: list, op: str, words: list[str]) -> None:
    err = _compile_error(fn, *specs)
    problem = next(p for p in err.problems if p.op == op)
    text = problem.reason + " " + problem.hint
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"


def test_unfed_placeholder_says_add_it_to_the_io_config() -> None:
    concrete = tf.function(lambda x, y: x + y, autograph=False).get_concrete_function(
        tf.TensorSpec([2], tf.float32), tf.TensorSpec([2], tf.float32))
    x, y = concrete.inputs
    io = {"inputs": {x.name: [[2], "float32"]}, "outputs": [t.name for t in concrete.outputs]}
    with pytest.raises(UnsupportedNodes) as info:
        compile_and_run(concrete.graph.as_graph_def().SerializeToString(), io, {})
    (problem,) = info.value.problems
    assert problem.op == "Placeholder" and y.name in problem.hint and "io-config" in problem.hint
