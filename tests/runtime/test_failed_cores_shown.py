"""`neuronish ls` and `top` show a failed core as failed, and why, whichever runtime's
process reports it: a C host (examples/c/run_model.c, runtime/capi/observe.cc) and a
Python host (runtime/telemetry.py) both put the core's message in its counters."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from neuronish.runtime import telemetry
from tests.runtime.test_capi_observe import DEADLINE, NEURONISH, _env, _wait_for, built

__all__ = ["built"]  # (the C example and its model: a fixture shared with test_capi_observe)

WHY = "core 1 failed (ECC error)"

_PYTHON_HOST = textwrap.dedent("""
    import sys
    import numpy as np
    import neuronish.runtime as rt
    model = rt.load(sys.argv[1])
    model.run({s.name: np.ones(s.shape, s.dtype) for s in model.inputs})
    print("ready", flush=True)
    sys.stdin.read()
""")


def _record(run_dir: Path, pid: int) -> dict:
    def published() -> dict | None:
        mine = [p for p in telemetry.read_all(run_dir) if p["pid"] == pid] \
            if run_dir.exists() else []
        return mine[0] if mine and mine[0]["models"] else None
    return _wait_for(f"process {pid}'s counters", published)


def _shown(run_dir: Path) -> None:
    for tool in (["ls"], ["top", "-n", "1", "--interval", "0.3"]):
        r = subprocess.run([NEURONISH, *tool], capture_output=True, text=True, timeout=DEADLINE,
                           env={**os.environ, "NEURONISH_RUN_DIR": str(run_dir)})
        assert r.returncode == 0, r.stderr
        lines = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln[:4].strip().isdigit()
                 and len(ln.split()) > 1 and ln.split()[0] in ("0", "1")}
        assert lines["1"].endswith(f"FAILED: {WHY}"), r.stdout
        assert "FAILED" not in lines["0"], r.stdout


def test_a_c_host_reports_its_failed_core(built: tuple[Path, Path], tmp_path: Path) -> None:
    program, model = built
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([str(program), "-w", str(model), "2"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(NEURONISH_RUN_DIR=str(run_dir), NEURONISH_NUM_CORES="2",
                                     NEURONISH_FAILED_CORES="1:ECC error"))
    try:
        record = _record(run_dir, proc.pid)
        assert record["cores"]["1"]["failed"] == WHY
        assert "failed" not in record["cores"]["0"]
        assert telemetry.check_record(record) is None
        _shown(run_dir)
    finally:
        out, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 0, err


def test_a_python_host_reports_its_failed_core(built: tuple[Path, Path],
                                               tmp_path: Path) -> None:
    _, model = built
    run_dir = tmp_path / "run"
    env = {**os.environ, "NEURONISH_RUN_DIR": str(run_dir), "NEURONISH_NUM_CORES": "2",
           "NEURONISH_TELEMETRY": "1", "NEURONISH_FAILED_CORES": "1:ECC error"}
    proc = subprocess.Popen([sys.executable, "-c", _PYTHON_HOST, str(model)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
        record = _record(run_dir, proc.pid)
        assert record["cores"]["1"]["failed"] == WHY
        assert "failed" not in record["cores"]["0"]
        _shown(run_dir)
    finally:
        proc.communicate(timeout=DEADLINE)


def test_a_failed_field_that_is_not_a_string_is_refused() -> None:
    record = {"pid": 5, "time": 1.0, "command": "x", "models": [],
              "device": {"num_cores": 1, "visible_cores": [0], "core_groups": [[0]],
                         "core_memory": 1},
              "cores": {"0": {"used_bytes": 0, "busy_seconds": 0.0, "failed": 3}}}
    assert "'failed' must be a message string" in telemetry.check_record(record)
