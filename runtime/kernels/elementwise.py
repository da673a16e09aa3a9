"""Elementwise kernels: unary, binary, select, cast, copy.

The unary functions follow TensorFlow's CPU kernels formula by formula (e.g. elu
is exp(x) - 1, not expm1, as in Eigen) so results agree to float rounding. Every
unary function may be called with `y is x`: conv/matmul apply their fused
activation in place on the output through `activate`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import special

from .. import isa
from .common import bf16_via_float32
from .registry import kernel

UnaryFn = Callable[[np.ndarray, np.ndarray, float], None]

_SELU_SCALE = 1.0507009873554805
_SELU_SCALE_ALPHA = 1.6732632423543772 * 1.0507009873554805


# numpy's maximum/minimum loops are ~5x faster array-with-array than
# array-with-scalar (only the former is SIMD), and relu is on the hot path of
# every CNN: so max(x, 0) runs against a read-only constant array of zeros, a
# chunk at a time. (multiply/add with a scalar are fast already.)
_CHUNK = 1 << 16
_CONSTANTS: dict[tuple[object, str], np.ndarray] = {}


def _constant(value: object, dtype: np.dtype) -> np.ndarray:
    key = (value, dtype.str)
    c = _CONSTANTS.get(key)
    if c is None:  # (a race only builds it twice)
        c = np.full(_CHUNK, value, dtype)
        c.flags.writeable = False
        _CONSTANTS[key] = c
    return c


def with_constant(f: np.ufunc, x: np.ndarray, value: object, y: np.ndarray) -> None:
    """y = f(x, value) for a binary ufunc, against a constant array."""
    if x.shape != y.shape or not (x.flags.c_contiguous and y.flags.c_contiguous):
        f(x, value, out=y)
        return
    xf, yf, c = x.reshape(-1), y.reshape(-1), _constant(value, y.dtype)
    for start in range(0, xf.size, _CHUNK):
        end = min(xf.size, start + _CHUNK)
        f(xf[start:end], c[:end - start], out=yf[start:end])


def _relu(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    with_constant(np.maximum, x, 0, y)


def _relu6(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    with_constant(np.maximum, x, 0, y)
    with_constant(np.minimum, y, 6, y)


def _neg_exp_minus_one(x: np.ndarray) -> np.ndarray:
    """exp(min(x, 0)) - 1: the negative branch of elu/selu; exactly 0 where x >= 0, so
    `max(x, 0) + this` is TF's select(x < 0, exp(x) - 1, x) without a mask."""
    t = np.minimum(x, 0)
    np.exp(t, out=t)
    t -= 1
    return t


