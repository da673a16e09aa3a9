"""A profile of a Python process measures the runtime that serves it: a model
`neuronish.runtime.load` puts on the C runtime while the profiler records stays there, and
its call, queue, execute and per-instruction spans (recorded inside the C library,
nr_profile_start / nr_profile_stop) are in the profiler's one trace, on the calling
thread's track and the core group's, nested in time; `top_instructions` lists the C
engine's instructions. Off again, the library records nothing.

Real compiler, C runtime and TensorFlow (for the reference outputs)."""

from __future__ import annotations

import collections
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import executable, load, profiler
from neuronish.runtime.capi import binding, library
from neuronish.runtime.capi.native_model import NativeModel
from tests.graphs import conv_bn_relu
from tests.runtime.test_profiler import spans_by_category

BATCH, CALL_BATCH = 2, 5  # a batch-5 call of a batch-2 executable: three chunks


@pytest.fixture(scope="module")
def graph_and_exe():  # noqa: ANN201
    g = conv_bn_relu(batch=BATCH)
    return g, compile_graph(g.graph_def, g.io_config)


def _recorder() -> binding.ProfileRecorder:
    [recorder] = [r for path, r in binding._recorders.items()
                  if Path(path) == library.build()]
    return recorder


def _inside(inner: dict, outer: dict) -> bool:
    return outer["ts"] <= inner["ts"] + 1e-3 and \
        inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3


def test_a_model_loaded_while_profiling_runs_on_the_c_runtime_and_is_in_the_trace(
        graph_and_exe, monkeypatch: pytest.MonkeyPatch) -> None:
    g, exe = graph_and_exe
    for name in ("NEURONISH_KERNEL", "NEURONISH_ENGINE", "NEURONISH_NATIVE_EXCLUDE"):
        monkeypatch.delenv(name, raising=False)
    x = np.random.default_rng(0).standard_normal((CALL_BATCH, 8, 8, 3)).astype(np.float32)
    profiler.start()
    try:
        model = load(exe)
        with model:
            assert isinstance(model, NativeModel), getattr(model, "runtime_note", model)
            assert _recorder().recording()
            [out] = model.run_list([x])
            model_id = model.id
    finally:
        trace = profiler.stop()
    assert not _recorder().recording()
    [want] = g.reference({"x:0": x}).values()
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)

    by_cat = spans_by_category(trace)  # (trace-event format; spans nest per track)
    assert len(by_cat["call"]) == 1
    assert len(by_cat["queue"]) == len(by_cat["execute"]) == 3
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
              if e["name"] == "thread_name"}
    [call] = by_cat["call"]
    assert tracks[call["tid"]] == f"host ({threading.current_thread().name})"
    assert {tracks[e["tid"]] for e in by_cat["queue"]} == {tracks[call["tid"]]}
    assert {tracks[e["tid"]] for e in by_cat["execute"]} == {"device cores [0]: Identity:0"}
    # Each chunk runs every engine instruction of the executable, on its track, inside it;
    # every chunk inside the call.
    kinds = [ins.kind for ins in executable.from_bytes(exe).programs[0]]
    assert collections.Counter(e["name"] for e in by_cat["instruction"]) == \
        collections.Counter(kinds * 3)
    for e in by_cat["execute"]:
        assert e["args"] == {"model": "Identity:0", "model_id": model_id, "batch": BATCH}
        assert _inside(e, call)
        mine = [i for i in by_cat["instruction"] if _inside(i, e) and i["tid"] == e["tid"]]
        assert sorted(i["name"] for i in mine) == sorted(kinds)
    # The modelled track (drawn in Python from the executable's stats) beside each chunk.
    modelled = executable.from_bytes(exe).stats["device_model"]["instruction_seconds"][0]
    assert len(by_cat["modelled"]) == 3 * len(modelled)
    assert sorted(e["dur"] for e in by_cat["modelled"]) == pytest.approx(
        sorted(round(s * 1e6, 3) for s in modelled * 3), abs=1e-3)
    assert {tracks[e["tid"]] for e in by_cat["modelled"]} == {
        "device cores [0]: Identity:0 (modelled time)"}
    rows = profiler.top_instructions(trace)
    assert {r["instruction"] for r in rows} == set(kinds)
    assert all(r["engine"] == "native" and r["calls"] == 3 and r["modelled_us"] > 0
               for r in rows)


