"""Review of the native engine's small float32 matmul loop (engine_small_matmul.cc):
specs whose operands disagree on M, K or N are refused (oneDNN refused them; the loop
would read past its operands), and the loop's register blocks and column tails compute
what TensorFlow does."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import tensorflow as tf

from neuronish.runtime.native import library, spec
from neuronish.runtime.program import one_instruction_program

SMALL = "neuronish:small_matmul"
RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def native() -> ctypes.CDLL:
    lib = library.load()
    assert lib is not None, f"native engine unavailable: {library.why_not()}"
    return lib


def add_matmul(native: ctypes.CDLL, a: tuple, b: tuple, y: tuple,
               bias: tuple | None = None) -> tuple[int, str]:
    """ne_add's result and error for a float32 matmul spec with these operand shapes
    (spec.py encodes them as given: only the engine sees the disagreement)."""
    err = ctypes.create_string_buffer(512)
    handle = native.ne_create(4, 1, err, 512)
    assert handle, err.value.decode()
    ins = [spec.Ref(0, 0, "float32", a), spec.Ref(1, 0, "float32", b)]
    if bias is not None:
        ins.append(spec.Ref(3, 0, "float32", bias))
    ints, floats = spec.encode("matmul", {"activation": "relu"}, ins,
                               [spec.Ref(2, 0, "float32", y)], [False] * len(ins))
    int_arr = (ctypes.c_int64 * len(ints))(*ints)
    float_arr = (ctypes.c_float * max(len(floats), 1))(*floats)
    try:
        k = native.ne_add(handle, int_arr, len(ints), float_arr, len(floats), err, 512)
    finally:
        native.ne_destroy(handle)
    return k, err.value.decode()


@pytest.mark.parametrize("a,b,y,bias,field", [
    ((2, 8), (4, 3), (2, 3), None, "b"),      # b has 4 rows, a 8 columns
    ((2, 8), (8, 3), (5, 3), None, "a"),      # y has 5 rows, a 2
    ((2, 8), (8, 3), (2, 6), None, "b"),      # y has 6 columns, b 3
    ((2, 8), (8, 3), (2, 3), (2,), "bias"),   # 2 biases for 3 columns
    ((2, 2, 8), (1, 8, 3), (1, 2, 3), None, "a"),  # a batch of 2 for one product
])
def test_disagreeing_operands_are_refused_naming_the_operand(
        native: ctypes.CDLL, a: tuple, b: tuple, y: tuple, bias: tuple | None,
        field: str) -> None:
    k, err = add_matmul(native, a, b, y, bias)
    assert k < 0, "the engine took a matmul whose operands disagree"
    assert f"matmul: {field}" in err, err


def run_small(native: ctypes.CDLL, inputs: list[np.ndarray], attrs: dict,
              y_shape: tuple) -> np.ndarray:
    program, call = one_instruction_program("matmul", inputs, attrs, [(y_shape, "float32")],
                                            constant=frozenset({1}), native=native)
    assert program.implementations()[0] == SMALL
    out = np.full(y_shape, np.nan, np.float32)  # (every element must be written)
    program.execute(call, [out])
    return out


# Every row count of a 4-row block and every column tail (16-, 8-, 4-wide vectors and
# single columns), with bias, residual and relu.
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("n", [1, 3, 4, 7, 8, 12, 15, 16, 29, 32, 45, 64])
def test_every_block_and_tail_matches_tf(native: ctypes.CDLL, m: int, n: int) -> None:
    k = 9
    a, b = RNG.standard_normal((m, k), np.float32), RNG.standard_normal((k, n), np.float32)
    bias, res = RNG.standard_normal(n, np.float32), RNG.standard_normal((m, n), np.float32)
    got = run_small(native, [a, b, bias, res], {"activation": "relu", "residual": True},
                    (m, n))
    want = tf.nn.relu(tf.linalg.matmul(a, b) + bias + res)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
