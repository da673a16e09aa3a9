"""`neuronish benchmark` on small plain SavedModels (run as a user would, in a
subprocess), its errors, its input generator, and the progress bar it draws.
Speed is never asserted: these machines are shared."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from models.cache import cached_saved_model
from neuronish.benchmark import BenchmarkError, main, make_inputs
from neuronish.progress import ProgressBar, format_seconds


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuronish.benchmark", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def mlp_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The mlp SavedModel and a copy of it (standing in for its compiled twin)."""
    original = cached_saved_model("mlp")
    copy = tmp_path_factory.mktemp("models") / "mlp_copy"
    shutil.copytree(original, copy)
    return original, str(copy)


ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*(\S*)$")


def test_compare_prints_a_row_per_model_batch_and_concurrency(mlp_pair: tuple[str, str]) -> None:
    first, other = mlp_pair
    r = bench(first, "--compare", other, "--batch-size", "1", "4", "--concurrency", "1", "2",
              "--duration", "0.5", "--warmup", "1")
    assert r.returncode == 0, r.stderr
    rows = [m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m]
    first_label, other_label = Path(first).name, "mlp_copy"
    expected = [(b, c, label) for b in ("1", "4") for c in ("1", "2")
                for label in (first_label, other_label)]
    assert [row[:3] for row in rows] == expected, r.stdout
    for row in rows:
        requests, throughput, p50, p99, ratio = int(row[3]), *map(float, row[4:7]), row[7]
        assert requests >= 1 and throughput > 0 and 0 < p50 <= p99
        if row[2] == first_label:
            assert ratio == ""
        else:
            assert re.fullmatch(r"\d+\.\d\dx", ratio) and float(ratio[:-1]) > 0
    assert f"relative to {first_label}" in r.stdout
    assert "outputs at batch 4: max relative difference" in r.stdout
    # The progress bar (plain lines: not a TTY): 4 settings x 5 rounds x 2 models.
    assert "benchmark 40/40 100%" in r.stderr


def test_json_output(mlp_pair: tuple[str, str]) -> None:
    first, other = mlp_pair
    r = bench(first, "--compare", other, "--batch-size", "3", "--concurrency", "1", "3",
              "--requests", "12", "--rounds", "3", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)  # stdout holds the JSON only
    assert report["signature"] == "serving_default" and report["requests"] == 12
    assert [m["path"] for m in report["models"]] == [str(Path(p).resolve()) for p in mlp_pair]
    results = report["results"]
    assert [(x["batch_size"], x["concurrency"]) for x in results] == [(3, 1), (3, 1), (3, 3),
                                                                      (3, 3)]
    assert all(x["requests"] == 12 for x in results)  # exactly --requests per model/setting
    assert [x["ratio"] is None for x in results] == [True, False, True, False]
    assert all(x["throughput"] > 0 and 0 < x["p50_ms"] <= x["p99_ms"] for x in results)
    assert results[1]["ratio"] > 0
    assert report["output_max_relative_difference"] == {"3": 0.0}  # same weights


def test_single_model(tmp_path: Path) -> None:
    r = bench(cached_saved_model("small_cnn"), "--batch-size", "2", "--requests", "4", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    [row] = report["results"]
    assert row["batch_size"] == 2 and row["ratio"] is None and row["requests"] == 4
    assert report["output_max_relative_difference"] == {}


def test_tensorflow_thread_counts_are_set_for_the_run(mlp_pair: tuple[str, str]) -> None:
    r = bench(mlp_pair[0], "--requests", "2", "--json")
    assert json.loads(r.stdout)["inter_op_threads"] == 0  # TensorFlow's own choice
    r = bench(mlp_pair[0], "--requests", "2", "--inter-op-threads", "1", "--intra-op-threads",
              "3", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["inter_op_threads"], report["intra_op_threads"]) == (1, 3)
    r = bench(mlp_pair[0], "--requests", "2", "--inter-op-threads", "1")
    assert "TensorFlow inter-op threads 1" in r.stdout


def test_thread_counts_after_tensorflow_started_are_a_clear_error(
        capsys: pytest.CaptureFixture) -> None:
    tf.constant(1.0) + 1.0  # TensorFlow is running in this process now
    assert main([cached_saved_model("mlp"), "--requests", "1", "--inter-op-threads", "7"]) == 1
    assert "cannot set TensorFlow's thread counts" in capsys.readouterr().err


def test_missing_model_dir_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_model"
    r = bench(str(missing))
    assert r.returncode == 1
    assert str(missing) in r.stderr and "does not exist" in r.stderr
    assert "Traceback" not in r.stderr
    r = bench(str(tmp_path))  # exists, but is not a SavedModel
    assert r.returncode == 1 and "not a SavedModel directory" in r.stderr
    assert bench(str(tmp_path), "--batch-size", "0").returncode == 2  # bad usage


def test_models_with_different_inputs_are_refused(capsys: pytest.CaptureFixture) -> None:
    mlp, cnn = cached_saved_model("mlp"), cached_saved_model("small_cnn")
    assert main([mlp, "--compare", cnn, "--requests", "1"]) == 1
    err = capsys.readouterr().err
    assert "take different inputs" in err and "(None, 32, 32, 3)" in err


def test_unknown_signature_lists_the_known_ones(capsys: pytest.CaptureFixture) -> None:
    assert main([cached_saved_model("mlp"), "--signature", "nope", "--requests", "1"]) == 1
    err = capsys.readouterr().err
    assert "no signature 'nope'" in err and "serving_default" in err and "--signature" in err


# --------------------------------------------------------------------------- inputs


def test_make_inputs_follow_the_signature() -> None:
    specs = {"x": tf.TensorSpec([None, 5], tf.float32), "ids": tf.TensorSpec([None, 7], tf.int32),
             "mask": tf.TensorSpec([None], tf.bool), "fixed": tf.TensorSpec([3, 2], tf.float16)}
    feeds = make_inputs(specs, 3)
    assert {k: (v.shape, v.dtype) for k, v in feeds.items()} == {
        "x": ((3, 5), np.float32), "ids": ((3, 7), np.int32), "mask": ((3,), np.bool_),
        "fixed": ((3, 2), np.float16)}
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() < 2  # safe ids for any vocabulary
    again = make_inputs(specs, 3)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)  # seeded


