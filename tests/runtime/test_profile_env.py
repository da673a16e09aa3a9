"""`NEURONISH_PROFILE` naming something that is not a directory (a file, /dev/null, a
dangling symlink, a path under a file) printed a FileExistsError traceback when the
program exited; now one line says why nothing is recorded, and the
program's own exit status stands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Records one span (what a NeuronOp call would), so the exit hook has a trace to write.
PROGRAM = ("from neuronish.runtime import profiler; import time; t = time.perf_counter(); "
           "profiler.record('x', 'tf', 'track', t, t + 1e-6); print('done')")


def run_with(value: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEURONISH_PROFILE": value}
    return subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("kind", ["file", "dev_null", "dangling_symlink", "under_a_file"])
def test_a_profile_path_that_is_not_a_directory_is_one_line(tmp_path: Path, kind: str) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    value = {"file": str(a_file), "dev_null": os.devnull,
             "under_a_file": str(a_file / "traces")}.get(kind)
    if kind == "dangling_symlink":
        (tmp_path / "link").symlink_to(tmp_path / "gone")
        value = str(tmp_path / "link")
    proc = run_with(value)
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "NEURONISH_PROFILE" in lines[0], proc.stderr
    assert a_file.read_text() == "keep me"
    assert not (tmp_path / "gone").exists()


def test_a_directory_still_gets_the_trace(tmp_path: Path) -> None:
    proc = run_with(str(tmp_path / "traces"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    (trace,) = (tmp_path / "traces").glob("neuronish-*.json")
    assert '"x"' in trace.read_text()