def _elu(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    t = _neg_exp_minus_one(x)
    with_constant(np.maximum, x, 0, y)
    y += t


def _selu(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    t = _neg_exp_minus_one(x)
    t *= y.dtype.type(_SELU_SCALE_ALPHA)
    with_constant(np.maximum, x, 0, y)
    y *= y.dtype.type(_SELU_SCALE)
    y += t


def _leaky_relu(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    # TF: select(x > 0, x, x * alpha) == max(x, alpha*x) for alpha <= 1 (min otherwise).
    scaled = x * y.dtype.type(alpha)
    (np.maximum if alpha <= 1 else np.minimum)(x, scaled, out=y)


def _softplus(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    # TF's Softplus: x above -threshold, exp(x) below threshold, log1p(exp(x)) between.
    # (x is read whole before y is written: as an epilogue, y is x.)
    threshold = np.log(np.finfo(y.dtype).eps) + 2
    big, small = x > -threshold, x < threshold
    e = np.exp(x)
    ends = np.where(big, x, e)
    np.log1p(e, out=y)
    np.copyto(y, ends, where=big | small)


def _rsqrt(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    np.sqrt(x, out=y)
    np.divide(1, y, out=y)


def _reciprocal(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    if y.dtype.kind == "f":
        np.divide(1, x, out=y)
    else:  # C integer division 1 / x: only +-1 survive
        np.copyto(y, np.where(np.abs(x) == 1, x, 0), casting="unsafe")


def _floor(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    if y.dtype.kind == "f":
        np.floor(x, out=y)
    else:
        np.copyto(y, x)


def _round_bf16(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    if x.dtype != np.float32:  # rare: go through float32
        tmp = x.astype(np.float32)
        _round_bf16(tmp, tmp, alpha)
        np.copyto(y, tmp, casting="unsafe")
        return
    if x.ndim == 0:  # numpy shifts of a 0-d array give a scalar, not an array
        _round_bf16(x.reshape(1), y.reshape(1), alpha)
        return
    u = x.view(np.uint32)
    bits = u >> 16  # round to nearest even: add 0x7FFF + lsb of the kept half, truncate
    bits &= 1
    bits += 0x7FFF
    bits += u
    bits &= np.uint32(0xFFFF0000)
    np.copyto(bits, u, where=np.isnan(x))  # the add would carry a NaN's payload into the sign
    np.copyto(y, bits.view(np.float32))


def _round_fp16(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    np.copyto(y, x.astype(np.float16), casting="unsafe")


def _ufunc(f: np.ufunc) -> UnaryFn:
    def apply(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
        f(x, out=y)
    return apply


def _gelu(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    # TF's exact gelu, in its own order: 0.5 * x * erfc(-x / sqrt(2)).
    t = np.divide(np.negative(x), x.dtype.type(1.4142135623730951))
    special.erfc(t, out=t)
    np.multiply(np.multiply(x, x.dtype.type(0.5)), t, out=y)


def _gelu_tanh(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    # TF's approximate gelu, in its own order (x ** 3 as x * square(x), as grappler runs it):
    # (0.5 * x) * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))).
    t = np.multiply(x, np.square(x))
    np.multiply(x.dtype.type(0.044715), t, out=t)
    np.add(x, t, out=t)
    np.multiply(x.dtype.type(0.7978845608028654), t, out=t)
    np.tanh(t, out=t)
    np.add(x.dtype.type(1.0), t, out=t)
    np.multiply(np.multiply(x.dtype.type(0.5), x), t, out=y)


def _swish(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    # x * sigmoid(x) with the sigmoid kernel itself: the numbers of the two-op form.
    s = np.empty_like(y)
    UNARY["sigmoid"](x, s, alpha)
    np.multiply(x, s, out=y)


def _hard_sigmoid(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    # TF's relu6(x + 3) / 6, in its order (Keras 3's hard_sigmoid on TensorFlow).
    t = np.add(x, x.dtype.type(3.0))
    _relu6(t, t, alpha)
    np.divide(t, x.dtype.type(6.0), out=y)


def _hard_swish(x: np.ndarray, y: np.ndarray, alpha: float) -> None:
    # x * hard_sigmoid(x): the numbers of the Keras graph's multiply.
    s = np.empty_like(y)
    _hard_sigmoid(x, s, alpha)
    np.multiply(x, s, out=y)


UNARY: dict[str, UnaryFn] = {
    "relu": _relu,
    "relu6": _relu6,
    "leaky_relu": _leaky_relu,
    "elu": _elu,
    "selu": _selu,
    "sigmoid": _ufunc(special.expit),
    "tanh": _ufunc(np.tanh),
    "softplus": _softplus,
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "swish": _swish,
    "hard_sigmoid": _hard_sigmoid,
    "hard_swish": _hard_swish,
    "erf": _ufunc(special.erf),
    "erfc": _ufunc(special.erfc),
    "exp": _ufunc(np.exp),
    "log": _ufunc(np.log),
    "sqrt": _ufunc(np.sqrt),
    "rsqrt": _rsqrt,
    "square": _ufunc(np.square),
    "abs": _ufunc(np.abs),
    "neg": _ufunc(np.negative),
    "reciprocal": _reciprocal,
    "floor": _floor,
    "sign": _ufunc(np.sign),
    "logical_not": _ufunc(np.logical_not),
    "round_bf16": _round_bf16,
    "round_fp16": _round_fp16,
    "sin": _ufunc(np.sin),
    "cos": _ufunc(np.cos),
    "tan": _ufunc(np.tan),
    "atan": _ufunc(np.arctan),
    "log1p": _ufunc(np.log1p),
    "expm1": _ufunc(np.expm1),
    "round": _ufunc(np.rint),  # half to even, as TF's Round
}


def apply_unary(fn: str, x: np.ndarray, y: np.ndarray, alpha: float = 0.2) -> None:
    """y = fn(x); `y` may be `x`."""
    try:
        f = UNARY[fn]
    except KeyError:
        raise ValueError(f"unknown unary function {fn!r}") from None
    with np.errstate(all="ignore"):  # TF gives inf/nan silently, so do we
        f(x, y, alpha)


def activate(y: np.ndarray, attrs: dict) -> None:
    """The fused `activation` of matmul/conv/binary, in place on the output."""
    fn = attrs.get("activation", "none")
    if fn == "relu":  # the hot case, without the dispatch
        with_constant(np.maximum, y, 0, y)
    elif fn and fn != "none":
        apply_unary(fn, y, y, attrs.get("alpha", 0.2))


@kernel("unary")
@bf16_via_float32
def unary(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
          scratch: np.ndarray | None) -> None:
    apply_unary(attrs["fn"], ins[0], outs[0], attrs.get("alpha", 0.2))


def _int_div(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    # TF's integer Div truncates toward zero (C semantics); numpy floors.
    q = np.floor_divide(a, b)
    q += ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0))).astype(q.dtype)
    np.copyto(out, q)


def _div(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    if out.dtype.kind == "f":
        np.divide(a, b, out=out)
    else:
        _int_div(a, b, out)


def _squared_difference(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.subtract(a, b, out=out)
    np.multiply(out, out, out=out)


def _floor_div(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    if out.dtype.kind == "f":  # TF: floor(a / b), not numpy's divmod-based quotient
        np.floor(np.divide(a, b, out=out), out=out)
    else:
        np.floor_divide(a, b, out=out)


BINARY: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], object]] = {
    "add": lambda a, b, out: np.add(a, b, out=out),
    "sub": lambda a, b, out: np.subtract(a, b, out=out),
    "mul": lambda a, b, out: np.multiply(a, b, out=out),
    "div": _div,
    "maximum": lambda a, b, out: np.maximum(a, b, out=out),
    "minimum": lambda a, b, out: np.minimum(a, b, out=out),
    "squared_difference": _squared_difference,
    "pow": lambda a, b, out: np.power(a, b, out=out),
    "greater": lambda a, b, out: np.greater(a, b, out=out),
    "greater_equal": lambda a, b, out: np.greater_equal(a, b, out=out),
    "less": lambda a, b, out: np.less(a, b, out=out),
    "less_equal": lambda a, b, out: np.less_equal(a, b, out=out),
    "equal": lambda a, b, out: np.equal(a, b, out=out),
    "not_equal": lambda a, b, out: np.not_equal(a, b, out=out),
    "logical_and": lambda a, b, out: np.logical_and(a, b, out=out),
    "logical_or": lambda a, b, out: np.logical_or(a, b, out=out),
    "floor_div": _floor_div,
    "floor_mod": lambda a, b, out: np.remainder(a, b, out=out),
}


@kernel("binary")
def binary(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
           scratch: np.ndarray | None) -> None:
    if attrs["fn"] == "floor_div" and outs[0].dtype.name == "bfloat16":
        # TF floors the quotient rounded to bfloat16, not the float32 quotient
        # (bf16_via_float32 rounds only the result): they differ in ~10% of operands.
        with np.errstate(all="ignore"):
            q = np.divide(ins[0].astype(np.float32), ins[1].astype(np.float32))
            np.copyto(outs[0], np.floor(q.astype(outs[0].dtype)))
        return
    _binary_wide(ins, outs, attrs, scratch)


@bf16_via_float32
def _binary_wide(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
                 scratch: np.ndarray | None) -> None:
    fn = attrs["fn"]
    if fn == "add":  # the hot case (residual adds), without errstate
        np.add(ins[0], ins[1], out=outs[0])
    else:
        try:
            f = BINARY[fn]
        except KeyError:
            raise ValueError(f"unknown binary function {fn!r}") from None
        with np.errstate(all="ignore"):
            f(ins[0], ins[1], outs[0])
    if len(ins) == 3:  # the addend c (a BatchNorm's shift after its scale)
        with np.errstate(all="ignore"):  # (inf + -inf is NaN, as defined)
            np.add(outs[0], ins[2], out=outs[0])
    activate(outs[0], attrs)  # (bfloat16: still the float32 result, rounded after)


@kernel("select")
def select(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
           scratch: np.ndarray | None) -> None:
    cond, a, b = ins
    np.copyto(outs[0], b)  # both broadcast to the output; no temporary
    np.copyto(outs[0], a, where=cond)


@kernel("cast")
def cast(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
         scratch: np.ndarray | None) -> None:
    x, y = ins[0], outs[0]
    if y.dtype == np.bool_:
        np.not_equal(x, 0, out=y)
    else:
        # numpy's float->int cast is the C conversion (truncation), as TF's Cast.
        with np.errstate(invalid="ignore", over="ignore"):
            np.copyto(y, x, casting="unsafe")


@kernel("copy")
def copy(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
         scratch: np.ndarray | None) -> None:
    np.copyto(outs[0], ins[0])


def _check_tables() -> None:
    """The function tables define exactly the functions runtime/isa.py declares (a
    declared function without a reference kernel, or a kernel for an undeclared one,
    stops the reference engine from starting)."""
    for what, table, declared in (("unary", UNARY, isa.UNARY_FNS),
                                  ("binary", BINARY, isa.BINARY_FNS)):
        if set(table) != set(declared):
            raise RuntimeError(f"numpy {what} functions {sorted(set(table) ^ set(declared))} "
                               "differ from runtime/isa.py's declarations")


_check_tables()
