"""Build and load the `NeuronOp` custom-op library (neuronish/ops/neuron_op.cc).

The library is compiled on first use against the TensorFlow installed in this
environment (a custom-op library must match TensorFlow's headers and ABI
exactly, so a prebuilt one would break on any TensorFlow upgrade) and cached:

    $NEURONISH_OP_CACHE/            default ~/.cache/neuronish/ops/
        neuron_op-tf2.21.0-cpython-311-<hash>.so    hash of: the source, the compiler
        neuron_op-tf2.21.0-cpython-311-<hash>.lock  command line and flags, Python's version

The cache is the device engine's kind (`neuronish.runtime.buildcache`): concurrent
first uses build once under a file lock, a temporary file is renamed into place, and
nothing another user could have written (directory, lock, library, symlinks) is ever
loaded or truncated. The compiler is `$CXX`, default `g++`. A failed build or an
untrusted cache raises `OpLibraryError` with the full command line or the reason.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType

from neuronish.runtime.buildcache import BuildError, Cache
from neuronish.runtime.capi.library import INCLUDE

SOURCE = Path(__file__).resolve().parent / "ops" / "neuron_op.cc"
# The op's registration, shared with the Python-free library (neuronish/native_op_library.py).
OP_DEF = SOURCE.parent / "neuron_op_def.h"
# The attrs record, its checks and the cancellation guard, shared with it too.
OP_ATTRS = SOURCE.parent / "neuron_op_attrs.h"
# The C runtime's API, whose nr_execute_with the kernel calls for a model loaded there.
RUNTIME_HEADER = INCLUDE / "neuronish_runtime.h"

_lock = threading.Lock()
_module: ModuleType | None = None


class OpLibraryError(BuildError):
    """The NeuronOp library could not be built or loaded."""


def cache_dir() -> Path:
    """Where built libraries go: `$NEURONISH_OP_CACHE`, else ~/.cache/neuronish/ops."""
    env = os.environ.get("NEURONISH_OP_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "neuronish" / "ops"


def _cache() -> Cache:
    return Cache(cache_dir(), "the NeuronOp library", "NEURONISH_OP_CACHE", OpLibraryError)


def secure_cache_dir() -> Path:
    """The cache directory, created 0700 if missing, else checked: a directory (not
    a symlink to one), owned by this user, writable by nobody else."""
    return _cache().secure()


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
        # The C runtime's header (its types; the kernel gets its entry point from Python).
        f"-I{RUNTIME_HEADER.parent}",
        *tf.sysconfig.get_link_flags(),
    ]


def library_path() -> Path:
    """The cached library for this source, TensorFlow, Python and compiler (built or not)."""
    import tensorflow as tf

    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(OP_DEF.read_bytes())
    key.update(OP_ATTRS.read_bytes())
    key.update(RUNTIME_HEADER.read_bytes())
    # Everything that changes the binary; the output path itself is not part of it.
    key.update("\0".join(build_command("OUT")).encode())
    key.update(sys.version.encode())
    digest = key.hexdigest()[:16]
    return cache_dir() / f"neuron_op-tf{tf.__version__}-{sys.implementation.cache_tag}-{digest}.so"


def build() -> Path:
    """Build the library unless the cache has it; return its path."""
    secure_cache_dir()
    path = library_path()
    return _cache().build(path.name, build_command)


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
