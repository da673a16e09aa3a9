"""benchmarks/peers.py's machinery on a tiny two-output model: every contender is built
and called for real (neuronish compiles in a subprocess; OpenVINO and NNCF when the
`bench` extra is installed), and the error column must equal the error recomputed
here from the contenders' own answers. Nothing is timed against anything."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "peers.py"
_spec = importlib.util.spec_from_file_location("peers", _PATH)
peers = importlib.util.module_from_spec(_spec)
sys.modules["peers"] = peers  # its dataclasses look their module up while being defined
_spec.loader.exec_module(peers)


def test_int8_flags_follow_what_the_cpu_computes() -> None:
    """int8 leaves float work in bf16 only where the CPU computes bf16 (as OpenVINO's
    default precision does), and asks for 7-bit weights where it has no VNNI."""
    amx = ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8"]
    avx2 = ["avx2"]
    assert peers.neuronish_flags("int8", amx) == peers.NEURONISH_FLAGS["int8"]
    assert peers.neuronish_flags("int8-fp32", amx) == []
    assert peers.neuronish_flags("int8", avx2) == ["--int8-weight-bits", "7"]
    assert peers.neuronish_flags("int8-fp32", avx2) == ["--int8-weight-bits", "7"]
    assert peers.neuronish_flags("int8", ["avx2", "avx_vnni"]) == []
    for precision in ("fp32", "bf16", "bf16-all"):
        assert peers.neuronish_flags(precision, avx2) == peers.NEURONISH_FLAGS[precision]


def test_ran_as_says_when_this_cpu_has_no_kernels_for_the_auto_cast_type() -> None:
    bf16 = peers.NEURONISH_FLAGS["bf16"]
    avx2, avx512 = {"avx2", "fma"}, {"avx2", "avx512f", "avx512bw"}
    assert peers.neuronish_ran_as(False, bf16, avx2).endswith(
        "(bf16 values, float32 compute: no bf16 kernels here)")
    assert peers.neuronish_ran_as(False, bf16, avx512) == " ".join(bf16)
    assert peers.neuronish_ran_as(False, [], avx2) == "float32"
    assert peers.neuronish_ran_as(True, ["--int8-weight-bits", "7"], avx2) == \
        "--quantize int8 --int8-weight-bits 7"


def test_output_errors_are_per_output_and_relative_to_tf() -> None:
    want = {"a": np.array([[1.0, -4.0], [2.0, 0.5]], "float32"), "b": np.ones((2, 3), "float32")}
    got = {"a": want["a"] + np.array([[0.0, 0.0], [0.0, -0.2]], "float32"),
           "b": want["b"] * 1.01}
    errors = peers.output_errors(got, want)
    assert errors["a"] == pytest.approx(0.2 / 4.0, rel=1e-6)   # max |diff| / max |TF|
    assert errors["b"] == pytest.approx(0.01, rel=1e-5)
    assert peers.output_errors({"a": want["a"]}, want)["b"] == math.inf  # missing output
    assert peers.output_errors({"a": want["a"][:1], "b": want["b"]}, want)["a"] == math.inf


def _two_heads(export_dir: str) -> None:
    keras.utils.set_random_seed(3)
    x = keras.Input((16,), name="x")
    h = keras.layers.Dense(64, activation="relu")(x)
    model = keras.Model(x, {"wide": keras.layers.Dense(32)(h), "narrow": keras.layers.Dense(3)(h)})
    model.export(export_dir, verbose=False)


@pytest.fixture(scope="module")
def tiny_rows(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, str, str]:
    base = tmp_path_factory.mktemp("peers")
    src = str(base / "two_heads")
    _two_heads(src)
    workdir = base / "work"
    workdir.mkdir()
    rows, other_cpus = peers.run_model("two_heads", 4, ["fp32", "bf16", "int8"],
                                       ["neuronish", "openvino"], str(workdir), rounds=1,
                                       warmup=1, round_seconds=0.0, calibration_count=4,
                                       saved_model=src)
    assert other_cpus >= 0.0
    return rows, src, str(workdir)


def _row(rows: list, runtime: str, precision: str) -> object:
    (row,) = [r for r in rows if (r.runtime, r.precision) == (runtime, precision)]
    return row


def test_error_column_matches_the_contenders_answers(tiny_rows: tuple) -> None:
    rows, src, workdir = tiny_rows
    signature = tf.saved_model.load(src).signatures["serving_default"]
    feeds = peers.model_inputs("two_heads", signature, 4, seed=0)
    args = {k: tf.constant(v) for k, v in feeds.items()}
    want = {k: v.numpy() for k, v in signature(**args).items()}
    assert set(want) == {"wide", "narrow"}
    assert _row(rows, "tensorflow", "fp32").errors == {"wide": 0.0, "narrow": 0.0}
    for precision in ("fp32", "bf16"):
        compiled = tf.saved_model.load(peers.compiled_dir(workdir, "two_heads", precision, 4))
        got = {k: v.numpy() for k, v in compiled.signatures["serving_default"](**args).items()}
        reported = _row(rows, "neuronish", precision).errors
        for key in want:
            scale = np.max(np.abs(want[key].astype("float64")))
            expected = np.max(np.abs(got[key].astype("float64") - want[key])) / scale
            assert reported[key] == pytest.approx(expected, rel=1e-9, abs=1e-12), key
    # fp32 matches TensorFlow closely; bf16 weights cost visible error, which the column shows
    assert max(_row(rows, "neuronish", "fp32").errors.values()) < 1e-5
    assert max(_row(rows, "neuronish", "bf16").errors.values()) > 1e-4


def test_rows_ratios_and_unavailable_contenders(tiny_rows: tuple) -> None:
    rows, _, _ = tiny_rows
    tf_row = _row(rows, "tensorflow", "fp32")
    assert tf_row.vs_tf == pytest.approx(1.0) and tf_row.throughput > 0
    for r in rows:
        if r.throughput is not None:
            assert r.vs_tf == pytest.approx(r.throughput / tf_row.throughput)
            assert r.latency_ms == pytest.approx(4 / r.throughput * 1000)
    int8 = _row(rows, "neuronish", "int8")
    if not peers.int8_available():
        print("neuronish int8 not measured: saved_model.compile has no quantize=")
        assert int8.throughput is None and "not available" in int8.note
    else:  # quantized from the calibration samples: measured, with a visible error
        assert int8.throughput is not None, int8.note
        assert 0.0 < max(int8.errors.values()) < 0.5
    missing = peers.openvino_available()
    ov = _row(rows, "openvino", "fp32")
    if missing:
        print(f"OpenVINO rows not measured: {missing}")
        assert ov.throughput is None and "not available" in ov.note
        assert _row(rows, "neuronish", "fp32").vs_openvino is None
    else:
        assert max(ov.errors.values()) < 1e-4  # f32 asked for, not OpenVINO's bf16 default
        nx = _row(rows, "neuronish", "fp32")
        assert nx.vs_openvino == pytest.approx(nx.throughput / ov.throughput)
        assert _row(rows, "openvino", "int8").errors.keys() == {"wide", "narrow"}
    table = peers.format_table(rows)
    assert f"narrow {tf_row.errors['narrow']:.1e}, wide" in table
    bf16 = _row(rows, "neuronish", "bf16").errors
    assert f"narrow {bf16['narrow']:.1e}, wide {bf16['wide']:.1e}" in table


class _FreeLength(tf.Module):
    """Token ids of any length: a user's model the zoo does not know."""

    def __init__(self) -> None:
        self.table = tf.Variable(np.random.default_rng(0).standard_normal((50, 16))
                                 .astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="ids")])
    def __call__(self, ids: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.reduce_mean(tf.gather(self.table, ids), axis=1)}


