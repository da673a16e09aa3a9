"""Native specs of the int8 instructions (docs/int8.md), read by engine.cc's `add_int8`.

Kept apart from spec.py's float instructions; spec.py adds these to its table. The
floats carry the scales exactly as the numpy reference computes with them: quantize's
float32(1/scale), the conv's x_scale and y_scale (as float32).
"""

from __future__ import annotations

from ..kernels.quantized import inverse
from .spec import LOOP, Ref, _activation, _epilogue, _padded

OP_QUANTIZE, OP_QCONV, OP_QMATMUL, OP_QBINARY = 40, 41, 42, 43


def _quantize(attrs: dict, ins: list[Ref], outs: list[Ref],
              const: list[bool]) -> tuple[list[int], list[float]] | None:
    x, y = ins[0], outs[0]
    if not x.shape or len(x.shape) > 6:
        return None
    return [OP_QUANTIZE, *x.encode(), *y.encode()], [float(inverse(attrs["scale"]))]


def _binary_quantize(attrs: dict, ins: list[Ref], outs: list[Ref],
                     const: list[bool]) -> tuple[list[int], list[float]] | None:
    """fn's code is OP_G_BINARY's (spec.LOOP), then whether c is given and whether the
    activation is relu; the operands padded to y's rank."""
    y = outs[0]
    rank = max(len(y.shape), 1)
    if rank > 8:
        return None
    ints = [OP_QBINARY, LOOP[attrs["fn"]], int(len(ins) == 3),
            int(attrs.get("activation", "none") == "relu")]
    for r in (*ins, y):
        ints += r.encode(_padded(r.shape, rank))
    return ints, [float(inverse(attrs["scale"]))]


def _conv2d_int8(attrs: dict, ins: list[Ref], outs: list[Ref],
                 const: list[bool]) -> tuple[list[int], list[float]] | None:
    act = _activation(attrs)
    if act is None or not const[1]:
        return None
    residual = bool(attrs.get("residual"))
    has_bias = len(ins) - residual == 4
    ints = [OP_QCONV, int(has_bias), int(residual), int(bool(attrs.get("depthwise")))]
    for r in (*ins, outs[0]):
        ints += r.encode()
    ints += [*attrs["strides"], *attrs["dilations"], *attrs["pads"]]
    floats: list[float] = []
    _epilogue(act, ints, floats)
    return ints, floats + [attrs["x_scale"], attrs.get("y_scale", 1.0),
                           attrs.get("residual_scale", 1.0)]


def _matmul_int8(attrs: dict, ins: list[Ref], outs: list[Ref],
                 const: list[bool]) -> tuple[list[int], list[float]] | None:
    act = _activation(attrs)
    rank = len(outs[0].shape)
    if act is None or not const[1] or rank > 6:
        return None
    residual = bool(attrs.get("residual"))
    a, b, ws, *extras = ins
    ints = [OP_QMATMUL, len(extras) - residual, int(residual)]
    ints += a.encode() + b.encode(_padded(b.shape, rank)) + ws.encode()
    for r in extras:
        ints += r.encode()
    ints += outs[0].encode()
    floats: list[float] = []
    _epilogue(act, ints, floats)
    return ints, floats + [attrs["a_scale"], attrs.get("y_scale", 1.0)]


ENCODERS = {"quantize": _quantize, "binary_quantize": _binary_quantize,
            "conv2d_int8": _conv2d_int8, "matmul_int8": _matmul_int8}
