"""A model's label changed after its first call (the model server labels the models its
warm-up loaded and called) names it from then on in the C library's profile spans and
telemetry, also while other threads call it.

- Through the Python binding: `NativeModel.label = ...` after calls reaches the spans of
  the profile the Python profiler merges (it used to stay on the Python side only).
- A C host (tests/c_api/nr_relabel_threads.c) built with ThreadSanitizer against the TSan
  build of the library: four threads call a model while the main thread labels it 200
  times and a profile records; TSan reports nothing, and the last label names the model in
  the spans of the next call and in the published telemetry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import profiler
from neuronish.runtime.capi import native_model
from tests.runtime import c_programs
from tests.runtime.c_programs import TSAN
from tests.runtime.test_profiler import spans_by_category

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None,
                                reason="gcc and g++ are needed to build the C runtime and host")


@pytest.fixture(scope="module")
def dense() -> bytes:
    from tests import graphs

    g = graphs.dense_relu(batch=3)
    return compile_graph(g.graph_def, g.io_config)


def _tracks(trace: dict) -> set[str]:
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    return {names[e["tid"]] for e in spans_by_category(trace)["execute"]}


def test_a_label_set_after_calls_names_the_model_in_the_spans(dense: bytes) -> None:
    x = np.zeros((3, 16), np.float32)
    profiler.start()
    try:
        model = native_model.load(dense, 1, "warm-up").model
        assert model is not None
        model.run_list([x])
        model.label = "served:1 dense"  # (what neuronish/serving/startup.py does)
        model.run_list([x])
    finally:
        trace = profiler.stop()
        model.unload()
    assert _tracks(trace) == {"device cores [0]: warm-up", "device cores [0]: served:1 dense"}


def test_relabel_while_threads_call_under_thread_sanitizer(dense: bytes, tmp_path: Path) -> None:
    program = c_programs.build("nr_relabel_threads.c", tmp_path / "nr_relabel_threads", TSAN)
    model = tmp_path / "dense3.neff"
    model.write_bytes(dense)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURONISH_")}
    proc = subprocess.Popen([str(program), str(model)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "NEURONISH_NUM_CORES": "2", "NEURONISH_TELEMETRY": "1",
                                 "NEURONISH_RUN_DIR": str(run_dir), "OMP_WAIT_POLICY": "passive",
                                 "TSAN_OPTIONS": "halt_on_error=1"})
    try:
        spans = proc.stdout.readline()
        published = proc.stdout.readline()
        files = list(run_dir.glob("*.json"))
        snapshot = json.loads(files[0].read_bytes()) if files else None
    finally:
        _, err = proc.communicate("go\n", timeout=300)
    assert proc.returncode == 0 and published == "published\n", err[-3000:]
    assert "ThreadSanitizer" not in err
    executes = [s for s in json.loads(spans)["spans"] if s["cat"] == "execute"]
    assert len(executes) == 2 + 4 * 100
    assert executes[0]["args"]["model"] == "warm-up"
    assert executes[-1]["args"]["model"] == "served:1 dense"
    assert executes[-1]["track"].endswith(": served:1 dense")
    assert [m["name"] for m in snapshot["models"]] == ["served:1 dense"]


RACE_CHILD = """
import sys, threading
from neuronish.runtime.capi import native_model
data = open(sys.argv[1], "rb").read()
sys.setswitchinterval(1e-6)  # the GIL changes hands between the setter's steps
errors = []
for i in range(int(sys.argv[2])):
    model = native_model.load(data, 1, "first").model
    started, stop = threading.Event(), threading.Event()

    def relabel():
        n = 0
        while not stop.is_set() or n < 100:
            try:
                model.label = f"label {n}"
            except Exception as e:
                errors.append(repr(e))
                return
            n += 1
            started.set()

    t = threading.Thread(target=relabel)
    t.start()
    started.wait()
    model.unload()
    stop.set()
    t.join()
    if errors:
        break
print(errors[:1] or "ok", model.label)
"""


def test_a_relabel_racing_an_unload_is_a_no_op(dense: bytes, tmp_path: Path) -> None:
    """A thread relabels a model while another unloads it (a server relabelling its
    models as a version is retired): the relabels after the unload do nothing and raise
    nothing. The old setter checked the handle, then called the library with it: an
    unload between the two was NR_INVALID_ARGUMENT (a NULL handle) or a call on a freed
    model. In a child: a call on a freed model may crash it."""
    model = tmp_path / "dense3.neff"
    model.write_bytes(dense)
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURONISH_")}
    r = subprocess.run([sys.executable, "-c", RACE_CHILD, str(model), "200"], cwd=root,
                       capture_output=True, text=True, timeout=600,
                       env={**env, "NEURONISH_NUM_CORES": "1", "NEURONISH_TELEMETRY": "0",
                            "OMP_WAIT_POLICY": "passive", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok label "), r.stdout