def test_off_again_records_nothing_and_on_again_records_the_same_model(
        graph_and_exe, monkeypatch: pytest.MonkeyPatch) -> None:
    _, exe = graph_and_exe
    monkeypatch.delenv("NEURONISH_KERNEL", raising=False)
    x = np.zeros((BATCH, 8, 8, 3), np.float32)
    profiler.start()
    try:
        model = load(exe)
    finally:
        profiler.stop()
    with model:
        assert isinstance(model, NativeModel)
        recorder = _recorder()
        model.run_list([x])  # off: the library is not recording, keeps nothing
        assert not recorder.recording()
        assert recorder.stop()["spans"] == []
        profiler.start()
        try:
            # From another thread: its spans on that thread's track.
            worker = threading.Thread(target=model.run_list, args=([x],), name="worker")
            worker.start()
            worker.join()
        finally:
            trace = profiler.stop()
    by_cat = spans_by_category(trace)
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
              if e["name"] == "thread_name"}
    assert [tracks[e["tid"]] for e in by_cat["call"]] == ["host (worker)"]
    assert len(by_cat["execute"]) == 1 and by_cat["instruction"]


def test_a_model_loaded_before_recording_is_timed_by_it(graph_and_exe,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded and called with no profile recording, then profiled: its calls have their
    execute spans and one measured span per instruction (the engine's timing buffers were
    set up only for models loaded while recording)."""
    g, exe = graph_and_exe
    monkeypatch.delenv("NEURONISH_KERNEL", raising=False)
    x = np.random.default_rng(2).standard_normal((BATCH, 8, 8, 3)).astype(np.float32)
    [want] = g.reference({"x:0": x}).values()
    with load(exe) as model:
        assert isinstance(model, NativeModel)
        model.run_list([x])
        profiler.start()
        try:
            [out] = model.run_list([x])
        finally:
            trace = profiler.stop()
        [again] = model.run_list([x])  # (no longer timed: the engine reads no clock)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(again, out)
    by_cat = spans_by_category(trace)
    assert len(by_cat["call"]) == len(by_cat["execute"]) == 1
    [execute] = by_cat["execute"]
    kinds = [i.kind for i in executable.from_bytes(exe).programs[0]]
    assert sorted(s["name"] for s in by_cat["instruction"]) == sorted(kinds)
    assert all(_inside(s, execute) for s in by_cat["instruction"])


def test_the_c_api_refuses_to_take_a_profile_neuronish_profile_writes(tmp_path: Path) -> None:
    """A process whose library records for NEURONISH_PROFILE (a C host: no
    nr_host_observes) cannot start or take an on-demand recording: that trace has one
    writer, at exit; and a NULL out-pointer is refused by name."""
    script = (
        "import ctypes, sys\n"
        "lib = ctypes.CDLL(sys.argv[1])\n"
        "err = ctypes.create_string_buffer(512)\n"
        "dev = ctypes.c_void_p()\n"
        "assert lib.nr_device_open(ctypes.byref(dev), err, 512) == 0, err.value\n"
        "print(lib.nr_profile_recording())\n"
        "print(lib.nr_profile_start(err, 512), err.value.decode())\n"
        "text, size = ctypes.c_void_p(), ctypes.c_size_t()\n"
        "print(lib.nr_profile_stop(ctypes.byref(text), ctypes.byref(size), err, 512),"
        " err.value.decode())\n"
        "print(lib.nr_profile_stop(None, ctypes.byref(size), err, 512), err.value.decode())\n")
    r = subprocess.run([sys.executable, "-c", script, str(library.build())],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NEURONISH_PROFILE": str(tmp_path),
                            "NEURONISH_TELEMETRY": "0"})
    assert r.returncode == 0, r.stderr
    recording, start, stop, null = r.stdout.splitlines()
    assert recording == "1"
    assert start.startswith("1 ") and f"NEURONISH_PROFILE={tmp_path}" in start  # invalid arg
    assert stop.startswith("1 ") and "NEURONISH_PROFILE" in stop
    assert null == "1 spans or size is NULL"
    assert list(tmp_path.iterdir()) == []  # nothing ran: nothing written


def test_the_spans_json_names_clock_tracks_and_threads(graph_and_exe) -> None:
    """nr_profile_stop's text, as the header documents it: times on perf_counter's clock,
    a host span's thread the caller's native id."""
    _, exe = graph_and_exe
    lib = binding.load_library()
    device = binding.Device(lib)
    recorder = _recorder()
    err = ctypes.create_string_buffer(512)
    assert lib.nr_profile_start(err, 512) == 0, err.value
    try:
        model = binding.Model(device, exe)  # (loaded while recording: timed)
        before = time.perf_counter()
        model.run([np.zeros((BATCH, 8, 8, 3), np.float32)])
        after = time.perf_counter()
    finally:
        text, size = ctypes.c_void_p(), ctypes.c_size_t()
        status = lib.nr_profile_stop(ctypes.byref(text), ctypes.byref(size), err, 512)
    try:
        assert status == 0, err.value
        raw = ctypes.string_at(text, size.value + 1)
    finally:
        lib.nr_profile_free(text)
        model.unload()
        device.close()
    assert not recorder.recording()
    assert raw.endswith(b"\0")
    got = json.loads(raw[:-1])
    assert got["clock"] == "CLOCK_MONOTONIC" and got["dropped_events"] == 0
    by_cat = collections.defaultdict(list)
    for s in got["spans"]:
        by_cat[s["cat"]].append(s)
        assert before <= s["start"] <= s["end"] <= after, s
    [call] = by_cat["call"]
    assert call["thread"] == threading.get_native_id()
    assert call["track"] == f"host (thread {threading.get_native_id()})"
    [execute] = by_cat["execute"]
    assert "thread" not in execute and execute["track"] == "device cores [0]: Identity:0"
    assert len(by_cat["instruction"]) == len(executable.from_bytes(exe).programs[0])
    assert all(s["args"]["engine"] == "native" and s["args"]["tf"] for s in by_cat["instruction"])


def test_start_and_stop_while_calls_are_in_flight(graph_and_exe,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Recording switched on and off while four threads call the model: every trace is
    well formed (spans nest on each track), every call's outputs are right."""
    g, exe = graph_and_exe
    monkeypatch.delenv("NEURONISH_KERNEL", raising=False)
    x = np.random.default_rng(1).standard_normal((CALL_BATCH, 8, 8, 3)).astype(np.float32)
    [want] = g.reference({"x:0": x}).values()
    profiler.start()
    try:
        model = load(exe, duplicates=2)
    finally:
        profiler.stop()
    done = threading.Event()
    wrong: list[str] = []

    def caller() -> None:
        while not done.is_set():
            [out] = model.run_list([x])
            if not np.allclose(out, want, rtol=1e-4, atol=1e-4):
                wrong.append("outputs differ from TensorFlow's")

    with model:
        assert isinstance(model, NativeModel)
        threads = [threading.Thread(target=caller, name=f"caller {k}") for k in range(4)]
        for t in threads:
            t.start()
        try:
            executes = 0
            for _ in range(20):
                profiler.start()
                time.sleep(0.01)
                executes += len(spans_by_category(profiler.stop()).get("execute", []))
        finally:
            done.set()
            for t in threads:
                t.join()
    assert not wrong and executes > 0
    assert not _recorder().recording()


def test_models_sharing_a_label_keep_their_own_modelled_track(graph_and_exe) -> None:
    """Two C models of one label (every compiled SavedModel has a neuron_op_0): the spans
    carry each model's nr_model_id, so a chunk of one is never drawn with the other's
    modelled instructions (keyed by label, the second load overwrote the first)."""
    from neuronish.runtime.capi import native_model
    from tests.graphs import dense_relu

    _, conv_exe = graph_and_exe
    g = dense_relu(batch=BATCH)
    dense_exe = compile_graph(g.graph_def, g.io_config)
    profiler.start()
    try:
        conv = native_model.load(conv_exe, 1, "model:1 op").model
        dense = native_model.load(dense_exe, 1, "model:1 op").model
        assert conv is not None and dense is not None and conv.id != dense.id
        conv_id = conv.id
        conv.run_list([np.zeros((BATCH, 8, 8, 3), np.float32)])
    finally:
        trace = profiler.stop()
        for m in (conv, dense):
            m.unload()
    by_cat = spans_by_category(trace)
    assert {e["args"]["model_id"] for e in by_cat["execute"]} == {conv_id}
    want = [i.kind for i in executable.from_bytes(conv_exe).programs[0]]
    assert sorted(e["name"] for e in by_cat["instruction"]) == sorted(want)
    assert sorted(e["name"] for e in by_cat["modelled"]) == sorted(want)
    assert conv_id not in profiler._native_abouts  # unloaded: not kept after the recording
