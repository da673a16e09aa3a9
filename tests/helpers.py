"""Shared test helpers: build tiny TF graphs, compile them, run them on the device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load


def compile_and_run(graph_def: bytes, io_config: dict, feeds: dict[str, np.ndarray],
                    **options: object) -> dict[str, np.ndarray]:
    """Compile `graph_def` in-process with the real pipeline (lower, passes,
    memory plan, executable file) and run the executable on the device."""
    executable = compile_graph(graph_def, io_config, **options)
    model = load(executable)
    try:
        return model.run(feeds)
    finally:
        model.unload()


def rewritten_copy(rewrite: object, graph_def: object, *args: object) -> tuple[bool, object]:
    """(whether `rewrite` changed anything, the result) for a rewrite that edits a
    `neuronish.graph.Graph` in place, run on a copy of `graph_def`: the original stays as
    it was, to compare the two."""
    from tensorflow.core.framework import graph_pb2

    from neuronish.graph import Graph

    copy = graph_pb2.GraphDef()
    copy.CopyFrom(graph_def)
    graph = Graph(copy)
    changed = rewrite(graph, *args)
    return changed, graph.graph_def


def run_reporting_numpy(exe: bytes, feeds: dict) -> tuple[dict, list[str]]:
    """The outputs of one call, and the kinds of the instructions the native engine
    left to numpy."""
    with load(exe, runtime="python") as model:
        got = model.run(feeds)
        program = model._idle.get()
        model._idle.put(program)
        left = [program.instructions[i].kind for stage in program.stages if stage.native
                for i in stage.native.rejected]
    return got, left


def one_output_on_every_engine(exe: bytes, feeds: dict[str, np.ndarray],
                               monkeypatch: object) -> dict[str, np.ndarray]:
    """The one output of a call on the numpy reference engine, the native engine under the
    Python host (which must leave nothing to numpy) and the C runtime (g++ needed)."""
    from neuronish.runtime.capi import binding

    out = {}
    monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
    with load(exe, runtime="python") as model:
        [out["numpy"]] = model.run(feeds).values()
    monkeypatch.setenv("NEURONISH_ENGINE", "native")
    native, left = run_reporting_numpy(exe, feeds)
    assert left == [], f"left to numpy: {left}"
    [out["native"]] = native.values()
    device = binding.Device(binding.load_library())
    try:
        model = binding.Model(device, exe)
        [out["c_runtime"]] = model.run(list(feeds.values()))
        model.unload()
    finally:
        device.close()
    return out


def onednn_exec_lines(probe: str, *args: str, **env: str) -> list[list[str]]:
    """The comma-separated fields of every ONEDNN_VERBOSE `exec` line printed while Python
    runs `probe` (a script, with `args`) from the repository's root on the native engine,
    with `env` added to the environment: which primitives oneDNN ran, on what, with which
    attributes. A subprocess, as oneDNN reads ONEDNN_VERBOSE once per process."""
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", probe, *args], cwd=root, capture_output=True,
                         text=True, timeout=300,
                         env=dict(os.environ, NEURONISH_ENGINE="native", ONEDNN_VERBOSE="1",
                                  **env))
    assert run.returncode == 0, run.stderr[-3000:]
    return [line.split(",") for line in run.stdout.splitlines()
            if line.startswith("onednn_verbose,exec,")]
