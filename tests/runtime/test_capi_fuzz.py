"""Untrusted executables through the C runtime's whole path: the fuzz mutants
(tests/runtime/executable_fuzz.py) that loading accepts are loaded as models and run on
zeros by examples/c/run_model.c, one child process each, at the compiled batch and at
another. Each either runs or is refused with a status and a message; none may crash (a
signal), hang, or exit any other way."""

from __future__ import annotations

import resource
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from neuronish.runtime import executable
from neuronish.runtime.errors import ExecutableError
from tests.runtime import executable_fuzz
from tests.runtime.test_capi_example import _build

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to build the C example")


def _limit_memory() -> None:  # a runaway allocation fails instead of taking the machine
    resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))


def test_accepted_mutants_run_or_are_refused(tmp_path: Path) -> None:
    program = _build(tmp_path / "run_model")
    mutants = executable_fuzz.mutants(executable_fuzz.seed_executables(), 1000, seed=77)
    accepted = []
    for what, data in mutants:
        try:
            executable.from_bytes(data)
        except ExecutableError:
            continue
        accepted.append((what, data))
    outcomes: Counter = Counter()
    for i, (what, data) in enumerate(accepted):
        path = tmp_path / f"m{i}.neff"
        path.write_bytes(data)
        for batch in ([], ["3"]):
            r = subprocess.run([str(program), str(path), *batch], capture_output=True,
                               text=True, timeout=120, preexec_fn=_limit_memory,
                               env={"OMP_WAIT_POLICY": "passive", "NEURONISH_CORE_THREADS": "1",
                                    "PATH": "/usr/bin:/bin"})
            assert r.returncode in (0, 1), (what, r.returncode, r.stderr[-2000:])
            if r.returncode == 1:
                assert r.stderr.startswith("run_model: ") and "(" in r.stderr, (what, r.stderr)
                outcomes["refused: " + r.stderr.rsplit("(", 1)[1].strip(" )\n")] += 1
            else:
                outcomes["ran"] += 1
    print(f"{len(accepted)} accepted mutants of 1000, run at two batches:", dict(outcomes))
    assert len(accepted) > 20 and outcomes["ran"] > 10
