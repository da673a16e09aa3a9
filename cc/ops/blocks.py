"""Transposed convolution and the block rearrangements, built from device instructions.

Conv2DBackpropInput (Keras `Conv2DTranspose`, `Conv1DTranspose`) is the gradient of a
forward convolution with respect to its input: spread the input out by the stride
(zeros between rows and columns), pad it so every window of the forward convolution is
seen, and correlate with the filter flipped in space and with its channel axes swapped.

SpaceToBatchND / BatchToSpaceND (what TF runs a dilated 1-D convolution through),
SpaceToDepth / DepthToSpace (pixel shuffle) and ExtractImagePatches only move elements: a
pad or crop, a reshape, a transpose and a reshape (patches: strided slices, concatenated).
A SpaceToBatchND folds the batch into its blocks
([b, ...] -> [blocks * b, ...]) and BatchToSpaceND unfolds it; inside one program that is
exact at any batch chunk, so a cluster holding both keeps its dynamic batch.

LRN (AlexNet-era local response normalization) is a window over the channels too: a sum
of shifted slices of the padded squares.
"""

from __future__ import annotations

import math

from .. import batch
from ..errors import NodeError
from ..graphdef import TFNode
from ..ir import Value
from .array import INDEX, concat, dtypes, ints, reshape_to, slice_dims
from .basic import DEVICE_DTYPES, FLOAT, dtype_check, require_dtype
from .nn import _hw, _pads, _window_reason
from .registry import LowerCtx, tf_op


def _conv_transpose_supports(node: TFNode) -> str | None:
    return dtype_check(FLOAT)(node) or _window_reason(node, ("strides", "dilations"))


