"""Build a shared library once into a per-user cache and hand back a path safe to load.

Both native libraries (the device's oneDNN engine and the TensorFlow `NeuronOp`) are
compiled on first use and cached under a key that covers their source and build command.
Loading a library runs its code, so the cache must hold only what this user built:

- the cache directory is created 0700, and an existing one must be a real directory
  (not a symlink) owned by this user and writable by nobody else;
- the lock file is opened without following symlinks (a planted link cannot make us
  truncate another file) and must be ours;
- a cached library is used only if it is a regular file owned by this user and writable
  by nobody else; otherwise it is refused with a message naming it.

Concurrent first uses (processes or threads) build once: the build runs under an
`fcntl` lock and writes a temporary file renamed into place, so nobody loads a
half-written library.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import stat
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path


class BuildError(RuntimeError):
    """A native library could not be built, or its cache cannot be trusted."""


def _check_owned(st: os.stat_result, path: Path, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise BuildError(f"refusing {what} {path}: it belongs to uid {st.st_uid}, not to this "
                         f"user (uid {os.geteuid()}); remove it or choose another cache directory")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise BuildError(f"refusing {what} {path}: other users can write it "
                         f"(mode {stat.S_IMODE(st.st_mode):o}); remove it or chmod go-w")


def secure_dir(path: Path) -> Path:
    """Create `path` (mode 0700) or check an existing one is ours alone."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise BuildError(f"cannot create the cache directory {path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise BuildError(f"refusing cache directory {path}: it is not a directory "
                         "(a symlink?); remove it or choose another cache directory")
    _check_owned(st, path, "cache directory")
    return path


def trusted_file(path: Path) -> bool:
    """True if `path` is a regular file we own that nobody else can write; False if it
    does not exist; BuildError if it exists but cannot be trusted."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise BuildError(f"refusing cached library {path}: not a regular file (a symlink?); "
                         "remove it")
    _check_owned(st, path, "cached library")
    return True


def build_cached(path: Path, command: Callable[[str], list[str]], what: str) -> Path:
    """Return `path`, building it first with `command(output)` unless the cache has it."""
    secure_dir(path.parent)
    if trusted_file(path):
        return path
    lock_path = path.with_suffix(".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise BuildError(f"cannot open the build lock {lock_path}: {e.strerror} (a planted "
                         "symlink is refused); remove it") from None
    try:
        _check_owned(os.fstat(fd), lock_path, "build lock")
        fcntl.flock(fd, fcntl.LOCK_EX)
        if trusted_file(path):  # another process built it while we waited
            return path
        tmp_fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
        os.close(tmp_fd)
        cmd = command(tmp)
        try:
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True)
            except OSError as e:
                raise BuildError(f"cannot run the C++ compiler {cmd[0]!r} ({e.strerror}) to "
                                 f"build {what}. Install g++ or set CXX.\n"
                                 f"command: {shlex.join(cmd)}") from None
            if proc.returncode != 0:
                raise BuildError(f"building {what} failed (exit status {proc.returncode}).\n"
                                 f"command: {shlex.join(cmd)}\n{proc.stderr.strip()[-4000:]}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    finally:
        os.close(fd)
    return path
