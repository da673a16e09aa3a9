"""The NeuronOp library cache never loads (or truncates) what another user could
have written: directory created 0700 or verified, owner and mode checked, no
symlink followed — for the directory, the library and the lock file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import tensorflow  # noqa: F401  (the real library loads now, from the real cache, not mid-test)

from neuronish import op_library
from neuronish.op_library import OpLibraryError

OTHER_UID = 54321


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ops"
    monkeypatch.setenv("NEURONISH_OP_CACHE", str(path))
    # A compiler that must never run in these tests: any build attempt fails loudly.
    fake = tmp_path / "must-not-run"
    fake.write_text("#!/bin/sh\necho compiler ran >&2\nexit 7\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    return path


def test_cache_dir_is_created_private(cache: Path) -> None:
    assert op_library.secure_cache_dir() == cache
    assert stat.S_IMODE(os.lstat(cache).st_mode) == 0o700


def test_group_or_world_writable_cache_dir_is_refused(cache: Path) -> None:
    cache.mkdir()
    for mode in (0o770, 0o707, 0o777):
        cache.chmod(mode)
        with pytest.raises(OpLibraryError, match="writable by group or others"):
            op_library.build()


def test_symlinked_cache_dir_is_refused(cache: Path, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    cache.symlink_to(real)
    with pytest.raises(OpLibraryError, match="is a symbolic link"):
        op_library.build()


def test_cache_under_a_world_writable_parent_without_sticky_bit(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = cache.parent / "shared"
    parent.mkdir()
    parent.chmod(0o777)
    monkeypatch.setenv("NEURONISH_OP_CACHE", str(parent / "ops"))
    with pytest.raises(OpLibraryError, match="writable by everyone without the sticky bit"):
        op_library.build()
    parent.chmod(0o1777)  # like /tmp: others cannot rename our entries
    with pytest.raises(OpLibraryError, match="exit status 7"):  # checks pass; build runs
        op_library.build()


def test_planted_library_is_never_loaded(cache: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(op_library, "_module", None)  # as in a fresh process
    op_library.secure_cache_dir()
    lib = op_library.library_path()
    lib.write_bytes(b"\x7fELF planted")
    lib.chmod(0o666)
    with pytest.raises(OpLibraryError, match="writable by group or others"):
        op_library.load()
    lib.unlink()
    target = tmp_path / "planted.so"
    target.write_bytes(b"\x7fELF planted")
    lib.symlink_to(target)
    with pytest.raises(OpLibraryError, match="not a regular file"):
        op_library.build()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file another owner")
def test_library_or_directory_of_another_user_is_refused(cache: Path) -> None:
    op_library.secure_cache_dir()
    lib = op_library.library_path()
    lib.write_bytes(b"\x7fELF planted")
    lib.chmod(0o644)
    os.chown(lib, OTHER_UID, OTHER_UID)
    with pytest.raises(OpLibraryError, match=f"belongs to uid {OTHER_UID}"):
        op_library.build()
    lib.unlink()
    os.chown(cache, OTHER_UID, OTHER_UID)
    with pytest.raises(OpLibraryError, match=f"directory .* belongs to uid {OTHER_UID}"):
        op_library.build()


def test_planted_lock_symlink_does_not_truncate_its_target(cache: Path, tmp_path: Path) -> None:
    op_library.secure_cache_dir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    lock = op_library.library_path().with_suffix(".lock")
    lock.symlink_to(victim)
    with pytest.raises(OpLibraryError, match="lock file .* is a symbolic link"):
        op_library.build()
    assert victim.read_text() == "precious"


def test_existing_lock_file_is_reused_not_truncated(cache: Path) -> None:
    op_library.secure_cache_dir()
    lock = op_library.library_path().with_suffix(".lock")
    lock.write_text("x")
    lock.chmod(0o600)
    with pytest.raises(OpLibraryError, match="exit status 7"):  # reached the build
        op_library.build()
    assert lock.read_text() == "x"
    lock.chmod(0o622)
    with pytest.raises(OpLibraryError, match="lock file .* writable by group or others"):
        op_library.build()
