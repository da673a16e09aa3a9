"""The compile driver with real `neuronish-cc` subprocesses, and with a stand-in
compiler that hangs, crashes or logs when it starts and stops."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from neuronish import compile_driver
from neuronish.compile_driver import CompileJob, CompileResult, compile_all
from neuronish.runtime import load
from tests.graphs import TracedGraph, conv_bn_relu, dense_relu, trace

REAL_CC = Path(sys.executable).parent / "neuronish-cc"

# Stands in for neuronish-cc. By the subgraph's name (the --workdir folder):
#   hang*   starts a child `sleep` (same process group), records both pids, sleeps
#   crash*  prints a line, then kills itself with SIGSEGV
#   else    logs "start", optionally waits until $FAKE_CC_BARRIER compilers have
#           started, runs the real compiler, logs "stop", exits with its status.
# Events are appended to $FAKE_CC_EVENTS, one line each; appends are atomic, so
# the file's line order is the order in which things happened.
FAKE_CC = """\
#!{python}
import os, resource, signal, subprocess, sys, time

args = sys.argv[1:]
job_dir = args[args.index("--workdir") + 1]
name = os.path.basename(job_dir)
events = os.environ.get("FAKE_CC_EVENTS")


def log(event):
    if events:
        with open(events, "a") as f:
            f.write(f"{{event}} {{name}} {{time.monotonic():.6f}}\\n")


def started():
    with open(events) as f:
        return sum(line.startswith("start ") for line in f)


if name.startswith("hang"):
    child = subprocess.Popen(["sleep", "60"])
    with open(os.path.join(job_dir, "pids.tmp"), "w") as f:
        f.write(f"{{os.getpid()}} {{child.pid}}")
    os.replace(os.path.join(job_dir, "pids.tmp"), os.path.join(job_dir, "pids"))
    time.sleep(60)
if name.startswith("crash"):
    print("fake-cc: about to crash", flush=True)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.kill(os.getpid(), signal.SIGSEGV)
log("start")
barrier = int(os.environ.get("FAKE_CC_BARRIER", "0"))
give_up = time.monotonic() + 30
while barrier and started() < barrier and time.monotonic() < give_up:
    time.sleep(0.01)
status = subprocess.call([{real_cc!r}, *args])
log("stop")
sys.exit(status)
"""


@pytest.fixture
def fake_cc(tmp_path: Path) -> Path:
    path = tmp_path / "fake-neuronish-cc"
    path.write_text(FAKE_CC.format(python=sys.executable, real_cc=str(REAL_CC)))
    path.chmod(0o755)
    return path


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Temporary directories go here, so a test can see that none is left behind."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def job(name: str, g: TracedGraph, *args: str) -> CompileJob:
    return CompileJob(name, g.graph_def, g.io_config, tuple(args))


def children() -> list[str]:
    """Our child processes still around (zombies included), as "pid state command"."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # not a process, or it just went away
        command, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
        state, ppid = rest.split()[:2]
        if int(ppid) == me:
            found.append(f"{entry.name} {state} {command}")
    return found


@pytest.fixture
def new_children() -> Callable[[], list[str]]:
    """Our child processes started during the test and still around: processes other
    tests' fixtures keep running (a model server, say) are not this test's leak."""
    before = set(children())
    return lambda: [c for c in children() if c not in before]


def assert_gone(pids: list[int]) -> None:
    """Each pid has exited. A killed grandchild is re-parented to init and may
    linger as a zombie until init reaps it; that is not ours to reap."""
    deadline = time.monotonic() + 10
    for pid in pids:
        while True:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                break
            if state == "Z":
                break
            assert time.monotonic() < deadline, f"process {pid} still running (state {state})"
            time.sleep(0.05)


def read_pids(job_dir: Path) -> list[int]:
    deadline = time.monotonic() + 60
    while not (job_dir / "pids").exists():
        assert time.monotonic() < deadline, f"the fake compiler never wrote {job_dir}/pids"
        time.sleep(0.02)
    return [int(p) for p in (job_dir / "pids").read_text().split()]


def max_concurrency(events: Path) -> int:
    running = peak = 0
    for line in events.read_text().splitlines():
        running += 1 if line.startswith("start ") else -1
        peak = max(peak, running)
    return peak


# --------------------------------------------------------------------------- real compiler


