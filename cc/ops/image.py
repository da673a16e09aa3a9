"""Image ops: ResizeBilinear and ResizeNearestNeighbor on NHWC images.

The output size must be a compile-time constant (the device's shapes are
static); it usually is, since Keras graphs compute it from static shapes and
`ctx.emit` folds that arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import batch
from ..errors import NodeError
from ..graphdef import TFNode
from ..ir import Value
from .array import dtypes, ints
from .basic import NUMERIC
from .registry import LowerCtx, tf_op


def _resize_supports(node: TFNode) -> str | None:
    if node.get("align_corners") and node.get("half_pixel_centers"):
        return ("align_corners and half_pixel_centers are both set, which TensorFlow "
                "rejects; set at most one (tf.image.resize uses half_pixel_centers)")
    return dtypes(T=NUMERIC)(node)


def _resize(mode: str) -> Callable[[LowerCtx, TFNode], list[Value]]:
    def lower(ctx: LowerCtx, node: TFNode) -> list[Value]:
        x = ctx.input(node, 0)
        if len(x.shape) != 4:
            raise NodeError(f"images must be 4-D NHWC, got {x.type}",
                            "reshape a single image to [1, H, W, C] first")
        size = ints(ctx.const_input(node, 1, "size"), "size")
        if len(size) != 2 or min(size) <= 0:
            raise NodeError(f"size must be two positive ints [new_height, new_width], got "
                            f"{size}", "fix the model")
        return [ctx.emit1("resize", [x], {
            "mode": mode, "size": size,
            "align_corners": bool(node.get("align_corners", False)),
            "half_pixel_centers": bool(node.get("half_pixel_centers", False))})]

    return lower


_bilinear = _resize("bilinear")
_nearest = _resize("nearest")


@tf_op("ResizeBilinear", supports=_resize_supports, batch=batch.image)
def resize_bilinear(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF ResizeBilinear: NHWC images resized to `size` (constant [h, w]) by bilinear
    interpolation, output float32. Source coordinate of output pixel y:
    half_pixel_centers: (y + 0.5) * scale - 0.5 (clamped at 0); otherwise y * scale,
    where scale = (in - 1) / (out - 1) with align_corners (and out > 1), else in / out."""
    return _bilinear(ctx, node)


@tf_op("ResizeNearestNeighbor", supports=_resize_supports, batch=batch.image)
def resize_nearest(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF ResizeNearestNeighbor: NHWC images resized to `size` (constant [h, w]),
    each output pixel copying one input pixel, same dtype. Source index of output
    pixel y: half_pixel_centers: floor((y + 0.5) * scale); align_corners:
    round(y * scale) with scale = (in - 1) / (out - 1); otherwise floor(y * scale)
    with scale = in / out; always clamped to in - 1."""
    return _nearest(ctx, node)
