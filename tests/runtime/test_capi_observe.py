"""Profiles and device telemetry from a process without Python (issue 25 item 6): the C
example `examples/c/run_model.c`, built against the C runtime, run on a model the real
neuronish-cc compiled. With NEURONISH_PROFILE it writes the profiler's trace, which
`neuronish profile --read` prints and which holds the same instructions as the Python
runtime's trace of the same executable; while it runs, `neuronish ls` shows it with its
model, calls and device memory; its counters file goes when it exits; an untrusted run dir
is refused with a warning and the program still runs. A Python host publishes through
runtime/telemetry.py alone (the library stays quiet: nr_host_observes).

No test assumes a thread ran within some time: each waits for the condition it needs,
with a deadline of minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from neuronish.device_tools import size
from neuronish.runtime import load, profiler, telemetry
from tests.runtime import c_programs
from tests.runtime.test_capi_example import _build
from tests.runtime.test_capi_execute import compile_graph
from tests.runtime.test_profiler import spans_by_category

NEURONISH = str(Path(sys.executable).parent / "neuronish")
DEADLINE = 300  # seconds: a loaded machine may be slow, never this slow


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the C example, a conv + batch-norm + relu executable compiled at batch 2)."""
    from tests import graphs

    tmp = tmp_path_factory.mktemp("observe")
    graph = graphs.conv_bn_relu(batch=2)
    model = tmp / "cnn.neff"
    model.write_bytes(compile_graph(tmp, "cnn", graph.graph_def, graph.io_config))
    return _build(tmp / "run_model"), model


def _env(**extra: str) -> dict[str, str]:
    return {"OMP_WAIT_POLICY": "passive", "PATH": "/usr/bin:/bin", **extra}


def _instructions(trace: dict) -> list[tuple[str, tuple[str, ...]]]:
    return sorted((e["name"], tuple(e["args"]["tf"])) for e in trace["traceEvents"]
                  if e.get("cat") == "instruction")


def test_the_c_example_writes_a_profile_neuronish_profile_reads(built, tmp_path: Path) -> None:
    program, model = built
    traces = tmp_path / "traces"
    r = subprocess.run([str(program), str(model), "5"], capture_output=True, text=True,
                       timeout=DEADLINE, env=_env(NEURONISH_PROFILE=str(traces),
                                                  NEURONISH_TELEMETRY="0"))
    assert r.returncode == 0, r.stderr
    [path] = traces.iterdir()
    assert path.name.startswith("neuronish-") and path.suffix == ".json"
    trace = json.loads(path.read_text())
    by_cat = spans_by_category(trace)
    # Batch 5 on a batch-2 executable: one call, three chunks, each timed per instruction.
    assert len(by_cat["call"]) == 1
    assert len(by_cat["queue"]) == len(by_cat["execute"]) == 3
    call = by_cat["call"][0]
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    for e in by_cat["execute"]:
        assert names[e["tid"]] == "device cores [0]: Identity:0"
        assert e["args"] == {"model": "Identity:0", "model_id": e["args"]["model_id"], "batch": 2}
        assert e["args"]["model_id"] >= 1  # (nr_model_id: models sharing a label apart)
        assert call["ts"] <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"] + 1e-3
    assert all(e["args"]["engine"] == "native" and e["dur"] >= 0
               for e in by_cat["instruction"])

    # The same instructions, with the same TF nodes, as the Python runtime's profile of
    # the same executable at the same batch.
    with load(model.read_bytes(), runtime="python") as py:
        x = np.zeros((5, 8, 8, 3), np.float32)
        profiler.start()
        try:
            py.run_list([x])
        finally:
            python_trace = profiler.stop()
    assert _instructions(trace) == _instructions(python_trace)
    assert len(by_cat["instruction"]) > 0

    r = subprocess.run([NEURONISH, "profile", "--read", str(path)], capture_output=True,
                       text=True, timeout=DEADLINE)
    assert r.returncode == 0, r.stderr
    rows = [row for row in map(str.split, r.stdout.splitlines()[1:]) if row[4:5] == ["native"]]
    assert {row[5] for row in rows} == {name for name, _ in _instructions(trace)}
    assert all(row[1] == "3" for row in rows)  # calls: one per chunk
    assert "1 call, 3 execute" in r.stderr


