"""A profile armed and disarmed while calls run, under ThreadSanitizer
(tests/c_api/nr_profile_toggle_threads.c against the TSan build of the library).

Four threads call a model with two copies (one stage each) and a model pipelined over
two cores, while the main thread starts a recording (nr_profile_start) and takes it
(nr_profile_stop) over and over, so calls begin timed and end untimed and the other way
round. What TSan catches here: a stage's timing armed or disarmed (`ne_set_timing` and
the resize of its times buffer, Model::run_stage) by a thread other than the one that
holds the stage's core, while the engine writes times into it; or a chunk's spans added
to the recording while nr_profile_stop swaps it out. Checked: arming every stage in
Model::run_one, before the call holds the stage's core, is a data race TSan reports here
(the pipelined model has two calls in flight on one copy). The calls must all succeed,
and one last recording around a call of each model still has the instructions of both
pipeline stages timed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import executable
from tests.runtime import c_programs
from tests.runtime.c_programs import TSAN

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None,
                                reason="gcc and g++ are needed to build the C runtime and host")


def test_profile_start_and_stop_while_threads_call_under_thread_sanitizer(
        tmp_path: Path) -> None:
    from tests import graphs

    dense = tmp_path / "dense.neff"
    g = graphs.dense_relu(batch=3)
    dense.write_bytes(compile_graph(g.graph_def, g.io_config))
    piped = tmp_path / "piped.neff"
    g = graphs.conv_bn_relu(batch=2)
    piped.write_bytes(compile_graph(g.graph_def, g.io_config, pipeline_cores=2))
    program = c_programs.build("nr_profile_toggle_threads.c",
                               tmp_path / "nr_profile_toggle_threads", TSAN, std="c11")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURONISH_")}
    r = subprocess.run([str(program), str(dense), "2", str(piped), "1"], capture_output=True,
                       text=True, timeout=600,
                       env={**env, "NEURONISH_NUM_CORES": "2", "NEURONISH_TELEMETRY": "0",
                            "OMP_WAIT_POLICY": "passive", "TSAN_OPTIONS": "halt_on_error=1"})
    assert r.returncode == 0 and "ThreadSanitizer" not in r.stderr, r.stderr[-4000:]
    out = json.loads(r.stdout)
    # The flag flipped under running calls, and some of them were timed.
    assert out["toggles"] == 200 and out["executes"] > 0, (out["toggles"], out["executes"])
    last = out["last"]["spans"]
    assert [s["cat"] for s in last].count("execute") == 2, last
    instructions = [s for s in last if s["cat"] == "instruction"]
    assert all(s["end"] >= s["start"] > 0 for s in instructions), instructions
    # Both stages of the pipelined model were timed again (each armed by the thread that
    # holds its core) after the flips: an instruction of each core's program is there.
    on_both_cores = {s["name"] for s in instructions
                     if s["track"].startswith("device cores [0, 1]")}
    programs = executable.from_bytes(piped.read_bytes()).programs
    assert len(programs) == 2
    for program in programs:
        assert on_both_cores & {i.kind for i in program}, (on_both_cores, program)
