"""Array and shape ops: reshaping, joining and splitting, slicing, padding, tiling,
gathering, and the shape queries (Shape, Size, Rank, ZerosLike, ...).

Shapes are static on the device, so every shape-like operand (a Reshape's shape,
a StridedSlice's begin/end/strides, paddings, multiples, axes, ...) must be a
compile-time constant; shape queries fold to constants. Axes are normalized to
be non-negative before they reach an instruction. `ctx.emit` folds instructions
whose inputs are all constants, so shape subgraphs (Shape → StridedSlice → Pack
→ Reshape) vanish at compile time.
"""

from __future__ import annotations

import math

import numpy as np

from .. import batch
from ..errors import NodeError
from ..graphdef import TFNode
from ..ir import Value
from .basic import DEVICE_DTYPES, dtype_reason
from .registry import LowerCtx, SupportsFn, tf_op

INDEX = ("int32", "int64")
_FIX_GRAPH = ("TensorFlow would fail on these shapes too: check the input shapes in the "
              "io-config, or fix the model")


# --- shared helpers ---------------------------------------------------------

def dtypes(**allowed: tuple[str, ...]) -> SupportsFn:
    """A `supports` check: each named dtype attribute (when the node has it) must be
    in its group, e.g. `dtypes(T=DEVICE_DTYPES, Tidx=INDEX)`."""

    def supports(node: TFNode) -> str | None:
        for key, group in allowed.items():
            what = "dtype" if key == "T" else f"{key} dtype"
            if (reason := dtype_reason(node.get(key), group, what)) is not None:
                return reason
        return None

    return supports


def ints(array: np.ndarray, what: str) -> list[int]:
    """A constant 1-D integer operand as a list of Python ints."""
    a = np.asarray(array)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise NodeError(f"{what} must be a 1-D integer tensor, got {a.dtype.name}"
                        f"{list(a.shape)}", _FIX_GRAPH)
    return [int(v) for v in a]


def scalar_int(array: np.ndarray, what: str) -> int:
    """A constant integer operand holding one value (a scalar or a 1-element vector)."""
    a = np.asarray(array)
    if a.size != 1 or a.dtype.kind not in "iu":
        raise NodeError(f"{what} must be one integer, got {a.dtype.name}{list(a.shape)}",
                        _FIX_GRAPH)
    return int(a.reshape(()))


def scalar(array: np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(array)
    if a.size != 1:
        raise NodeError(f"{what} must be a scalar, got shape {list(a.shape)}", _FIX_GRAPH)
    return a.reshape(())


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [-rank, rank) made non-negative."""
    if not -rank <= axis < rank:
        raise NodeError(f"{what} {axis} is out of range for a rank-{rank} tensor "
                        f"(valid: [{-rank}, {rank}))", _FIX_GRAPH)
    return axis + rank if axis < 0 else axis


def reshape_to(ctx: LowerCtx, x: Value, shape: tuple[int, ...] | list[int]) -> Value:
    shape = tuple(int(d) for d in shape)
    if shape == x.shape:
        return x
    return ctx.emit1("reshape", [x], {"shape": list(shape)})


def broadcast_to(ctx: LowerCtx, x: Value, shape: tuple[int, ...] | list[int]) -> Value:
    shape = tuple(int(d) for d in shape)
    if shape == x.shape:
        return x
    return ctx.emit1("broadcast_to", [x], {"shape": list(shape)})


def slice_dims(ctx: LowerCtx, x: Value, begin: list[int], end: list[int | None],
               strides: list[int]) -> Value:
    """A `strided_slice` with Python slice semantics per dim (no axis added or
    removed); `x` itself when the slice takes everything."""
    full = all(s == 1 and b == 0 and (e is None or e >= d)
               for b, e, s, d in zip(begin, end, strides, x.shape, strict=True))
    if full:
        return x
    return ctx.emit1("strided_slice", [x], {"begin": list(begin), "end": list(end),
                                            "strides": list(strides)})


def slice_axis(ctx: LowerCtx, x: Value, axis: int, start: int, stop: int) -> Value:
    """x[..., start:stop, ...] on one axis."""
    rank = len(x.shape)
    begin = [0] * rank
    end: list[int | None] = list(x.shape)
    begin[axis], end[axis] = start, stop
    return slice_dims(ctx, x, begin, end, [1] * rank)


def concat(ctx: LowerCtx, values: list[Value], axis: int) -> Value:
    if len(values) == 1:
        return values[0]
    return ctx.emit1("concat", values, {"axis": axis})


def _zero(dtype: str) -> int | float | bool:
    return np.zeros((), dtype=dtype).item()


# --- reshaping ----------------------------------------------------------------

def resolve_shape(x: Value, shape: list[int]) -> tuple[int, ...]:
    """TF Reshape's shape rule: at most one -1, filled in to keep the element count."""
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in shape):
        raise NodeError(f"bad target shape {shape}: only one dim may be -1, none negative",
                        _FIX_GRAPH)
    known = math.prod(d for d in shape if d != -1)
    if unknown:
        if known == 0 or x.type.size % known:
            raise NodeError(f"cannot reshape {x.type} ({x.type.size} elements) to {shape}",
                            _FIX_GRAPH)
        shape = list(shape)
        shape[unknown[0]] = x.type.size // known
    elif known != x.type.size:
        raise NodeError(f"cannot reshape {x.type} ({x.type.size} elements) to {shape}",
                        _FIX_GRAPH)
    return tuple(shape)


