"""An instruction that computes in float32 on 16-bit operands (runtime/native/engine.cc
`in_f32`: bfloat16 on a CPU without bfloat16 kernels) runs image by image once its
batch's float32 copies outgrow the cache (engine.cc `images_of`, `by_image`): the same
steps, described for one image, run once per image with the batched operands stepping.

Held here, on the native engine under the Python host and on the C runtime:
- against the numpy reference (a misplaced or repeated image is off by the values' size);
- bit for bit against the same instruction run on each image alone (batch 1 is never
  split), so splitting changes no number;
- and, through ONEDNN_VERBOSE, that the split happened (`mb1` primitives for a batch of
  3) where it should and not where the copies are small.

On a CPU with bfloat16 kernels (or VNNI, for int8) nothing computes in float32 unless
NEURONISH_NATIVE_BF16=float32 (NEURONISH_NATIVE_INT8=float32) says so:
tests/runtime/test_native_in_float32.py runs this module under both, and the verbose probe
here sets them itself.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from neuronish.runtime import isa, load
from neuronish.runtime.executable import to_bytes
from runtime.program import one_instruction_program
from tests.helpers import one_output_on_every_engine, onednn_exec_lines

BF16 = ml_dtypes.bfloat16
BATCH = 3
# Each case: kind, input shapes (x first, batched), which inputs are constants, attrs,
# input dtypes. Sized so the batch's float32 input and output pass engine.cc's
# kBatchMin (16 MiB) with BATCH images.
CASES = {
    "conv_1x1_bias_relu": (
        "conv2d", [(BATCH, 96, 96, 80), (1, 1, 80, 80), (80,)], {1, 2},
        {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "activation": "relu",
         "compute": "bfloat16"}, ["bfloat16", "bfloat16", "float32"]),
    "conv_3x3_stride_2": (
        "conv2d", [(BATCH, 161, 161, 48), (3, 3, 48, 48)], {1},
        {"strides": [2, 2], "dilations": [1, 1], "pads": [1, 1, 1, 1], "activation": "none",
         "compute": "bfloat16"}, ["bfloat16", "bfloat16"]),
    "conv_residual": (
        "conv2d", [(BATCH, 96, 96, 80), (1, 1, 80, 80), (80,), (BATCH, 96, 96, 80)], {1, 2},
        {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "activation": "relu",
         "compute": "bfloat16", "residual": True},
        ["bfloat16", "bfloat16", "float32", "bfloat16"]),
    "conv_float32_read_in_bf16": (  # float32 x rounded to bf16 first: y stays float32
        "conv2d", [(BATCH, 96, 96, 80), (1, 1, 80, 80)], {1},
        {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "activation": "none",
         "compute": "bfloat16"}, ["float32", "bfloat16"]),
    "depthwise_3x3": (
        "depthwise_conv2d", [(BATCH, 96, 96, 80), (3, 3, 80, 1), (80,)], {1, 2},
        {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "activation": "relu",
         "compute": "bfloat16"}, ["bfloat16", "bfloat16", "float32"]),
    "binary_per_image_vector": (  # a squeeze-excite's x * s[N, 1, 1, C]
        "binary", [(BATCH, 96, 96, 80), (BATCH, 1, 1, 80)], set(),
        {"fn": "mul", "activation": "none"}, ["bfloat16", "bfloat16"]),
    "binary_broadcast_and_addend": (  # x * v[C] + full, v shared by every image
        "binary", [(BATCH, 96, 96, 80), (80,), (BATCH, 96, 96, 80)], {1},
        {"fn": "mul", "activation": "relu"}, ["bfloat16", "bfloat16", "bfloat16"]),
    "max_pool_3x3_stride_2": (
        "pool", [(BATCH, 161, 161, 64)], set(),
        {"mode": "max", "ksize": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        ["bfloat16"]),
    "unary_swish": (
        "unary", [(BATCH, 96, 96, 80)], set(), {"fn": "swish"}, ["bfloat16"]),
    # int8 with full-range weights computes in float32 without VNNI (engine_int8.cc
    # `int8_path`): 8-bit x widened, y narrowed back to 8 bits.
    "conv_int8_requantized": (
        "conv2d_int8", [(BATCH, 96, 96, 80), (1, 1, 80, 80), (80,), (80,)], {1, 2, 3},
        {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "x_scale": 0.02,
         "activation": "relu", "out": "uint8", "y_scale": 0.05},
        ["uint8", "int8", "scale", "float32"]),
    "conv_int8_depthwise_residual": (
        "conv2d_int8",
        [(BATCH, 96, 96, 80), (3, 3, 80, 1), (80,), (80,), (BATCH, 96, 96, 80)], {1, 2, 3},
        {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "x_scale": 0.02,
         "depthwise": True, "residual": True, "residual_scale": 0.1, "out": "int8",
         "y_scale": 0.05},
        ["int8", "int8", "scale", "float32", "int8"]),
}


def _arrays(case: str) -> tuple[str, list[np.ndarray], frozenset[int], dict]:
    kind, shapes, constant, attrs, dtypes = CASES[case]
    rng = np.random.default_rng(len(case))
    arrays = []
    for k, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        if dtype in ("uint8", "int8"):
            info = np.iinfo(dtype)
            arrays.append(rng.integers(info.min, info.max + 1, shape).astype(dtype))
        elif dtype == "scale":  # an int8 weight's step
            arrays.append(rng.uniform(0.001, 0.003, shape).astype(np.float32))
        else:
            a = rng.standard_normal(shape) * (0.3 if k in constant else 1.0)  # weights smaller
            arrays.append(a.astype(BF16 if dtype == "bfloat16" else np.float32))
    return kind, arrays, frozenset(constant), attrs


def _exe(kind: str, arrays: list[np.ndarray], constant: frozenset[int], attrs: dict
         ) -> tuple[bytes, dict[str, np.ndarray]]:
    [out] = isa.check(kind, [isa.Type(a.shape, a.dtype.name) for a in arrays], attrs)
    program, feeds = one_instruction_program(kind, arrays, attrs, [(out.shape, out.dtype)],
                                             constant=constant)
    return to_bytes(program.exe), {s.name: f for s, f in zip(program.exe.inputs, feeds)}


def _image(a: np.ndarray, k: int, batched: bool) -> np.ndarray:
    return a[k:k + 1] if batched else a


@pytest.mark.parametrize("case", sorted(CASES))
def test_by_image_gives_the_batchs_numbers(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kind, arrays, constant, attrs = _arrays(case)
    exe, feeds = _exe(kind, arrays, constant, attrs)
    got = one_output_on_every_engine(exe, feeds, monkeypatch)
    want = got.pop("numpy").astype(np.float32)
    assert np.abs(want).max() > 0.5
    for engine, value in got.items():
        np.testing.assert_allclose(value.astype(np.float32), want, rtol=1.6e-2,
                                   atol=1.6e-2 * float(np.abs(want).max()), err_msg=engine)

    # Each image alone (a batch of one, never split) on the native engine: the same bits.
    monkeypatch.setenv("NEURONISH_ENGINE", "native")
    batched = [k not in constant and a.ndim == 4 and a.shape[0] == BATCH
               for k, a in enumerate(arrays)]
    for k in range(BATCH):
        one = [_image(a, k, b) for a, b in zip(arrays, batched)]
        one_exe, one_feeds = _exe(kind, one, constant, attrs)
        with load(one_exe, runtime="python") as model:
            [alone] = model.run(one_feeds).values()
        for engine, value in got.items():
            assert value[k:k + 1].tobytes() == alone.tobytes(), (engine, k)


_VERBOSE_PROBE = """
import sys
from neuronish.runtime import load
from tests.runtime.test_native_by_image import _arrays, _exe
kind, arrays, constant, attrs = _arrays(sys.argv[1])
if sys.argv[2] == "small":  # a tenth of the height: the batch's copies stay in the cache
    arrays = [a if k in constant else a[:, : a.shape[1] // 10] for k, a in enumerate(arrays)]
exe, feeds = _exe(kind, arrays, constant, attrs)
with load(exe, runtime="python") as model:
    model.run(feeds)
"""


def _primitives(case: str, size: str) -> list[list[str]]:
    """ONEDNN_VERBOSE's fields of each convolution, pooling, binary and eltwise primitive
    that ran."""
    lines = [f for f in onednn_exec_lines(_VERBOSE_PROBE, case, size,
                                          NEURONISH_NATIVE_BF16="float32",
                                          NEURONISH_NATIVE_INT8="float32")
             if f[3] in ("convolution", "pooling", "binary", "eltwise")]
    assert lines, f"oneDNN logged none of them for {case}"
    return lines


def _primitive_batches(case: str, size: str) -> list[str]:
    """The `mbN` of each of them."""
    return [fields[-2] for fields in _primitives(case, size)]  # e.g. "mb1_ic80oc80..."


@pytest.mark.parametrize("case", ["conv_1x1_bias_relu", "depthwise_3x3",
                                  "max_pool_3x3_stride_2", "conv_int8_requantized"])
def test_a_large_batch_runs_image_by_image(case: str) -> None:
    shapes = _primitive_batches(case, "large")
    assert len(shapes) == BATCH, shapes
    assert all("mb1" in s for s in shapes), shapes


def test_a_binarys_images_are_described_one_at_a_time() -> None:
    """A binary's description has no `mb`, only its operands' dims: image by image, x as
    [96 * 96, 80] rows times the shared vector (the addend a post-op), once per image. (A
    binary without addend or activation runs in one pass of the engine's own instead:
    test_native_bf16_one_pass.py.)"""
    shapes = _primitive_batches("binary_broadcast_and_addend", "large")
    assert shapes == ["9216x80:1x80"] * BATCH, shapes


@pytest.mark.parametrize("size", ["large", "small"])
def test_a_bf16_residual_is_summed_into_the_float32_result(size: str) -> None:
    """The residual, widened anyway, is widened into the convolution's float32 result and
    added by a sum post-op, as an in-place fp32 residual is, not by a binary post-op that
    reads a copy of its own (engine.cc `res_in_out`): split by image or not."""
    convs = [f for f in _primitives("conv_residual", size) if f[3] == "convolution"]
    assert convs and all("post-ops:sum+eltwise_relu" in f[7] for f in convs), convs


def test_a_small_batch_runs_whole() -> None:
    shapes = _primitive_batches("depthwise_3x3", "small")
    assert len(shapes) == 1 and f"mb{BATCH}" in shapes[0], shapes
