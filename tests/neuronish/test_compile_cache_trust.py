"""The compile cache does not trust its directory: an entry whose record
was rewritten, a symlinked entry, a FIFO or /dev/zero in place of a file, a
directory another user could write, and a re-put racing a lookup never make a
compile use bytes the cache did not check for that key."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuronish.compile_cache import (
    _MAGIC,
    CacheStats,
    CompileCache,
    UntrustedCache,
    compile_with_cache,
)
from neuronish.compile_driver import CompileJob
from neuronish.errors import CompileWarning

KEY_A, KEY_B = "a" * 64, "b" * 64


def _cache(tmp_path: Path) -> CompileCache:
    cache = CompileCache(tmp_path / "cache")
    cache.secure()
    stats = CacheStats()
    cache.put(KEY_A, b"executable A (fp16)", stats)
    cache.put(KEY_B, b"executable B (fp32)", stats)
    return cache


def test_a_rewritten_record_does_not_match(tmp_path: Path) -> None:
    """Another entry's executable under B's name, with the record rewritten the way the
    old format checked it (magic, key, SHA-256 of the executable): used before."""
    cache = _cache(tmp_path)
    exe_a = (cache.root / f"{KEY_A}.neff").read_bytes()
    (cache.root / f"{KEY_B}.neff").write_bytes(exe_a)
    (cache.root / f"{KEY_B}.sum").write_bytes(
        _MAGIC + bytes.fromhex(KEY_B) + hashlib.sha256(exe_a).digest())
    stats = CacheStats()
    with pytest.warns(CompileWarning, match="record or checksum does not match"):
        assert cache.lookup(KEY_B, stats) is None
    assert stats.damaged == 1 and not (cache.root / f"{KEY_B}.neff").exists()
    assert bytes(cache.lookup(KEY_A, stats)[0]) == b"executable A (fp16)"


def test_a_record_from_another_cache_does_not_match(tmp_path: Path) -> None:
    """Entries copied from another cache (another secret) are not taken as they are."""
    cache = _cache(tmp_path)
    other = CompileCache(tmp_path / "other")
    other.secure()
    other.put(KEY_B, b"planted", CacheStats())
    for suffix in (".neff", ".sum"):
        os.replace(other.root / f"{KEY_B}{suffix}", cache.root / f"{KEY_B}{suffix}")
    with pytest.warns(CompileWarning, match="does not match"):
        assert cache.lookup(KEY_B, CacheStats()) is None


@pytest.mark.parametrize("which", [".neff", ".sum"])
def test_a_symlinked_entry_is_not_followed(which: str, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    entry = cache.root / f"{KEY_A}{which}"
    moved = tmp_path / f"elsewhere{which}"
    os.replace(entry, moved)
    entry.symlink_to(moved)  # the same, valid bytes: only the link is wrong
    with pytest.warns(CompileWarning, match="is a symlink"):
        assert cache.lookup(KEY_A, CacheStats()) is None
    assert moved.exists()  # the link was removed, not what it pointed at


@pytest.mark.parametrize("kind", ["fifo entry", "fifo record", "/dev/zero record"])
def test_special_files_are_refused_at_once(kind: str, tmp_path: Path) -> None:
    """A FIFO entry hung the compile; a /dev/zero record was a MemoryError. Run in a
    subprocess with a timeout, so a reader that waits fails instead of hanging."""
    cache = _cache(tmp_path)
    path = cache.root / (f"{KEY_A}.neff" if kind == "fifo entry" else f"{KEY_A}.sum")
    path.unlink()
    if kind.startswith("fifo"):
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    script = textwrap.dedent(f"""
        import warnings
        from neuronish.compile_cache import CacheStats, CompileCache
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as seen:
            found = CompileCache({str(cache.root)!r}).lookup({KEY_A!r}, CacheStats())
        print(found is None, [str(w.message) for w in seen])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.startswith("True"), done.stderr
    assert ("is a FIFO" if kind.startswith("fifo") else "is a symlink") in done.stdout


def test_a_re_put_racing_a_lookup_cannot_change_what_the_caller_links(tmp_path: Path) -> None:
    """A hit hands out a link of the file it checked; a re-put of the key renaming a
    new file over the entry right after (what a concurrent compile does) leaves the
    caller's file as checked. Before, the caller got the entry's path and linked
    whatever was there by then."""
    cache = _cache(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    exe, file = cache.lookup(KEY_A, CacheStats(), scratch)
    cache.put(KEY_A, b"another compile's executable", CacheStats())
    assert Path(file).parent == scratch
    assert Path(file).read_bytes() == bytes(exe) == b"executable A (fp16)"


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_directory_others_can_write_is_not_used(mode: int, tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "cache")
    cache.root.mkdir()
    os.chmod(cache.root, mode)
    with pytest.raises(UntrustedCache, match=f"is writable by group or others \\(mode {mode:04o}"):
        cache.secure()
    from tests.cc.test_cc_hostile import IO, dense_graph
    job = CompileJob("sg", dense_graph().SerializeToString(), IO)
    stats = CacheStats()
    with pytest.warns(CompileWarning, match="compile cache not used: refusing the compile "
                      "cache: directory"):
        (result,) = compile_with_cache([job], cache, stats)
    assert result.ok and stats.hits == stats.misses == 0
    assert "writable by group or others" in stats.uncacheable
    assert list(cache.root.iterdir()) == []  # nothing written into it


def test_a_directory_of_another_user_is_not_used(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "cache")
    cache.root.mkdir(mode=0o700)
    try:
        os.chown(cache.root, 4242, -1)
    except PermissionError:
        pytest.skip("chown needs root here; the mode test covers the same check")
    with pytest.raises(UntrustedCache, match="belongs to uid 4242"):
        cache.secure()


def test_a_symlinked_directory_is_not_used(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "cache").symlink_to(tmp_path / "real")
    with pytest.raises(UntrustedCache, match="is a symbolic link"):
        CompileCache(tmp_path / "cache").secure()
