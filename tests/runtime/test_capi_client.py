"""The C API as a stranger calls it: tests/c_api/nr_client.c, written from the header and
docs/c-api.md alone, passes NULL wherever a pointer is taken, indices and counts out of
range, damaged and odd files, shapes whose byte counts overflow 64 bits, every batch from
0 to past the compiled one, deltas that overflow, labels that are not UTF-8, and many
threads at once; each call must return a status the header lists with a message naming
what is wrong, and never crash (also under AddressSanitizer, UBSan and ThreadSanitizer).
The outputs it computes are held against TensorFlow's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.runtime import c_programs
from tests.runtime.test_capi_execute import compile_graph

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "c_api" / "nr_client.c"
ASAN = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer")
TSAN = ("-fsanitize=thread", "-fno-omit-frame-pointer")

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None,
                                reason="gcc and g++ are needed to build the C runtime and client")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """A directory with the two executables nr_client.c expects, and dense3's graph."""
    import tensorflow as tf

    from tests import graphs

    out = tmp_path_factory.mktemp("client")
    dense = graphs.dense_relu(batch=3)
    (out / "dense3.neff").write_bytes(compile_graph(out, "dense3", dense.graph_def,
                                                    dense.io_config))
    two = graphs.trace(lambda a, b: (tf.nn.relu(a) + b, a * 2.0),
                       tf.TensorSpec([None, 4], tf.float32, name="a"),
                       tf.TensorSpec([None, 4], tf.float32, name="b"), batch=2)
    (out / "two.neff").write_bytes(compile_graph(out, "two", two.graph_def, two.io_config))
    return out, dense


def _build(out: Path, flags: tuple[str, ...] = ()) -> Path:
    return c_programs.build(SOURCE, out, flags, cflags=("-pedantic",))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURONISH_")}
    return {**env, "NEURONISH_NUM_CORES": "2", "NEURONISH_TELEMETRY": "0",
            "OMP_WAIT_POLICY": "passive", **extra}


def _run(program: Path, case: str, directory: Path, **env: str) -> str:
    r = subprocess.run([str(program), case, str(directory)], capture_output=True, text=True,
                       timeout=600, env=_env(**env))
    assert r.returncode == 0 and r.stdout.splitlines()[-1:] == ["ok"], \
        (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("bin") / "nr_client")


@pytest.mark.parametrize("case", ["load", "inspect", "device", "threads"])
def test_every_call_answers_as_the_header_says(client: Path, models: tuple, case: str) -> None:
    _run(client, case, models[0])


