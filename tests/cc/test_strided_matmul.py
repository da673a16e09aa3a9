"""Attention without transpose copies: matmul's perm_a / perm_b / perm_y read its operands
and write its result through strides (cc/passes/matmul_transposes.py), on both engines,
with TensorFlow's numbers at several batch sizes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import isa, load
from neuronish.runtime.executable import from_bytes
from neuronish.runtime.isa import IsaError
from neuronish.runtime.native import library
from neuronish.runtime.program import evaluate_one
from tests.graphs import trace

RNG = np.random.default_rng(20)
S, H, D = 12, 4, 8
F = H * D


def _weights(*shape: int) -> tf.Tensor:
    return tf.constant(RNG.standard_normal(shape).astype(np.float32) * 0.3)


WQ, WK, WV, WO = (_weights(F, F) for _ in range(4))


def _heads(x: tf.Tensor) -> tf.Tensor:
    """[B, S, F] -> [B, H, S, D], as BERT implementations split heads."""
    return tf.transpose(tf.reshape(x, [-1, S, H, D]), [0, 2, 1, 3])


def attention(x: tf.Tensor) -> tf.Tensor:
    q, k, v = (_heads(tf.tensordot(x, w, 1)) for w in (WQ, WK, WV))
    scores = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / np.sqrt(D).astype(np.float32))
    context = tf.transpose(tf.matmul(scores, v), [0, 2, 1, 3])  # heads merged back
    return tf.tensordot(tf.reshape(context, [-1, S, F]), WO, 1) + x


def _instructions(exe: bytes) -> list:
    return [i for p in from_bytes(exe).programs for i in p]


def _engine(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", name)
    if name == "native":
        assert library.load() is not None, f"native engine unavailable: {library.why_not()}"


@pytest.mark.parametrize("engine", ["numpy", "native"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("model", ["hand_written", "keras"])
def test_attention_has_no_transposes_and_matches_tensorflow(
        engine: str, batch: int, model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _engine(engine, monkeypatch)
    if model == "keras":  # einsums: the head split is in the dense, the merge in the output
        mha = tf.keras.layers.MultiHeadAttention(num_heads=H, key_dim=D)
        mha(tf.zeros([1, S, F]), tf.zeros([1, S, F]))
        fn = lambda x: mha(x, x)  # noqa: E731
    else:
        fn = attention
    g = trace(fn, tf.TensorSpec([None, S, F], tf.float32, name="x"), batch=batch)
    exe = compile_graph(g.graph_def, g.io_config)
    instructions = _instructions(exe)
    assert "transpose" not in [i.kind for i in instructions]
    strided = [i for i in instructions if i.kind == "matmul"
               and any(i.attrs.get(p) for p in ("perm_a", "perm_b", "perm_y"))]
    assert strided, [(i.kind, i.attrs) for i in instructions]
    x = RNG.standard_normal((batch, S, F)).astype(np.float32)
    with load(exe) as model_:
        got = model_.run({"x:0": x})
    for key, want in g.reference({"x:0": x}).items():
        np.testing.assert_allclose(got[key], want, rtol=1e-4, atol=1e-5)


CASES = [  # a shape, b shape, attrs (the leading dims broadcast as numpy's)
    ((2, 5, 3, 4), (2, 5, 3, 4), {"perm_a": [0, 2, 1, 3], "perm_b": [0, 2, 3, 1],
                                  "perm_y": [0, 2, 1, 3]}),
    ((2, 5, 3, 4), (2, 5, 3, 4), {"perm_a": [0, 2, 3, 1], "perm_b": [0, 2, 1, 3],
                                  "transpose_a": True, "transpose_b": True}),
    ((2, 3, 5, 5), (2, 5, 3, 4), {"perm_b": [0, 2, 1, 3], "perm_y": [0, 2, 1, 3]}),
    ((5, 2, 4), (4, 6), {"perm_a": [1, 0, 2], "activation": "gelu_tanh"}),
    ((4, 5), (3, 4, 6), {"perm_a": [1, 0], "perm_y": [1, 0, 2], "activation": "relu"}),
]


@pytest.mark.parametrize("a_shape, b_shape, attrs", CASES)
@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
def test_strided_operands_agree_on_both_engines(a_shape: tuple, b_shape: tuple, attrs: dict,
                                                compute: str) -> None:
    """The numpy reference kernel against numpy's own transposes, then the native engine
    (taking the instruction, not leaving it to numpy) against the reference."""
    lib = library.load()
    assert lib is not None, library.why_not()
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    attrs = {**attrs, "compute": compute}
    full = isa.KINDS["matmul"].with_defaults(attrs)
    (y_type,) = isa.check("matmul", [isa.Type(a.shape, "float32"), isa.Type(b.shape, "float32")],
                          attrs)
    out = [(tuple(y_type.shape), "float32")]
    ref, ran = evaluate_one("matmul", [a, b], full, out)
    assert ran == "numpy"
    if compute == "float32":
        at = np.transpose(a, full["perm_a"] or range(a.ndim))
        bt = np.transpose(b, full["perm_b"] or range(b.ndim))
        at = np.swapaxes(at, -1, -2) if full["transpose_a"] else at
        bt = np.swapaxes(bt, -1, -2) if full["transpose_b"] else bt
        want = at @ bt
        if full["activation"] == "relu":
            want = np.maximum(want, 0)
        if full["activation"] != "gelu_tanh":  # (TF's formula: the conformance tests')
            want = np.transpose(want, full["perm_y"] or range(want.ndim))
            np.testing.assert_allclose(ref[0], want, rtol=1e-5, atol=1e-5)
    got, ran = evaluate_one("matmul", [a, b], full, out, native=lib, threads=2)
    assert ran == "native"
    tol = 1e-5 if compute == "float32" else 2e-3
    np.testing.assert_allclose(got[0], ref[0], rtol=tol, atol=tol)


@pytest.mark.parametrize("attrs, field", [
    ({"perm_a": [0, 1, 1]}, "perm_a"),
    ({"perm_b": [1, 0]}, "perm_b"),
    ({"perm_y": [0, 2, 1], "residual": True}, "perm_y"),
    ({"perm_y": [3, 0, 1, 2]}, "perm_y"),
])
def test_bad_permutations_are_refused_naming_the_attribute(attrs: dict, field: str) -> None:
    t = isa.Type((2, 3, 4), "float32")
    with pytest.raises(IsaError) as e:
        isa.check("matmul", [t, isa.Type((2, 4, 3), "float32"),
                             isa.Type((2, 3, 3), "float32")][:2 + bool(attrs.get("residual"))],
                  attrs)
    assert e.value.field == field, e.value


@pytest.mark.parametrize("attrs", [
    {"perm_a": [0, 2, 3, 1], "perm_b": [0, 2, 1, 3], "transpose_a": True, "transpose_b": True},
    {"perm_b": [0, 2, 1, 3], "perm_y": [0, 2, 1, 3]},
])
def test_bf16_operands_are_read_in_place_through_strides(attrs: dict) -> None:
    """Under --auto-cast the heads are bfloat16 already: the engine takes the strided
    bf16 operands itself (not numpy) and writes bfloat16, within one bf16 rounding of the
    reference (the float32 sums may be added in another order)."""
    import ml_dtypes

    lib = library.load()
    assert lib is not None, library.why_not()
    heads = RNG.standard_normal((2, S, H, D)).astype(ml_dtypes.bfloat16)
    probs = RNG.standard_normal((2, H, S, S)).astype(ml_dtypes.bfloat16)
    a = heads if "perm_a" in attrs else probs
    full = isa.KINDS["matmul"].with_defaults({**attrs, "compute": "bfloat16"})
    (y_type,) = isa.check("matmul", [isa.Type(a.shape, "bfloat16"),
                                     isa.Type(heads.shape, "bfloat16")], full)
    out = [(tuple(y_type.shape), "bfloat16")]
    ref, _ = evaluate_one("matmul", [a, heads], full, out)
    got, ran = evaluate_one("matmul", [a, heads], full, out, native=lib, threads=2)
    assert ran == "native"
    np.testing.assert_allclose(got[0].astype(np.float32), ref[0].astype(np.float32),
                               rtol=2 ** -7, atol=2 ** -7)


def test_float64_attention_with_absorbed_transposes_matches_tensorflow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """float64 matmuls run on the engine's own dense loop, which cannot read through
    perms: such an instruction must go to the reference kernel, never be read densely."""
    _engine("native", monkeypatch)
    w = tf.constant(RNG.standard_normal((F, F)))

    def attention64(x: tf.Tensor) -> tf.Tensor:
        q = _heads(tf.tensordot(x, w, 1))
        return tf.transpose(tf.matmul(q, q, transpose_b=True) @ q, [0, 2, 1, 3])

    g = trace(attention64, tf.TensorSpec([None, S, F], tf.float64, name="x"), batch=2)
    exe = compile_graph(g.graph_def, g.io_config)
    assert any(i.kind == "matmul" and any(i.attrs.get(p) for p in ("perm_a", "perm_b", "perm_y"))
               for i in _instructions(exe))
    x = RNG.standard_normal((2, S, F))
    with load(exe) as model_:
        got = model_.run({"x:0": x})
    for key, want in g.reference({"x:0": x}).items():
        np.testing.assert_allclose(got[key], want, rtol=1e-10, atol=1e-10)
