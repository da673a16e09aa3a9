"""A binary over a few channels (a vector of 3 to 15 values along the last axis) is run in
regrouped rows: k rows at a time, the vector operands tiled k times by a step before the
op (runtime/native/engine.cc, add_binary). Held here against the numpy reference on every
engine, for vectors read from the call and from the program's constants, with and without
an addend, where the rows regroup and where they cannot (13 rows of 3: no divisor of 13
gives a row of 64 elements)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from neuronish.runtime import isa
from neuronish.runtime.executable import to_bytes
from runtime.program import one_instruction_program
from tests.helpers import one_output_on_every_engine

SHAPES = {
    "rgb_whole_vectors": (2, 16, 16, 3),  # 512 rows: k = 32 (rows of 96)
    "rgb_regrouped": (2, 30, 30, 3),   # 1800 rows: k = 24 (no multiple of 16 divides 1800)
    "five_channels": (3, 7, 7, 5),     # 147 rows: k = 21
    "twelve_channels": (4, 12, 5, 12),  # 240 rows: k = 8 (8 x 12 = 96, whole vectors)
    "no_divisor": (1, 13, 1, 3),       # 13 rows: left as they are
}

# (b, c) as vectors "v", one value "1", y-shaped "y", or no addend None
FORMS = [("v", None), ("v", "v"), ("1", "v"), ("y", "v"), ("v", "1")]


def _operand(form: str, y: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    shape = {"v": (y[-1],), "1": (), "y": y}[form]
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1], shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("forms", FORMS, ids=lambda f: f"b{f[0]}_c{f[1]}")
@pytest.mark.parametrize("fn", ["sub", "mul", "div"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("weights", [False, True], ids=["fed", "constant"])
def test_a_few_channels_give_the_references_numbers(
        shape: str, forms: tuple[str, str | None], fn: str, dtype: str, weights: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    y = SHAPES[shape]
    rng = np.random.default_rng(len(y) * 31 + y[-1])
    np_type = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    arrays = [rng.standard_normal(y) * 4, _operand(forms[0], y, rng)]
    if forms[1] is not None:
        arrays.append(_operand(forms[1], y, rng))
    arrays = [a.astype(np_type) for a in arrays]
    attrs = {"fn": fn, "activation": "relu" if forms[1] == "v" else "none"}
    [out] = isa.check("binary", [isa.Type(a.shape, dtype) for a in arrays], attrs)
    assert out.shape == y
    constant = frozenset(range(1, len(arrays))) if weights else frozenset()
    program, feeds = one_instruction_program("binary", arrays, attrs, [(y, dtype)],
                                             constant=constant)
    names = [s.name for s in program.exe.inputs]
    got = one_output_on_every_engine(to_bytes(program.exe), dict(zip(names, feeds)),
                                     monkeypatch)
    want = got.pop("numpy")
    assert not np.array_equal(want, np.zeros_like(want))
    for engine, value in got.items():
        # fn(a, b) and its addend round as the reference does, each in float32
        assert value.tobytes() == want.tobytes(), (engine, np.max(np.abs(
            value.astype(np.float32) - want.astype(np.float32))))
