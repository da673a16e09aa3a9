"""Two bfloat16 instructions on a CPU without bfloat16 kernels run in one pass of the
engine's own instead of widening their input into a float32 copy first
(runtime/native/engine.cc `bf16_binary_in_one_pass`, `bf16_global_mean_in_one_pass`;
engine_loops.cc):
- a binary (add, subtract, multiply, divide; b of a's shape, a vector over the last axis or
  one per image, as squeeze-excite's x * s[N, 1, 1, C]), which rounds once in float32 as
  the numpy reference does: held bit for bit against it, NaN and infinities included;
- a global average pool (squeeze-excite's mean over H and W), summed in float32 in another
  order than the reference's: held to the true value (float64) within one bfloat16 step.
Both on the native engine under the Python host and on the C runtime, with rows longer than
the loops' 512-value pieces. ONEDNN_VERBOSE shows that no oneDNN primitive ran for them;
test_native_by_image.py shows a binary with an addend still runs on oneDNN.

On a CPU with bfloat16 kernels nothing computes in float32 unless
NEURONISH_NATIVE_BF16=float32 says so: tests/runtime/test_native_in_float32.py runs this
module under it, and the verbose probe sets it itself.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from neuronish.runtime import isa
from neuronish.runtime.executable import to_bytes
from runtime.program import one_instruction_program
from tests.helpers import one_output_on_every_engine, onednn_exec_lines

BF16 = ml_dtypes.bfloat16
# name: (fn, a's shape, b's shape)
BINARY = {
    "mul_per_image_vector": ("mul", (3, 20, 20, 40), (3, 1, 1, 40)),
    "add_shared_vector": ("add", (2, 9, 9, 37), (37,)),
    "sub_same_shape": ("sub", (2, 7, 1000), (2, 7, 1000)),
    "div_same_shape": ("div", (5, 300), (5, 300)),
    "mul_shared_vector_long_rows": ("mul", (4, 1100), (1, 1100)),
    "add_one_long_row": ("add", (1, 100003), (1, 100003)),  # flat chunks, a ragged tail
}


# name: (x's shape, keepdims) of a mean over H and W (the spec encoder makes it a pool)
MEAN = {
    "mean_squeeze_excite": ((3, 20, 20, 40), True),
    "mean_dims_dropped_long_rows": ((2, 6, 7, 600), False),
    "mean_of_one_pixel": ((2, 1, 1, 24), True),
}


def _program(kind: str, arrays: list[np.ndarray], attrs: dict
             ) -> tuple[bytes, dict[str, np.ndarray]]:
    [out] = isa.check(kind, [isa.Type(x.shape, x.dtype.name) for x in arrays], attrs)
    program, feeds = one_instruction_program(kind, arrays, attrs, [(out.shape, out.dtype)])
    return to_bytes(program.exe), {s.name: f for s, f in zip(program.exe.inputs, feeds)}


def _exe(case: str) -> tuple[bytes, dict[str, np.ndarray]]:
    rng = np.random.default_rng(len(case))
    if case in MEAN:
        shape, keepdims = MEAN[case]
        x = rng.standard_normal(shape) + 0.5  # a mean away from 0, so one step is relative
        return _program("reduce", [x.astype(BF16)], {"fn": "mean", "axes": [1, 2],
                                                     "keepdims": keepdims})
    fn, a_shape, b_shape = BINARY[case]
    a = rng.standard_normal(a_shape).astype(np.float32) * 3
    a.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 0.0]
    b = rng.uniform(0.5, 2.0, b_shape) * rng.choice([-1, 1], b_shape)
    return _program("binary", [a.astype(BF16), b.astype(BF16)], {"fn": fn, "activation": "none"})


@pytest.mark.parametrize("case", sorted(BINARY))
def test_a_binary_gives_the_references_bits(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    exe, feeds = _exe(case)
    got = one_output_on_every_engine(exe, feeds, monkeypatch)
    want = got.pop("numpy")
    assert want.dtype == BF16 and np.isnan(want.astype(np.float32)).any()
    for engine, value in got.items():
        assert value.dtype == BF16, engine
        assert value.tobytes() == want.tobytes(), (
            engine, np.flatnonzero(value.view(np.uint16) != want.view(np.uint16))[:10])


_VERBOSE_PROBE = """
import sys
from neuronish.runtime import load
from tests.runtime.test_native_bf16_one_pass import _exe
exe, feeds = _exe(sys.argv[1])
with load(exe, runtime="python") as model:
    model.run(feeds)
"""


def _primitives(case: str) -> list[str]:
    """The kind of every oneDNN primitive that ran."""
    return [fields[3] for fields in onednn_exec_lines(_VERBOSE_PROBE, case,
                                                      NEURONISH_NATIVE_BF16="float32")]


@pytest.mark.parametrize("case", sorted(MEAN))
def test_a_global_mean_is_within_a_step_of_the_truth(case: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _, keepdims = MEAN[case]
    exe, feeds = _exe(case)
    [x] = feeds.values()
    truth = x.astype(np.float64).mean(axis=(1, 2), keepdims=keepdims)
    step = 2.0 ** (np.floor(np.log2(np.abs(truth))) - 7)  # one bfloat16 step at the truth
    got = one_output_on_every_engine(exe, feeds, monkeypatch)
    for engine, value in got.items():
        assert value.dtype == BF16 and value.shape == truth.shape, engine
        off = np.abs(value.astype(np.float64) - truth) / step
        assert off.max() <= 1.0, (engine, off.max())


@pytest.mark.parametrize("case", ["mul_per_image_vector", "add_shared_vector",
                                  *sorted(MEAN)])
def test_no_onednn_primitive_runs(case: str) -> None:
    assert _primitives(case) == []
