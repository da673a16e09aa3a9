"""The native engine's small float32 matmul loop (engine_small_matmul.cc):
specs whose operands disagree on M, K or N are refused (oneDNN refused them; the loop
would read past its operands); the loop's register tiles (every row count of a block of
four, 16-, 8- and 4-wide vectors, the last one to three columns side by side) and its
vector epilogue compute what TensorFlow does, NaN and infinities included; and the
narrow long-k products it is slower on stay on oneDNN. Each vector width's variant
(AVX-512, AVX2 + FMA, SSE: NEURONISH_NATIVE_SMALL_MATMUL picks a narrower one than the
CPU's) is held to TensorFlow on this CPU. Loop steps read their data pointers directly
(Arg::ptr, set by each run): slots bound after an instruction was added, or rebound between
runs, are read where they are now, by loops and primitives alike."""
from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.host import cpu_flags
from neuronish.runtime.native import spec
from neuronish.runtime.program import one_instruction_program
from tests.runtime.test_small_matmul import SMALL, matmul, native

__all__ = ["native"]  # (the engine fixture, shared with test_small_matmul)

RNG = np.random.default_rng(11)


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
    out, impl = matmul(native, inputs, attrs, y_shape)
    assert impl == SMALL
    return out


# Every row count of a 4-row block (1 to 4, and 4 + each) and every column tail (two or
# four 16-wide vectors at once, one, an 8- and a 4-wide one, the last 1, 2 or 3 columns),
# with bias, residual and relu.
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 9])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 7, 8, 12, 14, 15, 16, 29, 32, 45, 50, 64, 70])
def test_every_block_and_tail_matches_tf(native: ctypes.CDLL, m: int, n: int) -> None:
    k = 9
    a, b = RNG.standard_normal((m, k), np.float32), RNG.standard_normal((k, n), np.float32)
    bias, res = RNG.standard_normal(n, np.float32), RNG.standard_normal((m, n), np.float32)
    got = run_small(native, [a, b, bias, res], {"activation": "relu", "residual": True},
                    (m, n))
    want = tf.nn.relu(tf.linalg.matmul(a, b) + bias + res)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation,tf_fn", [
    ("relu", tf.nn.relu), ("relu6", tf.nn.relu6),
    ("leaky_relu", lambda x: tf.nn.leaky_relu(x, alpha=0.3)), ("neg", tf.negative),
])
def test_nan_and_infinities_in_every_tile_width_as_tensorflow(
        native: ctypes.CDLL, activation: str, tf_fn: object) -> None:
    # 23 columns: a 16-, a 4-wide vector and three single columns; rows of NaN, +inf and
    # -inf products (a's row times b's positive column 0 and the rest), and finite ones.
    a = RNG.standard_normal((4, 6), np.float32) * 4
    b = RNG.standard_normal((6, 23), np.float32)
    a[0, 2], a[1, :], a[2, :] = np.nan, 0, 0
    a[1, 0], a[2, 0], b[0, :] = np.inf, -np.inf, np.abs(b[0, :]) + 1
    attrs = {"activation": activation, "alpha": 0.3}
    got = run_small(native, [a, b], attrs, (4, 23))
    np.testing.assert_allclose(got, tf_fn(tf.linalg.matmul(a, b)), rtol=1e-5, atol=1e-5)


