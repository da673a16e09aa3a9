"""Elementwise math, comparisons, logic, Select, Cast, AddN and reductions.

TF's elementwise binary ops broadcast like numpy (the `binary` and `select`
kinds do the same), and both operands always share a dtype (TF type-checks
that). Reductions take their axes as a compile-time constant input.
"""

from __future__ import annotations

import numpy as np

from .. import batch
from ..errors import NodeError
from ..graphdef import TFNode
from ..ir import Value
from .basic import BOOL, DEVICE_DTYPES, FLOAT, NUMERIC, dtype_check, require_dtype
from .registry import LowerCtx, tf_op

SIGNED = FLOAT + ("int8", "int16", "int32", "int64")
FLOAT_OR_WIDE_INT = FLOAT + ("int32", "int64")


# --- unary ------------------------------------------------------------------

# TF op -> (unary fn of docs/isa.md, dtypes TF and the device both take)
UNARY: dict[str, tuple[str, tuple[str, ...]]] = {
    "Abs": ("abs", SIGNED),
    "Neg": ("neg", SIGNED),
    "Sign": ("sign", SIGNED),
    "Square": ("square", NUMERIC),
    "Reciprocal": ("reciprocal", FLOAT),
    "Inv": ("reciprocal", FLOAT),
    "Floor": ("floor", FLOAT),
    "Sqrt": ("sqrt", FLOAT),
    "Rsqrt": ("rsqrt", FLOAT),
    "Exp": ("exp", FLOAT),
    "Log": ("log", FLOAT),
    "Erf": ("erf", FLOAT),
    "Erfc": ("erfc", FLOAT),
    "LogicalNot": ("logical_not", BOOL),
    "Sin": ("sin", FLOAT),
    "Cos": ("cos", FLOAT),
    "Tan": ("tan", FLOAT),
    "Atan": ("atan", FLOAT),
    "Log1p": ("log1p", FLOAT),
    "Expm1": ("expm1", FLOAT),
    "Round": ("round", FLOAT),
}


def _unary_supports(node: TFNode) -> str | None:
    return dtype_check(UNARY[node.op][1])(node)