@pytest.mark.parametrize("spec, needle", [
    (tf.TensorSpec([4, 2], tf.float32), "pass --batch-size 4"),
    (tf.TensorSpec([None, None], tf.float32), "dimension 1 is free"),
    (tf.TensorSpec(None, tf.float32), "unknown rank"),
    (tf.TensorSpec([None], tf.string), "dtype string"),
])
def test_make_inputs_refuses_what_it_cannot_fill(spec: tf.TensorSpec, needle: str) -> None:
    with pytest.raises(BenchmarkError, match=re.escape(needle)) as e:
        make_inputs({"inp": spec}, 3)
    assert "'inp'" in str(e.value)


# --------------------------------------------------------------------------- progress bar


def test_progress_plain_lines_are_occasional() -> None:
    out = io.StringIO()
    with ProgressBar(100, "compiling", stream=out) as bar:
        for i in range(1, 101):
            bar.update(note=f"cluster_{i}")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert 10 <= len(lines) <= 12  # one per 10 %, not one per step
    assert lines[-1].startswith("compiling 100/100 100%") and lines[-1].endswith("cluster_100")


def test_progress_redraws_in_place_on_a_terminal() -> None:
    out = io.StringIO()
    with ProgressBar(4, "bench", stream=out, interactive=True) as bar:
        bar.update(1, note="a long note that is much longer than the next one")
        bar.write("warning: printed above the bar")
        bar.update(4, note="b")
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == 2  # the warning, and the final line
    assert "warning: printed above the bar\n" in text
    final = text.rstrip("\n").rsplit("\r", 1)[-1]
    assert final.startswith("bench [########################] 4/4 100%")
    assert final.rstrip().endswith("  b")


def test_progress_disabled_and_time_format() -> None:
    out = io.StringIO()
    with ProgressBar(3, stream=out, enabled=False) as bar:
        bar.update(3)
    assert out.getvalue() == ""
    assert format_seconds(75.2) == "1:15" and format_seconds(3725) == "1:02:05"


# --------------------------------------------------------------------------- --inputs


@pytest.fixture(scope="module")
def bytes_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A signature taking raw bytes and a float row, as image or text servers do."""
    module = tf.Module()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="blob"),
                                  tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(blob: tf.Tensor, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.cast(tf.strings.length(blob), tf.float32)[:, None] * x}

    path = tmp_path_factory.mktemp("models") / "bytes_model"
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return str(path)


def test_inputs_from_a_predict_request_feed_models_with_string_inputs(
        bytes_model: str, tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"instances": [
        {"blob": {"b64": "AAEC/w=="}, "x": [1.0, 2.0]},  # 4 binary bytes, a trailing 0xff
        {"blob": "hello", "x": [3.0, 4.0]}]}))
    r = bench(bytes_model, "--batch-size", "3", "--requests", "4", "--inputs", str(request),
              "--json")
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)["results"]
    assert row["batch_size"] == 3 and row["requests"] == 4


def test_inputs_rows_are_decoded_as_the_server_does_and_cycled(bytes_model: str,
                                                               tmp_path: Path) -> None:
    from neuronish.benchmark import cycle_rows, inputs_from_request

    specs = tf.saved_model.load(bytes_model).signatures["serving_default"] \
        .structured_input_signature[1]
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"inputs": {"blob": [{"b64": "AAEC/w=="}, "hello"],
                                              "x": [[1, 2], [3, 4]]}}))
    batch = cycle_rows(inputs_from_request(str(request), specs), 5)
    assert batch["blob"].tolist() == [b"\x00\x01\x02\xff", b"hello"] * 2 + [b"\x00\x01\x02\xff"]
    np.testing.assert_array_equal(batch["x"], np.array([[1, 2], [3, 4]] * 2 + [[1, 2]],
                                                       np.float32))


@pytest.mark.parametrize("body, needle", [
    ({"instances": [{"blob": "a"}]}, "x"),                     # an input missing
    ({"inputs": {"blob": ["a"], "x": [[1.0, 2.0, 3.0]]}}, "'x' has shape [1, 3]"),
    ({"inputs": {"blob": ["a"], "x": [["no"]]}}, "not a predict request"),
])
def test_inputs_that_do_not_fit_the_signature_are_named(bytes_model: str, tmp_path: Path,
                                                        body: dict, needle: str) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(body))
    r = bench(bytes_model, "--requests", "1", "--inputs", str(request))
    assert r.returncode == 1, r.stderr
    assert "--inputs" in r.stderr and needle in r.stderr, r.stderr