# Narrow products with a long k take several k-long multiply-add chains one after another
# on the loop (~1 ns a step) where oneDNN takes ~0.6 us plus ~1.3 ns per k (AMD EPYC Zen 4:
# [1, 3000] @ [3000, 10] 16.4 us on the loop, 4.3 us on oneDNN); wide ones the loop wins.
# (The same on every vector width: these products have as many tiles on each.)
@pytest.mark.parametrize("m,n,k,small", [
    (1, 10, 3000, False), (1, 7, 2048, False), (3, 7, 1024, False),
    (1, 4, 4096, True), (4, 4, 2048, True), (32, 32, 32, True), (16, 16, 16, True),
])
def test_narrow_long_products_stay_on_oneDNN(native: ctypes.CDLL, m: int, n: int, k: int,
                                             small: bool) -> None:
    a, b = RNG.standard_normal((m, k), np.float32), RNG.standard_normal((k, n), np.float32)
    got, impl = matmul(native, [a, b], {"activation": "none"}, (m, n))
    assert (impl == SMALL) == small, impl
    np.testing.assert_allclose(got, tf.linalg.matmul(a, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["avx2", "sse"])
def test_each_vector_width_matches_tf(native: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch,
                                      variant: str) -> None:
    if variant == "avx2" and not {"avx2", "fma"} <= cpu_flags():
        pytest.skip("this CPU has no AVX2 + FMA: its AVX2 variant cannot run here")
    # Two blocks of four rows and a last one; 38 columns: on each width tiles of several
    # vectors, then narrower ones down to 4 wide, then the last two columns side by side.
    a, b = RNG.standard_normal((9, 20), np.float32), RNG.standard_normal((20, 38), np.float32)
    bias, res = RNG.standard_normal(38, np.float32), RNG.standard_normal((9, 38), np.float32)
    inputs, attrs = [a, b, bias, res], {"activation": "leaky_relu", "alpha": 0.1,
                                        "residual": True}
    forced = "NEURONISH_NATIVE_SMALL_MATMUL" in os.environ
    widest = run_small(native, inputs, attrs, (9, 38))
    monkeypatch.setenv("NEURONISH_NATIVE_SMALL_MATMUL", variant)
    got = run_small(native, inputs, attrs, (9, 38))
    want = tf.nn.leaky_relu(tf.linalg.matmul(a, b) + bias + res, alpha=0.1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if variant == "sse" and "fma" in cpu_flags() and not forced:
        # (SSE has no fused multiply-add: its sums round each product, so some bits differ
        # from the widest variant's: the narrower variant did run.)
        assert not np.array_equal(got, widest)


def test_an_unknown_vector_width_is_refused_naming_the_variable(
        native: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_NATIVE_SMALL_MATMUL", "avx-512")
    a, b = RNG.standard_normal((2, 3), np.float32), RNG.standard_normal((3, 4), np.float32)
    program, _ = one_instruction_program("matmul", [a, b], {"activation": "none"},
                                         [((2, 4), "float32")], constant=frozenset({1}),
                                         native=native)
    (why,) = [w for st in program.stages for w in st.native.rejected.values()]
    assert "NEURONISH_NATIVE_SMALL_MATMUL must be avx512, avx2 or sse, got 'avx-512'" in why


def engine_run(native: ctypes.CDLL, handle: int, y: np.ndarray) -> None:
    err = ctypes.create_string_buffer(512)
    ptrs = (ctypes.c_void_p * 1)(y.ctypes.data)
    assert native.ne_run(handle, 0, 1, 2, ptrs, 1, None, 0.0, err, 512) == 0, err.value


# The small-matmul loop, oneDNN's matmul primitive (`brg:` with AVX-512, `gemm:` on an
# AVX2-only CPU: any but ours and its reference code), and pow (a loop over every dtype).
ONEDNN = "oneDNN's"


@pytest.mark.parametrize("kind,shapes,runs_on", [
    ("matmul", [(16, 8), (8, 16), (16, 16)], SMALL),
    ("matmul", [(64, 64), (64, 64), (64, 64)], ONEDNN),
    ("binary", [(5, 7), (5, 7), (5, 7)], "neuronish:binary_any"),
])
def test_slots_bound_after_adding_and_rebound_between_runs_are_read_there(
        native: ctypes.CDLL, kind: str, shapes: list[tuple], runs_on: str) -> None:
    # Slots 0 and 1 (a and b: neither constant) are bound only after the instruction was
    # added, and b is rebound between runs; slot 2 (y) is the call's own.
    attrs = {"activation": "none"} if kind == "matmul" else {"fn": "pow"}
    refs = [spec.Ref(slot, 0, "float32", shape) for slot, shape in enumerate(shapes)]
    ints, floats = spec.encode(kind, attrs, refs[:2], refs[2:], [False, False])
    err = ctypes.create_string_buffer(512)
    handle = native.ne_create(3, 1, err, 512)
    try:
        k = native.ne_add(handle, (ctypes.c_int64 * len(ints))(*ints), len(ints),
                          (ctypes.c_float * max(len(floats), 1))(*floats), len(floats), err, 512)
        assert k == 0, err.value
        impl = ctypes.create_string_buffer(256)
        assert native.ne_impl(handle, 0, impl, 256) == 0
        ran = impl.value.decode()
        assert (not ran.startswith(("neuronish:", "ref"))) if runs_on == ONEDNN else \
            ran.startswith(runs_on), ran
        a = np.abs(RNG.standard_normal(shapes[0], np.float32)) + 0.5
        bs = [RNG.standard_normal(shapes[1], np.float32) for _ in range(2)]
        native.ne_bind(handle, 0, a.ctypes.data, err, 512)
        y = np.empty(shapes[2], np.float32)
        for b in bs:
            native.ne_bind(handle, 1, b.ctypes.data, err, 512)
            engine_run(native, handle, y)
            want = a @ b if kind == "matmul" else np.power(a, b)
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    finally:
        native.ne_destroy(handle)
