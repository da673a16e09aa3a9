"""examples/c/run_model.c, a plain C99 program using only neuronish_runtime.h, built
with gcc against the C runtime library and run on a model the real neuronish-cc
compiled: its outputs' shapes and checksums are the Python runtime's, at the compiled
batch and at a larger non-multiple one, on inputs it reads from a file; and the same
load-split-execute-unload path under AddressSanitizer, UBSan and LeakSanitizer."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from neuronish import runtime as py_runtime
from tests.runtime import c_programs
from tests.runtime.test_capi_execute import compile_graph

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to build the C example")


def _build(out: Path, flags: tuple[str, ...] = ()) -> Path:
    return c_programs.build(ROOT / "examples" / "c" / "run_model.c", out, flags,
                            cflags=("-pedantic",))


def test_c_example_matches_python(tmp_path: Path) -> None:
    from tests import graphs

    program = _build(tmp_path / "run_model")
    graph = graphs.conv_bn_relu(batch=2)
    model = tmp_path / "cnn.neff"
    model.write_bytes(compile_graph(tmp_path, "cnn", graph.graph_def, graph.io_config))
    py = py_runtime.load(model.read_bytes())
    for batch in (2, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 8, 8, 3)).astype(np.float32)
        (tmp_path / "in.bin").write_bytes(x.tobytes())
        r = subprocess.run([str(program), str(model), str(batch), str(tmp_path / "in.bin")],
                           capture_output=True, text=True, timeout=300,
                           env={"OMP_WAIT_POLICY": "passive", "PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, r.stderr
        [line] = r.stdout.splitlines()
        name, dtype, shape, checksum = line.split()
        [want] = py.run_list([x])
        assert (name, dtype) == (py.outputs[0].name, "float32")
        assert shape == "[" + ",".join(map(str, want.shape)) + "]"
        # (the order of summation differs: C adds in order, numpy pairwise)
        assert float(checksum) == pytest.approx(float(want.astype(np.float64).sum()), rel=1e-7)
    r = subprocess.run([str(program), str(tmp_path / "missing.neff")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "cannot open" in r.stderr and "I/O error" in r.stderr
    py.unload()


def test_execute_under_sanitizers(tmp_path: Path) -> None:
    """A pipelined model (2 cores) at the compiled batch, a split-and-padded one and batch 0,
    loaded, run and unloaded by the C example built with ASan+UBSan (the engine library
    itself is not instrumented): no error, no leak."""
    from tests import graphs

    flags = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all",
             "-fno-omit-frame-pointer")
    program = _build(tmp_path / "run_model_asan", flags)
    graph = graphs.conv_bn_relu(batch=2)
    model = tmp_path / "cnn2.neff"
    model.write_bytes(compile_graph(tmp_path, "cnn2", graph.graph_def, graph.io_config,
                                    "--neuroncore-pipeline-cores", "2"))
    for batch in ("2", "5", "0"):
        r = subprocess.run([str(program), str(model), batch], capture_output=True, text=True,
                           timeout=300, env={"ASAN_OPTIONS": "detect_leaks=1",
                                             "UBSAN_OPTIONS": "print_stacktrace=1",
                                             "OMP_WAIT_POLICY": "passive", "PATH": "/usr/bin:/bin"})
        assert r.returncode == 0 and "Sanitizer" not in r.stderr, r.stderr[-3000:]
        assert f"[{batch},8]" in r.stdout, r.stdout