def test_execute_refuses_bad_calls_and_matches_tensorflow(client: Path, models: tuple) -> None:
    """Batches 0 to 11 each give the rows run one at a time; the bad calls are refused
    naming the field; the batch-5 outputs are TensorFlow's."""
    directory, dense = models
    lines = _run(client, "execute", directory).splitlines()
    got = np.array([float(v) for v in lines[-2].split()], np.float32).reshape(5, 8)
    x = ((np.arange(5 * 16) * 5) % 11 - 5).astype(np.float32).reshape(5, 16)
    want = dense.reference({"x:0": x})["Identity:0"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_labels_and_reasons_that_are_not_utf8_leave_readable_files(client: Path, models: tuple,
                                                                   tmp_path: Path) -> None:
    """Telemetry (what `neuronish ls` reads) and the profile are JSON Python must read,
    whatever bytes a caller's label or failure reason holds; a label cut at 200 bytes
    keeps whole characters."""
    run_dir, profile = tmp_path / "run", tmp_path / "profile"
    run_dir.mkdir(mode=0o700)
    profile.mkdir()
    proc = subprocess.Popen([str(client), "label", str(models[0])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(NEURONISH_TELEMETRY="1", NEURONISH_RUN_DIR=str(run_dir),
                                     NEURONISH_PROFILE=str(profile)))
    try:
        assert proc.stdout.readline() == "published\n"
        [published] = run_dir.glob("*.json")
        snapshot = json.loads(published.read_bytes().decode("utf-8"))
    finally:
        out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0 and out.splitlines()[-1:] == ["ok"], (out, err)
    names = [m["name"] for m in snapshot["models"]]
    assert names[0] == 'quote" back\\ nl\n ctl\x01 end'
    assert names[1].startswith("not utf-8: \ufffd\ufffd \ufffd( ") and names[1].endswith(" end")
    assert names[2] == "x" + "é" * 99  # 199 bytes: the 200th would split an "é"
    assert snapshot["cores"]["1"]["failed"] == "core 1 failed (bad \ufffd byte)"
    [trace] = profile.glob("*.json")
    tracks = json.dumps(json.loads(trace.read_bytes().decode("utf-8")))
    assert "quote" in tracks and "\\ufffd" in tracks


def test_under_address_and_undefined_behaviour_sanitizers(models: tuple, tmp_path: Path) -> None:
    """No error and no leak with the library and the client built with ASan and UBSan (the
    engine library is not instrumented)."""
    program = _build(tmp_path / "nr_client_asan", ASAN)
    for case in ("load", "inspect", "device", "execute"):
        _run(program, case, models[0], ASAN_OPTIONS="detect_leaks=1",
             UBSAN_OPTIONS="print_stacktrace=1")


def test_threads_under_thread_sanitizer(models: tuple, tmp_path: Path) -> None:
    """Calls on one model from eight threads while two more load, run and unload another
    model on the device and charge and refund its memory: TSan reports nothing."""
    program = _build(tmp_path / "nr_client_tsan", TSAN)
    out = _run(program, "threads", models[0], TSAN_OPTIONS="halt_on_error=1")
    assert "ThreadSanitizer" not in out


CONFIGS = [
    # (a range or group count far past the device: refused without listing it first)
    ({"NEURONISH_VISIBLE_CORES": "0-999999999"},
     "7 NEURONISH_VISIBLE_CORES='0-999999999': cores must be distinct and in 0..1 "
     "(NEURONISH_NUM_CORES=2)"),
    ({"NEURONISH_VISIBLE_CORES": "0-999999999,a"},
     "7 NEURONISH_VISIBLE_CORES='0-999999999,a': expected e.g. '0-1', '2' or '0,2'"),
    ({"NEURONISH_CORE_GROUP_SIZES": "999999999x1"},
     "7 NEURONISH_CORE_GROUP_SIZES='999999999x1' needs 999999999 cores, only 2 are visible"),
    # (2^64 bytes and more, never wrapped to 0: past 1 PiB per core refused, as in Python)
    ({"NEURONISH_CORE_MEMORY": "17179869184G"},
     "7 NEURONISH_CORE_MEMORY='17179869184G': at most 1PiB (1125899906842624 bytes) per core"),
    ({"NEURONISH_CORE_MEMORY": "99999999999999999999999"},
     "7 NEURONISH_CORE_MEMORY='99999999999999999999999': at most 1PiB (1125899906842624 bytes) "
     "per core"),
    ({"NEURONISH_CORE_MEMORY": "1048576G"},
     "0 core 0 total 1125899906842624, core 1 total 1125899906842624"),
]


@pytest.mark.parametrize("env,want", CONFIGS, ids=[next(iter(e.items()))[1] for e, _ in CONFIGS])
def test_huge_configuration_values_are_read_in_bounded_memory(client: Path, models: tuple,
                                                              env: dict, want: str) -> None:
    """Values a typo makes huge: refused as Python refuses them (its words), or read as
    Python reads them, within 1 GiB of address space (the old reader listed 0-999999999
    before refusing it, and the process was killed for want of memory)."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    r = subprocess.run([str(client), "config", str(models[0])], capture_output=True, text=True,
                       timeout=120, env=_env(**env), preexec_fn=limit)
    assert r.returncode == 0 and r.stdout.splitlines() == [want, "ok"], (r.stdout, r.stderr)
