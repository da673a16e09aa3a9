"""int8 reference kernels: `quantize`, `binary_quantize`, `conv2d_int8`, `matmul_int8`
(docs/int8.md).

These define the int8 semantics the native engine is held to (tests/runtime/test_int8.py):

- quantizing multiplies by float32(1/scale) once, rounds half to even and saturates
  (NaN gives 0), as oneDNN's reorder with a source scale and its cvt instructions do;
- the 8-bit products are summed exactly: here in float64, whose 53-bit mantissa holds
  any sum of up to 2^38 products of 8-bit values (a conv's K is far below that), so
  the BLAS GEMM of the float32 kernels is reused and the sum is the int32 one;
- that sum is dequantized with one float32 multiply by x_scale·w_scale[o] (a float32
  product too), then bias, residual and activation in float32, as oneDNN applies its
  scales before its post-ops;
- an 8-bit output is requantized like `quantize`, with 1/y_scale; a bfloat16 output
  (the int8 region's edge into a bf16 one, docs/int8.md) is that float32 value rounded
  once to nearest even, as oneDNN writes a bf16 destination;
- `quantize` of a bfloat16 value widens it to float32 (exact) first.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401 (gives numpy the "bfloat16" dtype)
import numpy as np

from . import conv  # noqa: F401 (the float kernel this one reuses)
from .elementwise import activate
from .registry import evaluate, kernel

_RANGE = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}


def inverse(scale: float) -> np.float32:
    """float32(1/scale): the one multiplier both engines quantize with."""
    return np.float32(1.0 / scale)


def quantize_into(x: np.ndarray, inv_scale: np.float32, out: np.ndarray) -> None:
    """out = saturate(round_half_even(x * inv_scale)), NaN -> 0."""
    lo, hi = _RANGE[out.dtype]
    v = np.multiply(x.astype(np.float32, copy=False), inv_scale, dtype=np.float32)
    np.rint(v, out=v)
    np.clip(v, lo, hi, out=v)
    np.copyto(out, np.nan_to_num(v, nan=0.0), casting="unsafe")


@kernel("quantize")
def quantize(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
             scratch: np.ndarray | None) -> None:
    quantize_into(ins[0], inverse(attrs["scale"]), outs[0])


@kernel("binary_quantize")
def binary_quantize(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
                    scratch: np.ndarray | None) -> None:
    """quantize(binary(a, b [, c], activation)) by definition: the binary's result in its
    operands' dtype (bfloat16 rounded once, as `binary` stores it), then quantized."""
    y = outs[0]
    fn_attrs = {"fn": attrs["fn"], "activation": attrs.get("activation", "none")}
    v = evaluate("binary", ins, fn_attrs, [(y.shape, ins[0].dtype.name)])[0]
    quantize_into(v, inverse(attrs["scale"]), y)


def _epilogue(acc: np.ndarray, scale: np.ndarray, extras: list[np.ndarray], y: np.ndarray,
              attrs: dict) -> None:
    """acc (exact integer sums, float64) -> y: scale, bias, residual, activation, and
    requantization when y is 8-bit (rounding once to nearest even when bfloat16)."""
    v = acc.astype(np.float32)
    v *= scale
    for extra in extras:  # bias, then residual
        v += extra
    activate(v, attrs)
    if y.dtype == np.float32:
        np.copyto(y, v)
    elif y.dtype.name == "bfloat16":
        np.copyto(y, v.astype(y.dtype))
    else:
        quantize_into(v, inverse(attrs["y_scale"]), y)


@kernel("conv2d_int8")
def conv2d_int8(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
                scratch: np.ndarray | None) -> None:
    x, w, w_scale = ins[:3]
    y = outs[0]
    plain = {k: attrs[k] for k in ("strides", "dilations", "pads")}
    kind = "depthwise_conv2d" if attrs.get("depthwise") else "conv2d"
    acc = evaluate(kind, [x.astype(np.float64), w.astype(np.float64)], plain,
                   [(y.shape, "float64")])[0]
    scale = np.float32(attrs["x_scale"]) * w_scale
    extras = list(ins[3:])
    if attrs.get("residual") and extras[-1].dtype != np.float32:  # a quantized shortcut
        extras[-1] = extras[-1].astype(np.float32) * np.float32(attrs.get("residual_scale", 1.0))
    _epilogue(acc, scale, extras, y, attrs)


@kernel("matmul_int8")
def matmul_int8(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
                scratch: np.ndarray | None) -> None:
    a, b, w_scale = ins[:3]
    acc = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = np.float32(attrs["a_scale"]) * w_scale
    _epilogue(acc, scale, list(ins[3:]), outs[0], attrs)
