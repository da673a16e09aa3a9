"""3-D convolution and pooling on NDHWC volumes (Keras Conv3D, MaxPooling3D,
AveragePooling3D): the `conv3d` and `pool3d` kinds. Padding SAME or VALID, as the 2-D
ops: SAME pads `total // 2` before and the rest after each spatial dim."""

from __future__ import annotations

from .. import batch
from ..errors import NodeError
from ..graphdef import TFNode
from ..ir import Value
from .basic import FLOAT, dtype_check
from .nn import float_input, same_pads
from .registry import LowerCtx, tf_op


def _dhw(values: object, name: str) -> list[int]:
    v = [int(d) for d in values] if values is not None else [1] * 5
    if len(v) != 5 or v[0] != 1 or v[4] != 1 or min(v) < 1:
        raise NodeError(f"{name}={v}: the device windows over D, H and W (batch and channel "
                        "entries must be 1)")
    return v[1:4]


def _volume_supports(keys: tuple[str, ...]) -> object:
    def supports(node: TFNode) -> str | None:
        if (reason := dtype_check(FLOAT)(node)) is not None:
            return reason
        if node.get("data_format", "NDHWC") != "NDHWC":
            return f"data_format={node.get('data_format')!r} is not supported (NDHWC only)"
        if node.get("padding", "VALID") not in ("SAME", "VALID"):
            return f"padding={node.get('padding')!r} is not supported (SAME or VALID)"
        for key in keys:
            v = node.get(key)
            if v is not None and (len(v) != 5 or v[0] != 1 or v[4] != 1):
                return (f"{key}={list(v)} is not supported: the device windows over D, H and W "
                        "only (batch and channel entries must be 1)")
        return None
    return supports


def _pads(node: TFNode, spatial: tuple[int, ...], kernel: list[int], strides: list[int],
          dilations: list[int]) -> list[int]:
    if node.get("padding", "VALID") == "VALID":
        return [0] * 6
    return [p for s, k, st, d in zip(spatial, kernel, strides, dilations)
            for p in same_pads(s, k, st, d)]


@tf_op("Conv3D", supports=_volume_supports(("strides", "dilations")), batch=batch.image)
def conv3d(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """3-D cross-correlation of NDHWC `input` with a [KD, KH, KW, C, O] `filter`;
    strides and dilations as NDHWC 5-lists."""
    x, w = float_input(ctx, node, "NDHWC"), ctx.input(node, 1)
    if len(w.shape) != 5 or w.shape[3] != x.shape[4]:
        raise NodeError(f"filter {w.type} must be [KD, KH, KW, C, O] with the input's C "
                        f"({x.type}); grouped 3-D convolution is not supported")
    strides, dilations = _dhw(node.get("strides"), "strides"), _dhw(node.get("dilations"),
                                                                    "dilations")
    pads = _pads(node, x.shape[1:4], list(w.shape[:3]), strides, dilations)
    return [ctx.emit1("conv3d", [x, w], {"strides": strides, "dilations": dilations,
                                         "pads": pads})]


@tf_op("MaxPool3D", "AvgPool3D", supports=_volume_supports(("ksize", "strides")),
       batch=batch.image)
def pool3d(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Max / average pooling over NDHWC windows `ksize` with `strides` (5-lists); max
    ignores padded cells, average divides by the number of real cells."""
    x = float_input(ctx, node, "NDHWC")
    ksize, strides = _dhw(node.get("ksize"), "ksize"), _dhw(node.get("strides"), "strides")
    pads = _pads(node, x.shape[1:4], ksize, strides, [1, 1, 1])
    return [ctx.emit1("pool3d", [x], {"mode": "max" if node.op == "MaxPool3D" else "avg",
                                      "ksize": ksize, "strides": strides, "pads": pads})]
