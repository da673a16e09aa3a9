"""`neuronish ls` / `top` and the telemetry publisher against a hostile run
directory: one malformed counters file, a /dev/zero link, a FIFO or a
3 GiB sparse file is skipped with one line naming it (no traceback, no hang, no
GiB read); a run directory another user could write is refused by readers and not
published into."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuronish.runtime import telemetry
from neuronish.runtime.telemetry import Telemetry, UntrustedRunDir, read_all

NEURONISH = str(Path(sys.executable).parent / "neuronish")
CAP = 2 << 30


def _good(pid: int) -> dict:
    return {"format": 1, "pid": pid, "command": "python serve.py", "started": time.time(),
            "time": time.time(),
            "device": {"num_cores": 2, "visible_cores": [0, 1], "core_groups": [[0], [1]],
                       "core_memory": 1 << 30, "engine": "numpy"},
            "cores": {"0": {"used_bytes": 1 << 20, "busy_seconds": 0.5}},
            "models": [{"id": 0, "name": "net/neuron_op_0", "core_groups": [[0]],
                        "bytes_per_core": [1 << 20], "batch": 1, "engine": "numpy",
                        "calls": 3, "inferences": 3, "busy_seconds": 0.5, "loaded_at": 0.0}]}


def _bad_records(pid: int) -> dict[str, object]:
    """Each broke ls/top with the named exception, or worse."""
    good = _good(pid)
    no_device = {k: v for k, v in good.items() if k != "device"}
    return {
        "keyerror.json": no_device,                                    # KeyError
        "typeerror.json": {**good, "pid": "12"},                         # TypeError
        "attributeerror.json": {**good, "cores": [1, 2]},                # AttributeError
        "overflow.json": {**good, "models": [{**good["models"][0],
                                              "bytes_per_core": [10**400]}]},  # OverflowError
        "not-an-object.json": [1, 2, 3],
        "empty-models-bytes.json": {**good, "models": [{**good["models"][0],
                                                        "bytes_per_core": []}]},  # ValueError
        "pid-zero.json": {**good, "pid": 0},
    }


def _populate(run_dir: Path) -> int:
    """A run dir with one good record (this test process: alive) and every kind of bad
    file; returns how many bad files."""
    run_dir.mkdir(mode=0o700)
    me = os.getpid()
    (run_dir / f"{me}.json").write_text(json.dumps(_good(me)))
    bad = _bad_records(me)
    for name, value in bad.items():
        (run_dir / name).write_text(json.dumps(value))
    (run_dir / "recursion.json").write_text("[" * 100_000 + "]" * 100_000)  # RecursionError
    (run_dir / "not-json.json").write_text("{")
    (run_dir / "zero.json").symlink_to("/dev/zero")  # MemoryError at 1.7 GB
    os.mkfifo(run_dir / "fifo.json")  # hung all three commands
    with open(run_dir / "sparse.json", "wb") as f:
        f.truncate(3 << 30)
    (run_dir / "dir.json").mkdir()
    return len(bad) + 6


def _tool(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    return subprocess.run([NEURONISH, *args], capture_output=True, text=True, timeout=60,
                          preexec_fn=cap, env={**os.environ, "NEURONISH_RUN_DIR": str(run_dir)})


@pytest.mark.parametrize("args", [("ls",), ("ls", "--json"),
                                  ("top", "-n", "1", "--interval", "0.1"),
                                  ("top", "-n", "1", "--interval", "0.1", "--json")])
def test_ls_and_top_skip_every_bad_file(args: tuple[str, ...], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    count = _populate(run_dir)
    done = _tool(run_dir, *args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    skipped = [line for line in done.stderr.splitlines() if line.startswith("neuronish: skipped")]
    assert len(skipped) == count, done.stderr
    for why in ("zero.json: the counters file is a symlink",
                "fifo.json: the counters file is a FIFO",
                "sparse.json: the counters file has 3221225472 bytes",
                "recursion.json: the counters file nests deeper than 8 levels",
                "keyerror.json: field 'device' is missing"):
        assert why in done.stderr, done.stderr
    if args == ("ls",):
        assert str(os.getpid()) in done.stdout and "net/neuron_op_0" in done.stdout
    assert (run_dir / "typeerror.json").exists()  # not ours to delete


def test_a_symlinked_counters_file_is_skipped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps(_good(os.getpid())))
    (run_dir / "link.json").symlink_to(real)
    skipped: list[str] = []
    assert read_all(run_dir, skipped) == []
    assert "is a symlink" in skipped[0]


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_run_dir_others_can_write_is_refused(mode: int, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(run_dir, mode)
    done = _tool(run_dir, "ls")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"directory {run_dir} is writable by group or others (mode {mode:04o})" in done.stderr
    with pytest.raises(UntrustedRunDir, match="writable by group or others"):
        read_all(run_dir)


def test_a_symlinked_run_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "run").symlink_to(tmp_path / "real")
    with pytest.raises(UntrustedRunDir, match="is a symbolic link"):
        read_all(tmp_path / "run")


class _Device:
    class config:  # noqa: N801 (stands for a DeviceConfig)
        num_cores, visible_cores, core_groups, core_memory = 1, (0,), ((0,),), 1 << 20

    @staticmethod
    def memory_report() -> dict:
        return {0: {"used": 0, "free": 1 << 20}}

    @staticmethod
    def failed_cores() -> dict:
        return {}


def test_the_publisher_refuses_a_world_writable_run_dir(tmp_path: Path) -> None:
    """Telemetry was published into a run directory of mode 0777."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(run_dir, 0o777)
    t = Telemetry(run_dir)
    t._device = _Device()
    with pytest.raises(UntrustedRunDir, match="writable by group or others"):
        t.publish()
    assert list(run_dir.iterdir()) == []
    os.chmod(run_dir, 0o700)
    t.publish()
    assert [p.name for p in run_dir.iterdir()] == [f"{os.getpid()}.json"]


def test_the_publisher_creates_its_run_dir_private(tmp_path: Path) -> None:
    t = Telemetry(tmp_path / "new")
    t._device = _Device()
    t.publish()
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o700
    (record,) = read_all(tmp_path / "new")
    assert telemetry.check_record(record) is None
