"""Reduced-precision instructions where the CPU's oneDNN has no kernels for them.

The native engine computes such instructions in float32 on widened operands, with one
rounding per result (runtime/native/engine.cc `in_f32`, engine_int8.cc
`int8_path`):

- float16, where oneDNN 3.2 has no float16 kernels (everywhere but AVX512-FP16);
- bfloat16, where it has no bfloat16 kernels (AVX2-only CPUs such as AMD Zen 3);
- int8 convolutions and matmuls, where the CPU lacks VNNI and oneDNN's int8 kernels
  would sum pairs of 8-bit products in int16 and saturate.

On such a CPU tests/runtime/test_native_gap.py's cases take that path already; here each
path is forced by its variable (read once per process, so in a process of its own) so that
it is held to the numpy reference on every CPU, whatever kernels it has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Per path: the variable that forces it, and the cases of every kind it rewrites.
_PATHS = {
    "float16": ("NEURONISH_NATIVE_F16",
                "float16 and (conv2d or matmul or pool or unary:relu or unary:tanh "
                "or unary:gelu or unary:swish or unary:sqrt)"),
    "bfloat16": ("NEURONISH_NATIVE_BF16",
                 "bfloat16 and (conv2d or matmul or pool or unary or binary or softmax "
                 "or layer_norm or reduce or concat or transpose or cast)"),
    "int8": ("NEURONISH_NATIVE_INT8", "conv2d_int8 or matmul_int8"),
}


@pytest.mark.parametrize("path", sorted(_PATHS))
def test_computed_in_float32_matches_the_reference(path: str) -> None:
    variable, cases = _PATHS[path]
    env = dict(os.environ, **{variable: "float32"})
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/runtime/test_native_gap.py", "tests/runtime/test_kernels.py", "-k", cases],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # The selection must really have run cases (a renamed sample would pass vacuously).
    summary = run.stdout.strip().splitlines()[-1]
    passed = int(summary.split(" passed")[0].split()[-1])
    assert passed >= 10, summary


def test_image_by_image_matches_the_reference() -> None:
    """Large batches computed in float32 run image by image (engine.cc `by_image`):
    tests/runtime/test_native_by_image.py holds that to the reference and to each image
    run alone; a bfloat16 binary and global mean run in one pass
    (test_native_bf16_one_pass.py). Here under the forcing variables, so a CPU with
    bfloat16 kernels and VNNI runs them too."""
    env = dict(os.environ, NEURONISH_NATIVE_BF16="float32", NEURONISH_NATIVE_INT8="float32")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/runtime/test_native_by_image.py", "tests/runtime/test_native_bf16_one_pass.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert int(summary.split(" passed")[0].split()[-1]) >= 10, summary