@tf_op("Reshape", supports=dtypes(T=DEVICE_DTYPES, Tshape=INDEX), batch=batch.reshape)
def reshape(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Reshape: row-major reshape to the (constant) `shape` operand; one entry may
    be -1 and is inferred from the element count."""
    x = ctx.input(node, 0)
    shape = ctx.const_input(node, 1, "shape")
    dims = [] if np.asarray(shape).size == 0 else ints(np.asarray(shape).reshape(-1), "shape")
    return [reshape_to(ctx, x, resolve_shape(x, dims))]


@tf_op("Squeeze", supports=dtypes(T=DEVICE_DTYPES), batch=batch.reshape)
def squeeze(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Squeeze: drop the size-1 dims listed in `squeeze_dims` (negative counts from
    the end), or every size-1 dim when the list is empty. A listed dim whose size is
    not 1 is an error."""
    x = ctx.input(node, 0)
    rank = len(x.shape)
    listed = list(node.get("squeeze_dims") or [])
    if listed:
        drop = {norm_axis(int(d), rank, "squeeze dim") for d in listed}
        for d in sorted(drop):
            if x.shape[d] != 1:
                raise NodeError(f"cannot squeeze dim {d} of {x.type}: its size is not 1",
                                _FIX_GRAPH)
    else:
        drop = {i for i, d in enumerate(x.shape) if d == 1}
    return [reshape_to(ctx, x, [d for i, d in enumerate(x.shape) if i not in drop])]


@tf_op("ExpandDims", supports=dtypes(T=DEVICE_DTYPES, Tdim=INDEX), batch=batch.reshape)
def expand_dims(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF ExpandDims: insert a size-1 dim at `dim` (constant, in [-(R+1), R]; -1
    appends)."""
    x = ctx.input(node, 0)
    rank = len(x.shape)
    dim = norm_axis(scalar_int(ctx.const_input(node, 1, "dim"), "dim"), rank + 1, "dim")
    return [reshape_to(ctx, x, x.shape[:dim] + (1,) + x.shape[dim:])]


@tf_op("Transpose", supports=dtypes(T=DEVICE_DTYPES, Tperm=INDEX), batch=batch.transpose)
def transpose(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Transpose: y.shape[i] = x.shape[perm[i]] (perm constant, a permutation of
    the dims; negative entries count from the end)."""
    x = ctx.input(node, 0)
    rank = len(x.shape)
    perm = [norm_axis(p, rank, "perm entry")
            for p in ints(ctx.const_input(node, 1, "perm"), "perm")]
    if sorted(perm) != list(range(rank)):
        raise NodeError(f"perm {perm} is not a permutation of the {rank} dims of {x.type}",
                        _FIX_GRAPH)
    if perm == list(range(rank)):
        return [x]
    return [ctx.emit1("transpose", [x], {"perm": perm})]


# --- joining and splitting --------------------------------------------------------

def _concat_values(ctx: LowerCtx, node: TFNode, values: list[Value], axis_arr: np.ndarray
                   ) -> list[Value]:
    rank = len(values[0].shape)
    if rank == 0:
        raise NodeError("cannot concatenate scalars", "use Pack (tf.stack) instead")
    axis = norm_axis(scalar_int(axis_arr, "axis"), rank)
    return [concat(ctx, values, axis)]


@tf_op("ConcatV2", supports=dtypes(T=DEVICE_DTYPES, Tidx=INDEX),
       batch=batch.concat(lambda v: len(v.ins) - 1, lambda v: range(len(v.ins) - 1)))
def concat_v2(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF ConcatV2: the N value inputs joined along `axis`, the last input (constant;
    negative counts from the end). All other dims must match."""
    n = len(node.inputs) - 1
    values = [ctx.input(node, i) for i in range(n)]
    return _concat_values(ctx, node, values, ctx.const_input(node, n, "axis"))


@tf_op("Concat", supports=dtypes(T=DEVICE_DTYPES),
       batch=batch.concat(lambda v: 0, lambda v: range(1, len(v.ins))))
def concat_v1(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Concat (v1): as ConcatV2, but the axis (`concat_dim`) is the first input."""
    values = [ctx.input(node, i) for i in range(1, len(node.inputs))]
    return _concat_values(ctx, node, values, ctx.const_input(node, 0, "concat_dim"))


@tf_op("Pack", supports=dtypes(T=DEVICE_DTYPES), batch=batch.pack)
def pack(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Pack (tf.stack): N tensors of one shape joined along a new dim at `axis`
    (in [-(R+1), R], R the inputs' rank)."""
    values = ctx.inputs(node)
    shape = values[0].shape
    for v in values[1:]:
        if v.shape != shape:
            raise NodeError(f"Pack inputs must have one shape, got {values[0].type} and "
                            f"{v.type}", _FIX_GRAPH)
    axis = norm_axis(int(node.get("axis", 0)), len(shape) + 1)
    parts = [reshape_to(ctx, v, shape[:axis] + (1,) + shape[axis:]) for v in values]
    return [concat(ctx, parts, axis)]


@tf_op("Unpack", supports=dtypes(T=DEVICE_DTYPES), batch=batch.unpack)
def unpack(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Unpack (tf.unstack): `num` tensors, the slices x[..., i, ...] along `axis`
    (that dim removed)."""
    x = ctx.input(node, 0)
    axis = norm_axis(int(node.get("axis", 0)), len(x.shape))
    num = int(node.get("num", x.shape[axis]))
    if num != x.shape[axis]:
        raise NodeError(f"num={num} but dim {axis} of {x.type} has size {x.shape[axis]}",
                        _FIX_GRAPH)
    out_shape = x.shape[:axis] + x.shape[axis + 1:]
    return [reshape_to(ctx, slice_axis(ctx, x, axis, i, i + 1), out_shape) for i in range(num)]


def _split(ctx: LowerCtx, x: Value, axis: int, sizes: list[int]) -> list[Value]:
    outs, start = [], 0
    for size in sizes:
        outs.append(slice_axis(ctx, x, axis, start, start + size))
        start += size
    return outs


@tf_op("Split", supports=dtypes(T=DEVICE_DTYPES), batch=batch.split(axis_input=0, data=1))
def split(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Split: `value` (input 1) cut into `num_split` equal pieces along `split_dim`
    (input 0, constant, negative counts from the end); the dim must divide evenly."""
    x = ctx.input(node, 1)
    axis = norm_axis(scalar_int(ctx.const_input(node, 0, "split_dim"), "split_dim"),
                     len(x.shape))
    num = int(node.get("num_split", 1))
    if num < 1 or x.shape[axis] % num:
        raise NodeError(f"dim {axis} of {x.type} does not split into {num} equal pieces",
                        _FIX_GRAPH)
    return _split(ctx, x, axis, [x.shape[axis] // num] * num)


@tf_op("SplitV", supports=dtypes(T=DEVICE_DTYPES, Tlen=INDEX),
       batch=batch.split(axis_input=2, data=0))
def split_v(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF SplitV: `value` cut along `split_dim` (input 2, constant) into pieces of
    `size_splits` (input 1, constant); one size may be -1 (the rest of the dim)."""
    x = ctx.input(node, 0)
    axis = norm_axis(scalar_int(ctx.const_input(node, 2, "split_dim"), "split_dim"),
                     len(x.shape))
    sizes = ints(ctx.const_input(node, 1, "size_splits"), "size_splits")
    dim = x.shape[axis]
    unknown = [i for i, s in enumerate(sizes) if s == -1]
    if len(unknown) > 1 or any(s < -1 for s in sizes):
        raise NodeError(f"bad size_splits {sizes}: at most one -1, none negative", _FIX_GRAPH)
    known = sum(s for s in sizes if s != -1)
    if unknown:
        sizes[unknown[0]] = dim - known
    if (unknown and known > dim) or (not unknown and known != dim):
        raise NodeError(f"size_splits {sizes} do not add up to dim {axis} of {x.type}",
                        _FIX_GRAPH)
    return _split(ctx, x, axis, sizes)


# --- slicing ------------------------------------------------------------------------

def _slice_batch(view: batch.OpView) -> str | None:
    """Slice keeps a per-sample input per sample only if it takes the whole batch axis:
    begin 0 and size -1 (or a size that follows the batch size)."""
    if view.samples() != [0]:
        return "its begin or size is computed per sample"
    axis = view.ins[0].axis
    begin, size = view.const_ints(1), view.const_ints(2)
    if begin is None or size is None:
        return "its begin or size is computed"
    dim = view.in_shapes[0][axis]
    end = dim if size[axis] == -1 else begin[axis] + size[axis]
    return batch.whole_batch_slice(begin[axis], end, 1, dim, size[axis] == -1,
                                   view.tracks_batch(2))


@tf_op("Slice", supports=dtypes(T=DEVICE_DTYPES, Index=INDEX), batch=_slice_batch)
def slice_(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Slice: x[begin[i] : begin[i] + size[i]] in every dim (begin and size
    constant); size -1 takes the rest of the dim. Out-of-range slices are errors."""
    x = ctx.input(node, 0)
    rank = len(x.shape)
    begin = ints(ctx.const_input(node, 1, "begin"), "begin")
    size = ints(ctx.const_input(node, 2, "size"), "size")
    if len(begin) != rank or len(size) != rank:
        raise NodeError(f"begin {begin} and size {size} need one entry per dim of {x.type}",
                        _FIX_GRAPH)
    end = []
    for i, (b, s, d) in enumerate(zip(begin, size, x.shape, strict=True)):
        e = d if s == -1 else b + s
        if not (0 <= b <= d and b <= e <= d):
            raise NodeError(f"slice [{b}, {e}) is out of range for dim {i} of {x.type}",
                            _FIX_GRAPH)
        end.append(e)
    return [slice_dims(ctx, x, begin, end, [1] * rank)]


_NEW_AXIS, _SHRINK = -2, -1


def _canonical(x: int, dim: int, stride: int, masked: bool, is_end: bool) -> int:
    """TF's canonical bound: a masked bound is the edge in the stride's direction;
    otherwise a negative index counts from the end and the result is clamped to
    [0, dim] (stride > 0) or [-1, dim - 1] (stride < 0)."""
    lo, hi = (0, dim) if stride > 0 else (-1, dim - 1)
    if masked:
        return (hi if is_end else lo) if stride > 0 else (lo if is_end else hi)
    x = x + dim if x < 0 else x
    return min(max(x, lo), hi)


def strided_slice_plan(shape: tuple[int, ...], begin: list[int], end: list[int],
                       strides: list[int], begin_mask: int = 0, end_mask: int = 0,
                       ellipsis_mask: int = 0, new_axis_mask: int = 0,
                       shrink_axis_mask: int = 0
                       ) -> tuple[list[int], list[int | None], list[int], tuple[int, ...]]:
    """TF's StridedSlice rule (tensorflow/core/util/strided_slice_op.cc) for a static
    shape: the sparse spec (with one optional ellipsis, new axes and shrunk axes) is
    expanded to one (begin, end, stride) per input dim in Python slice form, plus the
    final shape (new axes added, shrunk axes removed)."""
    if not len(begin) == len(end) == len(strides):
        raise NodeError(f"begin {begin}, end {end} and strides {strides} must have one "
                        f"length", _FIX_GRAPH)
    if ellipsis_mask & (ellipsis_mask - 1):
        raise NodeError("more than one ellipsis in the slice", _FIX_GRAPH)
    rank = len(shape)
    n_sparse = len(begin)
    # Step 1: count new axes after the ellipsis; add an ellipsis at the end if none.
    seen, new_after = False, 0
    for i in range(n_sparse):
        if seen and new_axis_mask >> i & 1:
            new_after += 1
        if ellipsis_mask >> i & 1:
            seen = True
    if not seen:
        ellipsis_mask |= 1 << n_sparse
        n_sparse += 1
    # Step 2: the dense spec, one entry per input dim.
    d_begin, d_end, d_stride = [0] * rank, [0] * rank, [1] * rank
    d_bmask = d_emask = d_shrink = 0
    gather: list[int] = []  # per final-shape entry: a dense dim, _NEW_AXIS or _SHRINK
    full = 0
    for i in range(n_sparse):
        if ellipsis_mask >> i & 1:
            stop = min(rank - (n_sparse - i) + 1 + new_after, rank)
            while full < stop:
                d_bmask |= 1 << full
                d_emask |= 1 << full
                gather.append(full)
                full += 1
        elif new_axis_mask >> i & 1:
            gather.append(_NEW_AXIS)
        else:
            if full == rank:
                raise NodeError(f"the slice indexes more dims than the input's {rank}",
                                _FIX_GRAPH)
            d_begin[full], d_end[full], d_stride[full] = begin[i], end[i], strides[i]
            if begin_mask >> i & 1:
                d_bmask |= 1 << full
            if end_mask >> i & 1:
                d_emask |= 1 << full
            if shrink_axis_mask >> i & 1:
                gather.append(_SHRINK)
                d_shrink |= 1 << full
            else:
                gather.append(full)
            full += 1
    # Step 3: canonical bounds and the processing shape.
    k_begin: list[int] = []
    k_end: list[int | None] = []
    k_stride: list[int] = []
    processing: list[int] = []
    for i, dim in enumerate(shape):
        b, e, s = d_begin[i], d_end[i], d_stride[i]
        if s == 0:
            raise NodeError(f"stride {i} is zero", _FIX_GRAPH)
        if d_shrink >> i & 1:
            if s < 0:
                raise NodeError("a shrunk (indexed) dim needs a positive stride", _FIX_GRAPH)
            b = b + dim if b < 0 else b
            if not 0 <= b < dim:
                raise NodeError(f"index {d_begin[i]} is out of range for dim {i} of size "
                                f"{dim}", _FIX_GRAPH)
            e = b + 1
        else:
            b = _canonical(b, dim, s, bool(d_bmask >> i & 1), is_end=False)
            e = _canonical(e, dim, s, bool(d_emask >> i & 1), is_end=True)
        length = e - b
        if length == 0 or (length < 0) != (s < 0):
            size = 0
        else:
            size = (abs(length) + abs(s) - 1) // abs(s)
        processing.append(size)
        if size == 0:
            b, e, s = 0, 0, 1
        # b is now a valid index; e is in [-1, dim], where -1 means "past the start"
        k_begin.append(b)
        k_end.append(None if e < 0 else e)
        k_stride.append(s)
    # Step 4: the final shape.
    final = tuple(1 if g == _NEW_AXIS else processing[g] for g in gather if g != _SHRINK)
    return k_begin, k_end, k_stride, final


def _strided_slice_batch(view: batch.OpView) -> str | None:
    """StridedSlice keeps a per-sample input per sample only if, along the batch axis,
    it takes every sample in order at the compiled batch, at the next one, and at any
    larger one (the end is masked, huge, or follows the batch size)."""
    if view.samples() != [0]:
        return "its bounds are computed per sample"
    axis = view.ins[0].axis
    masks = {k: int(view.node.get(k, 0) or 0) for k in (
        "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
    spans = []
    for shape, values in ((view.in_shapes[0], view.consts), (view.in_shapes_next[0],
                                                             view.consts_next)):
        bounds = [values[i] for i in (1, 2, 3)]
        if any(b is None for b in bounds):
            return "its bounds are computed"
        plan = strided_slice_plan(shape, *(ints(b, "bounds") for b in bounds), **masks)
        spans.append((plan[0][axis], plan[1][axis], plan[2][axis], shape[axis]))
    huge = list(view.in_shapes[0])
    huge[axis] = 1 << 40
    begin, end, strides = (ints(view.consts[i], "bounds") for i in (1, 2, 3))
    plan = strided_slice_plan(tuple(huge), begin, end, strides, **masks)
    endless = plan[0][axis] == 0 and plan[1][axis] == huge[axis] and plan[2][axis] == 1
    for b, e, stride, dim in spans:
        if (reason := batch.whole_batch_slice(b, e, stride, dim, endless,
                                              view.tracks_batch(2))) is not None:
            return reason
    return None


@tf_op("StridedSlice", supports=dtypes(T=DEVICE_DTYPES, Index=INDEX),
       batch=_strided_slice_batch)
def strided_slice(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF StridedSlice with every mask: begin/end/strides constant; `begin_mask` /
    `end_mask` bits take the whole range in the stride's direction; one
    `ellipsis_mask` bit stands for all dims not otherwise named; `new_axis_mask`
    bits insert size-1 dims; `shrink_axis_mask` bits index one element (negative
    counts from the end; out of range is an error) and drop the dim. Negative
    strides walk backwards; out-of-range bounds are clamped."""
    x = ctx.input(node, 0)
    begin = ints(ctx.const_input(node, 1, "begin"), "begin")
    end = ints(ctx.const_input(node, 2, "end"), "end")
    strides = ints(ctx.const_input(node, 3, "strides"), "strides")
    masks = {k: int(node.get(k, 0) or 0) for k in (
        "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
    k_begin, k_end, k_stride, final = strided_slice_plan(x.shape, begin, end, strides, **masks)
    return [reshape_to(ctx, slice_dims(ctx, x, k_begin, k_end, k_stride), final)]


# --- padding, tiling, broadcasting -------------------------------------------------

def _paddings(ctx: LowerCtx, node: TFNode, x: Value) -> list[list[int]]:
    p = np.asarray(ctx.const_input(node, 1, "paddings"))
    rank = len(x.shape)
    if p.shape != (rank, 2) or p.dtype.kind not in "iu":
        raise NodeError(f"paddings must be an integer [{rank}, 2] tensor for {x.type}, got "
                        f"{p.dtype.name}{list(p.shape)}", _FIX_GRAPH)
    if (p < 0).any():
        raise NodeError(f"paddings {p.tolist()} must not be negative", _FIX_GRAPH)
    return [[int(b), int(a)] for b, a in p]


def _pad(ctx: LowerCtx, x: Value, paddings: list[list[int]], mode: str, value: object
         ) -> Value:
    if not any(b or a for b, a in paddings):
        return x
    return ctx.emit1("pad", [x], {"paddings": paddings, "mode": mode, "value": value})


@tf_op("Pad", supports=dtypes(T=DEVICE_DTYPES, Tpaddings=INDEX),
       batch=batch.paddings_keep_batch)
def pad(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Pad: zero padding, paddings[i] = [before, after] per dim (constant)."""
    x = ctx.input(node, 0)
    return [_pad(ctx, x, _paddings(ctx, node, x), "constant", _zero(x.dtype))]


@tf_op("PadV2", supports=dtypes(T=DEVICE_DTYPES, Tpaddings=INDEX),
       batch=batch.paddings_keep_batch)
def pad_v2(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF PadV2: as Pad, filled with `constant_values` (a constant scalar)."""
    x = ctx.input(node, 0)
    value = scalar(ctx.const_input(node, 2, "constant_values"), "constant_values")
    return [_pad(ctx, x, _paddings(ctx, node, x), "constant", value.astype(x.dtype).item())]


def _mirror_supports(node: TFNode) -> str | None:
    if node.get("mode") not in ("REFLECT", "SYMMETRIC"):
        return f"MirrorPad mode {node.get('mode')!r} is not REFLECT or SYMMETRIC"
    return dtypes(T=DEVICE_DTYPES, Tpaddings=INDEX)(node)


@tf_op("MirrorPad", supports=_mirror_supports, batch=batch.paddings_keep_batch)
def mirror_pad(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF MirrorPad: REFLECT mirrors without the edge element (padding < dim),
    SYMMETRIC with it (padding <= dim)."""
    x = ctx.input(node, 0)
    paddings = _paddings(ctx, node, x)
    mode = str(node.get("mode")).lower()
    offset = 1 if mode == "reflect" else 0
    for i, ((b, a), d) in enumerate(zip(paddings, x.shape, strict=True)):
        if max(b, a) > d - offset:
            raise NodeError(f"{mode.upper()} padding {[b, a]} is too large for dim {i} of "
                            f"{x.type}", _FIX_GRAPH)
    return [_pad(ctx, x, paddings, mode, _zero(x.dtype))]


@tf_op("Tile", supports=dtypes(T=DEVICE_DTYPES, Tmultiples=INDEX), batch=batch.tile)
def tile(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Tile: repeat x multiples[i] times along dim i (constant, one per dim)."""
    x = ctx.input(node, 0)
    multiples = ints(ctx.const_input(node, 1, "multiples"), "multiples")
    if len(multiples) != len(x.shape) or any(m < 0 for m in multiples):
        raise NodeError(f"multiples {multiples} need one non-negative entry per dim of "
                        f"{x.type}", _FIX_GRAPH)
    if all(m == 1 for m in multiples):
        return [x]
    return [ctx.emit1("tile", [x], {"multiples": multiples})]


@tf_op("BroadcastTo", supports=dtypes(T=DEVICE_DTYPES, Tidx=INDEX),
       batch=batch.broadcast_to)
def broadcast_to_op(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF BroadcastTo: numpy broadcasting of x to the (constant) `shape`."""
    x = ctx.input(node, 0)
    shape = ints(ctx.const_input(node, 1, "shape"), "shape")
    return [broadcast_to(ctx, x, shape)]


# --- gathering and one-hot -------------------------------------------------------

@tf_op("GatherV2", supports=dtypes(Tparams=DEVICE_DTYPES, Tindices=INDEX, Taxis=INDEX),
       batch=batch.gather)
def gather_v2(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF GatherV2: params gathered along `axis` (input 2, constant; negative counts
    from the end) at `indices`; the first `batch_dims` dims (negative counts from
    the end of indices' dims) are batch dims shared by params and indices. Output
    shape params.shape[:axis] + indices.shape[batch_dims:] + params.shape[axis+1:].
    An index outside [0, dim) is a run-time error on the device."""
    params, indices = ctx.input(node, 0), ctx.input(node, 1)
    rank_p, rank_i = len(params.shape), len(indices.shape)
    axis = norm_axis(scalar_int(ctx.const_input(node, 2, "axis"), "axis"), rank_p)
    batch_dims = int(node.get("batch_dims", 0) or 0)
    if batch_dims < 0:
        batch_dims += rank_i
    if not 0 <= batch_dims <= min(axis, rank_i):
        raise NodeError(f"batch_dims={node.get('batch_dims')} must be in [0, min(axis={axis}, "
                        f"rank(indices)={rank_i})]", _FIX_GRAPH)
    if params.shape[:batch_dims] != indices.shape[:batch_dims]:
        raise NodeError(f"the {batch_dims} batch dims of params {params.type} and indices "
                        f"{indices.type} differ", _FIX_GRAPH)
    return [ctx.emit1("gather", [params, indices], {"axis": axis, "batch_dims": batch_dims})]


@tf_op("OneHot", supports=dtypes(T=DEVICE_DTYPES, TI=("uint8", "int8", "int32", "int64")),
       batch=batch.along(lambda v: [], "one-hot", data=(0,), keeps_rank=False))
def one_hot(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF OneHot: a new dim of size `depth` at `axis` (-1: last) holding on_value at
    the index and off_value elsewhere (depth/on/off constant); an index outside
    [0, depth) gives an all-off row."""
    indices = ctx.input(node, 0)
    depth = scalar_int(ctx.const_input(node, 1, "depth"), "depth")
    on = scalar(ctx.const_input(node, 2, "on_value"), "on_value")
    off = scalar(ctx.const_input(node, 3, "off_value"), "off_value")
    if depth < 0:
        raise NodeError(f"depth {depth} is negative", _FIX_GRAPH)
    rank = len(indices.shape)
    axis = int(node.get("axis", -1))
    if not -1 <= axis <= rank:
        raise NodeError(f"axis {axis} must be -1 or in [0, {rank}]", _FIX_GRAPH)
    axis = rank if axis == -1 else axis
    dtype = str(node.get("T") or on.dtype.name)
    return [ctx.emit1("one_hot", [indices], {
        "depth": depth, "on_value": on.astype(dtype).item(),
        "off_value": off.astype(dtype).item(), "axis": axis, "to": dtype})]


# --- creating tensors and shape queries -------------------------------------------

@tf_op("Fill", supports=dtypes(T=DEVICE_DTYPES, index_type=INDEX),
       batch=batch.mixes("its value is computed per sample"))
def fill(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Fill: a tensor of shape `dims` (constant) filled with the scalar `value`
    (which may be computed)."""
    dims = ints(ctx.const_input(node, 0, "dims"), "dims")
    if any(d < 0 for d in dims):
        raise NodeError(f"dims {dims} must not be negative", _FIX_GRAPH)
    value = ctx.input(node, 1)
    if value.shape != ():
        raise NodeError(f"value must be a scalar, got {value.type}", _FIX_GRAPH)
    return [broadcast_to(ctx, value, dims)]


@tf_op("ZerosLike", supports=dtypes(T=DEVICE_DTYPES), batch=batch.elementwise)
def zeros_like(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF ZerosLike: zeros of x's (static) shape and dtype; a constant (folded
    within the folding bound, else broadcast on the device)."""
    x = ctx.input(node, 0)
    return [broadcast_to(ctx, ctx.const(np.zeros((), dtype=x.dtype)), x.shape)]


@tf_op("OnesLike", supports=dtypes(T=DEVICE_DTYPES), batch=batch.elementwise)
def ones_like(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF OnesLike: ones of x's (static) shape and dtype; a constant (folded
    within the folding bound, else broadcast on the device)."""
    x = ctx.input(node, 0)
    return [broadcast_to(ctx, ctx.const(np.ones((), dtype=x.dtype)), x.shape)]


@tf_op("Shape", supports=dtypes(T=DEVICE_DTYPES, out_type=INDEX), batch=batch.by_value)
def shape(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Shape: x's static shape as a 1-D `out_type` (int32/int64) constant."""
    x = ctx.input(node, 0)
    return [ctx.const(np.array(x.shape, dtype=str(node.get("out_type") or "int32")))]


@tf_op("ShapeN", supports=dtypes(T=DEVICE_DTYPES, out_type=INDEX), batch=batch.by_value)
def shape_n(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF ShapeN: the static shape of each of the N inputs, as `out_type` constants."""
    dtype = str(node.get("out_type") or "int32")
    return [ctx.const(np.array(x.shape, dtype=dtype)) for x in ctx.inputs(node)]


@tf_op("Size", supports=dtypes(T=DEVICE_DTYPES, out_type=INDEX), batch=batch.by_value)
def size(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Size: x's element count as an `out_type` scalar constant."""
    x = ctx.input(node, 0)
    return [ctx.const(np.array(x.type.size, dtype=str(node.get("out_type") or "int32")))]


@tf_op("Rank", supports=dtypes(T=DEVICE_DTYPES), batch=batch.by_value)
def rank(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Rank: x's number of dims as an int32 scalar constant."""
    return [ctx.const(np.array(len(ctx.input(node, 0).shape), dtype="int32"))]


_RANGE_DTYPES = ("float32", "float64", "int32", "int64", "int8", "int16", "uint8")


@tf_op("Range", supports=dtypes(Tidx=_RANGE_DTYPES),
       batch=batch.mixes("its bounds are computed per sample"))
def range_(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF Range: [start, start + delta, ...) up to but excluding `limit` (all three
    constant, since the output's size depends on them); a constant of dtype Tidx.
    Size is ceil(|limit - start| / |delta|), element i is start + i * delta."""
    start, limit, delta = (scalar(ctx.const_input(node, i, what), what)
                           for i, what in enumerate(("start", "limit", "delta")))
    dtype = np.dtype(str(node.get("Tidx") or start.dtype.name))
    start, limit, delta = (v.astype(dtype) for v in (start, limit, delta))
    if delta == 0:
        raise NodeError("delta is zero", _FIX_GRAPH)
    if (delta > 0 and start > limit) or (delta < 0 and start < limit):
        raise NodeError(f"start {start}, limit {limit} and delta {delta} give a negative "
                        f"count", _FIX_GRAPH)
    if dtype.kind == "f":
        count = int(np.ceil(np.abs((limit - start) / delta)))
    else:
        span, step = abs(int(limit) - int(start)), abs(int(delta))
        count = (span + step - 1) // step
    ctx.check_const_size([count], dtype.name, f"Range({start}, {limit}, {delta})")
    values = start + np.arange(count).astype(dtype) * delta
    return [ctx.const(values.astype(dtype))]
