"""Small float32 matmuls on the native engine's own loop (runtime/native/engine_small_matmul.cc):
which matmuls take it, and that it computes what TensorFlow does at every block edge, with
bias, residual, each activation it applies itself, transposed and strided operands."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.runtime.native import library
from neuronish.runtime.program import one_instruction_program

RNG = np.random.default_rng(7)
SMALL = "neuronish:small_matmul"


@pytest.fixture(scope="module")
def native() -> object:
    lib = library.load()
    assert lib is not None, f"native engine unavailable: {library.why_not()}"
    return lib


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def matmul(native: object, inputs: list[np.ndarray], attrs: dict, y_shape: tuple,
           dtype: str = "float32") -> tuple[np.ndarray, str]:
    """The product on the native engine (b a constant, as in compiled models) and the
    implementation that ran it."""
    program, call_inputs = one_instruction_program("matmul", inputs, attrs, [(y_shape, dtype)],
                                                   constant=frozenset({1}), native=native,
                                                   threads=2)
    out = np.full(y_shape, 7, dtype)  # (every element must be written)
    program.execute(call_inputs, [out])
    assert all(st.native is not None and not st.native.rejected for st in program.stages)
    return out, program.implementations()[0]


# Rows 1..17 and columns 1..33 cross the loop's 4-row and 16-column blocks and their tails.
@pytest.mark.parametrize("m,n,k", [(1, 16, 16), (16, 16, 16), (3, 5, 7), (4, 16, 1),
                                   (5, 17, 9), (17, 33, 31), (1, 1, 1), (13, 48, 40)])
def test_small_matmuls_match_tf_at_every_block_edge(native: object, m: int, n: int, k: int
                                                    ) -> None:
    a, b = randn(m, k), randn(k, n)
    got, impl = matmul(native, [a, b], {"activation": "none"}, (m, n))
    assert impl == SMALL
    np.testing.assert_allclose(got, tf.linalg.matmul(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation,tf_fn", [
    ("relu", tf.nn.relu), ("relu6", tf.nn.relu6),
    ("leaky_relu", lambda x: tf.nn.leaky_relu(x, alpha=0.2)),
])
def test_bias_residual_and_activation_in_oneDNN_order(native: object, activation: str,
                                                      tf_fn: object) -> None:
    # Values spread past 6 and below 0, so every branch of each activation is taken.
    a, b, bias, res = randn(6, 9) * 3, randn(9, 20), randn(20), randn(6, 20) * 4
    want = tf_fn(tf.linalg.matmul(a, b) + bias + res)
    got, impl = matmul(native, [a, b, bias, res], {"activation": activation, "residual": True},
                       (6, 20))
    assert impl == SMALL
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_transposed_a_is_read_in_place(native: object) -> None:
    a, b, bias = randn(7, 5), randn(7, 18), randn(18)
    got, impl = matmul(native, [a, b, bias], {"transpose_a": True, "activation": "relu"}, (5, 18))
    assert impl == SMALL
    want = tf.nn.relu(tf.linalg.matmul(a, b, transpose_a=True) + bias)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_nan_and_inf_propagate_as_in_tensorflow(native: object) -> None:
    a, b = randn(4, 8), randn(8, 16)
    a[1, 3], a[2, 0] = np.nan, np.inf
    for activation, tf_fn in (("relu", tf.nn.relu), ("relu6", tf.nn.relu6)):
        got, impl = matmul(native, [a, b], {"activation": activation}, (4, 16))
        assert impl == SMALL
        np.testing.assert_allclose(got, tf_fn(tf.linalg.matmul(a, b)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["large", "batched", "transposed_b", "sigmoid", "float16"])
def test_other_matmuls_stay_on_oneDNN(native: object, case: str) -> None:
    # Past the size bound, a batch of products, a column-strided b, an activation the loop
    # does not apply and other dtypes keep oneDNN's primitive (and still compute right).
    attrs: dict = {"activation": "sigmoid" if case == "sigmoid" else "none"}
    a, b = randn(8, 16), randn(16, 8)
    if case == "large":
        a, b = randn(64, 64), randn(64, 64)
    elif case == "batched":
        a, b = randn(2, 8, 16), randn(2, 16, 8)
    elif case == "transposed_b":
        b = randn(8, 16)
        attrs["transpose_b"] = True
    elif case == "float16":
        a, b = a.astype(np.float16), b.astype(np.float16)
    want = tf.linalg.matmul(a, b, transpose_b=attrs.get("transpose_b", False))
    if case == "sigmoid":
        want = tf.sigmoid(want)
    got, impl = matmul(native, [a, b], attrs, tuple(want.shape), a.dtype.name)
    assert impl != SMALL
    tol = 1e-2 if case == "float16" else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
