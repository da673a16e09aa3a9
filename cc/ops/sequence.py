"""Ops along a sequence axis or over a matrix band: Cumsum and Cumprod (the `cumulative`
kind), TopKV2 (`top_k`), MatrixBandPart (causal masks), ReverseV2, Roll (shifted windows)
and XlaDynamicUpdateSlice at constant offsets. Axes, shifts, k and offsets must be
compile-time constants, as every shape-like operand on the device.
"""

from __future__ import annotations

import numpy as np

from .. import batch
from ..errors import NodeError
from ..graphdef import TFNode
from ..ir import Value
from .array import (
    INDEX,
    broadcast_to,
    concat,
    dtypes,
    ints,
    norm_axis,
    reshape_to,
    scalar_int,
    slice_axis,
    slice_dims,
)
from .basic import DEVICE_DTYPES, NUMERIC, require_dtype
from .registry import LowerCtx, tf_op


@tf_op("Cumsum", "Cumprod", supports=dtypes(T=NUMERIC, Tidx=INDEX),
       batch=batch.along(batch.const_axes(1), "cumulative"))
def cumulative(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Running sum (Cumsum) or product (Cumprod) along the constant scalar `axis`;
    `exclusive` leaves each element out (starting from 0 or 1), `reverse` runs from the
    end. Integers wrap as in TF."""
    x = ctx.input(node, 0)
    require_dtype(x, NUMERIC)
    if not x.shape:
        raise NodeError(f"{node.op} needs an input of rank >= 1, got a scalar")
    axis = norm_axis(scalar_int(ctx.const_input(node, 1, "axis"), "axis"), len(x.shape))
    return [ctx.emit1("cumulative", [x], {
        "fn": "sum" if node.op == "Cumsum" else "prod", "axis": axis,
        "exclusive": bool(node.get("exclusive", False)),
        "reverse": bool(node.get("reverse", False))})]


@tf_op("TopKV2", supports=dtypes(T=NUMERIC, Tk=INDEX, index_type=INDEX),
       batch=batch.along(batch.last_axes(1), "top-k"))
def top_k(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """The constant `k` largest entries of the last axis, in descending order (equal values
    in index order, as TF's CPU kernel), and their indices (`index_type`, default int32).
    `sorted=False` lets TF return any order; the device returns the sorted one."""
    x = ctx.input(node, 0)
    require_dtype(x, NUMERIC)
    k = scalar_int(ctx.const_input(node, 1, "k"), "k")
    if not x.shape or not 0 <= k <= x.shape[-1]:
        raise NodeError(f"k {k} must be in [0, last dim] of input {x.type}")
    to = node.get("index_type", "int32")
    return [ctx.emit1("top_k", [x], {"k": k, "indices": False, "to": to}),
            ctx.emit1("top_k", [x], {"k": k, "indices": True, "to": to})]


@tf_op("MatrixBandPart", supports=dtypes(T=DEVICE_DTYPES, Tindex=INDEX),
       batch=batch.along(batch.last_axes(2), "band"))
def matrix_band_part(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Keep the band of each innermost matrix [..., M, N]: entry (m, n) stays when
    (num_lower < 0 or m - n <= num_lower) and (num_upper < 0 or n - m <= num_upper), the
    rest is zero. A select against a constant mask (`tf.linalg.band_part`, causal masks)."""
    x = ctx.input(node, 0)
    if len(x.shape) < 2:
        raise NodeError(f"MatrixBandPart needs an input of rank >= 2, got {x.type}")
    lower = scalar_int(ctx.const_input(node, 1, "num_lower"), "num_lower")
    upper = scalar_int(ctx.const_input(node, 2, "num_upper"), "num_upper")
    m, n = x.shape[-2:]
    ctx.check_const_size([m, n], "int64", "the band mask")
    diff = np.arange(m)[:, None] - np.arange(n)[None, :]
    keep = ((lower < 0) | (diff <= lower)) & ((upper < 0) | (-diff <= upper))
    zero = ctx.const(np.zeros((), dtype=x.dtype))
    return [ctx.emit1("select", [ctx.const(keep), x, zero])]


@tf_op("ReverseV2", supports=dtypes(T=DEVICE_DTYPES, Tidx=INDEX),
       batch=batch.along(batch.const_axes(1), "reverse"))
def reverse(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Reverse along each of the constant `axis` (a strided slice with stride -1)."""
    x = ctx.input(node, 0)
    rank = len(x.shape)
    axes = {norm_axis(a, rank) for a in ints(ctx.const_input(node, 1, "axis").reshape(-1),
                                             "axis")}
    if not axes:
        return [x]
    begin = [d - 1 if i in axes else 0 for i, d in enumerate(x.shape)]
    end: list[int | None] = [None if i in axes else d for i, d in enumerate(x.shape)]
    strides = [-1 if i in axes else 1 for i in range(rank)]
    return [slice_dims(ctx, x, begin, end, strides)]


@tf_op("Roll", supports=dtypes(T=DEVICE_DTYPES, Tshift=INDEX, Taxis=INDEX),
       batch=batch.along(batch.const_axes(2), "roll"))
def roll(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Shift elements along the constant axes by the constant shifts, wrapping around
    (shifts on one axis add up); the two pieces of each axis are concatenated."""
    x = ctx.input(node, 0)
    rank = len(x.shape)
    shifts = ints(ctx.const_input(node, 1, "shift").reshape(-1), "shift")
    axes = ints(ctx.const_input(node, 2, "axis").reshape(-1), "axis")
    if len(shifts) != len(axes):
        raise NodeError(f"shift has {len(shifts)} entries but axis has {len(axes)}")
    total: dict[int, int] = {}
    for s, a in zip(shifts, axes):
        a = norm_axis(a, rank)
        total[a] = total.get(a, 0) + s
    y = x
    for a, s in sorted(total.items()):
        d = x.shape[a]
        s = s % d if d else 0
        if s:
            y = concat(ctx, [slice_axis(ctx, y, a, d - s, d), slice_axis(ctx, y, a, 0, d - s)],
                       a)
    return [y]


@tf_op("XlaDynamicUpdateSlice", supports=dtypes(T=DEVICE_DTYPES, Tindices=INDEX),
       batch=batch.mixes("it writes at computed positions of the whole tensor"))
def dynamic_update_slice(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """`input` with the block `update` written at the constant start `indices` (clamped so
    the block fits, as XLA does): a select between `input` and `update` padded to its
    shape. Keras' `ops.slice_update` on TensorFlow (Swin's window masks)."""
    x, update = ctx.input(node, 0), ctx.input(node, 1)
    starts = ints(ctx.const_input(node, 2, "indices").reshape(-1), "indices")
    rank = len(x.shape)
    if len(update.shape) != rank or len(starts) != rank or update.dtype != x.dtype:
        raise NodeError(f"update {update.type} and indices {starts} must match input {x.type}")
    if any(u > d for u, d in zip(update.shape, x.shape)):
        raise NodeError(f"update {update.type} is larger than input {x.type}")
    starts = [min(max(s, 0), d - u) for s, d, u in zip(starts, x.shape, update.shape)]
    paddings = [[s, d - s - u] for s, d, u in zip(starts, x.shape, update.shape)]
    ctx.check_const_size(x.shape, "bool", "the update mask")
    keep = np.zeros(x.shape, dtype=bool)
    keep[tuple(slice(s, s + u) for s, u in zip(starts, update.shape))] = True
    if keep.all():
        return [update]
    padded = ctx.emit1("pad", [update], {"paddings": paddings, "mode": "constant",
                                         "value": np.zeros((), x.dtype).item()})
    return [ctx.emit1("select", [ctx.const(keep), padded, x])]


@tf_op("GatherNd", supports=dtypes(Tparams=DEVICE_DTYPES, Tindices=INDEX), batch=batch.gather_nd)
def gather_nd(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """params[indices[..., 0], .., indices[..., K-1]] for the last axis of `indices` of
    length K <= rank(params): the first K axes of params are flattened into one and each
    index tuple becomes one position in it (a dot product with their strides), then one
    gather. A constant index outside its dim is refused; a computed one that leaves params
    as a whole is a run-time error (one inside it reads that element, where TF's CPU
    kernel would fail)."""
    params, indices = ctx.input(node, 0), ctx.input(node, 1)
    if not indices.shape or indices.shape[-1] > len(params.shape):
        raise NodeError(f"indices {indices.type} must end in a dim of at most the rank of "
                        f"params {params.type}")
    k = indices.shape[-1]
    lead, rest = list(params.shape[:k]), list(params.shape[k:])
    strides = [int(np.prod(lead[i + 1:], dtype=np.int64)) for i in range(k)]
    flat = reshape_to(ctx, params, [int(np.prod(lead, dtype=np.int64))] + rest)
    if k == 0:
        raise NodeError("indices with an empty last dim are not supported")
    # position = sum_i indices[..., i] * strides[i]; an index out of its own dim is an
    # error in TF, so check each one against its bound before folding them together.
    if indices.data is not None:
        idx = np.asarray(indices.data)
        if (idx < 0).any() or (idx >= np.asarray(lead)).any():
            raise NodeError(f"a constant index in {idx.tolist()} is outside params "
                            f"{params.type}", "fix the indices")
        position = ctx.const((idx * np.asarray(strides)).sum(-1).astype(indices.dtype))
    else:
        weights = ctx.const(np.asarray(strides, dtype=indices.dtype))
        scaled = ctx.emit1("binary", [indices, weights], {"fn": "mul"})
        position = ctx.emit1("reduce", [scaled], {"fn": "sum", "axes": [len(indices.shape) - 1],
                                                  "keepdims": False})
    return [ctx.emit1("gather", [flat, position], {"axis": 0, "batch_dims": 0})]


@tf_op("Bucketize", supports=dtypes(T=("int32", "int64", "float32", "float64")),
       batch=batch.elementwise)
def bucketize(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """int32 index of the bucket of each element: how many of the sorted `boundaries`
    (an attribute) are <= it (Keras Discretization). A compare against every boundary,
    summed."""
    x = ctx.input(node, 0)
    if x.dtype not in ("float32", "float64"):  # TF compares integers with float bounds
        x = ctx.emit1("cast", [x], {"to": "float64"})
    bounds = np.asarray(node.get("boundaries") or [], dtype=np.float32).astype(x.dtype)
    if bounds.size == 0:
        return [broadcast_to(ctx, ctx.const(np.zeros((), np.int32)), x.shape)]
    column = reshape_to(ctx, x, [*x.shape, 1])
    above = ctx.emit1("binary", [column, ctx.const(bounds)], {"fn": "greater_equal"})
    counts = ctx.emit1("cast", [above], {"to": "int32"})
    return [ctx.emit1("reduce", [counts], {"fn": "sum", "axes": [len(x.shape)],
                                           "keepdims": False})]


@tf_op("UnsortedSegmentSum", supports=dtypes(T=("float16", "float32", "float64", "int32",
                                                "int64"), Tindices=INDEX,
                                             Tnumsegments=INDEX),
       batch=batch.segment_sum)
def unsorted_segment_sum(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """out[s, ...] = sum of data[i..., ...] over the index tuples i whose segment_ids[i] is s,
    for the constant num_segments; negative ids are dropped, as in TF (an id past
    num_segments, an error on TF's CPU, is dropped too).
    A one-hot [n, num_segments] of the ids, transposed, times the data flattened to [n, f]."""
    data, ids = ctx.input(node, 0), ctx.input(node, 1)
    segments = scalar_int(ctx.const_input(node, 2, "num_segments"), "num_segments")
    k = len(ids.shape)
    if tuple(data.shape[:k]) != tuple(ids.shape) or segments < 0:
        raise NodeError(f"segment_ids {ids.type} must be a prefix of data {data.type}'s shape "
                        f"and num_segments {segments} >= 0")
    rows = int(np.prod(ids.shape, dtype=np.int64))
    rest = list(data.shape[k:])
    flat = reshape_to(ctx, data, [rows, int(np.prod(rest, dtype=np.int64))])
    hot = ctx.emit1("one_hot", [reshape_to(ctx, ids, [rows])], {
        "depth": segments, "on_value": 1, "off_value": 0, "axis": -1, "to": data.dtype})
    summed = ctx.emit1("matmul", [hot, flat], {"transpose_a": True, "transpose_b": False,
                                               "activation": "none", "alpha": 0.0})
    return [reshape_to(ctx, summed, [segments, *rest])]
