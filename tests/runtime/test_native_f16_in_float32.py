"""float16 instructions where the CPU's oneDNN has no float16 kernels.

oneDNN 3.2 builds float16 convolutions, matmuls, pools and element-wise ops only on CPUs
with AVX512-FP16; elsewhere the native engine computes them in float32 and rounds the
result once (runtime/native/engine.cc `in_f32`). On such a CPU tests/runtime/
test_native_gap.py's float16 cases already take that path; here it is forced with
NEURONISH_NATIVE_F16=float32 (read once per process, so in a process of its own) so that
it is held to the numpy reference on every CPU, float16 kernels or not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The float16 cases of every kind the float32 path rewrites: convolutions (plain,
# depthwise), matmuls (also float32 operands read in float16: rounded, then widened),
# pools and element-wise functions.
_CASES = ("float16 and (conv2d or matmul or pool or unary:relu or unary:tanh "
          "or unary:gelu or unary:swish or unary:sqrt)")


def test_float16_computed_in_float32_matches_the_reference() -> None:
    env = dict(os.environ, NEURONISH_NATIVE_F16="float32")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/runtime/test_native_gap.py", "tests/runtime/test_kernels.py", "-k", _CASES],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # The selection must really have run cases (a renamed sample would pass vacuously).
    summary = run.stdout.strip().splitlines()[-1]
    passed = int(summary.split(" passed")[0].split()[-1])
    assert passed >= 10, summary
