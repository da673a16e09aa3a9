"""The profiler: a Chrome-trace / Perfetto timeline of device calls (runtime/profiler.py)
and `neuronish profile`; the trace is checked against the trace-event format."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import numpy as np
import pytest

import neuronish.saved_model
from models.cache import cached_saved_model
from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load, profiler
from neuronish.runtime.config import DeviceConfig
from neuronish.runtime.device import Device
from tests.graphs import conv_bn_relu

NEURONISH = str(Path(sys.executable).parent / "neuronish")


def check_trace_format(trace: dict) -> list[dict]:
    """The trace-event format's rules that viewers rely on; returns the spans."""
    assert isinstance(trace["traceEvents"], list)
    json.loads(json.dumps(trace))  # plain JSON: no NaN, no objects
    spans = []
    for e in trace["traceEvents"]:
        assert isinstance(e["name"], str) and isinstance(e["pid"], int)
        assert isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index")
            assert isinstance(e["args"], dict)
        else:
            assert e["ph"] == "X", e
            assert isinstance(e["cat"], str) and e["ts"] >= 0 and e["dur"] >= 0
            spans.append(e)
    # Spans on one track nest: each starts after the previous ends or ends inside it.
    by_track: dict[tuple[int, int], list[dict]] = {}
    for e in spans:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    for track in by_track.values():
        open_ends: list[float] = []
        for e in sorted(track, key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and e["ts"] >= open_ends[-1] - 1e-3:
                open_ends.pop()
            if open_ends:
                assert e["ts"] + e["dur"] <= open_ends[-1] + 1e-3, (e, open_ends[-1])
            open_ends.append(e["ts"] + e["dur"])
    named = {e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {e["tid"] for e in spans} <= named  # every track has a name
    return spans


def spans_by_category(trace: dict) -> dict[str, list[dict]]:
    """The trace's spans (checked by check_trace_format) grouped by category, in trace order."""
    by_cat: dict[str, list[dict]] = {}
    for e in check_trace_format(trace):
        by_cat.setdefault(e["cat"], []).append(e)
    return by_cat


@pytest.fixture(scope="module")
def executable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    g = conv_bn_relu(batch=8)
    path = tmp_path_factory.mktemp("exe") / "conv.neff"
    path.write_bytes(compile_graph(g.graph_def, g.io_config))
    return path


@pytest.mark.parametrize("engine", ["native", "numpy"])
def test_a_split_call_records_chunks_instructions_and_modelled_time(
        executable: Path, tmp_path: Path, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    device = Device(DeviceConfig.from_env({"NEURONISH_NUM_CORES": "2"}))
    with load(executable, duplicates=2, device=device) as model:
        x = {s.name: np.ones((20, *s.shape[1:]), s.dtype) for s in model.inputs}
        profiler.start()
        try:
            model.run(x)  # batch 20 of a batch-8 executable: three chunks
        finally:
            trace = profiler.stop(tmp_path / "t.json")
        steps = len(model._idle.get().instructions)  # profiling times each instruction
    assert json.loads((tmp_path / "t.json").read_text()) == trace
    by_cat = spans_by_category(trace)
    assert len(by_cat["call"]) == 1
    assert len(by_cat["execute"]) == len(by_cat["queue"]) == 3
    assert len(by_cat["instruction"]) == 3 * steps
    assert {e["args"]["engine"] for e in by_cat["instruction"]} == {model.engine}
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    for e in by_cat["execute"]:  # a track per core group the chunk ran on
        assert re.fullmatch(r"device cores \[[01]\]: .*", names[e["tid"]]), names[e["tid"]]
    call = by_cat["call"][0]
    for e in by_cat["execute"]:  # inside the call
        assert call["ts"] <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"] + 1e-3
    exe = model.exe
    modelled = exe.stats["device_model"]["instruction_seconds"][0]
    assert len(by_cat["modelled"]) == 3 * len(modelled)
    assert sorted(e["dur"] for e in by_cat["modelled"]) == pytest.approx(
        sorted(round(s * 1e6, 3) for s in modelled * 3), abs=1e-3)
    # Every instruction's TF nodes reach the table, with both times.
    rows = profiler.top_instructions(trace)
    assert {n for r in rows for n in r["tf_nodes"]} == {
        n for i in exe.programs[0] for n in i.source}
    assert all(r["calls"] == 3 and r["modelled_us"] > 0 and r["mean_us"] > 0 for r in rows)


def test_off_records_nothing_and_adds_no_wrapper() -> None:
    assert not profiler.active()
    # The program's profiled path is taken only while active; its hooks record nothing off.
    profiler.stage_done(object(), object(), None, [0.0, 1.0])
    profiler.record("x", "call", "t", 0.0, 1.0)
    assert [e for e in profiler.stop()["traceEvents"] if e["ph"] == "X"] == []


def test_stop_switches_the_engines_instruction_timing_off(executable: Path) -> None:
    with load(executable, runtime="python") as model:
        x = {s.name: np.ones(s.shape, s.dtype) for s in model.inputs}
        program = model._idle.get()
        model._idle.put(program)
        native = program.stages[0].native
        if native is None:
            pytest.skip("the native engine is unavailable here; nothing times instructions")
        profiler.start()
        model.run(x)
        profiler.stop()
        written = native._timing.copy()  # the engine's times of the profiled call
        model.run(x)
        assert written.any() and (native._timing == written).all()  # not written off


def test_a_recording_keeps_no_unloaded_model_alive(executable: Path) -> None:
    """A server profiled from start-up (NEURONISH_PROFILE) reloads models: the records of
    old calls must not keep the old models' weights and engines in memory."""
    model = load(executable, runtime="python")
    x = {s.name: np.ones(s.shape, s.dtype) for s in model.inputs}
    profiler.start()
    try:
        model.run(x)
        model.unload()
        gone = weakref.ref(model)
        del model
        gc.collect()
        assert gone() is None
    finally:
        trace = profiler.stop()
    assert [e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"].count("execute") == 1


def test_env_var_profiles_any_process(executable: Path, tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import sys, numpy as np
        import neuronish.runtime as rt
        with rt.load(sys.argv[1]) as m:
            m.run({s.name: np.ones(s.shape, s.dtype) for s in m.inputs})
        print(__import__("os").getpid())
    """)
    env = {**os.environ, "NEURONISH_PROFILE": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", script, str(executable)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    trace = json.loads((tmp_path / f"neuronish-{r.stdout.strip()}.json").read_text())
    assert len(spans_by_category(trace)["execute"]) == 1
    idle = subprocess.run([sys.executable, "-c", "import neuronish.runtime.profiler"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert idle.returncode == 0 and len(list(tmp_path.iterdir())) == 1  # nothing recorded


def test_neuronish_profile_on_a_partly_compiled_savedmodel(tmp_path: Path) -> None:
    out = tmp_path / "compiled"
    report = neuronish.saved_model.compile(cached_saved_model("cnn_cumsum"), str(out),
                                           batch_size=2)
    trace_path = tmp_path / "trace.json"
    r = subprocess.run([NEURONISH, "profile", str(out), "--batch-size", "3", "--requests", "4",
                        "-o", str(trace_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    spans = check_trace_format(json.loads(trace_path.read_text()))
    requests = [e for e in spans if e["name"] == "request"]
    # Its NeuronOps run on the C runtime, as they serve (no `tf` span: the kernel calls the
    # C runtime without Python); each call is a `call` span naming its op.
    calls = [e for e in spans if e["cat"] == "call"]
    assert len(requests) == 4
    assert not [e for e in spans if e["cat"] == "tf" and e["name"].startswith("NeuronOp ")]
    assert {e["args"]["model"].split("/")[-1] for e in calls} == {
        op["name"] for op in report["NeuronOps"]}
    assert len(calls) == 4 * len(report["NeuronOps"])
    # Batch 3 of a batch-2 executable: two chunks per NeuronOp call.
    assert sum(e["cat"] == "execute" for e in spans) == 2 * len(calls)
    assert "modelled us" in r.stdout and "conv" in r.stdout
