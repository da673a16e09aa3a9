"""Build the C runtime library (libneuronish_runtime.so) on first use, as the native
engine is built (runtime/native/library.py): compiled once per source and build
command into `$NEURONISH_RUNTIME_CACHE` (default ~/.cache/neuronish/runtime) under
runtime/buildcache.py's trust rules. It needs only a C++17 compiler: no oneDNN, no
msgpack-c, no Python at run time.

The instruction schema is generated from runtime/isa.py (isa_table.py) into a private
temporary directory for the build; its text is part of the cache key, so a change to
isa.py rebuilds the library.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from ..buildcache import BuildError, Cache
from . import isa_table

HERE = Path(__file__).resolve().parent
INCLUDE = HERE.parent / "include"  # neuronish_runtime.h, for C programs
SOURCES = sorted(HERE.glob("*.cc"))
HEADERS = sorted(HERE.glob("*.h")) + [INCLUDE / "neuronish_runtime.h"]

__all__ = ["BuildError", "INCLUDE", "build", "cache_dir"]


def cache_dir() -> Path:
    env = os.environ.get("NEURONISH_RUNTIME_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "neuronish" / "runtime"


def build_command(output: str, generated: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [os.environ.get("CXX", "g++"), "-std=c++17", "-O2", "-shared", "-fPIC",
            "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-Wall", *extra,
            f"-I{generated}", *map(str, SOURCES), "-o", output]


def library_name(table: str, extra: tuple[str, ...] = ()) -> str:
    key = hashlib.sha256(table.encode())
    for path in (*SOURCES, *HEADERS):
        key.update(path.name.encode() + b"\0" + path.read_bytes())
    key.update("\0".join(build_command("OUT", "GEN", extra)).encode())
    return f"libneuronish_runtime-{key.hexdigest()[:16]}.so"


def build(extra_flags: tuple[str, ...] = ()) -> Path:
    """The library's path, built first unless cached (BuildError when it cannot be).
    `extra_flags` (e.g. sanitizers) give a separately cached variant."""
    table = isa_table.header()
    cache = Cache(cache_dir(), "the C runtime library", "NEURONISH_RUNTIME_CACHE")
    with tempfile.TemporaryDirectory(prefix="neuronish-capi-") as generated:
        (Path(generated) / "isa_table.h").write_text(table)
        return cache.build(library_name(table, extra_flags),
                           lambda out: build_command(out, generated, extra_flags))
