"""`neuronish ls` / `neuronish top` on a running process: every process using the
device publishes its counters (runtime/telemetry.py) and the tools read them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from neuronish.runtime.config import DeviceConfig
from neuronish.runtime.device import Device
from neuronish.runtime.telemetry import Telemetry, read_all
from tests.graphs import conv_bn_relu

NEURONISH = str(Path(sys.executable).parent / "neuronish")

# Loads the executable with two duplicates and runs it until stdin closes.
_WORKER = textwrap.dedent("""
    import sys, threading
    import numpy as np
    import neuronish.runtime as rt
    model = rt.load(sys.argv[1], duplicates=2)
    x = {s.name: np.ones(s.shape, s.dtype) for s in model.inputs}
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    model.run(x)
    print("ready", flush=True)
    while not stop.is_set():
        model.run(x)
""")


@pytest.fixture(scope="module")
def executable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    g = conv_bn_relu(batch=8)
    path = tmp_path_factory.mktemp("exe") / "conv.neff"
    path.write_bytes(compile_graph(g.graph_def, g.io_config))
    return path


def _env(run_dir: Path) -> dict[str, str]:
    return {**os.environ, "NEURONISH_RUN_DIR": str(run_dir), "NEURONISH_NUM_CORES": "2",
            "NEURONISH_TELEMETRY": "1"}


def _start(executable: Path, env: dict[str, str]) -> subprocess.Popen:
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, str(executable)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "ready"
    return worker


def _published(run_dir: Path, pid: int) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [p for p in read_all(run_dir) if p["pid"] == pid and p["models"]]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"process {pid} published nothing in {run_dir}")


def _tool(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([NEURONISH, *args], capture_output=True, text=True, env=env,
                          timeout=60)


def test_counters_follow_calls_and_memory(executable: Path, tmp_path: Path) -> None:
    device = Device(DeviceConfig.from_env({"NEURONISH_NUM_CORES": "2"}))
    t = Telemetry(tmp_path)
    with load(executable, duplicates=2, device=device) as model:
        t.track(model)
        x = {s.name: np.ones(s.shape, s.dtype) for s in model.inputs}
        for _ in range(3):
            with t.busy(model):
                model.run(x)
        t.publish()
        (data,) = read_all(tmp_path)
        (m,) = data["models"]
        assert (m["calls"], m["inferences"], m["batch"]) == (3, 24, 8)
        assert m["name"] == ", ".join(s.name for s in model.outputs)  # no label: its outputs
        model.label = "net/neuron_op_0"  # as neuronish's kernel bridge names a NeuronOp's
        t.publish()
        assert read_all(tmp_path)[0]["models"][0]["name"] == "net/neuron_op_0"
        assert m["core_groups"] == [[0], [1]] or m["core_groups"] == [[1], [0]]
        used = {int(c): v["used_bytes"] for c, v in data["cores"].items()}
        assert used == {c: r["used"] for c, r in device.memory_report().items()}
        assert used[0] == used[1] == max(m["bytes_per_core"]) > 0
        busy = sum(v["busy_seconds"] for v in data["cores"].values())
        assert busy == pytest.approx(m["busy_seconds"])  # one core per group
        t.untrack(model)
    t.publish()
    assert read_all(tmp_path)[0]["models"] == []
    t.close()
    assert read_all(tmp_path) == []


def test_ls_and_top_show_a_running_process(executable: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    worker = _start(executable, env)
    try:
        data = _published(tmp_path, worker.pid)
        (model,) = data["models"]
        r = _tool("ls", env=env)
        assert r.returncode == 0, r.stderr
        assert "device: 2 core(s)" in r.stdout and str(worker.pid) in r.stdout
        assert model["name"][:30] in r.stdout
        for core in ("0", "1"):  # two duplicates: a copy's weights on each core
            line = next(x for x in r.stdout.splitlines() if x.split()[:1] == [core])
            assert float(line.split()[1]) > 0, r.stdout
        top = _tool("top", "--iterations", "1", "--interval", "0.8", "--json", env=env)
        assert top.returncode == 0, top.stderr
        reading = json.loads(top.stdout)
        assert max(reading["cores"].values()) > 0, reading
        (rate,) = [m for m in reading["models"] if m["pid"] == worker.pid]
        assert rate["inferences_per_second"] > 0 and rate["calls_per_second"] > 0
        screen = _tool("top", "-n", "1", "--interval", "0.5", env=env)
        assert "util" in screen.stdout and str(worker.pid) in screen.stdout
    finally:
        worker.stdin.close()
        assert worker.wait(timeout=30) == 0
    # A process that exits removes its counters.
    assert not (tmp_path / f"{worker.pid}.json").exists()
    assert "no process is using the device" in _tool("ls", env=env).stdout


def test_top_faster_than_the_publisher_still_gives_rates(executable: Path,
                                                         tmp_path: Path) -> None:
    """Readings closer together than PUBLISH_INTERVAL would read one snapshot twice (no
    rate): each screen waits for every process to publish anew."""
    env = _env(tmp_path)
    worker = _start(executable, env)
    try:
        _published(tmp_path, worker.pid)
        top = _tool("top", "--iterations", "3", "--interval", "0.01", "--json", env=env)
        assert top.returncode == 0, top.stderr
        for line in top.stdout.splitlines():
            (rate,) = [m for m in json.loads(line)["models"] if m["pid"] == worker.pid]
            assert rate["calls_per_second"] > 0, line
    finally:
        worker.stdin.close()
        assert worker.wait(timeout=30) == 0


def test_a_killed_process_is_not_listed(executable: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    worker = _start(executable, env)
    _published(tmp_path, worker.pid)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    assert (tmp_path / f"{worker.pid}.json").exists()  # it had no chance to clean up
    r = _tool("ls", "--json", env=env)
    assert json.loads(r.stdout)["processes"] == []
    assert not (tmp_path / f"{worker.pid}.json").exists()


def test_a_forked_child_leaves_its_parents_counters_alone(executable: Path,
                                                          tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import os, sys, time
        import numpy as np
        import neuronish.runtime as rt
        from neuronish.runtime import telemetry
        model = rt.load(sys.argv[1])
        telemetry.get_telemetry().publish()
        pid = os.fork()
        if pid == 0:  # the child exits normally: its atexit must not remove the file
            sys.exit(0)
        os.waitpid(pid, 0)
        print(os.path.exists(telemetry.get_telemetry().path), flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", script, str(executable)], env=_env(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def test_sizes_keep_a_unit_that_shows_them() -> None:
    """A tiny model's 12 KiB read "0.0 MiB" when every size was printed in MiB."""
    from neuronish.device_tools import format_ls, size
    assert [size(n) for n in (0, 1023, 1024, 12 << 10, 97 << 20, 3 << 30)] == [
        "0 B", "1023 B", "1.0 KiB", "12.0 KiB", "97.0 MiB", "3.0 GiB"]
    device = {"num_cores": 1, "visible_cores": [0], "core_groups": [[0]],
              "core_memory": 256 << 20, "engine": "native"}
    process = {"pid": 7, "command": "serve", "device": device,
               "cores": {"0": {"used_bytes": 12 << 10, "busy_seconds": 0.0}},
               "models": [{"id": 1, "name": "tiny", "core_groups": [[0]],
                           "bytes_per_core": [12 << 10], "calls": 3}]}
    lines = format_ls([process]).splitlines()
    assert lines[0].endswith("256.0 MiB per core, engine native"), lines[0]
    assert lines[2].split() == ["0", "12.0", "KiB", "of", "256.0", "MiB"], lines
    assert lines[-1].split()[:6] == ["7", "tiny", "[[0]]", "12.0", "KiB", "3"], lines
