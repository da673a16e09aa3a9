"""int8 post-training quantization (docs/int8.md).

- the int8 instructions on both engines against an independent reference (TensorFlow's
  float64 convolution of the integer operands, then the documented epilogue), and the
  native engine against the numpy one;
- neuronish-cc --quantize int8 as a subprocess: the calibration file, its errors, the
  per-instruction report, `max_error`;
- a small CNN trained here on scikit-learn's digits keeps its accuracy within 1 point.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc import host
from neuronish.cc.compiler import compile_executable
from neuronish.runtime import load
from neuronish.runtime.executable import from_bytes, to_bytes
from neuronish.runtime.kernels import evaluate
from neuronish.runtime.native import library
from neuronish.runtime.program import evaluate_one
from tests.graphs import trace

RNG = np.random.default_rng(7)
WINDOW = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1]}


def _rint_sat(v: np.ndarray, dtype: str) -> np.ndarray:
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    return np.clip(np.rint(v), lo, hi).astype(dtype)


def _epilogue(acc: np.ndarray, scale: np.ndarray, extras: list, attrs: dict) -> np.ndarray:
    """The documented semantics, written out independently of the kernels."""
    v = acc.astype(np.float32) * scale
    for e in extras:
        v = v + e
    if attrs.get("activation") == "relu":
        v = np.maximum(v, 0)
    elif attrs.get("activation") == "relu6":
        v = np.clip(v, 0, 6)
    if attrs.get("out", "float32") == "float32":
        return v.astype(np.float32)
    if attrs["out"] == "bfloat16":  # rounded once, to nearest even
        return v.astype(np.float32).astype(ml_dtypes.bfloat16)
    return _rint_sat(v * np.float32(1.0 / attrs["y_scale"]), attrs["out"])


def _conv_reference(x: np.ndarray, w: np.ndarray, ws: np.ndarray, extras: list,
                    attrs: dict) -> np.ndarray:
    top, bottom, left, right = attrs["pads"]
    acc = tf.nn.conv2d(x.astype(np.float64), w.astype(np.float64), [1, *attrs["strides"], 1],
                       [[0, 0], [top, bottom], [left, right], [0, 0]],
                       dilations=[1, *attrs["dilations"], 1]).numpy()
    return _epilogue(acc, np.float32(attrs["x_scale"]) * ws, extras, attrs)


def _both_engines(kind: str, inputs: list[np.ndarray], attrs: dict, out_type: tuple
                  ) -> dict[str, np.ndarray]:
    out = {"numpy": evaluate(kind, inputs, attrs, [out_type])[0]}
    lib = library.load()
    assert lib is not None, library.why_not()
    got, engine = evaluate_one(kind, inputs, attrs, [out_type], native=lib, threads=2,
                               constant=frozenset({1, 2}) if kind != "quantize" else frozenset())
    assert engine == "native", f"{kind} {attrs} did not run natively"
    out["native"] = got[0]
    return out


def _agree(got: np.ndarray, want: np.ndarray) -> None:
    """Float outputs to float32 rounding (oneDNN may fuse the scale and bias into one FMA);
    8-bit outputs exactly but for a rare ±1 where that rounding lands on a tie."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.name == "bfloat16":  # (a float32 rounding apart can cross a bf16 tie)
        g, w = got.astype(np.float32), want.astype(np.float32)
        np.testing.assert_allclose(g, w, rtol=2.0 ** -8, atol=1e-6 * np.abs(w).max())
        assert np.mean(g != w) < 1e-3
    elif got.dtype == np.float32:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    else:
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1 and np.mean(diff) < 1e-3, (diff.max(), np.mean(diff))


