"""Neural-network ops: convolutions, pooling, inference batch norm, bias, softmax
and activations. Everything is channels-last (NHWC); NCHW graphs are refused.

Padding follows TF: VALID is no padding; SAME pads
`total = max((ceil(in / stride) - 1) * stride + (k - 1) * dilation + 1 - in, 0)`
with `total // 2` before and the rest after; EXPLICIT reads `explicit_paddings`
(pairs per NHWC dim). All three become explicit `pads` [top, bottom, left, right].
"""

from __future__ import annotations

import numpy as np

from .. import batch
from ..errors import NodeError
from ..graphdef import TFNode
from ..ir import Value
from .basic import FLOAT, NUMERIC, data_format_reason, dtype_check, require_dtype
from .registry import LowerCtx, tf_op

_PADDINGS = ("SAME", "VALID", "EXPLICIT")


# --- windows and padding -------------------------------------------------------

def same_pads(size: int, k: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TF's SAME padding of one spatial dim: (before, after)."""
    effective = (k - 1) * dilation + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def _hw(values: object, name: str) -> tuple[int, int]:
    """(h, w) from an NHWC 4-list whose batch and channel entries must be 1."""
    v = list(values) if values is not None else [1, 1, 1, 1]
    if len(v) != 4 or v[0] != 1 or v[3] != 1:
        raise NodeError(f"{name}={v}: the device only windows over H and W (batch and "
                        f"channel entries must be 1)")
    return int(v[1]), int(v[2])


def _window_reason(node: TFNode, keys: tuple[str, ...]) -> str | None:
    """A supports() check of NHWC window attrs, padding and data_format."""
    if (reason := data_format_reason(node)) is not None:
        return reason
    for key in keys:
        v = node.get(key)
        if v is not None and (len(v) != 4 or v[0] != 1 or v[3] != 1):
            return (f"{key}={list(v)} is not supported: the device windows over H and W only "
                    f"(batch and channel entries must be 1); keep this node on TensorFlow")
    padding = node.get("padding", "VALID")
    if padding not in _PADDINGS:
        return f"padding={padding!r} is not supported (SAME, VALID or EXPLICIT)"
    if padding == "EXPLICIT":
        ex = list(node.get("explicit_paddings") or [])
        if len(ex) != 8 or any(ex[i] for i in (0, 1, 6, 7)):
            return (f"explicit_paddings={ex} is not supported: only H and W may be padded "
                    f"(8 entries, batch and channel pairs 0)")
    return None


def _pads(node: TFNode, spatial: tuple[int, int], kernel: tuple[int, int],
          strides: tuple[int, int], dilations: tuple[int, int]) -> list[int]:
    """`padding` (+ `explicit_paddings`) as [top, bottom, left, right]."""
    padding = node.get("padding", "VALID")
    if padding == "VALID":
        return [0, 0, 0, 0]
    if padding == "EXPLICIT":
        ex = [int(p) for p in node.get("explicit_paddings")]
        return ex[2:6]
    (t, b), (lf, r) = (same_pads(s, k, st, d)
                       for s, k, st, d in zip(spatial, kernel, strides, dilations, strict=True))
    return [t, b, lf, r]


def float_input(ctx: LowerCtx, node: TFNode, layout: str = "NHWC") -> Value:
    """Input 0, a float tensor of the rank `layout` ("NHWC", "NDHWC") names."""
    x = ctx.input(node, 0)
    require_dtype(x, FLOAT)
    if len(x.shape) != len(layout):
        raise NodeError(f"input {x.type} must be {len(layout)}-D {layout}")
    return x


# --- convolutions ----------------------------------------------------------------

def _conv_supports(node: TFNode) -> str | None:
    return dtype_check(FLOAT)(node) or _window_reason(node, ("strides", "dilations"))


@tf_op("Conv2D", "DepthwiseConv2dNative", supports=_conv_supports, batch=batch.image)
def conv2d(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """2-D convolution (cross-correlation) on NHWC `input` with an HWIO `filter`
    ([KH, KW, C, O]; DepthwiseConv2dNative: [KH, KW, C, M] giving C*M channels,
    channel c*M+m from input channel c). Strides/dilations are NHWC 4-lists;
    padding as the module docstring. The filter may be a constant (fastest) or
    computed.

    Conv2D's grouped form (Keras `Conv2D(groups=G)`): a filter [KH, KW, C/G, O]
    whose C/G divides the input's C into G groups, output channels in G equal
    blocks, block g reading input group g. One input channel per group
    (G = C) is depthwise convolution with the filter reshaped to
    [KH, KW, C, O/C]; other G become `conv2d` with `groups=G`."""
    x = float_input(ctx, node)
    w = ctx.input(node, 1)
    if len(w.shape) != 4:
        raise NodeError(f"filter {w.type} must be 4-D [KH, KW, C, O]")
    strides = _hw(node.get("strides"), "strides")
    dilations = _hw(node.get("dilations"), "dilations")
    if min(strides) < 1 or min(dilations) < 1:
        raise NodeError(f"strides {strides} and dilations {dilations} must be >= 1")
    attrs = {"strides": list(strides), "dilations": list(dilations),
             "pads": _pads(node, x.shape[1:3], w.shape[:2], strides, dilations),
             "activation": "none", "alpha": 0.0}
    if node.op == "DepthwiseConv2dNative":
        return [ctx.emit1("depthwise_conv2d", [x, w], attrs)]
    channels, (kh, kw, group_channels, out_channels) = x.shape[3], w.shape
    groups = _groups(channels, group_channels, out_channels, w, x)
    if groups == 1:
        return [ctx.emit1("conv2d", [x, w], attrs)]
    if group_channels == 1:
        w = ctx.emit1("reshape", [w], {"shape": [kh, kw, channels, out_channels // channels]})
        return [ctx.emit1("depthwise_conv2d", [x, w], attrs)]
    return [ctx.emit1("conv2d", [x, w], {**attrs, "groups": groups})]


def _groups(channels: int, group_channels: int, out_channels: int, w: Value, x: Value) -> int:
    """How many groups a Conv2D's filter splits the input into (1: an ordinary one)."""
    if group_channels < 1 or channels % group_channels:
        raise NodeError(f"filter {w.type} reads {group_channels} channels per group, which does "
                        f"not divide the input {x.type}'s {channels} channels",
                        "fix the filter's third dimension (C / groups)")
    groups = channels // group_channels
    if out_channels % groups:
        raise NodeError(f"filter {w.type} has {out_channels} output channels for {groups} "
                        f"groups; grouped convolution needs a multiple of the group count",
                        "fix the filter's last dimension")
    return groups


# --- pooling -----------------------------------------------------------------------

def _pool_supports(node: TFNode) -> str | None:
    return dtype_check(FLOAT)(node) or _window_reason(node, ("ksize", "strides"))


def _pool(ctx: LowerCtx, node: TFNode, mode: str, ksize: object, strides: object) -> Value:
    x = float_input(ctx, node)
    k, s = _hw(ksize, "ksize"), _hw(strides, "strides")
    if min(k) < 1 or min(s) < 1:
        raise NodeError(f"ksize {k} and strides {s} must be >= 1")
    if node.get("padding", "VALID") == "SAME":
        # Any SAME window of at least 2 * (size + (out - 1) * stride) covers the whole
        # input at every output, so a larger one (ksize 10^9) is clamped to that: the
        # same numbers, as TF's reference kernel computes them, without padding sized by it.
        k = tuple(min(kk, 2 * (size + (-(-size // ss) - 1) * ss))
                  for kk, size, ss in zip(k, x.shape[1:3], s))
    pads = _pads(node, x.shape[1:3], k, s, (1, 1))
    return ctx.emit1("pool", [x], {"mode": mode, "ksize": list(k), "strides": list(s),
                                   "pads": pads})


@tf_op("MaxPool", "AvgPool", supports=_pool_supports, batch=batch.image)
def pool(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Max / average pooling over NHWC windows `ksize` with `strides` (NHWC
    4-lists). Padding as the module docstring (EXPLICIT: MaxPool only); max
    ignores padded cells, average divides by the number of real cells."""
    mode = "max" if node.op == "MaxPool" else "avg"
    return [_pool(ctx, node, mode, node.get("ksize"), node.get("strides"))]


@tf_op("MaxPoolV2", supports=_pool_supports, batch=batch.image)
def max_pool_v2(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """MaxPool with `ksize` and `strides` given as constant inputs 1 and 2."""
    ksize = ctx.const_input(node, 1, "ksize").tolist()
    strides = ctx.const_input(node, 2, "strides").tolist()
    return [_pool(ctx, node, "max", ksize, strides)]


# --- batch norm, bias ------------------------------------------------------------

def _bn_supports(node: TFNode) -> str | None:
    if node.get("is_training", True):
        return ("is_training=True (training-mode batch norm computes batch statistics) is "
                "not supported; export the model for inference (Keras: call it with "
                "training=False, or freeze it) so batch norm uses its moving averages")
    return dtype_check(FLOAT)(node) or dtype_check(("float32",), "U")(node)


@tf_op("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", supports=_bn_supports,
       batch=batch.fused_batch_norm)
def fused_batch_norm(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Inference batch norm over the last (channel) axis:
    y = (x - mean) * scale / sqrt(variance + epsilon) + offset, emitted as
    `y = x * a + b` with a = scale / sqrt(variance + epsilon), b = offset - mean * a
    (constants when the parameters are, so fold_scale_shift folds them into a
    preceding conv/matmul). float16 x is computed in float32 (TF's `U`) and cast
    back. Outputs 1..2 (batch_mean, batch_variance) are the mean and variance
    inputs, as TF returns in inference; reserve_space_* (undefined in TF) are 0."""
    x = ctx.input(node, 0)
    params = [ctx.input(node, i) for i in range(1, 5)]
    require_dtype(x, FLOAT)
    if not x.shape:
        raise NodeError("batch norm needs an input of rank >= 1")
    channels = x.shape[-1]
    for name, p in zip(("scale", "offset", "mean", "variance"), params, strict=True):
        if p.shape != (channels,):
            raise NodeError(f"{name} {p.type} must be a vector over the {channels} channels")
        require_dtype(p, ("float32",), name)
    scale, offset, mean, var = params
    eps = float(node.get("epsilon", 1e-4))
    if all(p.is_const for p in params):
        a64 = scale.data.astype(np.float64) / np.sqrt(var.data.astype(np.float64) + eps)
        b64 = offset.data.astype(np.float64) - mean.data.astype(np.float64) * a64
        a, b = ctx.const(a64, "float32"), ctx.const(b64, "float32")
    else:
        shifted = ctx.emit1("binary", [var, ctx.const(eps, "float32")], {"fn": "add"})
        rsqrt = ctx.emit1("unary", [shifted], {"fn": "rsqrt"})
        a = ctx.emit1("binary", [scale, rsqrt], {"fn": "mul"})
        mean_a = ctx.emit1("binary", [mean, a], {"fn": "mul"})
        b = ctx.emit1("binary", [offset, mean_a], {"fn": "sub"})
    xf = x if x.dtype == "float32" else ctx.emit1("cast", [x], {"to": "float32"})
    y = ctx.emit1("binary", [ctx.emit1("binary", [xf, a], {"fn": "mul"}), b], {"fn": "add"})
    if x.dtype != "float32":
        y = ctx.emit1("cast", [y], {"to": x.dtype})
    zeros = ctx.const(np.zeros(channels, np.float32))
    outs = [y, mean, var, zeros, zeros]
    if node.op == "FusedBatchNormV3":
        outs.append(ctx.const(np.zeros((), np.float32)))
    return outs


@tf_op("BiasAdd", "BiasAddV1", supports=dtype_check(NUMERIC), batch=batch.elementwise)
def bias_add(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """value + bias, the rank-1 bias added along the last (channel, NHWC) axis."""
    x, bias = ctx.input(node, 0), ctx.input(node, 1)
    require_dtype(x, NUMERIC)
    if len(x.shape) < 2 or bias.shape != (x.shape[-1],):
        raise NodeError(f"bias {bias.type} must be a vector over the last axis of {x.type} "
                        f"(rank >= 2)")
    return [ctx.emit1("binary", [x, bias], {"fn": "add"})]


# --- softmax and activations ---------------------------------------------------------

@tf_op("Softmax", "LogSoftmax", supports=dtype_check(FLOAT),
       batch=batch.along(batch.last_axes(1), "softmax"))
def softmax(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """softmax / log-softmax over the last axis (TF's raw ops have no axis attr;
    tf.nn.softmax(axis=k) transposes around them)."""
    x = ctx.input(node, 0)
    require_dtype(x, FLOAT)
    if not x.shape:
        raise NodeError("softmax needs an input of rank >= 1")
    return [ctx.emit1("softmax", [x], {"axis": len(x.shape) - 1,
                                       "log": node.op == "LogSoftmax"})]


# TF op -> (unary fn, dtypes)
ACTIVATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Relu": ("relu", NUMERIC),
    "Relu6": ("relu6", NUMERIC),
    "LeakyRelu": ("leaky_relu", FLOAT),
    "Elu": ("elu", FLOAT),
    "Selu": ("selu", FLOAT),
    "Sigmoid": ("sigmoid", FLOAT),
    "Tanh": ("tanh", FLOAT),
    "Softplus": ("softplus", FLOAT),
}


def _activation_supports(node: TFNode) -> str | None:
    return dtype_check(ACTIVATIONS[node.op][1])(node)


@tf_op(*ACTIVATIONS, supports=_activation_supports, batch=batch.elementwise)
def activation(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Elementwise activations: Relu max(x, 0); Relu6 min(max(x, 0), 6); LeakyRelu
    x if x > 0 else alpha * x (`alpha` attr, default 0.2); Elu x if x > 0 else
    exp(x) - 1; Selu scale * elu_alpha(x) with TF's constants; Sigmoid; Tanh;
    Softplus log(1 + exp(x))."""
    fn, allowed = ACTIVATIONS[node.op]
    x = ctx.input(node, 0)
    require_dtype(x, allowed)
    attrs: dict = {"fn": fn}
    if fn == "leaky_relu":
        attrs["alpha"] = float(node.get("alpha", 0.2))
    return [ctx.emit1("unary", [x], attrs)]


@tf_op("Softsign", supports=dtype_check(FLOAT), batch=batch.elementwise)
def softsign(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """x / (1 + |x|)."""
    x = ctx.input(node, 0)
    require_dtype(x, FLOAT)
    denom = ctx.emit1("binary", [ctx.emit1("unary", [x], {"fn": "abs"}),
                                 ctx.const(1, x.dtype)], {"fn": "add"})
    return [ctx.emit1("binary", [x, denom], {"fn": "div"})]