def test_compiles_in_parallel_and_the_executables_match_tensorflow(
        tmp_path: Path, new_children: Callable[[], list[str]]) -> None:
    graphs = {"dense": dense_relu(batch=4), "conv": conv_bn_relu(batch=2),
              "dense_small": dense_relu(batch=2, features=8, units=3, seed=1)}
    calls: list[tuple[int, int, str, int]] = []

    def progress(done: int, total: int, result: CompileResult) -> None:
        calls.append((done, total, result.name, threading.get_ident()))

    work = tmp_path / "work"
    results = compile_all([job(n, g) for n, g in graphs.items()], max_num_compilers=3,
                          workdir=work, progress=progress)

    assert [r.name for r in results] == list(graphs)  # job order, not finishing order
    assert [c[:2] for c in calls] == [(1, 3), (2, 3), (3, 3)]
    assert {c[2] for c in calls} == set(graphs)
    assert {c[3] for c in calls} == {threading.get_ident()}
    rng = np.random.default_rng(0)
    for result, (name, g) in zip(results, graphs.items()):
        assert result.outcome == "compiled" and result.ok, result.error
        assert result.seconds > 0 and result.error == "" and result.rejected_nodes == []
        folder = work / name
        assert result.workdir == str(folder) and result.log_path == str(folder / "compiler.log")
        for file in ("graph.pb", "io-config.json", "command_line.txt", "compiler.log"):
            assert (folder / file).is_file(), file
        assert (folder / "graph.pb").read_bytes() == g.graph_def
        assert (folder / f"{name}.neff").read_bytes() == result.executable
        assert result.command_line[0] == str(REAL_CC)
        assert str(REAL_CC) in (folder / "command_line.txt").read_text()
        feeds = {n: rng.standard_normal(shape).astype(dtype)
                 for n, (shape, dtype) in g.io_config["inputs"].items()}
        with load(result.executable) as model:
            got = model.run(feeds)
        for key, want in g.reference(feeds).items():
            np.testing.assert_allclose(got[key], want, rtol=1e-4, atol=1e-5)
    assert new_children() == []


def test_unsupported_op_is_rejected_with_the_node_named(private_tmp: Path) -> None:
    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.relu(tf.math.cumulative_logsumexp(x, axis=1, name="running_total"))

    g = trace(fn, tf.TensorSpec([2, 3], tf.float32, name="x"))
    [result] = compile_all([job("cluster_7", g)])

    assert result.outcome == "rejected" and not result.ok and result.executable is None
    assert result.error_class == "UnsupportedNodes"
    assert "cluster_7" in result.error and "running_total (CumulativeLogsumexp)" in result.error
    assert {"node": "running_total", "op": "CumulativeLogsumexp"}.items() <= \
        result.rejected_nodes[0].items()
    assert set(result.rejected_nodes[0]) == {"node", "op", "reason", "hint"}
    # No workdir: everything lived in a temporary directory, now removed.
    assert result.workdir is None and result.log_path is None
    assert list(private_tmp.iterdir()) == []


def test_bad_compiler_flag_fails_naming_compiler_args(tmp_path: Path) -> None:
    [result] = compile_all([job("flags", dense_relu(), "--no-such-flag")], workdir=tmp_path)
    assert result.outcome == "bad_usage" and not result.ok
    assert "'flags'" in result.error and "status 2" in result.error
    assert "compiler_args" in result.error and "--no-such-flag" in result.error  # log tail


def test_a_malformed_io_config_is_a_failure_not_the_users_flags(tmp_path: Path) -> None:
    g = dense_relu()
    bad = CompileJob("io", g.graph_def, {"inputs": {"x": [[4, 16], "float32"]},
                                         "outputs": g.io_config["outputs"]})
    [result] = compile_all([bad], workdir=tmp_path)
    assert result.outcome == "failed" and not result.ok
    assert "io-config neuronish wrote is malformed" in result.error and "'x:0'" in result.error
    assert "compiler_args" not in result.error.split("(see")[0]


