"""Conformance of the array/shape and image lowerings (cc/ops/array.py, image.py)
against TensorFlow: every op type those modules register, over shapes, dtypes
and attribute values.

Data flows in through placeholders (the function's arguments) so the ops are
compiled to instructions, not folded; the operands that must be constant are
constants. Ops that fold to constants by design (Shape, Size, Range, ZerosLike,
...) are checked all the same: the harness compares with TF either way.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.cc.errors import NodeError, UnsupportedNodes
from neuronish.cc.ops import array as array_ops
from neuronish.cc.ops import image as image_ops
from neuronish.cc.ops.registry import LOWERINGS
from tests.cc.conformance import Case, both_engines, run_case  # noqa: F401 (fixture)
from tests.graphs import trace

# Every case on the numpy reference engine and on the native one.
pytestmark = pytest.mark.usefixtures("both_engines")

_rng = np.random.default_rng(1234)
raw = tf.raw_ops


def f32(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


def f64(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float64)


def f16(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float16)


def i32(*shape: int, lo: int = -50, hi: int = 50) -> np.ndarray:
    return _rng.integers(lo, hi, shape).astype(np.int32)


def i64(*shape: int, lo: int = -50, hi: int = 50) -> np.ndarray:
    return _rng.integers(lo, hi, shape).astype(np.int64)


def u8(*shape: int) -> np.ndarray:
    return _rng.integers(0, 255, shape).astype(np.uint8)


def b(*shape: int) -> np.ndarray:
    return _rng.random(shape) < 0.5


def c32(values: object) -> tf.Tensor:
    return tf.constant(values, tf.int32)


def c64(values: object) -> tf.Tensor:
    return tf.constant(values, tf.int64)


CASES: list[Case] = []


def case(op: str, id: str, fn: object, *inputs: np.ndarray, **kw: object) -> None:
    CASES.append(Case(op, fn, list(inputs), id=id, **kw))


# --- Reshape, Squeeze, ExpandDims, Transpose -----------------------------------------
case("Reshape", "f32", lambda x: raw.Reshape(tensor=x, shape=c32([6, 4])), f32(2, 3, 4))
case("Reshape", "i32-infer", lambda x: raw.Reshape(tensor=x, shape=c32([-1, 3])), i32(2, 3, 4))
case("Reshape", "bool-infer-mid", lambda x: raw.Reshape(tensor=x, shape=c64([2, -1, 3])),
     b(4, 6))
case("Reshape", "f64-to-scalar", lambda x: raw.Reshape(tensor=x, shape=c32([])), f64(1, 1))
case("Reshape", "i64-from-scalar", lambda x: raw.Reshape(tensor=x, shape=c32([1, 1, 1])),
     np.array(7, np.int64))
# The Keras pattern: the target shape is computed from the input's shape (folds).
case("Reshape", "shape-chain",
     lambda x: tf.reshape(x, tf.stack([tf.shape(x)[0], -1])), f32(3, 2, 5))
case("Reshape", "shape-chain-int64",
     lambda x: tf.reshape(x, tf.concat([tf.shape(x, tf.int64)[1:], [-1]], 0)), f32(2, 3, 4))

case("Squeeze", "all", lambda x: raw.Squeeze(input=x), f32(1, 3, 1, 2))
case("Squeeze", "dim", lambda x: raw.Squeeze(input=x, axis=[2]), i32(1, 3, 1, 2))
case("Squeeze", "negative-dims", lambda x: raw.Squeeze(input=x, axis=[-4, -2]), b(1, 3, 1, 2))
case("Squeeze", "to-scalar", lambda x: raw.Squeeze(input=x), f64(1, 1))

case("ExpandDims", "front", lambda x: raw.ExpandDims(input=x, axis=c32(0)), f32(3, 4))
case("ExpandDims", "end", lambda x: raw.ExpandDims(input=x, axis=c32(-1)), i32(3, 4))
case("ExpandDims", "mid-int64", lambda x: raw.ExpandDims(input=x, axis=c64([1])), b(3, 4))
case("ExpandDims", "neg-front", lambda x: raw.ExpandDims(input=x, axis=c32(-3)), i64(3, 4))
case("ExpandDims", "scalar", lambda x: raw.ExpandDims(input=x, axis=c32(0)),
     np.array(2.5, np.float32))

case("Transpose", "2d", lambda x: raw.Transpose(x=x, perm=c32([1, 0])), f32(3, 5))
case("Transpose", "nhwc-nchw", lambda x: raw.Transpose(x=x, perm=c32([0, 3, 1, 2])),
     f32(2, 3, 4, 5))
case("Transpose", "i32-3d", lambda x: raw.Transpose(x=x, perm=c64([2, 0, 1])), i32(2, 3, 4))
case("Transpose", "bool", lambda x: raw.Transpose(x=x, perm=c32([1, 0, 2])), b(2, 3, 2))
case("Transpose", "f16", lambda x: raw.Transpose(x=x, perm=c32([1, 0])), f16(4, 3))
case("Transpose", "identity", lambda x: raw.Transpose(x=x, perm=c32([0, 1])), f64(2, 3))

# --- ConcatV2, Concat, Pack, Unpack, Split, SplitV -------------------------------------
case("ConcatV2", "axis0", lambda x, y: raw.ConcatV2(values=[x, y], axis=c32(0)),
     f32(2, 3), f32(4, 3))
case("ConcatV2", "three-neg-axis", lambda x, y, z: raw.ConcatV2(values=[x, y, z],
                                                                 axis=c32(-1)),
     i32(2, 1), i32(2, 3), i32(2, 2))
case("ConcatV2", "with-const", lambda x: raw.ConcatV2(
    values=[x, tf.ones([2, 2, 1]), x], axis=c64(2)), f32(2, 2, 3))
case("ConcatV2", "bool", lambda x, y: raw.ConcatV2(values=[x, y], axis=c32(1)),
     b(2, 3), b(2, 1))
case("ConcatV2", "i64", lambda x, y: raw.ConcatV2(values=[x, y], axis=c32(0)),
     i64(1, 3), i64(2, 3))
case("Concat", "v1", lambda x, y: raw.Concat(concat_dim=c32(1), values=[x, y]),
     f32(2, 3), f32(2, 2))

case("Pack", "axis0", lambda x, y: raw.Pack(values=[x, y], axis=0), f32(2, 3), f32(2, 3))
case("Pack", "axis1-three", lambda x, y, z: raw.Pack(values=[x, y, z], axis=1),
     i32(2, 3), i32(2, 3), i32(2, 3))
case("Pack", "axis-neg1", lambda x, y: raw.Pack(values=[x, y], axis=-1), b(2, 3), b(2, 3))
case("Pack", "scalars", lambda x, y: raw.Pack(values=[x, y, x], axis=0),
     np.array(1.5, np.float32), np.array(-2.0, np.float32))
case("Pack", "single-f64", lambda x: raw.Pack(values=[x], axis=1), f64(3, 2))

case("Unpack", "axis0", lambda x: tuple(raw.Unpack(value=x, num=3, axis=0)), f32(3, 4))
case("Unpack", "axis1", lambda x: tuple(raw.Unpack(value=x, num=4, axis=1)), i32(2, 4, 2))
case("Unpack", "axis-neg1-bool", lambda x: tuple(raw.Unpack(value=x, num=2, axis=-1)),
     b(3, 2))
case("Unpack", "to-scalars", lambda x: tuple(raw.Unpack(value=x, num=3, axis=0)), i64(3))

case("Split", "two-axis1", lambda x: tuple(raw.Split(axis=c32(1), value=x, num_split=2)),
     f32(3, 4))
case("Split", "three-neg-axis", lambda x: tuple(raw.Split(axis=c32(-1), value=x,
                                                          num_split=3)), i32(2, 2, 6))
case("Split", "one-bool", lambda x: tuple(raw.Split(axis=c32(0), value=x, num_split=1)),
     b(2, 3))

case("SplitV", "minus-one", lambda x: tuple(raw.SplitV(
    value=x, size_splits=c32([1, 2, -1]), axis=c32(1), num_split=3)), f32(2, 7))
case("SplitV", "axis0-int64", lambda x: tuple(raw.SplitV(
    value=x, size_splits=c64([2, 2]), axis=c32(0), num_split=2)), i32(4, 3))
case("SplitV", "neg-axis-zero-piece", lambda x: tuple(raw.SplitV(
    value=x, size_splits=c32([3, 0, -1]), axis=c32(-1), num_split=3)), f64(2, 5))

# --- Slice, StridedSlice ----------------------------------------------------------------
case("Slice", "basic", lambda x: raw.Slice(input=x, begin=c32([1, 0]), size=c32([2, 3])),
     f32(4, 5))
case("Slice", "size-minus-one", lambda x: raw.Slice(input=x, begin=c64([0, 2, 1]),
                                                    size=c64([-1, 1, -1])), i32(3, 4, 5))
case("Slice", "bool-full", lambda x: raw.Slice(input=x, begin=c32([0, 0]),
                                               size=c32([-1, -1])), b(2, 3))

SS_CASES = {
    "range": (lambda x: x[1:3], f32(5, 4)),
    "reverse": (lambda x: x[::-1], f32(5, 4)),
    "reverse-step2-both": (lambda x: x[::-2, ::-3], i32(5, 7)),
    "shrink-neg": (lambda x: x[-1], f32(5, 4)),
    "shrink-neg-inner": (lambda x: x[:, -2], i64(5, 4)),
    "ellipsis-shrink": (lambda x: x[..., 1], f32(2, 3, 4)),
    "shrink-ellipsis": (lambda x: x[1, ...], b(2, 3, 4)),
    "ellipsis-mid": (lambda x: x[0, ..., 1:3], f32(2, 3, 4, 5)),
    "newaxis": (lambda x: x[:, tf.newaxis, 1:], f32(3, 4)),
    "newaxis-ellipsis": (lambda x: x[tf.newaxis, ..., tf.newaxis], i32(2, 3)),
    "ellipsis-newaxis-shrink": (lambda x: x[..., tf.newaxis, 0], f32(2, 3, 4)),
    "clamped-neg-stride": (lambda x: x[5:-7:-2], f32(6, 2)),
    "clamped-out-of-range": (lambda x: x[-100:100, 2:100], f64(4, 5)),
    "rev-range": (lambda x: x[3:1:-1, ::2], f32(5, 6)),
    "shrink-ellipsis-rev": (lambda x: x[1, ..., ::-2], i32(3, 2, 5)),
    "empty": (lambda x: x[2:2], f32(4, 3)),
    "empty-rev": (lambda x: x[1:3:-1], f32(4, 3)),
    "neg-begin-end": (lambda x: x[-3:-1, -4:], f32(5, 6)),
    "all-shrink-scalar": (lambda x: x[1, 2], f32(3, 4)),
    "f16-step3": (lambda x: x[1::3], f16(10, 2)),
}
for _name, (_fn, _x) in SS_CASES.items():
    case("StridedSlice", _name, _fn, _x)


def _ss(x: tf.Tensor, begin: list[int], end: list[int], strides: list[int],
        dtype: tf.DType = tf.int32, **masks: int) -> tf.Tensor:
    return raw.StridedSlice(input=x, begin=tf.constant(begin, dtype),
                            end=tf.constant(end, dtype), strides=tf.constant(strides, dtype),
                            **masks)


case("StridedSlice", "raw-masks-int64",
     lambda x: _ss(x, [1, 5, 1], [0, 1, 3], [1, -2, 1], tf.int64, begin_mask=0b001,
                   end_mask=0b101), f32(3, 6, 4))
case("StridedSlice", "raw-shrink-with-begin-mask",
     lambda x: _ss(x, [2, 0], [0, 0], [1, 1], begin_mask=0b01, end_mask=0b10,
                   shrink_axis_mask=0b01), f32(4, 3))
case("StridedSlice", "raw-newaxis-and-shrink-same-bit",
     lambda x: _ss(x, [0, 1], [0, 2], [1, 1], new_axis_mask=0b01, shrink_axis_mask=0b11),
     i32(3, 4))
case("StridedSlice", "raw-ellipsis-first",
     lambda x: _ss(x, [0, -1], [0, -3], [1, -1], ellipsis_mask=0b01), f32(2, 3, 5))
case("StridedSlice", "raw-fewer-than-rank",
     lambda x: _ss(x, [1], [3], [1]), b(4, 2, 3))

# --- Pad, PadV2, MirrorPad, Tile, BroadcastTo ---------------------------------------------
case("Pad", "f32", lambda x: raw.Pad(input=x, paddings=c32([[1, 2], [0, 3]])), f32(2, 3))
case("Pad", "i32-4d-int64", lambda x: raw.Pad(input=x, paddings=c64(
    [[0, 0], [1, 1], [2, 0], [0, 0]])), i32(1, 2, 3, 2))
case("Pad", "bool", lambda x: raw.Pad(input=x, paddings=c32([[1, 0]])), b(3))
case("PadV2", "f32-value", lambda x: raw.PadV2(input=x, paddings=c32([[1, 1], [2, 0]]),
                                               constant_values=tf.constant(1.5)), f32(2, 3))
case("PadV2", "i64-neg-value", lambda x: raw.PadV2(
    input=x, paddings=c32([[0, 2], [1, 1]]), constant_values=c64(-7)), i64(2, 2))
case("MirrorPad", "reflect", lambda x: raw.MirrorPad(
    input=x, paddings=c32([[1, 2], [2, 1]]), mode="REFLECT"), f32(4, 3))
case("MirrorPad", "symmetric", lambda x: raw.MirrorPad(
    input=x, paddings=c32([[2, 2], [0, 3]]), mode="SYMMETRIC"), i32(2, 3))
case("MirrorPad", "reflect-nhwc", lambda x: raw.MirrorPad(
    input=x, paddings=c64([[0, 0], [1, 1], [1, 1], [0, 0]]), mode="REFLECT"), f32(2, 3, 4, 2))

case("Tile", "f32", lambda x: raw.Tile(input=x, multiples=c32([2, 1, 3])), f32(2, 3, 1))
case("Tile", "i32-int64", lambda x: raw.Tile(input=x, multiples=c64([3, 2])), i32(2, 2))
case("Tile", "bool", lambda x: raw.Tile(input=x, multiples=c32([4])), b(3))
case("BroadcastTo", "f32", lambda x: raw.BroadcastTo(input=x, shape=c32([2, 3, 4])),
     f32(3, 1))
case("BroadcastTo", "scalar-i32", lambda x: raw.BroadcastTo(input=x, shape=c64([2, 2])),
     np.array(5, np.int32))
case("BroadcastTo", "bool", lambda x: raw.BroadcastTo(input=x, shape=c32([3, 2])), b(1, 2))

# --- GatherV2, OneHot -------------------------------------------------------------------
case("GatherV2", "axis0-const-idx", lambda p: raw.GatherV2(
    params=p, indices=c32([2, 0, 2, 1]), axis=c32(0)), f32(3, 4))
case("GatherV2", "axis1-fed-idx", lambda p, i: raw.GatherV2(params=p, indices=i, axis=c32(1)),
     f32(2, 5, 3), i32(2, 3, lo=0, hi=5))
case("GatherV2", "neg-axis-int64", lambda p, i: raw.GatherV2(params=p, indices=i,
                                                             axis=c64(-1)),
     i32(2, 3, 4), i64(5, lo=0, hi=4))
case("GatherV2", "batch-dims1", lambda p, i: raw.GatherV2(params=p, indices=i, axis=c32(1),
                                                          batch_dims=1),
     f32(3, 5, 2), i32(3, 4, lo=0, hi=5))
case("GatherV2", "batch-dims1-axis2", lambda p, i: raw.GatherV2(
    params=p, indices=i, axis=c32(2), batch_dims=1), f64(2, 3, 4), i64(2, 2, lo=0, hi=4))
case("GatherV2", "batch-dims-neg", lambda p, i: raw.GatherV2(
    params=p, indices=i, axis=c32(-1), batch_dims=-1), f32(2, 6), i32(2, 3, lo=0, hi=6))
case("GatherV2", "scalar-idx-bool", lambda p: raw.GatherV2(params=p, indices=c32(1),
                                                           axis=c32(0)), b(3, 2))
case("GatherV2", "embedding", lambda i: raw.GatherV2(
    params=tf.constant(np.arange(40, dtype=np.float32).reshape(10, 4)), indices=i,
    axis=c32(0)), i32(2, 3, lo=0, hi=10))


def _one_hot(i: tf.Tensor, depth: int, on: object, off: object, axis: int) -> tf.Tensor:
    return raw.OneHot(indices=i, depth=c32(depth), on_value=tf.constant(on),
                      off_value=tf.constant(off), axis=axis)


case("OneHot", "last-f32", lambda i: _one_hot(i, 4, 1.0, 0.0, -1),
     np.array([0, 3, -1, 5, 2], np.int32))
case("OneHot", "axis0-i32", lambda i: _one_hot(i, 3, 5, -1, 0), i32(2, 3, lo=-1, hi=4))
case("OneHot", "axis1-int64-idx", lambda i: _one_hot(i, 5, 2.5, 0.5, 1),
     i64(2, 3, lo=0, hi=5))
case("OneHot", "uint8-idx-bool", lambda i: _one_hot(i, 4, True, False, -1),
     np.array([[0, 3], [9, 1]], np.uint8))
case("OneHot", "f64", lambda i: _one_hot(i, 2, np.float64(1.0), np.float64(0.0), -1),
     i32(4, lo=0, hi=2))

# --- Fill, ZerosLike, OnesLike, Shape, ShapeN, Size, Rank, Range --------------------------
case("Fill", "fed-value", lambda v: raw.Fill(dims=c32([2, 3]), value=v),
     np.array(3.5, np.float32))
case("Fill", "shape-dims-int64", lambda x: raw.Fill(dims=tf.shape(x, tf.int64),
                                                    value=tf.constant(7, tf.int32)) + 0 * x,
     i32(2, 4))
case("Fill", "const-bool", lambda x: tf.logical_and(
    raw.Fill(dims=tf.shape(x), value=tf.constant(True)), x), b(3, 2))
case("ZerosLike", "f32", lambda x: raw.ZerosLike(x=x), f32(2, 3))
case("ZerosLike", "bool", lambda x: raw.ZerosLike(x=x), b(4))
case("OnesLike", "i32", lambda x: raw.OnesLike(x=x), i32(3, 1))
case("OnesLike", "f64", lambda x: raw.OnesLike(x=x) + x, f64(2, 2))
case("Shape", "int32", lambda x: raw.Shape(input=x, out_type=tf.int32), f32(2, 3, 4))
case("Shape", "int64", lambda x: raw.Shape(input=x, out_type=tf.int64), b(5))
case("Shape", "scalar", lambda x: raw.Shape(input=x), np.array(1.0, np.float32))
case("ShapeN", "two", lambda x, y: tuple(raw.ShapeN(input=[x, y], out_type=tf.int64)),
     f32(2, 3), f32(4))
case("Size", "int32", lambda x: raw.Size(input=x, out_type=tf.int32), f32(2, 3, 4))
case("Size", "int64", lambda x: raw.Size(input=x, out_type=tf.int64), i32(7))
case("Rank", "3d", lambda x: raw.Rank(input=x), f32(2, 3, 4))
case("Range", "int32-from-size", lambda x: raw.Range(start=c32(0), limit=tf.size(x),
                                                     delta=c32(1)), f32(2, 3))
case("Range", "int64-neg-delta", lambda x: raw.Range(start=c64(10), limit=c64(0),
                                                     delta=c64(-3)), i64(4))
case("Range", "float32", lambda x: raw.Range(start=tf.constant(1.0), limit=tf.constant(2.0),
                                             delta=tf.constant(0.1)), f32(2))
case("Range", "float64-frac", lambda x: raw.Range(
    start=tf.constant(-1.0, tf.float64), limit=tf.constant(1.25, tf.float64),
    delta=tf.constant(0.5, tf.float64)), f64(3))
case("Range", "in-shape-chain", lambda x: raw.GatherV2(
    params=x, indices=tf.range(tf.shape(x)[1] - 1, -1, -1), axis=c32(1)), f32(2, 4))

# --- ResizeBilinear, ResizeNearestNeighbor ----------------------------------------------
RESIZE = [
    ("up", (1, 4, 5, 3), (8, 10)),
    ("down", (2, 8, 8, 2), (3, 5)),
    ("mixed", (1, 5, 3, 1), (2, 7)),
    ("to-1x1", (1, 4, 4, 2), (1, 1)),
]
for _name, _shape, _size in RESIZE:
    for _mode, _kw in (("default", {}), ("align", {"align_corners": True}),
                       ("half", {"half_pixel_centers": True})):
        for _op, _fn in (("ResizeBilinear", raw.ResizeBilinear),
                         ("ResizeNearestNeighbor", raw.ResizeNearestNeighbor)):
            case(_op, f"{_name}-{_mode}",
                 lambda x, _fn=_fn, _size=_size, _kw=_kw: _fn(images=x, size=c32(list(_size)),
                                                                **_kw),
                 f32(*_shape), atol=1e-5)
case("ResizeBilinear", "int32-in", lambda x: raw.ResizeBilinear(
    images=x, size=c32([6, 4]), half_pixel_centers=True), i32(1, 3, 2, 2), atol=1e-4)
case("ResizeBilinear", "f64-in", lambda x: raw.ResizeBilinear(
    images=x, size=c32([5, 5]), align_corners=True), f64(1, 3, 3, 1), atol=1e-5)
case("ResizeNearestNeighbor", "int32", lambda x: raw.ResizeNearestNeighbor(
    images=x, size=c32([5, 3]), half_pixel_centers=True), i32(2, 2, 4, 3))
case("ResizeNearestNeighbor", "uint8-align", lambda x: raw.ResizeNearestNeighbor(
    images=x, size=c32([7, 2]), align_corners=True), u8(1, 3, 5, 1))
case("ResizeBilinear", "keras-resize", lambda x: tf.image.resize(x, [6, 9]), f32(2, 3, 4, 3),
     atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_conformance(case: Case) -> None:
    run_case(case)


def test_every_op_is_covered() -> None:
    """Every op type these modules register has at least one case."""
    mine = {op for op, lowering in LOWERINGS.items()
            if lowering.fn.__module__ in (array_ops.__name__, image_ops.__name__)}
    assert mine - {c.op_type for c in CASES} == set()


def test_case_ids_are_unique() -> None:
    ids = [str(c) for c in CASES]
    assert len(ids) == len(set(ids))


# --- StridedSlice's rule, checked against TF on random specs ------------------------------

def test_strided_slice_plan_matches_tensorflow() -> None:
    """The compile-time StridedSlice rule gives TF's values and shapes (or refuses
    where TF refuses) for random shapes, bounds, strides and masks."""
    rng = np.random.default_rng(7)
    agreed = 0
    for _ in range(1500):
        rank = int(rng.integers(1, 5))
        shape = tuple(int(d) for d in rng.integers(0, 5, rank))
        x = np.arange(int(np.prod(shape))).reshape(shape)
        n = int(rng.integers(1, 6))
        begin = [int(v) for v in rng.integers(-6, 6, n)]
        end = [int(v) for v in rng.integers(-6, 6, n)]
        strides = [int(v) for v in rng.choice([-3, -2, -1, 1, 2, 3], n)]
        masks = {k: int(rng.integers(0, 1 << n))
                 for k in ("begin_mask", "end_mask", "new_axis_mask", "shrink_axis_mask")}
        masks["ellipsis_mask"] = int(1 << rng.integers(0, n)) if rng.random() < 0.4 else 0
        try:
            want = raw.StridedSlice(input=x, begin=begin, end=end, strides=strides,
                                    **masks).numpy()
        except tf.errors.InvalidArgumentError:
            want = None
        try:
            kb, ke, ks, final = array_ops.strided_slice_plan(shape, begin, end, strides,
                                                             **masks)
            got = x[tuple(slice(*t) for t in zip(kb, ke, ks, strict=True))].reshape(final)
        except NodeError:
            got = None
        spec = (shape, begin, end, strides, masks)
        if want is None:
            assert got is None, f"TF refuses {spec}, the plan gives shape {got.shape}"
            continue
        assert got is not None, f"the plan refuses {spec}, TF gives shape {want.shape}"
        assert got.shape == want.shape, spec
        np.testing.assert_array_equal(got, want, err_msg=str(spec))
        agreed += 1
    assert agreed > 500


# --- what cannot be compiled is refused with the node named -----------------------------

def _refusal(fn: object, *specs: tf.TensorSpec, batch: int = 2) -> str:
    traced = trace(fn, *specs, batch=batch)
    with pytest.raises(UnsupportedNodes) as info:
        compile_graph(traced.graph_def, traced.io_config)
    return str(info.value)


def test_out_of_range_shrink_index_is_refused() -> None:
    message = _refusal(lambda x: x[5], tf.TensorSpec([None, 3], tf.float32))
    assert "StridedSlice" in message and "out of range" in message


def test_computed_shape_operand_is_refused() -> None:
    message = _refusal(lambda x, s: tf.reshape(x, s), tf.TensorSpec([None, 4], tf.float32),
                       tf.TensorSpec([2], tf.int32))
    assert "Reshape" in message and "compile-time constant" in message


def test_unsupported_dtype_is_refused_by_supports() -> None:
    node = type("N", (), {"get": lambda self, k, d=None: {"T": "string"}.get(k, d)})()
    reason = LOWERINGS["Transpose"].check(node)
    assert reason is not None and "string" in reason
    reason = LOWERINGS["ResizeBilinear"].check(type("N", (), {
        "get": lambda self, k, d=None: {"T": "float32", "align_corners": True,
                                        "half_pixel_centers": True}.get(k, d)})())
    assert reason is not None and "align_corners" in reason
