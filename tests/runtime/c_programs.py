"""The one builder of the tests' C programs: those over the runtime's header
(tests/c_api/*.c, examples/c/run_model.c, programs a test writes), built against the
runtime library (a sanitizer variant when `flags` ask for one), and those on
TensorFlow's C API (examples/c/tf_saved_model.c, which loads the NeuronOp library at
run time); each is run from its path."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from runtime.capi import library

ROOT = Path(__file__).resolve().parents[2]
C_API = ROOT / "tests" / "c_api"
TSAN = ("-fsanitize=thread", "-fno-omit-frame-pointer")

# Programs built in this test session, by what went into them: linking against
# TensorFlow's C library takes ~10 s on 2 CPUs, and some twenty tests build the same one.
_built: dict[tuple, Path] = {}


def build(source: str | Path, out: Path, flags: tuple[str, ...] = (), std: str = "c99", *,
          cflags: tuple[str, ...] = (), tensorflow: bool = False) -> Path:
    """`source` (a name under tests/c_api, or a path) compiled with -Wall -Werror and
    `cflags` (-pedantic, defines: the program's alone) and linked as `out`: against the
    library built with `flags` (the same flags for both, so a sanitizer sees both
    sides), or with `tensorflow` against TensorFlow's C library instead."""
    source = C_API / source if isinstance(source, str) else source
    if tensorflow:
        import tensorflow as tf

        tf_lib = tf.sysconfig.get_lib()
        include = tf.sysconfig.get_include()
        link = [f"-L{tf_lib}", "-l:libtensorflow_cc.so.2", "-l:libtensorflow_framework.so.2",
                f"-Wl,-rpath,{tf_lib}"]
    else:
        lib = library.build(flags)
        include, link = str(library.INCLUDE), [str(lib), f"-Wl,-rpath,{lib.parent}"]
    command = ["gcc", f"-std={std}", "-Wall", "-Werror", *cflags, *flags, f"-I{include}",
               str(source), "-o", "OUT", *link, "-lpthread"]
    key = (tuple(command), hashlib.sha256(Path(source).read_bytes()).hexdigest())
    if key in _built and _built[key].exists():
        shutil.copy2(_built[key], out)
        return out
    command[command.index("OUT")] = str(out)
    subprocess.run(command, check=True, capture_output=True, text=True)
    _built[key] = out
    return out
