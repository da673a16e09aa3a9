"""Build the Python-free `NeuronOp` library (neuronish/ops/neuron_op_native.cc).

The same op as neuronish/op_library.py's library (they share neuron_op_def.h), for hosts
without Python: its kernel calls the C runtime (libneuronish_runtime.so, built by
neuronish.runtime.capi.library) instead of kernel_bridge.py. It is compiled against the
installed TensorFlow's headers with the same flags, linked against the runtime library
with an rpath to it (and to TensorFlow's framework library), so `TF_LoadLibrary(path)`
works from any process that has TensorFlow: a C program on the C API, TF Serving.

Cached beside the Python library (`$NEURONISH_OP_CACHE`, default ~/.cache/neuronish/ops)
under the same trust rules, named by TensorFlow's version and a hash of the sources,
the compiler command line and the runtime library's path (whose name carries its own
sources' hash):

    neuron_op_native-tf2.21.0-<hash>.so

Python's version is not part of the key: nothing in it depends on Python.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from neuronish import op_library
from neuronish.op_library import OpLibraryError
from neuronish.runtime.buildcache import BuildError

SOURCE = Path(__file__).resolve().parent / "ops" / "neuron_op_native.cc"
# Included by SOURCE only (free dimensions at run time).
HEADERS = tuple(SOURCE.parent / name for name in (
    "neuron_op_shapes.h", "neuron_op_dynamic_spec.h", "neuron_op_compiler.h",
    "neuron_op_compile_cache.h"))

__all__ = ["OpLibraryError", "build", "build_command", "library_path"]


def _runtime_library() -> Path:
    from neuronish.runtime.capi import library

    try:
        return library.build()
    except BuildError as e:
        raise OpLibraryError(f"cannot build the C runtime library the native NeuronOp "
                             f"links: {e}") from e


def build_command(output: str | Path, runtime: Path) -> list[str]:
    """The compiler command line that builds the library into `output`, linking `runtime`."""
    import tensorflow as tf

    from neuronish.runtime.capi import library

    tf_lib = tf.sysconfig.get_lib()
    return [
        os.environ.get("CXX", "g++"), "-std=c++17", "-shared", "-fPIC", "-O2",
        # TensorFlow's own headers trip these hundreds of times (as op_library's build).
        "-Wno-deprecated-declarations", "-Wno-interference-size",
        str(SOURCE), "-o", str(output),
        *tf.sysconfig.get_compile_flags(),
        f"-I{library.INCLUDE}", f"-I{SOURCE.parent}",
        # The runtime library has no SONAME: its full path is recorded (DT_NEEDED).
        str(runtime), f"-Wl,-rpath,{runtime.parent}", f"-Wl,-rpath,{tf_lib}",
        *tf.sysconfig.get_link_flags(),
        # Fail the build, not TF_LoadLibrary, on an unresolved symbol (a Python one, say).
        "-Wl,--no-undefined",
    ]


def library_path(runtime: Path) -> Path:
    """The cached library for these sources, TensorFlow, compiler and runtime (built or not)."""
    import tensorflow as tf

    key = hashlib.sha256()
    for path in (SOURCE, *HEADERS, op_library.OP_DEF, op_library.OP_ATTRS):
        key.update(path.name.encode() + b"\0" + path.read_bytes())
    key.update("\0".join(build_command("OUT", runtime)).encode())
    digest = key.hexdigest()[:16]
    return op_library.cache_dir() / f"neuron_op_native-tf{tf.__version__}-{digest}.so"


def build() -> Path:
    """Build the library (and the runtime library it links) unless cached; its path."""
    runtime = _runtime_library()
    op_library.secure_cache_dir()
    path = library_path(runtime)
    return op_library._cache().build(path.name, lambda out: build_command(out, runtime))