@pytest.fixture(scope="module")
def free_length(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, np.ndarray]:
    base = tmp_path_factory.mktemp("mine")
    module = _FreeLength()
    tf.saved_model.save(module, str(base / "mine"), signatures=module.__call__)
    ids = np.random.default_rng(1).integers(0, 50, (5, 12)).astype(np.int32)
    np.savez(base / "feeds.npz", ids=ids)
    return str(base / "mine"), str(base / "feeds.npz"), ids


def test_a_users_model_is_measured_on_its_own_samples(free_length: tuple, capsys) -> None:  # noqa: ANN001
    src, npz, ids = free_length
    signature = tf.saved_model.load(src).signatures["serving_default"]
    samples = peers.read_samples(npz, signature)
    # batch 4 from row seed*4 on, cycling through the 5 samples
    np.testing.assert_array_equal(peers.model_inputs("mine", signature, 4, 0, samples)["ids"],
                                  ids[:4])
    np.testing.assert_array_equal(peers.model_inputs("mine", signature, 4, 1, samples)["ids"],
                                  ids[[4, 0, 1, 2]])
    # calibration from the last row back: apart from the measured batch where rows allow
    calibration = peers.calibration_samples("mine", signature, 1, samples, 4)
    np.testing.assert_array_equal(calibration[0]["ids"], ids[[4]])
    assert peers.main(["--models", "mine", "--saved-model", f"mine={src}", "--inputs",
                       f"mine={npz}", "--batch", "4", "--precisions", "fp32", "--runtimes",
                       "neuronish", "--quick"]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("| mine | 4 | neuronish | fp32 |")][-1:]
    cells = [c.strip() for c in row.split("|")]
    assert cells[5] and float(cells[9]) < 1e-5, row  # measured, and TensorFlow's numbers


def test_a_users_model_without_what_it_needs_is_refused_by_name(free_length: tuple,
                                                                 tmp_path: Path) -> None:
    src, _, ids = free_length
    signature = tf.saved_model.load(src).signatures["serving_default"]
    with pytest.raises(SystemExit, match=r"mine: input 'ids' has shape \[None, None\], free "
                       r"beyond the batch axis; give samples .* --inputs mine=FEEDS.npz"):
        peers.model_inputs("mine", signature, 4, 0)
    bad = tmp_path / "bad.npz"
    np.savez(bad, tokens=ids)
    with pytest.raises(SystemExit, match=r"has arrays \['tokens'\]; the serving signature's "
                       r"inputs are \['ids'\]"):
        peers.read_samples(str(bad), signature)
    np.savez(bad, ids=ids.astype(np.int64))
    with pytest.raises(SystemExit, match="'ids' is int64; the signature takes int32"):
        peers.read_samples(str(bad), signature)
    with pytest.raises(SystemExit):  # a path for a model not measured: argparse's error
        peers.main(["--models", "ResNet50", "--saved-model", f"mine={src}"])
