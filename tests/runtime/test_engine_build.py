"""Building the native engine: where, and what the runtime does when it cannot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuronish.runtime.buildcache import BuildError
from neuronish.runtime.native import library


def test_engine_is_cached_by_source_and_command(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE_CACHE", str(tmp_path / "engine"))
    path = library.build()
    assert path.parent == tmp_path / "engine" and path.suffix == ".so"
    assert (os.stat(tmp_path / "engine").st_mode & 0o777) == 0o700
    inode = path.stat().st_ino  # a rebuild renames a new file into place
    assert library.build() == path and path.stat().st_ino == inode  # reused


def test_an_untrusted_cache_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "shared"
    cache.mkdir(mode=0o777)
    os.chmod(cache, 0o777)
    monkeypatch.setenv("NEURONISH_ENGINE_CACHE", str(cache))
    with pytest.raises(BuildError, match="writable by group or others"):
        library.build()


def test_without_onednn_the_runtime_says_why_once_and_runs_numpy(tmp_path: Path) -> None:
    code = (
        "import numpy as np\n"
        "from neuronish.cc.compiler import compile_graph\n"
        "from neuronish.runtime import load\n"
        "from neuronish.runtime.native import engine_name\n"
        "print(engine_name()); print(engine_name())\n"
    )
    env = {**os.environ, "NEURONISH_ONEDNN_ROOT": str(tmp_path / "nowhere"),
           "NEURONISH_ENGINE_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["numpy", "numpy"]
    assert proc.stderr.count("native engine is unavailable") == 1, proc.stderr
    assert "oneDNN was not found" in proc.stderr and "onednn-cpu-gomp" in proc.stderr


def test_a_failed_build_names_the_compiler_command(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(BuildError, match=r"building the native engine failed \(exit status 1\)"
                                         r"[\s\S]*command: false -std=c\+\+17"):
        library.build()


def test_the_cache_keeps_the_latest_builds_of_each_family(tmp_path: Path) -> None:
    """Every source change builds a new library: without pruning the cache grows by a
    library per edit for ever."""
    import fcntl

    from neuronish.runtime.buildcache import KEEP_PER_FAMILY, Cache

    cache = Cache(tmp_path / "cache", "a test library", "TEST_CACHE")

    def write(out: str) -> list[str]:
        return [sys.executable, "-c", f"open({out!r}, 'w').write('library')"]

    other = cache.build("other-0000.so", write)  # another family: never pruned here
    building = None
    built = []
    for i in range(KEEP_PER_FAMILY + 5):
        path = cache.build(f"lib-{i:04x}.so", write)
        os.utime(path, (1000 + i, 1000 + i))  # build order, whatever the clock's resolution
        built.append(path)
        if i == 1:  # another process is (re)building this one: its lock is held
            building = os.open(path.with_suffix(".lock"), os.O_RDWR)
            fcntl.flock(building, fcntl.LOCK_EX)
    try:
        left = sorted(p.name for p in (tmp_path / "cache").glob("lib-*.so"))
        newest = [p.name for p in built[-KEEP_PER_FAMILY:]]
        assert left == sorted([built[1].name, *newest]), left
        assert other.exists()
        assert not built[0].with_suffix(".lock").exists()  # its lock went with it
    finally:
        os.close(building)


def test_the_cache_spares_a_library_in_use_while_another_checkout_builds_many(
        tmp_path: Path) -> None:
    """A test run links C programs against its cached library by path; another checkout
    building variant after variant must not prune it from under them (CI failed so:
    'error while loading shared libraries'). A cache hit counts as a use; recently used
    libraries are kept up to MAX_PER_FAMILY, and past that the least recently used go."""
    import time

    from neuronish.runtime.buildcache import KEEP_PER_FAMILY, MAX_PER_FAMILY, Cache

    cache = Cache(tmp_path / "cache", "a test library", "TEST_CACHE")

    def write(out: str) -> list[str]:
        return [sys.executable, "-c", f"open({out!r}, 'w').write('library')"]

    mine = cache.build("lib-mine.so", write)
    os.utime(mine, (1000, 1000))  # built long ago...
    assert cache.build("lib-mine.so", write) == mine  # ...and used now: a hit touches it
    assert mine.stat().st_mtime > time.time() - 60
    others = [cache.build(f"lib-{i:04x}.so", write) for i in range(KEEP_PER_FAMILY + 3)]
    assert mine.exists(), "a library used a moment ago was pruned"
    assert all(p.exists() for p in others)  # all recent: kept, within the bound

    old = time.time() - 7200  # two hours ago: no longer spared
    for i, p in enumerate(others):
        os.utime(p, (old + i, old + i))
    newest = cache.build("lib-newest.so", write)
    left = {p.name for p in (tmp_path / "cache").glob("lib-*.so")}
    assert left == {mine.name, newest.name, *(p.name for p in others[-(KEEP_PER_FAMILY - 2):])}

    for i in range(MAX_PER_FAMILY + 4):  # a burst of builds: the bound still holds
        cache.build(f"lib-b{i:03x}.so", write)
    assert len(list((tmp_path / "cache").glob("lib-*.so"))) == MAX_PER_FAMILY
