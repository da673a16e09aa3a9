"""A convolution adding a residual that nothing reads afterwards writes its output over the
residual's bytes (cc/memory.py `in_place_residual`), and the native engine adds the residual
as oneDNN's `sum` post-op there (engine.cc `Program::in_place`): ResNet's conv + add + relu
blocks. The plan shares only where that is safe, the validators (Python and C) accept exactly
that sharing, and the numbers stay TensorFlow's on both engines, in fp32, bf16 and int8."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_executable
from neuronish.runtime import load
from neuronish.runtime.errors import DeviceError, ExecutableError
from neuronish.runtime.executable import to_bytes
from neuronish.runtime.validate import check_executable
from tests.graphs import trace

RNG = np.random.default_rng(11)
C = 32


def _w(kh: int, ci: int, co: int) -> tf.Tensor:
    return tf.constant(RNG.standard_normal((kh, kh, ci, co)).astype(np.float32)
                       * np.float32(1.0 / np.sqrt(kh * kh * ci)))


def _b(co: int) -> tf.Tensor:
    return tf.constant(RNG.standard_normal(co).astype(np.float32) * np.float32(0.1))


W = {"s": (_w(1, 16, C), _b(C)), "a": (_w(1, C, 8), _b(8)), "b": (_w(3, 8, 8), _b(8)),
     "c": (_w(1, 8, C), _b(C)), "d": (_w(1, C, 8), _b(8)), "e": (_w(1, 8, C), _b(C))}


def _conv(x: tf.Tensor, k: str) -> tf.Tensor:
    w, b = W[k]
    return tf.nn.conv2d(x, w, 1, "SAME") + b


def _model(x: tf.Tensor) -> tf.Tensor:
    """A projection block (its shortcut a 1x1 conv) and an identity block, as in ResNet;
    then a third conv + add whose shortcut is read again afterwards (no sharing there)."""
    s = _conv(x, "s")
    h = tf.nn.relu(_conv(tf.nn.relu(_conv(tf.nn.relu(_conv(s, "a")), "b")), "c") + s)
    h2 = tf.nn.relu(_conv(tf.nn.relu(_conv(h, "d")), "e") + h)
    return tf.nn.relu(_conv(tf.nn.relu(_conv(h2, "d")), "e") + h2) * h2


def _graph(batch: int = 2) -> object:
    return trace(_model, tf.TensorSpec([None, 12, 12, 16], tf.float32, name="x"), batch=batch)


def _residual_convs(exe: object) -> list[tuple[object, bool]]:
    """Each conv adding a residual, and whether its output sits on the residual's bytes."""
    flat = [i for p in exe.programs for i in p]
    return [(i, i.inputs[-1] in exe.offsets and i.outputs[0] in exe.offsets
             and exe.offsets[i.inputs[-1]] == exe.offsets[i.outputs[0]])
            for i in flat if i.kind in ("conv2d", "conv2d_int8") and i.attrs.get("residual")]


def _inputs(batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 12, 12, 16)).astype(np.float32)


@pytest.mark.parametrize("options", [{}, {"auto_cast": "matmult"}], ids=["fp32", "bf16"])
def test_the_plan_shares_only_a_residual_nothing_reads_after(options: dict) -> None:
    g = _graph()
    exe = compile_executable(g.graph_def, g.io_config, **options)
    shared = [s for _, s in _residual_convs(exe)]
    # the projection and identity blocks share; the last add's shortcut is read after it
    assert shared == [True, True, False], [(i.kind, i.inputs, i.outputs)
                                            for i, _ in _residual_convs(exe)]
    check_executable(exe)


@pytest.mark.parametrize("runtime", ["python-numpy", "python-native", "c"])
@pytest.mark.parametrize("options", [{}, {"auto_cast": "matmult"}], ids=["fp32", "bf16"])
def test_in_place_residuals_match_tensorflow(runtime: str, options: dict,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if runtime == "python-numpy":
        monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
    g = _graph(3)
    exe = compile_executable(g.graph_def, g.io_config, **options)
    assert [s for _, s in _residual_convs(exe)] == [True, True, False]
    x = _inputs(3, 0)
    want = g.reference({"x:0": x})
    with load(to_bytes(exe), runtime="c" if runtime == "c" else "python") as model:
        got = model.run({"x:0": x})
    # bf16 rounds every value between the convolutions: 2^-9 relative, a few times over
    tol = dict(rtol=1e-5, atol=1e-5) if not options else dict(rtol=0, atol=3e-2)
    for key, w in want.items():
        scale = 1.0 if not options else float(np.max(np.abs(w)))
        np.testing.assert_allclose(got[key] / scale, w / scale, **tol)


def test_int8_in_place_residuals_agree_on_both_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """int8: the shortcut passes 8 bits (u8, or s8 from the projection) into the next
    block's residual, which the native engine adds as a sum post-op at the shortcut's step;
    the numpy kernels define the result (docs/int8.md), and the native one must agree."""
    g = _graph(2)
    calibration = [[_inputs(2, 100 + k)] for k in range(4)]
    exe = compile_executable(g.graph_def, g.io_config, calibration=calibration,
                             auto_cast="matmult")
    convs = _residual_convs(exe)
    assert [i.kind for i, _ in convs] == ["conv2d_int8"] * 3
    # the second block's output is read by float32 code too (the last multiply), so it is
    # written in bf16 over an 8-bit residual: a different size, no sharing
    assert [s for _, s in convs] == [True, False, False]
    assert {exe.values[i.inputs[-1]][1] for i, s in convs if s} <= {"uint8", "int8"}
    x = _inputs(2, 7)
    outs = {}
    for engine in ("numpy", "native"):
        monkeypatch.setenv("NEURONISH_ENGINE", engine)
        with load(to_bytes(exe), runtime="python") as model:
            outs[engine] = model.run({"x:0": x})
    want = g.reference({"x:0": x})
    for key, w in want.items():
        scale = float(np.max(np.abs(w)))
        # native against the int8 definition: float32 rounding and rare requantization ties
        np.testing.assert_allclose(outs["native"][key] / scale, outs["numpy"][key] / scale,
                                   rtol=0, atol=2e-2)
        # and int8 against TensorFlow's float32: within int8's error on this small net
        assert np.max(np.abs(outs["native"][key] - w)) / scale < 0.1


def _shared_then_read_again(exe: object) -> object:
    """`exe` with the last residual conv's output moved onto its shortcut's bytes, while
    the shortcut is still read after it (by the final multiply)."""
    i, shared = _residual_convs(exe)[-1]
    assert not shared
    offsets = {**exe.offsets, i.outputs[0]: exe.offsets[i.inputs[-1]]}
    return dataclasses.replace(exe, offsets=offsets)


def test_validators_refuse_a_residual_overwritten_while_still_to_be_read() -> None:
    g = _graph()
    exe = compile_executable(g.graph_def, g.io_config)
    bad = _shared_then_read_again(exe)
    with pytest.raises(ExecutableError, match=r"puts .* over .*while both are in use"):
        check_executable(bad)
    with pytest.raises(DeviceError, match=r"puts .* over .*while both are in use"):
        load(to_bytes(bad), runtime="c")
