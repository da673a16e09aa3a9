"""Graph plumbing ops (Placeholder, Const, Identity and friends) and the checks
that every op family shares (dtype groups, `data_format`).

None of these ops emits an instruction: a Const becomes a constant value, an
Identity hands its input on. The dtype helpers live here because every family
needs them and this module depends on nothing but the registry.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import batch
from ..errors import NodeError
from ..graphdef import TFNode
from ..ir import Value
from .registry import LowerCtx, attr_tensor, tf_op

# --- dtype groups (numpy names; docs/isa.md lists what the device holds) -----

FLOAT = ("float16", "float32", "float64")
INT = ("int8", "int16", "int32", "int64", "uint8")
NUMERIC = FLOAT + INT
BOOL = ("bool",)
DEVICE_DTYPES = NUMERIC + BOOL

_KEEP_ON_TF = "keep this node on TensorFlow (the partitioner does this for you)"


def dtype_reason(dtype: object, allowed: tuple[str, ...], what: str = "dtype") -> str | None:
    """Why `dtype` (a dtype name from a TF attr) cannot be taken, or None."""
    if dtype is None or dtype in allowed:
        return None
    if dtype not in DEVICE_DTYPES:
        extra = ("; with bfloat16 models, cast to float32 and use --auto-cast to get bf16 "
                 "matmuls" if dtype == "bfloat16" else "")
        return (f"{what} {dtype} is not supported by the device (it holds "
                f"{', '.join(DEVICE_DTYPES)}){extra}; {_KEEP_ON_TF}")
    return (f"{what} {dtype} is not supported by this op on the device (it takes "
            f"{', '.join(allowed)}); cast the operand first, or {_KEEP_ON_TF}")


def dtype_check(allowed: tuple[str, ...], *attrs: str) -> Callable[[TFNode], str | None]:
    """A `supports` function: the node's dtype attributes (default `T`) must be in
    `allowed`, and `data_format` (if present) must put channels last."""
    keys = attrs or ("T",)

    def supports(node: TFNode) -> str | None:
        for key in keys:
            what = "dtype" if key == "T" else f"{key} dtype"
            if (reason := dtype_reason(node.get(key), allowed, what)) is not None:
                return reason
        return data_format_reason(node)

    return supports


def data_format_reason(node: TFNode) -> str | None:
    """The device is channels-last: NHWC / NDHWC (or no data_format attr)."""
    fmt = node.get("data_format")
    if fmt is None or fmt in ("NHWC", "NDHWC", "NWC"):
        return None
    return (f"data_format={fmt} is not supported: the device computes channels-last "
            f"(NHWC). Export the model with channels_last (Keras "
            f"`image_data_format='channels_last'`), or {_KEEP_ON_TF}")


def require_dtype(v: Value, allowed: tuple[str, ...], what: str = "input") -> None:
    """Raise a NodeError when a value's dtype is outside `allowed`."""
    if v.dtype not in allowed:
        raise NodeError(f"{what} has dtype {v.dtype}; this op takes {', '.join(allowed)} on "
                        f"the device", f"cast it first, or {_KEEP_ON_TF}")


# --- the plumbing ops -------------------------------------------------------

@tf_op("Placeholder", batch=batch.by_value)
def placeholder(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """A graph input. Only a Placeholder the io-config feeds has a value; reaching
    this lowering means the compiled subgraph needs an input nobody gives it."""
    raise NodeError("this input is not fed",
                    f"add '{node.name}:0' to the io-config inputs with its shape and dtype")


@tf_op("PlaceholderWithDefault", batch=batch.elementwise)
def placeholder_with_default(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """An input that falls back to its `input` when not fed: not fed here (the
    io-config feeds it otherwise), so it is its default value."""
    return [ctx.input(node, 0)]


def _const_supports(node: TFNode) -> str | None:
    return dtype_reason(node.get("dtype"), DEVICE_DTYPES, "constant of dtype")


@tf_op("Const", supports=_const_supports, batch=batch.by_value)
def const(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """A constant tensor from the `value` attribute (TensorProto, splats expanded)."""
    return [ctx.const(attr_tensor(node, "value"))]


@tf_op("Identity", "StopGradient", "Snapshot", "PreventGradient", batch=batch.elementwise)
def identity(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """y = x. StopGradient/PreventGradient only matter for training; Snapshot is a
    copy TF may elide. No instruction: the input value is handed on."""
    return [ctx.input(node, 0)]


@tf_op("IdentityN", batch=batch.per_output)
def identity_n(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """y_i = x_i for every input (Keras uses it around custom gradients)."""
    return ctx.inputs(node)


@tf_op("NoOp", batch=batch.by_value)
def no_op(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """No outputs; only ever reached through control edges, which the device ignores."""
    return []
