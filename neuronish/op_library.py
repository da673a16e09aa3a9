"""Build and load the `NeuronOp` custom-op library (neuronish/ops/neuron_op.cc).

The library is compiled on first use against the TensorFlow installed in this
environment (a custom-op library must match TensorFlow's headers and ABI
exactly, so a prebuilt one would break on any TensorFlow upgrade) and cached:

    $NEURONISH_OP_CACHE/            default ~/.cache/neuronish/ops/
        neuron_op-tf2.21.0-cpython-311-<hash>.so    hash of: the source, the compiler
        neuron_op-tf2.21.0-cpython-311-<hash>.lock  command line and flags, Python's version

Concurrent first uses (two processes, or many threads) are safe: the build runs
under an `fcntl` lock on the `.lock` file and writes a temporary file that is
renamed into place, so nobody ever loads a half-written library. The compiler
is `$CXX`, default `g++`. A failed build raises `OpLibraryError` with the full
command line and the compiler's output.

Loading a library runs its code, so the cache is trusted only if nobody else
could have written into it: the directory is created `0700`, and an existing
one must be a real directory (not a symlink) owned by this user and writable by
nobody else; the library and the lock file must be regular files owned by this
user, writable by nobody else, and are opened without following symlinks.
Anything else is refused with `OpLibraryError`, never loaded or truncated.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().parent / "ops" / "neuron_op.cc"

_lock = threading.Lock()
_module: ModuleType | None = None


class OpLibraryError(RuntimeError):
    """The NeuronOp library could not be built or loaded."""


def cache_dir() -> Path:
    """Where built libraries go: `$NEURONISH_OP_CACHE`, else ~/.cache/neuronish/ops."""
    env = os.environ.get("NEURONISH_OP_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "neuronish" / "ops"


def _untrusted(what: str, path: Path, reason: str) -> OpLibraryError:
    return OpLibraryError(
        f"refusing the NeuronOp library cache: {what} {path} {reason}, so another user could "
        "have put code there that this process would run. Remove it, or set "
        "NEURONISH_OP_CACHE to a directory only you can write (it is created with mode 0700)")


def _check_owned(what: str, path: Path, st: os.stat_result) -> None:
    """`st` (from lstat/fstat of `path`) must be ours and writable by nobody else."""
    if st.st_uid != os.getuid():
        raise _untrusted(what, path, f"belongs to uid {st.st_uid}, not to you "
                                     f"(uid {os.getuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _untrusted(what, path, f"is writable by group or others "
                                     f"(mode {stat.S_IMODE(st.st_mode):04o})")


def secure_cache_dir() -> Path:
    """The cache directory, created 0700 if missing, else checked: a directory (not
    a symlink to one), owned by this user, writable by nobody else."""
    path = cache_dir()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(path)
    except OSError as e:
        raise OpLibraryError(f"cannot create the NeuronOp library cache {path}: {e.strerror}; "
                             "set NEURONISH_OP_CACHE to a writable directory") from None
    if stat.S_ISLNK(st.st_mode):
        raise _untrusted("directory", path, "is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise _untrusted("directory", path, "is not a directory")
    _check_owned("directory", path, st)
    # Whoever can rename entries in a parent can swap the whole directory.
    for parent in path.resolve().parents:
        pst = os.stat(parent)
        if pst.st_uid not in (0, os.getuid()):
            raise _untrusted("parent directory", parent, f"belongs to uid {pst.st_uid}")
        if pst.st_mode & stat.S_IWOTH and not pst.st_mode & stat.S_ISVTX:
            raise _untrusted("parent directory", parent, "is writable by everyone without "
                             "the sticky bit")
    return path


def _check_library(path: Path) -> bool:
    """True if the cached library exists and may be loaded; raise if it exists but
    could have been planted."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise OpLibraryError(f"cannot read the NeuronOp library {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _untrusted("library", path, "is not a regular file (a symlink?)")
    _check_owned("library", path, st)
    return True


def _open_lock(path: Path) -> int:
    """The lock file's descriptor: never follows a symlink, never truncates."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if os.path.islink(path):
            raise _untrusted("lock file", path, "is a symbolic link") from None
        raise OpLibraryError(f"cannot write the NeuronOp library cache {path.parent}: "
                             f"{e.strerror}; set NEURONISH_OP_CACHE to a writable directory"
                             ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _untrusted("lock file", path, "is not a regular file")
        _check_owned("lock file", path, st)
    except BaseException:
        os.close(fd)
        raise
    return fd


def build_command(output: str | Path) -> list[str]:
    """The compiler command line that builds the library into `output`."""
    import tensorflow as tf

    return [
        os.environ.get("CXX", "g++"), "-std=c++17", "-shared", "-fPIC", "-O2",
        # TensorFlow's own headers trip these hundreds of times; they would bury
        # a real error in the message of a failed build.
        "-Wno-deprecated-declarations", "-Wno-interference-size",
        str(SOURCE), "-o", str(output),
        *tf.sysconfig.get_compile_flags(),
        "-I" + sysconfig.get_paths()["include"],
        *tf.sysconfig.get_link_flags(),
    ]


def library_path() -> Path:
    """The cached library for this source, TensorFlow, Python and compiler (built or not)."""
    import tensorflow as tf

    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    # Everything that changes the binary; the output path itself is not part of it.
    key.update("\0".join(build_command("OUT")).encode())
    key.update(sys.version.encode())
    digest = key.hexdigest()[:16]
    return cache_dir() / f"neuron_op-tf{tf.__version__}-{sys.implementation.cache_tag}-{digest}.so"


def build() -> Path:
    """Build the library unless the cache has it; return its path."""
    secure_cache_dir()
    path = library_path()
    if _check_library(path):
        return path
    lock = _open_lock(path.with_suffix(".lock"))
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the descriptor closes
        if _check_library(path):  # another process built it while we waited
            return path
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
        os.close(fd)
        cmd = build_command(tmp)
        try:
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True)
            except OSError as e:
                raise OpLibraryError(
                    f"cannot run the C++ compiler {cmd[0]!r} ({e.strerror}) to build the "
                    f"NeuronOp library. Install g++ or set CXX.\ncommand: {shlex.join(cmd)}"
                ) from None
            if proc.returncode != 0:
                raise OpLibraryError(
                    f"building the NeuronOp library failed (exit status {proc.returncode}).\n"
                    f"command: {shlex.join(cmd)}\n{proc.stderr.strip()}")
            os.chmod(tmp, 0o700)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    finally:
        os.close(lock)
    return path


def load() -> ModuleType:
    """Build if needed and load the library; returns `tf.load_op_library`'s module.

    Idempotent and thread-safe. After it, `NeuronOp` is a registered op and the
    module's `neuron_op(...)` runs one eagerly."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            import tensorflow as tf

            path = build()
            try:
                _module = tf.load_op_library(str(path))
            except Exception as e:  # tf raises NotFoundError for unresolved symbols
                raise OpLibraryError(
                    f"cannot load the NeuronOp library {path}: {e}. Delete it to force a "
                    "rebuild, or point NEURONISH_OP_CACHE elsewhere") from e
    return _module