def test_no_profile_unless_asked_and_a_bad_directory_is_named(built, tmp_path: Path) -> None:
    program, model = built
    r = subprocess.run([str(program), str(model)], capture_output=True, text=True,
                       timeout=DEADLINE, cwd=tmp_path, env=_env(NEURONISH_TELEMETRY="0"))
    assert r.returncode == 0 and r.stderr == "" and list(tmp_path.iterdir()) == []
    (tmp_path / "a_file").write_text("")
    r = subprocess.run([str(program), str(model)], capture_output=True, text=True,
                       timeout=DEADLINE, env=_env(NEURONISH_PROFILE=str(tmp_path / "a_file"),
                                                  NEURONISH_TELEMETRY="0"))
    assert r.returncode == 0
    assert "NEURONISH_PROFILE=" in r.stderr and "is not a directory; not profiling" in r.stderr
    assert (tmp_path / "a_file").read_text() == ""


def _wait_for(what: str, condition, deadline: float = DEADLINE):  # noqa: ANN001, ANN202
    end = time.monotonic() + deadline
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < end, f"not within {deadline} s: {what}"
        time.sleep(0.2)


def test_neuronish_ls_shows_the_c_example_while_it_runs(built, tmp_path: Path) -> None:
    program, model = built
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([str(program), "-w", str(model), "5"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(NEURONISH_RUN_DIR=str(run_dir), NEURONISH_NUM_CORES="2"))
    try:
        def published() -> dict | None:
            if not run_dir.exists():
                return None
            mine = [p for p in telemetry.read_all(run_dir) if p["pid"] == proc.pid]
            # (the model's three chunks done: the run printed its outputs before -w waits)
            return mine[0] if mine and mine[0]["models"] and \
                mine[0]["models"][0]["calls"] == 3 else None

        record = _wait_for("the C example's counters with its three runs", published)
        assert oct(run_dir.stat().st_mode & 0o777) == "0o700"
        assert record["command"].endswith(f"run_model -w {model} 5")
        assert record["device"]["num_cores"] == 2
        [m] = record["models"]
        assert (m["name"], m["core_groups"], m["engine"]) == ("Identity:0", [[0]],
                                                              "native (C runtime)")
        assert (m["batch"], m["inferences"]) == (2, 6) and m["busy_seconds"] > 0
        # Its device memory is what the C runtime charges for this executable in any host.
        with load(model.read_bytes(), runtime="c") as native:
            assert m["bytes_per_core"] == native.copies()[0][1]
        assert record["cores"]["0"]["used_bytes"] == m["bytes_per_core"][0]
        assert record["cores"]["0"]["busy_seconds"] == pytest.approx(m["busy_seconds"])
        assert record["cores"]["1"] == {"used_bytes": 0, "busy_seconds": 0.0}

        r = subprocess.run([NEURONISH, "ls"], capture_output=True, text=True, timeout=DEADLINE,
                           env={**os.environ, "NEURONISH_RUN_DIR": str(run_dir)})
        assert r.returncode == 0, r.stderr
        [line] = [ln for ln in r.stdout.splitlines() if ln.strip().startswith(str(proc.pid))]
        assert line.split()[1:5] == ["Identity:0", "[[0]]", *size(m["bytes_per_core"][0]).split()]
        assert line.split()[5] == "3" and "run_model -w" in line
    finally:
        out, err = proc.communicate(timeout=DEADLINE)  # (stdin closed: the example exits)
    assert proc.returncode == 0, err
    assert out.startswith("Identity:0 float32 [5,8]")
    assert not (run_dir / f"{proc.pid}.json").exists()  # removed at exit
    assert [p for p in telemetry.read_all(run_dir) if p["pid"] == proc.pid] == []


def test_an_untrusted_run_dir_is_refused_and_the_program_still_runs(built, tmp_path: Path
                                                                     ) -> None:
    program, model = built
    run_dir = tmp_path / "shared"
    run_dir.mkdir()
    run_dir.chmod(0o777)
    r = subprocess.run([str(program), "-w", str(model)], input="", capture_output=True,
                       text=True, timeout=DEADLINE, env=_env(NEURONISH_RUN_DIR=str(run_dir)))
    assert r.returncode == 0 and r.stdout.startswith("Identity:0")
    # (the warning comes from the publisher's first round, which may still be on its way
    # when a quick program exits: it is joined at exit, so it has always run by then)
    assert "neuronish: warning: not publishing device counters" in r.stderr
    assert "is writable by group or others (mode 0777)" in r.stderr
    assert list(run_dir.iterdir()) == []


def test_a_python_host_publishes_once(built, tmp_path: Path) -> None:
    """The Python binding calls nr_host_observes: a model loaded straight through the
    binding (not tracked by runtime/telemetry.py) publishes nothing from C++ either."""
    _, model = built
    run_dir = tmp_path / "run"
    script = (
        "import time, sys\n"
        "from neuronish.runtime.capi import binding\n"
        "lib = binding.load_library()\n"
        "m = binding.Model(binding.Device(lib), open(sys.argv[1], 'rb').read())\n"
        "time.sleep(2.0)\n"  # four of the C publisher's rounds, had it started
        "print(len(list(__import__('pathlib').Path(sys.argv[2]).glob('*.json'))))\n")
    r = subprocess.run([sys.executable, "-c", script, str(model), str(run_dir)],
                       capture_output=True, text=True, timeout=DEADLINE,
                       env={**os.environ, "NEURONISH_RUN_DIR": str(run_dir)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["0"]


def test_the_tensorflow_c_host_profiles_its_neuron_op_by_node_name(tmp_path: Path,
                                                                    ) -> None:
    """examples/c/tf_saved_model.c (TensorFlow's C API, the NeuronOp library, no Python):
    its trace names the model by the NeuronOp's node (nr_model_set_label), and a batch of
    5 on an op compiled at 2 runs as three chunks."""
    import tensorflow as tf

    import neuronish.saved_model
    from neuronish import native_op_library
    from tests.neuronish.test_op_library_c import _build_program, _run, _signature, _TwoInputs

    src, out = tmp_path / "src", tmp_path / "compiled"
    module = _TwoInputs()
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    report = neuronish.saved_model.compile(str(src), str(out), batch_size=2)
    [op] = report["NeuronOps"]
    ins, outs = _signature(out)
    program = _build_program(tmp_path / "tf_saved_model")
    traces = tmp_path / "traces"
    r = _run(program, "-l", str(native_op_library.build()), str(out),
             f"{ins['x']}=float32:5,16", f"{ins['z']}=float32:5,8", "--", outs["y"],
             NEURONISH_PROFILE=str(traces), NEURONISH_TELEMETRY="0")
    assert r.returncode == 0, r.stderr
    [path] = traces.iterdir()
    by_cat = spans_by_category(json.loads(path.read_text()))
    executes = by_cat["execute"]
    # (TensorFlow names the node inside the function it inlined: .../model/neuron_op_0)
    assert [(e["args"]["model"].rsplit("/", 1)[-1], e["args"]["batch"]) for e in executes] \
        == [(op["name"], 2)] * 3
    assert len(by_cat["call"]) == 1 and by_cat.get("instruction")


_FORKS = r"""
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "neuronish_runtime.h"
/* Load a model, wait until this process's counters file is there, fork a child that
 * exits at once (running the library's exit handler), then say whether the file is
 * still there: the child must leave the parent's publisher and files alone. */
int main(int argc, char **argv) {
  char err[1024], path[4096];
  nr_device *dev; nr_model *m;
  if (nr_device_open(&dev, err, sizeof err) ||
      nr_model_load_file(dev, argv[1], 1, &m, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  snprintf(path, sizeof path, "%s/%ld.json", argv[2], (long)getpid());
  struct stat st;
  while (stat(path, &st) != 0) usleep(20000);  /* (the test's deadline bounds this) */
  pid_t child = fork();
  if (child == 0) return 0;  /* exit(): atexit handlers run in the child */
  int status;
  waitpid(child, &status, 0);
  printf("child %d, file %s\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
         stat(path, &st) == 0 ? "kept" : "gone");
  nr_model_unload(m);
  nr_device_close(dev);
  return 0;
}
"""


def test_a_forked_child_leaves_the_parents_counters_alone(built, tmp_path: Path) -> None:
    _, model = built
    (tmp_path / "forks.c").write_text(_FORKS)
    c_programs.build(tmp_path / "forks.c", tmp_path / "forks", cflags=("-D_DEFAULT_SOURCE",))
    run_dir = tmp_path / "run"
    r = subprocess.run([str(tmp_path / "forks"), str(model), str(run_dir)],
                       capture_output=True, text=True, timeout=DEADLINE,
                       env=_env(NEURONISH_RUN_DIR=str(run_dir)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["child", "0,", "file", "kept"]
    assert list(run_dir.iterdir()) == []  # and the parent's own exit removed it