@tf_op("Conv2DBackpropInput", supports=_conv_transpose_supports, batch=batch.image)
def conv2d_transpose(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """The input gradient of Conv2D: `input_sizes` (a constant NHWC shape, the forward
    input's), `filter` [KH, KW, C, O] (C: this op's output channels), `out_backprop`
    [N, H, W, O]. NHWC, strides and dilations as Conv2D, SAME/VALID/EXPLICIT padding
    of the forward convolution."""
    sizes = ints(ctx.const_input(node, 0, "input_sizes"), "input_sizes")
    w, dy = ctx.input(node, 1), ctx.input(node, 2)
    require_dtype(dy, FLOAT)
    if len(sizes) != 4 or len(w.shape) != 4 or len(dy.shape) != 4:
        raise NodeError(f"input_sizes {sizes}, filter {w.type} and out_backprop {dy.type} "
                        "must be 4-D NHWC")
    n, height, width, channels = sizes
    kh, kw, c, o = w.shape
    if c != channels or o != dy.shape[3] or n != dy.shape[0]:
        raise NodeError(f"filter {w.type}, out_backprop {dy.type} and input_sizes {sizes} "
                        "disagree on channels or batch")
    strides = _hw(node.get("strides"), "strides")
    dilations = _hw(node.get("dilations"), "dilations")
    top, _, left, _ = _pads(node, (height, width), (kh, kw), strides, dilations)
    # Spread dy by the stride: [N, H, 1, W, 1, O] padded to [N, H, sh, W, sw, O].
    (sh, sw), (dh, dw) = strides, dilations
    h, wd = dy.shape[1:3]
    x = dy
    if sh > 1 or sw > 1:
        x = reshape_to(ctx, x, [n, h, 1, wd, 1, o])
        x = ctx.emit1("pad", [x], {"paddings": [[0, 0], [0, 0], [0, sh - 1], [0, 0],
                                                [0, sw - 1], [0, 0]], "mode": "constant",
                                   "value": 0})
        x = reshape_to(ctx, x, [n, h * sh, wd * sw, o])
    spread_h, spread_w = (h - 1) * sh + 1, (wd - 1) * sw + 1
    # Pads of the correlation: before = effective kernel - 1 - forward pad; after so that
    # the output has the forward input's size (negative: crop).
    eff_h, eff_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    before_h, before_w = eff_h - 1 - top, eff_w - 1 - left
    after_h = height + eff_h - 1 - before_h - spread_h
    after_w = width + eff_w - 1 - before_w - spread_w
    x = slice_dims(ctx, x, [0, 0, 0, 0], [n, spread_h, spread_w, o], [1, 1, 1, 1])
    crop = [max(-before_h, 0), max(-after_h, 0), max(-before_w, 0), max(-after_w, 0)]
    if any(crop):
        x = slice_dims(ctx, x, [0, crop[0], crop[2], 0],
                       [n, spread_h - crop[1], spread_w - crop[3], o], [1, 1, 1, 1])
    pads = [max(before_h, 0), max(after_h, 0), max(before_w, 0), max(after_w, 0)]
    flipped = slice_dims(ctx, w, [kh - 1, kw - 1, 0, 0], [None, None, c, o], [-1, -1, 1, 1])
    flipped = ctx.emit1("transpose", [flipped], {"perm": [0, 1, 3, 2]})
    return [ctx.emit1("conv2d", [x, flipped], {
        "strides": [1, 1], "dilations": [dh, dw], "pads": pads, "activation": "none",
        "alpha": 0.0})]


# --- block rearrangements ---------------------------------------------------------------

def _blocks(ctx: LowerCtx, node: TFNode, x: Value, what: str) -> tuple[list[int], list[list[int]]]:
    block = ints(ctx.const_input(node, 1, "block_shape").reshape(-1), "block_shape")
    pairs = ctx.const_input(node, 2, what)
    m = len(block)
    if pairs.shape != (m, 2) or m < 1 or len(x.shape) < m + 1 or min(block) < 1:
        raise NodeError(f"block_shape {block} and {what} {pairs.tolist()} do not fit input "
                        f"{x.type}")
    return block, [[int(a), int(b)] for a, b in pairs.tolist()]


@tf_op("SpaceToBatchND", supports=dtypes(T=DEVICE_DTYPES, Tblock_shape=INDEX, Tpaddings=INDEX),
       batch=batch.space_to_batch)
def space_to_batch(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Pad the M spatial dims after the batch, cut each into blocks of block_shape, and
    move the offsets within a block to the front of the batch:
    [b, s1, .., sM, rest] -> [b1 * .. * bM * b, s1 / b1, .., sM / bM, rest]."""
    x = ctx.input(node, 0)
    block, paddings = _blocks(ctx, node, x, "paddings")
    m, rank = len(block), len(x.shape)
    if any(p < 0 for pair in paddings for p in pair):
        raise NodeError(f"paddings {paddings} must be >= 0")
    if any(paddings[i] != [0, 0] for i in range(m)):
        x = ctx.emit1("pad", [x], {"paddings": [[0, 0], *paddings] + [[0, 0]] * (rank - m - 1),
                                   "mode": "constant", "value": 0})
    b, spatial, rest = x.shape[0], x.shape[1:m + 1], list(x.shape[m + 1:])
    if any(s % k for s, k in zip(spatial, block)):
        raise NodeError(f"padded spatial dims {list(spatial)} are not multiples of "
                        f"block_shape {block}")
    split = [b] + [d for s, k in zip(spatial, block) for d in (s // k, k)] + rest
    x = reshape_to(ctx, x, split)
    perm = [2 + 2 * i for i in range(m)] + [0] + [1 + 2 * i for i in range(m)] + \
        list(range(1 + 2 * m, len(split)))
    x = ctx.emit1("transpose", [x], {"perm": perm})
    return [reshape_to(ctx, x, [math.prod(block) * b] + [s // k for s, k in
                                                         zip(spatial, block)] + rest)]


@tf_op("BatchToSpaceND", supports=dtypes(T=DEVICE_DTYPES, Tblock_shape=INDEX, Tcrops=INDEX),
       batch=batch.batch_to_space)
def batch_to_space(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """SpaceToBatchND's inverse: [b1 * .. * bM * b, s1, .., sM, rest] -> [b, s1 * b1, ..,
    sM * bM, rest], then `crops` cut from the start and end of each spatial dim."""
    x = ctx.input(node, 0)
    block, crops = _blocks(ctx, node, x, "crops")
    m, prod = len(block), math.prod(block)
    if x.shape[0] % prod or any(c < 0 for pair in crops for c in pair):
        raise NodeError(f"input {x.type} batch is not a multiple of {prod}, or crops {crops} "
                        "are negative")
    b, spatial, rest = x.shape[0] // prod, list(x.shape[1:m + 1]), list(x.shape[m + 1:])
    x = reshape_to(ctx, x, block + [b] + spatial + rest)
    perm = [m] + [d for i in range(m) for d in (m + 1 + i, i)] + \
        list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    x = ctx.emit1("transpose", [x], {"perm": perm})
    full = [s * k for s, k in zip(spatial, block)]
    x = reshape_to(ctx, x, [b] + full + rest)
    if any(c != [0, 0] for c in crops):
        if any(lo + hi > f for (lo, hi), f in zip(crops, full)):
            raise NodeError(f"crops {crops} are larger than the spatial dims {full}")
        x = slice_dims(ctx, x, [0] + [lo for lo, _ in crops] + [0] * len(rest),
                       [b] + [f - hi for (_, hi), f in zip(crops, full)] + rest,
                       [1] * len(x.shape))
    return [x]


def _depth_supports(node: TFNode) -> str | None:
    if node.get("data_format", "NHWC") != "NHWC":
        return f"data_format={node.get('data_format')!r} is not supported (NHWC only)"
    return dtypes(T=DEVICE_DTYPES)(node)


@tf_op("DepthToSpace", "SpaceToDepth", supports=_depth_supports, batch=batch.image)
def depth_space(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """NHWC pixel shuffle with `block_size` k: DepthToSpace [n, h, w, k*k*c] ->
    [n, h*k, w*k, c] (depth index (i*k + j)*c + ch goes to row h*k + i, column w*k + j);
    SpaceToDepth is its inverse."""
    x = ctx.input(node, 0)
    k = int(node.get("block_size", 0))
    if len(x.shape) != 4 or k < 2:
        raise NodeError(f"input {x.type} must be 4-D NHWC and block_size {k} >= 2")
    n, h, w, c = x.shape
    if node.op == "DepthToSpace":
        if c % (k * k):
            raise NodeError(f"depth {c} is not a multiple of block_size^2 = {k * k}")
        x = reshape_to(ctx, x, [n, h, w, k, k, c // (k * k)])
        x = ctx.emit1("transpose", [x], {"perm": [0, 1, 3, 2, 4, 5]})
        return [reshape_to(ctx, x, [n, h * k, w * k, c // (k * k)])]
    if h % k or w % k:
        raise NodeError(f"height {h} and width {w} must be multiples of block_size {k}")
    x = reshape_to(ctx, x, [n, h // k, k, w // k, k, c])
    x = ctx.emit1("transpose", [x], {"perm": [0, 1, 3, 2, 4, 5]})
    return [reshape_to(ctx, x, [n, h // k, w // k, k * k * c])]


@tf_op("ExtractImagePatches", supports=dtypes(T=DEVICE_DTYPES), batch=batch.image)
def extract_patches(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Every `ksizes` window of NHWC `images` (strides, rates and SAME/VALID padding as a
    convolution's), flattened into the depth in [kh, kw, c] order: [n, oh, ow, kh*kw*c].
    One strided slice per window offset, concatenated; SAME pads with zeros."""
    x = ctx.input(node, 0)
    if len(x.shape) != 4:
        raise NodeError(f"images {x.type} must be 4-D NHWC")
    (kh, kw), (sh, sw), (rh, rw) = (_hw(node.get(k), k) for k in ("ksizes", "strides",
                                                                  "rates"))
    n, h, w, c = x.shape
    top, bottom, left, right = _pads(node, (h, w), (kh, kw), (sh, sw), (rh, rw))
    if top or bottom or left or right:
        x = ctx.emit1("pad", [x], {"paddings": [[0, 0], [top, bottom], [left, right], [0, 0]],
                                   "mode": "constant", "value": 0})
    oh = (h + top + bottom - (kh - 1) * rh - 1) // sh + 1
    ow = (w + left + right - (kw - 1) * rw - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise NodeError(f"the window {kh}x{kw} (rates {rh}, {rw}) is larger than {x.type}")
    pieces = [slice_dims(ctx, x, [0, i * rh, j * rw, 0],
                         [n, i * rh + (oh - 1) * sh + 1, j * rw + (ow - 1) * sw + 1, c],
                         [1, sh, sw, 1]) for i in range(kh) for j in range(kw)]
    return [concat(ctx, pieces, 3) if len(pieces) > 1 else pieces[0]]


@tf_op("LRN", supports=dtype_check(FLOAT), batch=batch.image)
def local_response_normalization(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF's LRN over the last axis of a 4-D input: sqr_sum[c] = sum of x[c']^2 for
    |c' - c| <= depth_radius; y = x / (bias + alpha * sqr_sum) ** beta. The window sum
    is 2 * depth_radius + 1 shifted slices of the zero-padded squares, added."""
    x = ctx.input(node, 0)
    require_dtype(x, FLOAT)
    if len(x.shape) != 4:
        raise NodeError(f"input {x.type} must be 4-D")
    radius = int(node.get("depth_radius", 5))
    bias, alpha = float(node.get("bias", 1.0)), float(node.get("alpha", 1.0))
    beta = float(node.get("beta", 0.5))
    channels = x.shape[3]
    squares = ctx.emit1("unary", [x], {"fn": "square"})
    padded = ctx.emit1("pad", [squares], {"paddings": [[0, 0], [0, 0], [0, 0],
                                                       [radius, radius]],
                                          "mode": "constant", "value": 0})
    total = None
    for k in range(2 * radius + 1):
        piece = slice_dims(ctx, padded, [0, 0, 0, k], [*x.shape[:3], k + channels],
                           [1, 1, 1, 1])
        total = piece if total is None else ctx.emit1("binary", [total, piece], {"fn": "add"})
    scaled = ctx.emit1("binary", [ctx.emit1("binary", [total, ctx.const(alpha, x.dtype)],
                                            {"fn": "mul"}), ctx.const(bias, x.dtype)],
                       {"fn": "add"})
    denominator = ctx.emit1("binary", [scaled, ctx.const(beta, x.dtype)], {"fn": "pow"})
    return [ctx.emit1("binary", [x, denominator], {"fn": "div"})]
