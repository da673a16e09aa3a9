"""Telemetry is not published into a run directory owned by
another user, nor one of mode 0777 (test_run_dir_bounds.py has the mode and symlink
cases for readers). The directory really belongs to another uid when the tests run
as root; otherwise it is ours and the process is made to see another uid, so the
check compares the same two numbers either way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from neuronish.runtime.telemetry import Telemetry, UntrustedRunDir
from tests.runtime.test_run_dir_bounds import _Device

NOBODY = 65534


def _owned_by_another_user(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.getuid() == 0:
        os.chown(run_dir, NOBODY, NOBODY)
    else:
        uid = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: uid + 1)


@pytest.mark.parametrize("mode", [0o700, 0o777])
def test_the_publisher_refuses_a_run_dir_of_another_user(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(run_dir, mode)
    _owned_by_another_user(run_dir, monkeypatch)
    t = Telemetry(run_dir)
    t._device = _Device()
    with pytest.raises(UntrustedRunDir, match=r"belongs to uid \d+"):
        t.publish()
    assert list(run_dir.iterdir()) == []  # nothing written into it