@pytest.mark.parametrize("to", ["uint8", "int8"])
def test_quantize_rounds_half_to_even_and_saturates(to: str) -> None:
    x = np.array([-300, -128.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 126.5, 127.5, 254.5, 255.5,
                  1e9], np.float32)
    want = _rint_sat(x.astype(np.float64), to)
    assert list(_rint_sat(np.array([0.5, 1.5, 2.5]), to)) == [0, 2, 2]
    for engine, got in _both_engines("quantize", [x], {"scale": 1.0, "to": to},
                                     (x.shape, to)).items():
        np.testing.assert_array_equal(got, want, err_msg=engine)
    # A step that is not a power of two: one multiply by float32(1/scale).
    x = RNG.standard_normal((4, 33)).astype(np.float32) * 3
    want = _rint_sat(x * np.float32(1 / 0.037), to)
    for engine, got in _both_engines("quantize", [x], {"scale": 0.037, "to": to},
                                     (x.shape, to)).items():
        np.testing.assert_array_equal(got, want, err_msg=engine)


@pytest.mark.parametrize("shape", [(3, 50), (5, 40011)])  # (the second: many threads' chunks)
def test_quantize_reads_bfloat16_as_its_float32_value(shape: tuple) -> None:
    x = (RNG.standard_normal(shape) * 4).astype(ml_dtypes.bfloat16)
    want = _rint_sat(x.astype(np.float32) * np.float32(1 / 0.031), "int8")
    for engine, got in _both_engines("quantize", [x], {"scale": 0.031, "to": "int8"},
                                     (x.shape, "int8")).items():
        np.testing.assert_array_equal(got, want, err_msg=engine)