@tf_op(*UNARY, supports=_unary_supports, batch=batch.elementwise)
def unary(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """y = f(x) elementwise, same shape and dtype: Abs, Neg, Sign, Square,
    Reciprocal (= Inv, 1/x), Floor, Sqrt, Rsqrt (1/sqrt x), Exp, Log (natural),
    Erf, Erfc, LogicalNot, Sin, Cos, Tan, Atan (radians), Log1p log(1 + x), Expm1
    exp(x) - 1, Round (half to even). IEEE results for out-of-domain inputs
    (log(-1) = nan)."""
    fn, allowed = UNARY[node.op]
    x = ctx.input(node, 0)
    require_dtype(x, allowed)
    return [ctx.emit1("unary", [x], {"fn": fn})]


@tf_op("IsNan", "IsInf", "IsFinite", supports=dtype_check(FLOAT), batch=batch.elementwise)
def float_class(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Bool per element: IsNan x != x; IsInf |x| == inf; IsFinite |x| < inf (false for
    NaN, whose comparisons are all false). reduce_logsumexp and masking code use these."""
    x = ctx.input(node, 0)
    require_dtype(x, FLOAT)
    if node.op == "IsNan":
        return [ctx.emit1("binary", [x, x], {"fn": "not_equal"})]
    magnitude = ctx.emit1("unary", [x], {"fn": "abs"})
    fn = "equal" if node.op == "IsInf" else "less"
    return [ctx.emit1("binary", [magnitude, ctx.const(np.inf, x.dtype)], {"fn": fn})]


@tf_op("Ceil", supports=dtype_check(FLOAT), batch=batch.elementwise)
def ceil(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """ceil(x) = -floor(-x) (exact in floating point)."""
    x = ctx.input(node, 0)
    require_dtype(x, FLOAT)
    neg = ctx.emit1("unary", [x], {"fn": "neg"})
    return [ctx.emit1("unary", [ctx.emit1("unary", [neg], {"fn": "floor"})], {"fn": "neg"})]


# --- binary -----------------------------------------------------------------

_COMPARE = NUMERIC
BINARY: dict[str, tuple[str, tuple[str, ...]]] = {
    "Add": ("add", NUMERIC),
    "AddV2": ("add", NUMERIC),
    "Sub": ("sub", NUMERIC),
    "Mul": ("mul", NUMERIC),
    # Integer Div truncates in TF; the device's integer division is not promised
    # to, so only the float forms are taken.
    "Div": ("div", FLOAT),
    "RealDiv": ("div", FLOAT),
    "Maximum": ("maximum", NUMERIC),
    "Minimum": ("minimum", NUMERIC),
    "SquaredDifference": ("squared_difference", FLOAT_OR_WIDE_INT),
    "Pow": ("pow", FLOAT_OR_WIDE_INT),
    "Greater": ("greater", _COMPARE),
    "GreaterEqual": ("greater_equal", _COMPARE),
    "Less": ("less", _COMPARE),
    "LessEqual": ("less_equal", _COMPARE),
    "Equal": ("equal", _COMPARE + BOOL),
    "NotEqual": ("not_equal", _COMPARE + BOOL),
    "LogicalAnd": ("logical_and", BOOL),
    "LogicalOr": ("logical_or", BOOL),
    "FloorDiv": ("floor_div", FLOAT_OR_WIDE_INT),
    "FloorMod": ("floor_mod", FLOAT_OR_WIDE_INT),
}


def _binary_supports(node: TFNode) -> str | None:
    return dtype_check(BINARY[node.op][1])(node)


@tf_op(*BINARY, supports=_binary_supports, batch=batch.elementwise)
def binary(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """y = a (op) b with numpy broadcasting: Add/AddV2, Sub, Mul, Div/RealDiv
    (float true division), Maximum, Minimum, SquaredDifference ((a-b)^2), Pow,
    Greater/GreaterEqual/Less/LessEqual/Equal/NotEqual (bool result; Equal's
    `incompatible_shape_error=False` path is not needed: shapes are static and
    must broadcast), LogicalAnd/LogicalOr (bool)."""
    fn, allowed = BINARY[node.op]
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    require_dtype(a, allowed)
    if fn in ("floor_div", "floor_mod") and b.is_const and b.data.dtype.kind in "iu" \
            and not b.data.all():
        # TensorFlow fails the node when it runs; numpy would quietly give 0 here.
        raise NodeError(f"integer division by zero: the divisor (input 1) is a constant "
                        f"{b.type} holding 0, and TensorFlow fails this node with "
                        f"'Integer division by zero' when it runs",
                        hint="fix the model: divide by a non-zero constant")
    return [ctx.emit1("binary", [a, b], {"fn": fn})]


@tf_op("ClipByValue", supports=dtype_check(NUMERIC), batch=batch.elementwise)
def clip_by_value(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """min(max(t, clip_value_min), clip_value_max), bounds broadcast against t."""
    t, lo, hi = ctx.inputs(node)
    require_dtype(t, NUMERIC)
    return [ctx.emit1("binary", [ctx.emit1("binary", [t, lo], {"fn": "maximum"}), hi],
                      {"fn": "minimum"})]


@tf_op("AddN", supports=dtype_check(NUMERIC), batch=batch.elementwise)
def add_n(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Sum of N same-shape tensors, as a chain of adds (left to right)."""
    xs = ctx.inputs(node)
    if not xs:
        raise NodeError("AddN has no inputs")
    require_dtype(xs[0], NUMERIC)
    total = xs[0]
    for x in xs[1:]:
        total = ctx.emit1("binary", [total, x], {"fn": "add"})
    return [total]


# --- select and cast ---------------------------------------------------------

@tf_op("Select", supports=dtype_check(DEVICE_DTYPES), batch=batch.select_v1)
def select(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF v1 Select: `condition` has the branches' shape, or is a scalar, or (when
    the branches have rank > 1) is a vector picking whole rows along axis 0; no
    other broadcasting. The vector form becomes [n, 1, ..., 1] before `select`."""
    cond, a, b = ctx.inputs(node)
    if len(cond.shape) == 1 and len(a.shape) > 1:
        if cond.shape[0] != a.shape[0]:
            raise NodeError(f"condition {cond.type} must have the length of the first "
                            f"dimension of the branches {a.type}")
        shape = [cond.shape[0]] + [1] * (len(a.shape) - 1)
        cond = ctx.emit1("reshape", [cond], {"shape": shape})
    elif cond.shape and cond.shape != a.shape:
        raise NodeError(f"condition {cond.type} must be a scalar, a vector over the first "
                        f"dimension, or have the branches' shape {a.type}")
    return [ctx.emit1("select", [cond, a, b])]


@tf_op("SelectV2", supports=dtype_check(DEVICE_DTYPES), batch=batch.elementwise)
def select_v2(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """where(condition, t, e) with numpy broadcasting over all three."""
    return [ctx.emit1("select", ctx.inputs(node))]


@tf_op("Cast", supports=dtype_check(DEVICE_DTYPES, "SrcT", "DstT"), batch=batch.elementwise)
def cast(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Convert SrcT to DstT like C: float→int truncates toward zero, →bool is
    x != 0. The `Truncate` attr (only meaningful for float narrowing in TF's
    quantization paths) is ignored."""
    x = ctx.input(node, 0)
    to = node.get("DstT")
    if x.dtype == to:
        return [x]
    return [ctx.emit1("cast", [x], {"to": to})]


# --- reductions --------------------------------------------------------------

def normalize_axes(axes: np.ndarray, rank: int, what: str = "axis") -> list[int]:
    """Non-negative, sorted, de-duplicated axes; NodeError if one is out of range."""
    out = set()
    for a in np.asarray(axes).reshape(-1).tolist():
        if not -rank <= a < rank:
            raise NodeError(f"{what} {a} is out of range for a rank-{rank} input")
        out.add(a % rank)
    return sorted(out)


_REDUCE_FN = {"Sum": "sum", "Mean": "mean", "Max": "max", "Min": "min", "Prod": "prod",
              "Any": "any", "All": "all"}


def _reduce(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Reduce `input` over the constant `reduction_indices` (scalar or vector,
    negative axes count from the end); `keep_dims` keeps them as size 1. Integer
    Mean truncates like TF (sum / count in the integer type). No axes = a copy."""
    x = ctx.input(node, 0)
    require_dtype(x, BOOL if node.op in ("Any", "All") else NUMERIC)
    axes = normalize_axes(ctx.const_input(node, 1, "reduction axes"), len(x.shape))
    if not axes:
        return [x]
    return [ctx.emit1("reduce", [x], {"fn": _REDUCE_FN[node.op], "axes": axes,
                                      "keepdims": bool(node.get("keep_dims", False))})]


_reduce_batch = batch.along(batch.const_axes(1), "reduction", keeps_rank=False)
reduce_numeric = tf_op("Sum", "Mean", "Max", "Min", "Prod", supports=dtype_check(NUMERIC),
                       batch=_reduce_batch)(_reduce)
reduce_bool = tf_op("Any", "All", batch=_reduce_batch)(_reduce)


def _argminmax_supports(node: TFNode) -> str | None:
    return dtype_check(NUMERIC + BOOL)(node) or dtype_check(
        ("int32", "int64"), "output_type")(node)


@tf_op("ArgMax", "ArgMin", supports=_argminmax_supports,
       batch=batch.along(batch.const_axes(1), "arg-reduction", keeps_rank=False))
def argminmax(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Index of the first largest (ArgMax) / smallest (ArgMin) element along the
    constant scalar `dimension`, which is removed; `output_type` int32 or int64
    (default int64)."""
    x = ctx.input(node, 0)
    require_dtype(x, NUMERIC + BOOL)
    dim = ctx.const_input(node, 1, "dimension")
    if dim.size != 1:
        raise NodeError(f"dimension must be a scalar, got shape {list(dim.shape)}")
    if not x.shape:
        raise NodeError("ArgMax/ArgMin needs an input of rank >= 1")
    (axis,) = normalize_axes(dim, len(x.shape), "dimension")
    fn = "argmax" if node.op == "ArgMax" else "argmin"
    return [ctx.emit1("argminmax", [x], {"fn": fn, "axis": axis,
                                         "to": node.get("output_type", "int64")})]
