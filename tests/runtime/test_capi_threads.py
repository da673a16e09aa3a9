"""Concurrent nr_execute calls under ThreadSanitizer: tests/c_api/nr_execute_threads.c
(six threads, a pipelined model on 2 cores with 2 duplicates, batches 1 to 5) built with
-fsanitize=thread against the TSan build of the C runtime; every call gives the result
the same call gives alone, and TSan reports nothing (the engine library and libgomp are
not instrumented: what is checked is the runtime's own locking)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.runtime import c_programs
from tests.runtime.c_programs import TSAN
from tests.runtime.test_capi_execute import compile_graph

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to build the C test program")


def test_concurrent_execute_under_thread_sanitizer(tmp_path: Path) -> None:
    from tests import graphs

    program = c_programs.build("nr_execute_threads.c", tmp_path / "nr_execute_threads", TSAN)
    graph = graphs.conv_bn_relu(batch=2)
    model = tmp_path / "cnn2.neff"
    model.write_bytes(compile_graph(tmp_path, "cnn2", graph.graph_def, graph.io_config,
                                    "--neuroncore-pipeline-cores", "2"))
    r = subprocess.run([str(program), str(model)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TSAN_OPTIONS": "halt_on_error=1",
                            "OMP_WAIT_POLICY": "passive"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    assert "ThreadSanitizer" not in r.stderr
