"""The reference-model cache (`models/cache.py`) builds an entry once and drops a
model's entries under other keys once nobody has used them for a while."""

from __future__ import annotations

import os
import time
from pathlib import Path

from models import cache


def _entry(root: Path, name: str, marker: str, idle_s: float) -> Path:
    path = root / name
    path.mkdir()
    (path / marker).write_text("x")
    then = time.time() - idle_s
    os.utime(path / marker, (then, then))
    (root / f"{name}.lock").write_text("")
    return path


def test_a_new_entry_drops_the_same_models_long_unused_entries(tmp_path: Path) -> None:
    marker = "saved_model.pb"
    long_idle = cache.STALE_AFTER_S + 60
    stale = _entry(tmp_path, "Net-aaaaaaaaaaaa", marker, long_idle)
    recent = _entry(tmp_path, "Net-bbbbbbbbbbbb", marker, 10)  # an older checkout's, in use
    frozen = _entry(tmp_path, "Net-aaaaaaaaaaaa-frozen-b1", marker, long_idle)  # other kind
    other = _entry(tmp_path, "Net2-aaaaaaaaaaaa", marker, long_idle)  # another model
    built = []

    def build(target: str) -> None:
        os.makedirs(target)
        Path(target, marker).write_text("model")
        built.append(target)

    final = str(tmp_path / "Net-cccccccccccc")
    assert cache._build_atomically(final, marker, build, str(tmp_path)) == final
    assert Path(final, marker).read_text() == "model" and len(built) == 1
    assert not stale.exists() and not (tmp_path / "Net-aaaaaaaaaaaa.lock").exists()
    assert recent.exists() and frozen.exists() and other.exists()

    # A second use finds the entry (no rebuild) and marks it used.
    os.utime(Path(final, marker), (0, 0))
    assert cache._build_atomically(final, marker, build, str(tmp_path)) == final
    assert len(built) == 1
    assert time.time() - os.path.getmtime(Path(final, marker)) < 60


def test_an_entry_without_a_key_drops_nothing(tmp_path: Path) -> None:
    old = _entry(tmp_path, "entry-aaaaaaaaaaaa", "done", cache.STALE_AFTER_S + 60)

    def build(target: str) -> None:
        os.makedirs(target)
        Path(target, "done").write_text("ok")

    final = str(tmp_path / "entry")
    assert cache._build_atomically(final, "done", build, str(tmp_path)) == final
    assert old.exists()
