"""int8 instructions on oneDNN's int8 kernels where those are exact without VNNI.

Without VNNI, oneDNN sums pairs of u8·s8 products in int16 and saturates, so the native
engine computes full-range int8 instructions in float32 there (test_native_in_float32.py).
Weights in [-64, 64] (what `--int8-weight-bits 7` compiles) cannot saturate with uint8
activations (2·255·64 = 32640 < 2^15 in magnitude), so such instructions take the int8
kernels on every CPU (runtime/native/engine_int8.cc `int8_path`); int8 activations are
read as uint8 x + 128 with a source zero point of 128. Here: they still give the numpy
reference's numbers with every pair at the int16 edge, and oneDNN's verbose log shows the
int8 kernel (u8 source) ran; full-range weights on a CPU without VNNI show float32.
"""

from __future__ import annotations

import dataclasses
import json
import re
import zlib

import numpy as np
import pytest

from neuronish.cc.host import cpu_flags
from neuronish.runtime.native import library
from neuronish.runtime.native.coverage import Sample, sample_instructions
from tests.helpers import onednn_exec_lines
from tests.runtime.test_native_gap import _executable, assert_native_matches_reference

# conv2d_int8 and matmul_int8 reading uint8 or int8, every output dtype, depthwise and
# residual (coverage.py samples depthwise from uint8 only: an int8 twin is added).
CASES = [s for s in sample_instructions() if s.kind in ("conv2d_int8", "matmul_int8")]
CASES += [dataclasses.replace(s, dtypes=("int8", *s.dtypes[1:]),
                              types=(((s.types[0][0]), "int8"), *s.types[1:]))
          for s in CASES if s.attrs.get("depthwise")]


def _has_vnni() -> bool:
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni"})


def _edge_inputs(s: Sample, low: int, high: int, seed: int) -> list[np.ndarray]:
    """Activations at 255 and weights at the range's ends, where int16 pair sums of
    full-range weights saturate; the rest random."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(s.types[0][1])
    x = rng.integers(info.min, int(info.max) + 1, s.types[0][0]).astype(info.dtype)
    x.reshape(-1)[: x.size // 2] = info.max  # (255 as uint8, shifted or not)
    w = rng.integers(low, high + 1, s.types[1][0]).astype(np.int8)
    # output channels (the last axis) whose every product is at an end: all pairs summed
    # along the input channels are 2·255·high, or 2·255·low
    out = w.shape[-1]
    w[..., : out // 2], w[..., out // 2: 3 * out // 4] = high, low
    rest = [rng.uniform(-2, 2, shape).astype(np.float32) for shape, _ in s.types[2:]]
    return [x, w, *rest]


@pytest.mark.parametrize("sample", CASES, ids=[s.label() for s in CASES])
def test_seven_bit_weights_match_the_reference(monkeypatch: pytest.MonkeyPatch,
                                               sample: Sample) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", "native")
    assert library.load() is not None, f"native engine unavailable: {library.why_not()}"
    exe, feeds = _executable(sample, _edge_inputs(sample, -64, 64,
                                                  zlib.crc32(sample.label().encode())))
    assert_native_matches_reference(sample, exe, feeds, monkeypatch)


_PROBE = """
import sys
from neuronish.runtime import load
from tests.runtime.test_native_gap import _executable
from tests.runtime.test_native_int8_seven_bits import CASES, _edge_inputs
label, low, high = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sample = next(s for s in CASES if s.label() == label)
exe, feeds = _executable(sample, _edge_inputs(sample, low, high, 7))
with load(exe, runtime="python") as model:
    model.run(feeds)
"""


def _kernel_sources(label: str, low: int, high: int) -> list[str]:
    """The source dtypes of the convolution/matmul primitives oneDNN ran for one call."""
    ran = onednn_exec_lines(_PROBE, label, str(low), str(high))
    sources = [src for fields in ran if fields[3] in ("convolution", "matmul")
               for src in re.findall(r"(?:^| )src_([a-z0-9]+):", fields[6])]
    assert sources, "oneDNN logged no convolution or matmul:\n" + json.dumps(
        [",".join(f) for f in ran[-20:]], indent=1)
    return sources


@pytest.mark.parametrize("x", ["uint8", "int8"])
@pytest.mark.parametrize("kind", ["conv2d_int8", "conv2d_int8:depthwise", "matmul_int8"])
def test_seven_bit_weights_run_on_int8_kernels(kind: str, x: str) -> None:
    label = next(s.label() for s in CASES
                 if s.label().startswith(kind + " ") and s.types[0][1] == x)
    given = "u8" if x == "uint8" else "s8"
    # With VNNI int8 activations are taken as they are; without, shifted to uint8.
    seven = _kernel_sources(label, -64, 64)
    assert seven == ([given] if _has_vnni() else ["u8"]), seven
    # Full-range weights: int8 kernels only where VNNI sums in int32.
    full = _kernel_sources(label, -128, 127)
    assert full == ([given] if _has_vnni() else ["f32"]), full
