"""Conformance of cc/ops/sequence.py, blocks.py and volume.py against TensorFlow: running
sums and products, top-k, band parts, reversal, rolls, constant-offset slice updates,
gathers by index tuples, transposed convolutions, the block rearrangements (dilated 1-D
convolutions, pixel shuffles) and 3-D convolution and pooling, over shapes, dtypes and
attribute values; numpy and native engines. Inputs come in through placeholders, so each
op is compiled, not folded."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.ops import blocks as blocks_ops
from neuronish.cc.ops import sequence as sequence_ops
from neuronish.cc.ops import volume as volume_ops
from neuronish.cc.ops.registry import LOWERINGS
from tests.cc.conformance import Case, both_engines, run_case  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("both_engines")

raw = tf.raw_ops
_rng = np.random.default_rng(4321)
SUM_ATOL = 1e-5  # sums of products in another order (convolutions)


def f32(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


def i32(*shape: int, lo: int = -9, hi: int = 9) -> np.ndarray:
    return _rng.integers(lo, hi, shape).astype(np.int32)


CASES: list[Case] = []


def case(op: str, id: str, fn: object, *inputs: np.ndarray, **kw: object) -> None:
    CASES.append(Case(op, fn, list(inputs), id=id, **kw))


# --- Cumsum, Cumprod ----------------------------------------------------------------------
for axis in (0, 1, -1):
    for exclusive in (False, True):
        for reverse in (False, True):
            case("Cumsum", f"f32-axis{axis}-ex{int(exclusive)}-rev{int(reverse)}",
                 lambda x, a=axis, e=exclusive, r=reverse: tf.math.cumsum(
                     x, axis=a, exclusive=e, reverse=r), f32(3, 4, 5), atol=1e-5)
case("Cumsum", "i32-wraps", lambda x: tf.math.cumsum(x, axis=1),
     np.full((2, 4), 2 ** 30, np.int32))
case("Cumsum", "f64-int64-axis", lambda x: raw.Cumsum(x=x, axis=tf.constant(0, tf.int64)),
     _rng.standard_normal((6,)))
case("Cumsum", "keras-mask-positions",  # position ids from a padding mask
     lambda m: tf.math.cumsum(tf.cast(m, tf.int32), axis=1) * tf.cast(m, tf.int32),
     (np.arange(8)[None, :] < np.array([[8], [5]])))
case("Cumprod", "f32", lambda x: tf.math.cumprod(x, axis=1), f32(2, 6))
case("Cumprod", "f32-exclusive-reverse",
     lambda x: tf.math.cumprod(x, axis=0, exclusive=True, reverse=True), f32(4, 3))
case("Cumprod", "i32", lambda x: tf.math.cumprod(x, axis=-1), i32(3, 4, lo=-3, hi=4))

# --- TopKV2 ---------------------------------------------------------------------------------
case("TopKV2", "f32", lambda x: tf.math.top_k(x, k=3), f32(4, 10))
case("TopKV2", "ties-in-index-order", lambda x: tf.math.top_k(x, k=5),
     np.array([[1, 3, 3, 2, 3, 1, 0]], np.float32))
case("TopKV2", "i32-rank3", lambda x: tf.math.top_k(x, k=2), i32(2, 3, 6))
case("TopKV2", "k-all-int64-index", lambda x: raw.TopKV2(
    input=x, k=tf.constant(6, tf.int64), index_type=tf.int64), f32(2, 6))
case("TopKV2", "k0", lambda x: tf.math.top_k(x, k=0), f32(2, 6))

# --- MatrixBandPart, ReverseV2, Roll --------------------------------------------------------
for lower, upper in ((-1, 0), (0, -1), (1, 2), (0, 0), (-1, -1), (4, 1)):
    case("MatrixBandPart", f"f32-{lower}-{upper}",
         lambda x, lo=lower, up=upper: tf.linalg.band_part(x, lo, up), f32(2, 4, 5))
case("MatrixBandPart", "bool-causal", lambda x: tf.linalg.band_part(x, -1, 0),
     _rng.random((3, 3)) < 0.7)
case("MatrixBandPart", "i32-int64-bounds", lambda x: raw.MatrixBandPart(
    input=x, num_lower=tf.constant(1, tf.int64), num_upper=tf.constant(0, tf.int64)), i32(4, 4))
case("ReverseV2", "f32-one-axis", lambda x: tf.reverse(x, [1]), f32(2, 5, 3))
case("ReverseV2", "i32-two-axes-negative", lambda x: tf.reverse(x, [0, -1]), i32(3, 2, 4))
case("ReverseV2", "no-axes", lambda x: tf.reverse(x, tf.constant([], tf.int32)) * 2.0,
     f32(3))
case("Roll", "f32-swin-shift", lambda x: tf.roll(x, shift=[-2, -2], axis=[1, 2]),
     f32(1, 8, 8, 3))
case("Roll", "i32-same-axis-twice", lambda x: tf.roll(x, shift=[3, 4], axis=[0, 0]), i32(5, 2))
case("Roll", "f32-zero-and-whole", lambda x: tf.roll(x, shift=[0, 6], axis=[0, 1]), f32(2, 6))


# --- XlaDynamicUpdateSlice (keras.ops.slice_update) ------------------------------------------
def _slice_update(start: list[int]) -> object:
    return lambda x, u: keras.ops.slice_update(x, start, u)


case("XlaDynamicUpdateSlice", "f32", _slice_update([1, 2]), f32(4, 6), f32(2, 3))
case("XlaDynamicUpdateSlice", "clamped-start", _slice_update([3, 5]), f32(4, 6), f32(2, 3))
case("XlaDynamicUpdateSlice", "i32-rank3", _slice_update([0, 1, 0]), i32(2, 3, 4),
     i32(2, 1, 4))

# --- GatherNd ------------------------------------------------------------------------------
case("GatherNd", "const-pairs", lambda p: tf.gather_nd(p, [[0, 1], [2, 0], [1, 1]]),
     f32(3, 2, 5))
case("GatherNd", "const-full-index", lambda p: tf.gather_nd(p, [[[0, 1, 2]], [[1, 0, 4]]]),
     i32(2, 2, 5))
case("GatherNd", "computed-indices", lambda p, i: tf.gather_nd(p, i), f32(4, 3, 2),
     _rng.integers(0, 3, (5, 2)).astype(np.int32))
case("GatherNd", "computed-int64-rank1", lambda p, i: tf.gather_nd(p, i), f32(7, 2),
     _rng.integers(0, 7, (3, 2, 1)).astype(np.int64))


# --- Conv2DBackpropInput (Conv2DTranspose) ------------------------------------------------------
def _transpose_conv(w: np.ndarray, out_shape: list[int], strides: int | list[int],
                    padding: str | list, dilations: int = 1) -> object:
    return lambda x: tf.nn.conv2d_transpose(x, tf.constant(w), out_shape, strides, padding,
                                            dilations=dilations)


for (kh, kw), stride, padding, size in (((3, 3), 2, "SAME", (8, 8)), ((3, 3), 2, "VALID", (9, 9)),
                                        ((4, 4), 2, "SAME", (8, 8)), ((2, 3), 3, "VALID", (12, 14)),
                                        ((3, 3), 1, "SAME", (4, 5)), ((5, 5), 2, "SAME", (7, 9))):
    w = f32(kh, kw, 3, 4)
    case("Conv2DBackpropInput", f"{kh}x{kw}-s{stride}-{padding}-{size[0]}x{size[1]}",
         _transpose_conv(w, [2, *size, 3], stride, padding), f32(2, -(-size[0] // stride)
                                                                  if padding == "SAME" else
                                                                  (size[0] - kh) // stride + 1,
                                                                  -(-size[1] // stride)
                                                                  if padding == "SAME" else
                                                                  (size[1] - kw) // stride + 1,
                                                                  4), atol=SUM_ATOL)
case("Conv2DBackpropInput", "dilated", _transpose_conv(f32(3, 3, 2, 3), [1, 6, 6, 2], 1, "SAME",
                                                       dilations=2), f32(1, 6, 6, 3),
     atol=SUM_ATOL)
case("Conv2DBackpropInput", "explicit-pads",
     _transpose_conv(f32(3, 3, 2, 3), [1, 7, 7, 2], 2, [[0, 0], [1, 1], [2, 0], [0, 0]]),
     f32(1, 4, 4, 3), atol=SUM_ATOL)

case("Conv2DBackpropInput", "conv1d-transpose", lambda x: tf.nn.conv1d_transpose(
    x, tf.constant(f32(3, 3, 4)), [2, 11, 3], 2, "VALID"), f32(2, 5, 4), atol=SUM_ATOL)

# --- SpaceToBatchND, BatchToSpaceND, DepthToSpace, SpaceToDepth ----------------------------------
case("SpaceToBatchND", "2d-padded", lambda x: tf.space_to_batch_nd(x, [2, 3], [[1, 1], [0, 2]]),
     f32(2, 4, 4, 3))
case("SpaceToBatchND", "1d-i32", lambda x: tf.space_to_batch_nd(x, [2], [[0, 2]]),
     i32(3, 6, 2))
case("BatchToSpaceND", "2d-cropped", lambda x: tf.batch_to_space(x, [2, 3], [[1, 1], [0, 2]]),
     f32(12, 3, 2, 3))
case("BatchToSpaceND", "1d", lambda x: tf.batch_to_space(x, [2], [[0, 1]]), f32(4, 3, 2))
case("SpaceToBatchND", "dilated-conv1d", lambda x: tf.nn.convolution(
    x, tf.constant(f32(3, 4, 5)), padding="SAME", dilations=[2]), f32(2, 16, 4), atol=SUM_ATOL)
case("BatchToSpaceND", "dilated-conv1d-causal", lambda x: tf.nn.convolution(  # Keras' causal
    tf.pad(x, [[0, 0], [8, 0], [0, 0]]), tf.constant(f32(3, 4, 3)), padding="VALID",
    dilations=[4]), f32(2, 16, 4), atol=SUM_ATOL)
case("DepthToSpace", "k2", lambda x: tf.nn.depth_to_space(x, 2), f32(2, 3, 4, 8))
case("DepthToSpace", "k3-i32", lambda x: tf.nn.depth_to_space(x, 3), i32(1, 2, 2, 9))
case("SpaceToDepth", "k2", lambda x: tf.nn.space_to_depth(x, 2), f32(2, 4, 6, 3))


# --- Bucketize (Keras Discretization), ExtractImagePatches -----------------------------------
case("Bucketize", "f32", lambda x: raw.Bucketize(input=x, boundaries=[-1.0, 0.0, 0.5, 2.0]),
     np.array([[-3.0, -1.0, -0.5, 0.0], [0.5, 0.7, 2.0, 9.0]], np.float32))
case("Bucketize", "i32-float-bounds", lambda x: raw.Bucketize(input=x, boundaries=[-0.5, 2.5]),
     i32(3, 4))
case("Bucketize", "no-bounds", lambda x: raw.Bucketize(input=x, boundaries=[]) + 1, f32(5))
for k, s_, r, padding in ((2, 2, 1, "VALID"), (3, 1, 1, "SAME"), (3, 2, 2, "VALID"),
                          (2, 3, 1, "SAME")):
    case("ExtractImagePatches", f"k{k}-s{s_}-r{r}-{padding}", lambda x, k=k, s_=s_, r=r,
         p=padding: tf.image.extract_patches(x, [1, k, k, 1], [1, s_, s_, 1], [1, r, r, 1], p),
         f32(2, 7, 8, 3))


# --- UnsortedSegmentSum (message passing in graph networks) ------------------------------------
case("UnsortedSegmentSum", "f32-rows", lambda d, i: tf.math.unsorted_segment_sum(d, i, 4),
     f32(6, 3), np.array([0, 3, 1, 0, -1, 3], np.int32), atol=1e-6)
case("UnsortedSegmentSum", "i32-2d-ids", lambda d, i: tf.math.unsorted_segment_sum(d, i, 3),
     i32(2, 3, 2), np.array([[2, 0, 2], [1, -1, 0]], np.int64))
case("UnsortedSegmentSum", "f32-scalar-rows", lambda d, i: tf.math.unsorted_segment_sum(
    d, i, tf.constant(5, tf.int64)), f32(7), _rng.integers(0, 5, 7).astype(np.int32))


# --- LRN (AlexNet-era local response normalization) --------------------------------------------
case("LRN", "defaults", lambda x: tf.nn.local_response_normalization(x), f32(2, 3, 3, 8),
     rtol=1e-5, atol=1e-6)
case("LRN", "googlenet", lambda x: tf.nn.local_response_normalization(
    x, depth_radius=2, bias=2.0, alpha=1e-4, beta=0.75), f32(1, 4, 4, 5), rtol=1e-5)
case("LRN", "radius-past-depth", lambda x: tf.nn.local_response_normalization(
    x, depth_radius=6, bias=0.5, alpha=0.3, beta=0.6), f32(1, 2, 2, 3), rtol=1e-5)


# --- Conv3D, MaxPool3D, AvgPool3D ------------------------------------------------------------
def _conv3d(w: np.ndarray, strides: tuple, dilation: int, padding: str) -> object:
    # (a closure: tf.function would turn an array default argument into an input)
    return lambda x: tf.nn.conv3d(x, tf.constant(w), [1, *strides, 1], padding,
                                  dilations=[1, dilation, dilation, dilation, 1])


for (k, stride, dilation, padding) in ((3, 1, 1, "SAME"), (2, 2, 1, "VALID"), (3, 2, 1, "SAME"),
                                       (3, 1, 2, "SAME"), ((1, 3, 2), (1, 2, 1), 1, "VALID")):
    kernel = (k,) * 3 if isinstance(k, int) else k
    case("Conv3D", f"k{kernel}-s{stride}-d{dilation}-{padding}".replace(" ", ""),
         _conv3d(f32(*kernel, 3, 4), (stride,) * 3 if isinstance(stride, int) else stride,
                 dilation, padding), f32(2, 6, 7, 5, 3), atol=SUM_ATOL)
for op, fn in (("MaxPool3D", tf.nn.max_pool3d), ("AvgPool3D", tf.nn.avg_pool3d)):
    for k, stride, padding in ((2, 2, "VALID"), (3, 2, "SAME"), (3, 1, "SAME")):
        case(op, f"k{k}-s{stride}-{padding}", lambda x, fn=fn, k=k, s=stride, p=padding: fn(
            x, k, s, p), f32(2, 5, 6, 7, 3), atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_conformance(case: Case) -> None:
    run_case(case)


def test_every_op_is_covered() -> None:
    mine = {op for op, lowering in LOWERINGS.items()
            if lowering.fn.__module__ in (sequence_ops.__name__, blocks_ops.__name__,
                                                  volume_ops.__name__)}
    assert mine - {c.op_type for c in CASES} == set()


def test_case_ids_are_unique() -> None:
    ids = [str(c) for c in CASES]
    assert len(ids) == len(set(ids))