@pytest.mark.parametrize("x_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("out", ["float32", "bfloat16", "uint8", "int8"])
@pytest.mark.parametrize("case", ["bias_relu", "strided_dilated", "residual",
                                  "residual_uint8"])
def test_conv2d_int8_matches_reference(x_dtype: str, out: str, case: str) -> None:
    lo, hi = (0, 256) if x_dtype == "uint8" else (-128, 128)
    x = RNG.integers(lo, hi, (2, 9, 10, 24)).astype(x_dtype)
    w = RNG.integers(-127, 128, (3, 3, 24, 32)).astype(np.int8)
    ws = RNG.uniform(0.5, 2, 32).astype(np.float32) * 1e-3
    bias = RNG.standard_normal(32).astype(np.float32)
    attrs = {**WINDOW, "x_scale": 0.02, "out": out, "y_scale": 0.05}
    extras = [bias]
    if case == "bias_relu":
        attrs["activation"] = "relu"
    elif case == "strided_dilated":
        attrs.update(strides=[2, 1], dilations=[1, 2], pads=[0, 1, 2, 2])
    if case == "residual":
        attrs["residual"] = True
        extras.append(RNG.standard_normal((2, 9, 10, 32)).astype(np.float32))
    inputs = list(extras)
    if case == "residual_uint8":  # a quantized shortcut adds r * residual_scale
        attrs.update(residual=True, residual_scale=0.03, activation="relu")
        r = RNG.integers(0, 256, (2, 9, 10, 32)).astype(np.uint8)
        inputs.append(r)
        extras.append(r.astype(np.float32) * np.float32(0.03))
    want = _conv_reference(x, w, ws, extras, attrs)
    for got in _both_engines("conv2d_int8", [x, w, ws, *inputs], attrs,
                             (want.shape, out)).values():
        _agree(got, want)


@pytest.mark.parametrize("x_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("out", ["float32", "bfloat16", "uint8"])
@pytest.mark.parametrize("mult,strides", [(1, [1, 1]), (1, [2, 2]), (2, [1, 1])])
def test_depthwise_conv2d_int8_matches_reference(x_dtype: str, out: str, mult: int,
                                                 strides: list) -> None:
    lo, hi = (0, 256) if x_dtype == "uint8" else (-128, 128)
    x = RNG.integers(lo, hi, (2, 9, 10, 24)).astype(x_dtype)
    w = RNG.integers(-127, 128, (3, 3, 24, mult)).astype(np.int8)
    ws = RNG.uniform(0.5, 2, 24 * mult).astype(np.float32) * 1e-2
    bias = RNG.standard_normal(24 * mult).astype(np.float32)
    attrs = {**WINDOW, "strides": strides, "x_scale": 0.02, "out": out, "y_scale": 0.05,
             "depthwise": True, "activation": "relu6"}
    acc = tf.nn.depthwise_conv2d(x.astype(np.float64), w.astype(np.float64),
                                 [1, *strides, 1], [[0, 0], [1, 1], [1, 1], [0, 0]]).numpy()
    want = _epilogue(acc, np.float32(0.02) * ws, [bias], attrs)
    for got in _both_engines("conv2d_int8", [x, w, ws, bias], attrs,
                             (want.shape, out)).values():
        _agree(got, want)


@pytest.mark.parametrize("out", ["float32", "bfloat16", "uint8"])
@pytest.mark.parametrize("residual", [False, True])
def test_matmul_int8_matches_reference(out: str, residual: bool) -> None:
    a = RNG.integers(0, 256, (3, 5, 40)).astype(np.uint8)
    b = RNG.integers(-127, 128, (40, 24)).astype(np.int8)
    ws = RNG.uniform(0.5, 2, 24).astype(np.float32) * 1e-3
    bias = RNG.standard_normal(24).astype(np.float32)
    attrs = {"a_scale": 0.01, "activation": "relu", "out": out, "y_scale": 0.01,
             "residual": residual}
    extras = [bias]
    if residual:  # (a transformer's residual stream: float32, added after the bias)
        extras.append(RNG.standard_normal((3, 5, 24)).astype(np.float32))
    acc = a.astype(np.float64) @ b.astype(np.float64)
    want = _epilogue(acc, np.float32(0.01) * ws, extras, attrs)
    for _, got in _both_engines("matmul_int8", [a, b, ws, *extras], attrs,
                                (want.shape, out)).items():
        _agree(got, want)


def test_isa_refuses_bad_int8_instructions() -> None:
    from neuronish.runtime import isa

    t = isa.Type
    with pytest.raises(isa.IsaError, match="w_scale must be float32\\[8\\]"):
        isa.check("conv2d_int8", [t((1, 4, 4, 3), "uint8"), t((1, 1, 3, 8), "int8"),
                                  t((3,), "float32")], {**WINDOW, "x_scale": 1.0})
    with pytest.raises(isa.IsaError, match="x_scale"):
        isa.check("conv2d_int8", [t((1, 4, 4, 3), "uint8"), t((1, 1, 3, 8), "int8"),
                                  t((8,), "float32")], {**WINDOW, "x_scale": 0.0})
    with pytest.raises(isa.IsaError, match="int8 operands"):
        isa.check("matmul_int8", [t((4, 3), "float32"), t((3, 8), "int8"),
                                  t((8,), "float32")], {"a_scale": 1.0})
    with pytest.raises(isa.IsaError, match="residual must be float32"):
        isa.check("matmul_int8", [t((4, 3), "uint8"), t((3, 8), "int8"), t((8,), "float32"),
                                  t((4, 8), "uint8")], {"a_scale": 1.0, "residual": True})
    with pytest.raises(isa.IsaError, match="quantize takes float32 or bfloat16"):
        isa.check("quantize", [t((4, 3), "int32")], {"scale": 1.0, "to": "int8"})


# --- the compiler ------------------------------------------------------------------------------

def _small_cnn():  # noqa: ANN202
    """conv-relu -> conv-relu -> conv + residual -> mean -> dense: a chain (8 bits between
    two convolutions), a value read by a conv and a residual (float32), a matmul."""
    rng = np.random.default_rng(0)
    w1 = tf.constant(rng.standard_normal((3, 3, 3, 16)).astype(np.float32) * 0.3)
    w2 = tf.constant(rng.standard_normal((3, 3, 16, 16)).astype(np.float32) * 0.1)
    w3 = tf.constant(rng.standard_normal((3, 3, 16, 16)).astype(np.float32) * 0.1)
    wd = tf.constant(rng.standard_normal((16, 10)).astype(np.float32) * 0.3)
    b = tf.constant(rng.standard_normal(16).astype(np.float32) * 0.1)

    def fn(x: tf.Tensor) -> tf.Tensor:
        y = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME") + b)
        z = tf.nn.relu(tf.nn.conv2d(y, w2, 1, "SAME"))
        z = tf.nn.relu(tf.nn.conv2d(z, w3, 1, "SAME") + y)
        return tf.matmul(tf.reduce_mean(z, axis=[1, 2]), wd)

    return trace(fn, tf.TensorSpec([None, 8, 8, 3], tf.float32, name="x"), batch=4)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_cli_quantizes_with_a_calibration_file(tmp_path: Path) -> None:
    g = _small_cnn()
    (tmp_path / "g.pb").write_bytes(g.graph_def)
    calib = RNG.standard_normal((6, 4, 8, 8, 3)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", **{"x:0": calib})
    cmd = [sys.executable, "-m", "neuronish.cc.cli", "compile", str(tmp_path / "g.pb"),
           "--framework", "TENSORFLOW", "--io-config", json.dumps(g.io_config),
           "--output", str(tmp_path / "int8.neff")]
    done = subprocess.run([*cmd, "--quantize", "int8", "--calibration",
                           str(tmp_path / "calib.npz")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    exe = from_bytes((tmp_path / "int8.neff").read_bytes())
    kinds = [i.kind for i in exe.programs[0]]
    # One quantize per float edge: the input, the mean in front of the dense layer; the
    # convolutions pass uint8 on, to the next one's input and to the residual alike.
    assert kinds.count("quantize") == 2 and kinds.count("conv2d_int8") == 3, kinds
    assert "matmul_int8" in kinds and "conv2d" not in kinds, kinds
    convs = [i for i in exe.programs[0] if i.kind == "conv2d_int8"]
    assert [i.attrs["out"] for i in convs] == ["uint8", "uint8", "float32"]
    assert convs[2].attrs["residual_scale"] == convs[1].attrs["x_scale"]
    q = exe.stats["quantization"]
    assert q["samples"] == 6 and len(q["instructions"]) == 4
    assert all(r["precision"] == "int8" and 0 < r["error"] < 0.05 for r in q["instructions"])
    x = RNG.standard_normal((4, 8, 8, 3)).astype(np.float32)
    with load(tmp_path / "int8.neff") as model:
        got = model.run({"x:0": x})
    for name, want in g.reference({"x:0": x}).items():
        assert 0 < _rel(got[name], want) < 0.03, _rel(got[name], want)
    shown = subprocess.run([sys.executable, "-m", "neuronish.cc.cli", "inspect",
                            str(tmp_path / "int8.neff")], capture_output=True, text=True)
    assert "conv2d_int8 x3" in shown.stdout and "int8: 4 of 4" in shown.stdout, shown.stdout

    # Bad calibration files are bad usage (exit 2), naming what is wrong.
    np.savez(tmp_path / "wrong.npz", y=calib)
    bad = subprocess.run([*cmd, "--quantize", "int8", "--calibration",
                          str(tmp_path / "wrong.npz")], capture_output=True, text=True)
    assert bad.returncode == 2 and "no array for input(s) ['x:0']" in bad.stderr, bad.stderr
    np.savez(tmp_path / "shape.npz", **{"x:0": calib[:, :2]})
    bad = subprocess.run([*cmd, "--quantize", "int8", "--calibration",
                          str(tmp_path / "shape.npz")], capture_output=True, text=True)
    assert bad.returncode != 0 and "compiled for [4, 8, 8, 3]" in bad.stderr, bad.stderr
    bad = subprocess.run([*cmd, "--quantize", "int8"], capture_output=True, text=True)
    assert bad.returncode == 2 and "needs --calibration" in bad.stderr


def test_max_error_keeps_the_costliest_in_float32() -> None:
    g = _small_cnn()
    calib = [[RNG.standard_normal((4, 8, 8, 3)).astype(np.float32)] for _ in range(4)]
    free = compile_executable(g.graph_def, g.io_config, calibration=calib)
    q = free.stats["quantization"]
    bound = q["all_int8_error"] / 2
    held = compile_executable(g.graph_def, g.io_config, calibration=calib, max_error=bound)
    h = held.stats["quantization"]
    assert h["output_error"] <= bound < h["all_int8_error"]
    kept = [r for r in h["instructions"] if r["precision"] == "float32"]
    int8 = [r for r in h["instructions"] if r["precision"] == "int8"]
    assert kept and all(r["why"].startswith("kept") for r in kept)
    # what stays in float32 is what costs most
    assert min(r["error"] for r in kept) >= max((r["error"] for r in int8), default=0)
    # ...and the bound holds for the compiled program on the device, on those samples
    with load(to_bytes(held)) as model, \
            load(to_bytes(compile_executable(g.graph_def, g.io_config))) as fp32:
        for (x,) in calib:
            got, want = model.run({"x:0": x}), fp32.run({"x:0": x})
            for k in want:
                assert _rel(got[k], want[k]) <= bound * 1.01
    # --auto-cast applies to what int8 left in float32
    mixed = compile_executable(g.graph_def, g.io_config, calibration=calib, max_error=bound,
                               auto_cast="matmult")
    assert {r["precision"] for r in mixed.stats["quantization"]["instructions"]} <= \
        {"int8", "bfloat16"}


def test_seven_bit_weights_stay_in_the_range_int16_sums_hold(tmp_path: Path) -> None:
    """--int8-weight-bits 7: every weight in [-64, 64] (oneDNN's int8 kernels are exact
    with them without VNNI), steps of max |w| / 64, accuracy close to 8 bits'."""
    g = _small_cnn()
    calib = [[RNG.standard_normal((4, 8, 8, 3)).astype(np.float32)] for _ in range(4)]
    eight = compile_executable(g.graph_def, g.io_config, calibration=calib)
    seven = compile_executable(g.graph_def, g.io_config, calibration=calib, int8_weight_bits=7)
    assert seven.compiler["options"]["int8_weight_bits"] == 7
    assert "int8_weight_bits" not in eight.compiler["options"]
    assert seven.stats["quantization"]["weight_bits"] == 7

    def weights(exe) -> list[np.ndarray]:  # noqa: ANN001
        return [exe.constants[i.inputs[1]] for i in exe.programs[0]
                if i.kind in ("conv2d_int8", "matmul_int8")]

    for w7, w8 in zip(weights(seven), weights(eight), strict=True):
        assert w7.min() >= -64 and w7.max() <= 64 and np.abs(w7).max() == 64
        assert np.abs(w8).max() == 127
    x = RNG.standard_normal((4, 8, 8, 3)).astype(np.float32)
    want = g.reference({"x:0": x})
    with load(to_bytes(seven)) as m7, load(to_bytes(eight)) as m8:
        got7, got8 = m7.run({"x:0": x}), m8.run({"x:0": x})
    for k, w in want.items():
        assert _rel(got7[k], w) < max(3 * _rel(got8[k], w), 0.01), (_rel(got7[k], w),
                                                                    _rel(got8[k], w))
    (tmp_path / "g.pb").write_bytes(g.graph_def)
    np.savez(tmp_path / "calib.npz", **{"x:0": np.stack([c[0] for c in calib])})
    cmd = [sys.executable, "-m", "neuronish.cc.cli", "compile", str(tmp_path / "g.pb"),
           "--framework", "TENSORFLOW", "--io-config", json.dumps(g.io_config),
           "--output", str(tmp_path / "int8.neff"), "--int8-weight-bits", "7"]
    bad = subprocess.run(cmd, capture_output=True, text=True)
    assert bad.returncode == 2 and "--int8-weight-bits need --quantize int8" in bad.stderr, \
        bad.stderr
    done = subprocess.run([*cmd, "--quantize", "int8", "--calibration",
                           str(tmp_path / "calib.npz")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    shown = subprocess.run([sys.executable, "-m", "neuronish.cc.cli", "inspect",
                            str(tmp_path / "int8.neff")], capture_output=True, text=True)
    assert "7-bit weights" in shown.stdout, shown.stdout
    # Full 8-bit weights on a CPU without VNNI: the report says they compute in float32
    # there, and what to do; with 7 bits (or VNNI) it has nothing to say.
    vnni = bool({"avx512_vnni", "avx_vnni"} & host.cpu_flags())
    note = eight.stats["quantization"].get("note", "")
    assert ("--int8-weight-bits 7" in note) == (not vnni), note
    assert "note" not in seven.stats["quantization"]


def _int8_next_to_floats():  # noqa: ANN202
    """conv-relu -> average pool -> conv -> mean -> dense -> dense + residual: int8
    regions with float instructions between them, and a matmul adding a residual. (A
    max pool would pass 8 bits on: tests/runtime/test_int8_max_pool.py.)"""
    rng = np.random.default_rng(1)
    w1 = tf.constant(rng.standard_normal((3, 3, 3, 16)).astype(np.float32) * 0.3)
    w2 = tf.constant(rng.standard_normal((3, 3, 16, 16)).astype(np.float32) * 0.1)
    wd = tf.constant(rng.standard_normal((16, 32)).astype(np.float32) * 0.3)
    we = tf.constant(rng.standard_normal((32, 32)).astype(np.float32) * 0.2)

    def fn(x: tf.Tensor) -> tf.Tensor:
        y = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME"))
        z = tf.nn.conv2d(tf.nn.avg_pool2d(y, 2, 2, "VALID"), w2, 1, "SAME")
        h = tf.matmul(tf.reduce_mean(z, axis=[1, 2]), wd)
        return tf.matmul(h, we) + h

    return trace(fn, tf.TensorSpec([None, 8, 8, 3], tf.float32, name="x"), batch=4)


def test_int8_with_auto_cast_writes_bf16_at_its_edges(monkeypatch) -> None:  # noqa: ANN001
    """With --auto-cast to bf16 the float instructions between int8 regions run in bf16,
    with no float32 value and conversion at an edge: an int8 instruction dequantizes
    straight to bf16, a quantize reads bf16; what is added as a residual, and the graph's
    outputs, stay float32. Both engines agree and the answer stays near TensorFlow's."""
    g = _int8_next_to_floats()
    rng = np.random.default_rng(11)  # (its own: the error depends on the samples drawn)
    calib = [[rng.standard_normal((4, 8, 8, 3)).astype(np.float32)] for _ in range(6)]
    exe = compile_executable(g.graph_def, g.io_config, calibration=calib, auto_cast="matmult")
    prog = exe.programs[0]
    kinds = [i.kind for i in prog]
    assert kinds.count("conv2d_int8") == 2 and kinds.count("matmul_int8") == 2, kinds
    assert "cast" not in kinds, kinds
    conv1, conv2 = [i for i in prog if i.kind == "conv2d_int8"]
    dense, dense_res = [i for i in prog if i.kind == "matmul_int8"]
    assert conv1.attrs["out"] == "bfloat16" and conv2.attrs["out"] == "bfloat16"
    assert dense.attrs["out"] == "float32"  # (added as the next one's residual)
    assert dense_res.attrs["residual"] and dense_res.attrs["out"] == "float32"
    pool = next(i for i in prog if i.kind == "pool")
    assert exe.values[pool.outputs[0]][1] == "bfloat16"
    x = rng.standard_normal((4, 8, 8, 3)).astype(np.float32)
    want = g.reference({"x:0": x})
    results = {}
    for engine in ("numpy", "native"):
        monkeypatch.setenv("NEURONISH_ENGINE", engine)
        with load(to_bytes(exe)) as model:
            results[engine] = model.run({"x:0": x})
    for k, v in want.items():  # (int8 with bf16 between: a few percent)
        print("int8 + bf16 error vs TF", _rel(results["numpy"][k], v))
        assert _rel(results["numpy"][k], v) < 0.06, _rel(results["numpy"][k], v)
        np.testing.assert_allclose(results["native"][k], results["numpy"][k], rtol=1e-2,
                                   atol=1e-2 * np.abs(v).max())


def test_an_inverted_residual_block_stays_8_bit() -> None:
    """MobileNetV2's block: expand 1x1 (relu6) -> depthwise 3x3 (relu6) -> project 1x1 +
    the block's input. The depthwise conv is int8 too, so one quantize (the input) starts
    the region and only the project conv dequantizes; the answer stays near TF's."""
    rng = np.random.default_rng(2)
    we = tf.constant(rng.standard_normal((1, 1, 8, 24)).astype(np.float32) * 0.4)
    wd = tf.constant(rng.standard_normal((3, 3, 24, 1)).astype(np.float32) * 0.3)
    wp = tf.constant(rng.standard_normal((1, 1, 24, 8)).astype(np.float32) * 0.2)

    def fn(x: tf.Tensor) -> tf.Tensor:
        h = tf.nn.relu6(tf.nn.conv2d(x, we, 1, "SAME"))
        h = tf.nn.relu6(tf.nn.depthwise_conv2d(h, wd, [1, 1, 1, 1], "SAME"))
        return tf.nn.conv2d(h, wp, 1, "SAME") + x

    g = trace(fn, tf.TensorSpec([None, 6, 6, 8], tf.float32, name="x"), batch=4)
    calib = [[rng.standard_normal((4, 6, 6, 8)).astype(np.float32)] for _ in range(4)]
    exe = compile_executable(g.graph_def, g.io_config, calibration=calib)
    kinds = [i.kind for i in exe.programs[0]]
    assert kinds == ["quantize", "conv2d_int8", "conv2d_int8", "conv2d_int8"], kinds
    expand, dw, project = exe.programs[0][1:]
    assert dw.attrs["depthwise"] and not expand.attrs["depthwise"]
    assert [i.attrs["out"] for i in (expand, dw, project)] == ["uint8", "uint8", "float32"]
    x = rng.standard_normal((4, 6, 6, 8)).astype(np.float32)
    with load(to_bytes(exe)) as model:
        got = model.run({"x:0": x})
    for name, want in g.reference({"x:0": x}).items():
        assert _rel(got[name], want) < 0.03, _rel(got[name], want)


def test_native_and_numpy_engines_agree_on_a_quantized_model(monkeypatch) -> None:  # noqa: ANN001
    g = _small_cnn()
    calib = [[RNG.standard_normal((4, 8, 8, 3)).astype(np.float32)] for _ in range(2)]
    blob = to_bytes(compile_executable(g.graph_def, g.io_config, calibration=calib))
    x = RNG.standard_normal((4, 8, 8, 3)).astype(np.float32)
    results = {}
    for engine in ("numpy", "native"):
        monkeypatch.setenv("NEURONISH_ENGINE", engine)
        with load(blob, runtime="python") as model:
            results[engine] = model.run({"x:0": x})
            if engine == "native":
                program = model._idle.get()
                model._idle.put(program)
                impls = program.implementations()
                assert len(impls) == len(from_bytes(blob).programs[0]), impls
                assert not [v for v in impls.values() if v.startswith("ref")], impls
    for k, v in results["numpy"].items():
        np.testing.assert_allclose(results["native"][k], v, rtol=1e-5, atol=1e-5 * np.abs(v).max())


# --- a real task ---------------------------------------------------------------------------------

def _digits_model(directory: Path):  # noqa: ANN202
    """A small CNN trained on scikit-learn's 8x8 digits (a few seconds), exported."""
    sklearn = pytest.importorskip("sklearn.datasets", reason="scikit-learn (the test extra) "
                                  "holds the digits data set")
    digits = sklearn.load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    split = 1200
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 1), name="image"),
        tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(2),
        tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[:split], y[:split], epochs=8, batch_size=32, verbose=0)
    model.export(str(directory), verbose=False)
    return x[:split], x[split:], y[split:]


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray,
                                                               np.ndarray]:
    directory = tmp_path_factory.mktemp("int8") / "digits"
    return (directory, *_digits_model(directory))


def test_digits_cnn_keeps_its_accuracy_in_int8(digits: tuple, tmp_path: Path) -> None:
    import neuronish.saved_model

    source, train, test_x, test_y = digits
    original = tf.saved_model.load(str(source)).signatures["serving_default"]
    key = next(iter(original.structured_input_signature[1]))
    calibration = [{key: train[i:i + 32]} for i in range(0, 256, 32)]
    report = neuronish.saved_model.compile(str(source), str(tmp_path / "int8"),
                                           batch_size=32, quantize="int8",
                                           calibration_data=calibration, verify=True)
    (verdict,) = report["verification"]
    (op,) = report["NeuronOps"]  # judged by its calibrated error, not float rounding
    assert verdict["passed"] and verdict["auto_cast"] == "int8", verdict
    q = op["quantization"]
    assert q["samples"] == 8 and {r["precision"] for r in q["instructions"]} == {"int8"}
    assert len(q["instructions"]) == 5  # three convolutions, two dense layers
    assert "int8 on 8 calibration sample(s)" in neuronish.saved_model.format_report(report)
    compiled = tf.saved_model.load(str(tmp_path / "int8")).signatures["serving_default"]

    def accuracy(fn) -> float:  # noqa: ANN001
        logits = next(iter(fn(**{key: tf.constant(test_x)}).values())).numpy()
        return float(np.mean(np.argmax(logits, axis=1) == test_y))

    fp32, int8 = accuracy(original), accuracy(compiled)
    print(f"digits: {len(test_y)} test images, accuracy TF fp32 {fp32:.4f}, int8 {int8:.4f}")
    assert fp32 > 0.9, fp32  # the model did learn
    assert abs(int8 - fp32) <= 0.01, (fp32, int8)
    # ...and it ran in int8: its logits differ from TF's by the quantization error
    want = next(iter(original(**{key: tf.constant(test_x)}).values())).numpy()
    got = next(iter(compiled(**{key: tf.constant(test_x)}).values())).numpy()
    assert 1e-4 < _rel(got, want) < 0.05, _rel(got, want)


def test_compile_refuses_quantize_without_calibration(tmp_path: Path) -> None:
    import neuronish.saved_model
    from neuronish.errors import SavedModelError

    (tmp_path / "m").mkdir()  # (checked before the model is read)
    model, out = str(tmp_path / "m"), str(tmp_path / "out")
    with pytest.raises(SavedModelError, match="needs calibration_data"):
        neuronish.saved_model.compile(model, out, quantize="int8")
    with pytest.raises(SavedModelError, match="must be None or 'int8'"):
        neuronish.saved_model.compile(model, out, quantize="int4")
    with pytest.raises(SavedModelError, match="need quantize='int8'"):
        neuronish.saved_model.compile(model, out, max_error=0.1)


def test_neuronish_cli_compiles_int8_from_a_calibration_file(digits: tuple,
                                                             tmp_path: Path) -> None:
    source, train, _, _ = digits
    key = next(iter(tf.saved_model.load(str(source)).signatures["serving_default"]
                    .structured_input_signature[1]))
    np.savez(tmp_path / "calib.npz", **{key: train[:100]})  # 100 rows: 3 calls of 32 + 4
    cmd = [sys.executable, "-m", "neuronish.cli", "compile", str(source),
           str(tmp_path / "out"), "--batch-size", "32", "--quantize", "int8",
           "--calibration-data", str(tmp_path / "calib.npz"), "--max-error", "0.5", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    q = report["NeuronOps"][0]["quantization"]
    assert q["samples"] == 3 and q["max_error"] == 0.5 and q["output_error"] <= 0.5
    np.savez(tmp_path / "bad.npz", nothing=train[:4])
    bad = subprocess.run([*cmd[:5], str(tmp_path / "out2"), *cmd[6:8], "--quantize", "int8",
                          "--calibration-data", str(tmp_path / "bad.npz")],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and f"no value for input(s) ['{key}']" in bad.stderr, bad.stderr
