"""Build a shared library once into a per-user cache, and load only what this user built.

Both native libraries (the device's oneDNN engine and the TensorFlow `NeuronOp`) are
compiled on first use and cached under a key that covers their source and build
command. Loading a library runs its code, so a cache must hold nothing another user
could have written:

- the cache directory is created 0700; an existing one must be a real directory (not
  a symlink), ours, writable by nobody else, and every parent must be ours or root's
  and, if everyone may write it, sticky (else someone could swap the directory);
- the lock file is opened without following symlinks and never truncated (a planted
  link cannot make us clobber another file), and must be ours;
- a cached library is used only if it is a regular file we own that nobody else can
  write; otherwise it is refused with a message naming it.

Concurrent first uses (processes or threads) build once: the build runs under an
`fcntl` lock and writes a temporary file renamed into place, so nobody loads a
half-written library.

Every change of a source or a build flag makes a new library, so after a build the
cache keeps only the KEEP_PER_FAMILY most recently used of that family (`engine-*`,
`neuron_op-*`; a pruned one in use again is rebuilt), leaving alone a library whose
lock another process holds (it is being built). A library's modification time is its
last use (a cache hit touches it). Removing a library a running process has loaded is
safe: its mapping outlives the name; but a program linked against its path (a C host,
a test's client) needs the name, so libraries used within the last RECENT_USE seconds
are kept too, up to MAX_PER_FAMILY: a second checkout building variant after variant
(sanitizer builds, source edits) does not take a library from under a test run that
uses it.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KEEP_PER_FAMILY = 12  # ~1.6 MB an engine: bounded at tens of MB per family
RECENT_USE = 3600.0  # seconds: a library used this recently stays...
MAX_PER_FAMILY = 24  # ...unless its family holds this many (sanitizer builds are ~11 MB)


class BuildError(RuntimeError):
    """A native library could not be built, or its cache cannot be trusted."""


@dataclass(frozen=True)
class Cache:
    """Where one kind of library is cached, and how to talk about it."""

    directory: Path
    what: str        # "the NeuronOp library"
    env_var: str     # the variable that moves the cache, named in every hint
    error: type[BuildError] = BuildError
    # What another user could do with the directory (the compile cache and the
    # telemetry run directory share these rules: runtime/files.py's trust rule).
    risk: str = "could have put code there that this process would run"
    title: str = "the cache of"

    def untrusted(self, kind: str, path: Path, reason: str) -> BuildError:
        return self.error(
            f"refusing {self.title} {self.what}: {kind} {path} {reason}, so another user "
            f"{self.risk}. Remove it, or set "
            f"{self.env_var} to a directory only you can write (it is created with mode 0700)")

    def check_owned(self, kind: str, path: Path, st: os.stat_result) -> None:
        """`st` (from lstat/fstat of `path`) must be ours and writable by nobody else."""
        if st.st_uid != os.getuid():
            raise self.untrusted(kind, path, f"belongs to uid {st.st_uid}, not to you "
                                             f"(uid {os.getuid()})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise self.untrusted(kind, path, f"is writable by group or others "
                                             f"(mode {stat.S_IMODE(st.st_mode):04o})")

    def secure(self) -> Path:
        """The directory, created 0700 if missing, else checked (see the module doc)."""
        path = self.directory
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            st = os.lstat(path)
        except OSError as e:
            raise self.error(f"cannot create {self.title} {self.what} {path}: {e.strerror}; "
                             f"set {self.env_var} to a writable directory") from None
        if stat.S_ISLNK(st.st_mode):
            raise self.untrusted("directory", path, "is a symbolic link")
        if not stat.S_ISDIR(st.st_mode):
            raise self.untrusted("directory", path, "is not a directory")
        self.check_owned("directory", path, st)
        for parent in path.resolve().parents:  # who can rename entries can swap the dir
            pst = os.stat(parent)
            if pst.st_uid not in (0, os.getuid()):
                raise self.untrusted("parent directory", parent, f"belongs to uid {pst.st_uid}")
            if pst.st_mode & stat.S_IWOTH and not pst.st_mode & stat.S_ISVTX:
                raise self.untrusted("parent directory", parent, "is writable by everyone "
                                     "without the sticky bit")
        return path

    def trusted(self, path: Path) -> bool:
        """True if the cached library exists and may be loaded; raise if it exists but
        could have been planted."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise self.error(f"cannot read {self.what} {path}: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise self.untrusted("library", path, "is not a regular file (a symlink?)")
        self.check_owned("library", path, st)
        return True

    def _open_lock(self, path: Path) -> int:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            if os.path.islink(path):
                raise self.untrusted("lock file", path, "is a symbolic link") from None
            raise self.error(f"cannot write the cache of {self.what} {path.parent}: "
                             f"{e.strerror}; set {self.env_var} to a writable directory"
                             ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self.untrusted("lock file", path, "is not a regular file")
            self.check_owned("lock file", path, st)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def build(self, name: str, command: Callable[[str], list[str]]) -> Path:
        """The library `name` in the cache, built first with `command(output)` unless it
        is there already."""
        self.secure()
        path = self.directory / name
        if self.trusted(path):
            _mark_used(path)
            return path
        lock = self._open_lock(path.with_suffix(".lock"))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the descriptor closes
            if self.trusted(path):  # another process built it while we waited
                _mark_used(path)
                return path
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
            os.close(fd)
            cmd = command(tmp)
            try:
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True)
                except OSError as e:
                    raise self.error(
                        f"cannot run the C++ compiler {cmd[0]!r} ({e.strerror}) to build "
                        f"{self.what}. Install g++ or set CXX.\ncommand: {shlex.join(cmd)}"
                    ) from None
                if proc.returncode != 0:
                    raise self.error(
                        f"building {self.what} failed (exit status {proc.returncode}).\n"
                        f"command: {shlex.join(cmd)}\n{proc.stderr.strip()[-4000:]}")
                os.chmod(tmp, 0o700)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        finally:
            os.close(lock)
        self.prune(path)
        return path

    def prune(self, kept: Path, keep: int = KEEP_PER_FAMILY, recent: float = RECENT_USE,
              most: int = MAX_PER_FAMILY) -> list[Path]:
        """Remove the libraries of `kept`'s family (its name up to the last '-') beyond
        the `keep` most recently used, sparing those used within `recent` seconds while
        the family holds fewer than `most`; never `kept` itself. Returns what was
        removed."""
        family = kept.stem.rpartition("-")[0]
        if not family:
            return []
        try:
            used = {p: p.stat().st_mtime for p in self.directory.glob(f"{family}-*{kept.suffix}")
                    if p.stem.rpartition("-")[0] == family and p != kept}
        except OSError:  # one vanished meanwhile (another process pruned): next time
            return []
        libraries = sorted(used, key=used.__getitem__, reverse=True)
        since = time.time() - recent
        spared = sum(1 for p in libraries[keep - 1:most - 1] if used[p] >= since)
        removed = []
        for old in libraries[keep - 1 + spared:]:
            if _remove_unless_building(old):
                removed.append(old)
        return removed


def _mark_used(library: Path) -> None:
    """Record a cache hit in the library's modification time (what prune orders by)."""
    try:
        os.utime(library, follow_symlinks=False)  # (trusted() checked it with lstat)
    except OSError:
        pass  # a read-only cache still serves; its pruning order is then build order


def _remove_unless_building(library: Path) -> bool:
    lock_path = library.with_suffix(".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        fd = None  # no lock file: nobody is building it
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # another process is building it right now
        library.unlink(missing_ok=True)
        lock_path.unlink(missing_ok=True)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