def test_missing_compiler_says_how_to_choose_one(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-compiler")
    [result] = compile_all([job("a", dense_relu())], compiler=[missing], workdir=tmp_path / "w")
    assert result.outcome == "failed"
    assert missing in result.error and "NEURONISH_CC" in result.error


# --------------------------------------------------------------------------- misbehaving compiler


def test_hung_compiler_is_killed_with_its_process_group(
        fake_cc: Path, tmp_path: Path, new_children: Callable[[], list[str]]) -> None:
    work = tmp_path / "work"
    results = compile_all([job("hang_0", dense_relu()), job("fine", dense_relu())],
                          compiler=[str(fake_cc)], timeout=5, workdir=work,
                          max_num_compilers=2)
    hung, fine = results
    assert fine.outcome == "compiled", fine.error
    assert hung.outcome == "timeout" and not hung.ok and hung.executable is None
    assert 5 <= hung.seconds < 5 + 30  # the limit, plus slack for a loaded machine (< 60)
    assert "'hang_0'" in hung.error and "5 s" in hung.error
    assert_gone(read_pids(work / "hang_0"))  # the compiler and the child it started
    assert new_children() == []


def test_crashed_compiler_from_neuronish_cc_env(
        fake_cc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        new_children: Callable[[], list[str]]) -> None:
    # $NEURONISH_CC is split like a shell command line.
    monkeypatch.setenv("NEURONISH_CC", f"{sys.executable} {fake_cc}")
    [result] = compile_all([job("crash_0", dense_relu())], workdir=tmp_path)
    assert result.command_line[:2] == [sys.executable, str(fake_cc)]
    assert result.outcome == "crashed" and not result.ok
    assert "'crash_0'" in result.error and "SIGSEGV" in result.error
    assert "fake-cc: about to crash" in result.error  # the log's tail
    assert new_children() == []


@pytest.mark.parametrize("limit, num_jobs", [(1, 3), (3, 6)])
def test_at_most_max_num_compilers_run_at_once(
        fake_cc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        limit: int, num_jobs: int) -> None:
    events = tmp_path / "events.txt"
    events.touch()
    monkeypatch.setenv("FAKE_CC_EVENTS", str(events))
    # Each compiler waits until `limit` have started: with a driver that ran
    # fewer at once, they would only go on after the 30 s give-up.
    monkeypatch.setenv("FAKE_CC_BARRIER", str(limit) if limit > 1 else "0")
    g = dense_relu()
    results = compile_all([job(f"j{i}", g) for i in range(num_jobs)], compiler=[str(fake_cc)],
                          max_num_compilers=limit, workdir=tmp_path / "work")
    assert [r.outcome for r in results] == ["compiled"] * num_jobs, [r.error for r in results]
    assert len(events.read_text().splitlines()) == 2 * num_jobs
    assert max_concurrency(events) == limit, events.read_text()


def test_interrupt_kills_running_compilers(
        fake_cc: Path, private_tmp: Path, monkeypatch: pytest.MonkeyPatch,
        new_children: Callable[[], list[str]]) -> None:
    pids: list[int] = []

    def progress(done: int, total: int, result: CompileResult) -> None:
        # "fine" finished while "hang_1" still runs: now the user presses Ctrl-C.
        [folder] = private_tmp.iterdir()
        pids.extend(read_pids(folder / "hang_1"))
        raise KeyboardInterrupt

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        compile_all([job("fine", dense_relu()), job("hang_1", dense_relu())],
                    compiler=[str(fake_cc)], max_num_compilers=2, progress=progress)
    assert time.monotonic() - start < 40  # not the fake compiler's 60 s
    assert len(pids) == 2
    assert_gone(pids)
    assert new_children() == []
    assert list(private_tmp.iterdir()) == []


# --------------------------------------------------------------------------- arguments


def test_argument_errors() -> None:
    g = dense_relu()
    with pytest.raises(ValueError, match="'a' are named|named 'a'"):
        compile_all([job("a", g), job("a", g)])
    with pytest.raises(ValueError, match="'../x'"):
        compile_all([job("../x", g)])
    with pytest.raises(ValueError, match="max_num_compilers"):
        compile_all([job("a", g)], max_num_compilers=0)
    with pytest.raises(ValueError, match="timeout"):
        compile_all([job("a", g)], timeout=0)
    assert compile_all([]) == []


def test_default_max_num_compilers_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    gib = 2**30
    monkeypatch.setattr(compile_driver, "usable_cpus", lambda: 8)
    monkeypatch.setattr(compile_driver, "_available_memory", lambda: 3 * gib + 5)
    assert compile_driver.default_max_num_compilers(gib) == 3  # memory-bound
    assert compile_driver.default_max_num_compilers(gib // 4) == 8  # CPU-bound
    assert compile_driver.default_max_num_compilers(16 * gib) == 1  # never below one
    monkeypatch.setattr(compile_driver, "_available_memory", lambda: None)
    assert compile_driver.default_max_num_compilers(16 * gib) == 8  # no /proc/meminfo
    monkeypatch.undo()
    assert compile_driver.default_max_num_compilers() >= 1
    assert compile_driver.estimate_compiler_memory(100 * 2**20) > 100 * 2**20
