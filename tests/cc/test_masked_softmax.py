"""Attention's masked softmax as one instruction: Keras' where(mask, x, -1e9) → softmax →
where(mask, p, 0) becomes `masked_softmax` (cc/passes/idioms.py), whose numpy kernel,
native loop (engine.cc, AVX-512 and portable) and compiled models give TensorFlow's
numbers: fully masked rows, NaN scores, rows that are not a multiple of the vector width,
masks broadcasting along every axis, bfloat16 scores, and a keras_hub BERT backbone."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from models import third_party
from models.cache import cached_saved_model
from neuronish.cc.compiler import compile_graph
from neuronish.cc.saved_model_executables import neuron_op_executables
from neuronish.runtime import load
from neuronish.runtime.executable import from_bytes
from neuronish.runtime.native import library
from neuronish.runtime.program import one_instruction_program
from tests.cc.test_bf16_attention import F, S, masked_attention
from tests.graphs import trace

RNG = np.random.default_rng(5)


def _tf_masked_softmax(x: np.ndarray, mask: np.ndarray, fill: float, masked: float
                       ) -> np.ndarray:
    keep = tf.broadcast_to(tf.constant(mask), x.shape)
    p = tf.nn.softmax(tf.where(keep, tf.constant(x), fill))
    return tf.where(keep, p, masked).numpy()


def _run(engine: str, x: np.ndarray, mask: np.ndarray, attrs: dict) -> np.ndarray:
    native = library.load() if engine == "native" else None
    if engine == "native":
        assert native is not None, library.why_not()
    program, call = one_instruction_program("masked_softmax", [x, mask], attrs,
                                            [(x.shape, x.dtype.name)], native=native,
                                            threads=2)
    if engine == "native":
        assert all(not st.native.rejected for st in program.stages if st.native), \
            "masked_softmax was left to numpy"
    out = [np.empty(x.shape, x.dtype)]
    program.execute(call, out)
    return out[0]


# (x shape, mask shape): BERT's key mask, a row of 37 (two full vectors and a tail of 5),
# a mask per element, one broadcast along the row, rows shorter than a vector.
SHAPES = [((2, 3, 5, 37), (2, 1, 1, 37)), ((3, 4, 16), (3, 4, 16)), ((2, 6, 40), (2, 6, 1)),
          ((4, 3), (3,)), ((5, 128), (1, 128))]


@pytest.mark.parametrize("engine", ["numpy", "native"])
@pytest.mark.parametrize("x_shape, mask_shape", SHAPES)
def test_matches_tensorflows_three_ops(engine: str, x_shape: tuple, mask_shape: tuple) -> None:
    x = (RNG.standard_normal(x_shape) * 4).astype(np.float32)
    mask = RNG.uniform(size=mask_shape) < 0.6
    mask.reshape(-1, mask_shape[-1])[0] = False  # a fully masked row (or more)
    for fill, masked in ((-1e9, 0.0), (float(np.finfo(np.float32).min), -2.5)):
        attrs = {"fill": fill, "masked": masked}
        want = _tf_masked_softmax(x, mask, fill, masked)
        got = _run(engine, x, mask, attrs)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def test_a_nan_score_makes_its_kept_row_nan_on_both_engines() -> None:
    # (the device's softmax, both instructions: numpy's max, exp and sum carry the NaN to
    # the whole row; TF's CPU kernel leaves it at its own position and zeroes the rest)
    x = RNG.standard_normal((2, 3, 21)).astype(np.float32)
    x[0, 1, 4] = np.nan
    x[1, 2, 20] = np.nan  # masked out: its row is unaffected
    mask = np.ones((2, 3, 21), bool)
    mask[1, 2, 20] = False
    mask[0, 1, 7] = False
    attrs = {"fill": -1e9, "masked": -3.0}
    ref, got = _run("numpy", x, mask, attrs), _run("native", x, mask, attrs)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-7)
    assert np.isnan(got[0, 1]).sum() == 20 and got[0, 1, 7] == -3.0
    want = _tf_masked_softmax(x, mask, -1e9, -3.0)
    np.testing.assert_allclose(got[1], want[1], rtol=2e-6, atol=1e-7)


def test_bfloat16_scores_on_both_engines() -> None:
    x = (RNG.standard_normal((2, 4, 8, 50)) * 3).astype(ml_dtypes.bfloat16)
    mask = RNG.uniform(size=(2, 1, 1, 50)) < 0.7
    mask[1] = False
    attrs = {"fill": -1e9, "masked": 0.0}
    ref = _run("numpy", x, mask, attrs).astype(np.float32)
    got = _run("native", x, mask, attrs).astype(np.float32)
    np.testing.assert_allclose(got, ref, rtol=8e-3, atol=1e-6)  # one bf16 rounding apart
    want = _tf_masked_softmax(x.astype(np.float32), mask, -1e9, 0.0)
    np.testing.assert_allclose(got, want, rtol=8e-3, atol=1e-6)


def _kinds(exe: bytes) -> list[tuple[str, int]]:
    e = from_bytes(exe)
    return [(i.kind, len(e.values[i.outputs[0]][0])) for p in e.programs for i in p]


def test_keras_mask_select_softmax_select_is_one_instruction(
        monkeypatch: pytest.MonkeyPatch) -> None:
    g = trace(masked_attention, tf.TensorSpec([3, S, F], tf.float32, name="x"),
              tf.TensorSpec([3, S], tf.int32, name="mask"))
    exe = compile_graph(g.graph_def, g.io_config)
    kinds = _kinds(exe)
    assert kinds.count(("masked_softmax", 4)) == 1, kinds
    assert not [k for k in kinds if k[0] in ("softmax", "select") and k[1] == 4], kinds
    x = RNG.standard_normal((3, S, F)).astype(np.float32)
    mask = (RNG.uniform(size=(3, S)) < 0.7).astype(np.int32)
    mask[1] = 0
    feeds = {"x:0": x, "mask:0": mask}
    for engine in ("numpy", "native"):
        monkeypatch.setenv("NEURONISH_ENGINE", engine)
        with load(exe) as model:
            got = model.run(feeds)
        for key, want in g.reference(feeds).items():
            err = np.max(np.abs(got[key] - want)) / np.max(np.abs(want))
            assert err < 1e-5, (engine, key, err)


def _softmax_also_returned(x: tf.Tensor, mask: tf.Tensor) -> tuple:
    keep = tf.cast(mask, tf.bool)[:, None, :]
    p = tf.nn.softmax(tf.where(keep, x, -1e9))
    return tf.where(keep, p, 0.0), p


def _other_mask_after(x: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    keep = tf.cast(mask, tf.bool)[:, None, :]
    p = tf.nn.softmax(tf.where(keep, x, -1e9))
    return tf.where(tf.logical_not(keep), p, 0.0)


@pytest.mark.parametrize("fn", [_softmax_also_returned, _other_mask_after])
def test_not_fused_when_the_parts_are_read_elsewhere_or_masks_differ(fn: object) -> None:
    g = trace(fn, tf.TensorSpec([2, 4, 9], tf.float32, name="x"),
              tf.TensorSpec([2, 9], tf.int32, name="mask"))
    exe = compile_graph(g.graph_def, g.io_config)
    assert "masked_softmax" not in [k for k, _ in _kinds(exe)]
    feeds = {"x:0": RNG.standard_normal((2, 4, 9)).astype(np.float32),
             "mask:0": (RNG.uniform(size=(2, 9)) < 0.6).astype(np.int32)}
    with load(exe) as model:
        got = model.run(feeds)
    for key, want in g.reference(feeds).items():
        np.testing.assert_allclose(got[key], want, rtol=1e-6, atol=1e-7)


def test_keras_hub_bert_backbone_within_1e_4_of_tensorflow(tmp_path: Path) -> None:
    src = cached_saved_model("bert_tiny")
    out = tmp_path / "compiled"
    neuronish.saved_model.compile(src, str(out), batch_size=2)
    kinds = [k for op in neuron_op_executables(out) for k, _ in _kinds(op.executable)]
    assert kinds.count("masked_softmax") >= 2, kinds  # one per layer
    assert "softmax" not in kinds
    original = tf.saved_model.load(src).signatures["serving_default"]
    feeds = third_party.example_inputs("bert_tiny", original, 2, seed=3)
    want = original(**{k: tf.constant(v) for k, v in feeds.items()})
    compiled = tf.saved_model.load(str(out)).signatures["serving_default"]
    got = compiled(**{k: tf.constant(v) for k, v in feeds.items()})
    for key, w in want.items():
        w, g = w.numpy(), got[key].numpy()
        err = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30)
        assert err <= 1e-4, f"{key}: relative error {err:.2e}"
