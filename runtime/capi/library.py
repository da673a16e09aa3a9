"""Build the C runtime library (libneuronish_runtime.so) on first use, as the native
engine is built (runtime/native/library.py): compiled once per source and build
command into `$NEURONISH_RUNTIME_CACHE` (default ~/.cache/neuronish/runtime) under
runtime/buildcache.py's trust rules. It needs a C++17 compiler and links the native
engine (runtime/native/engine.cc, built by runtime/native/library.py against the oneDNN
wheels) for execution: the engine library's path is recorded in it (DT_NEEDED, and its
directory and oneDNN's as rpath), so a C program links only this library. No msgpack-c,
no Python at run time.

The instruction schema is generated from runtime/isa.py (isa_table.py) into a private
temporary directory for the build; its text is part of the cache key, so a change to
isa.py rebuilds the library.

The sources are read once, into a snapshot: the cache key is their hash and the compiler
reads the snapshot's copies (in the same temporary directory), never the tree, so a
source edited while a build runs cannot put a library built from other text under a key.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from ..buildcache import BuildError, Cache
from ..native import library as engine_library
from . import isa_table

HERE = Path(__file__).resolve().parent
INCLUDE = HERE.parent / "include"  # neuronish_runtime.h, for C programs
SOURCES = sorted(HERE.glob("*.cc"))
HEADERS = sorted(HERE.glob("*.h")) + [INCLUDE / "neuronish_runtime.h"]

__all__ = ["BuildError", "INCLUDE", "build", "cache_dir"]


def cache_dir() -> Path:
    env = os.environ.get("NEURONISH_RUNTIME_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "neuronish" / "runtime"


def build_command(output: str, generated: str, engine: str, extra: tuple[str, ...] = ()
                  ) -> list[str]:
    """Compiles the snapshot in `generated` (see snapshot())."""
    # -ffp-contract=off: the encoder computes resize weights in float32 exactly as numpy
    # does (no fused multiply-adds).
    sources = [f"{generated}/capi/{p.name}" for p in SOURCES]
    return [os.environ.get("CXX", "g++"), "-std=c++17", "-O2", "-shared", "-fPIC",
            "-ffp-contract=off", "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-Wall",
            *extra, f"-I{generated}", *sources, "-o", output, engine,
            f"-Wl,-rpath,{Path(engine).parent}", "-lpthread"]


def snapshot() -> dict[str, bytes]:
    """Every source and header, read once: relative path in the snapshot -> bytes."""
    return {f"{'include' if p.parent == INCLUDE else 'capi'}/{p.name}": p.read_bytes()
            for p in (*SOURCES, *HEADERS)}


def library_name(table: str, engine: str, extra: tuple[str, ...] = (),
                 files: dict[str, bytes] | None = None) -> str:
    """The cached library's name: a hash of `files` (default: a fresh snapshot()), the
    generated schema and the build command."""
    key = hashlib.sha256(table.encode())
    for name, data in (snapshot() if files is None else files).items():
        key.update(name.rsplit("/", 1)[-1].encode() + b"\0" + data)
    key.update("\0".join(build_command("OUT", "GEN", engine, extra)).encode())
    return f"libneuronish_runtime-{key.hexdigest()[:16]}.so"


def build(extra_flags: tuple[str, ...] = ()) -> Path:
    """The library's path, built first unless cached (BuildError when it cannot be).
    `extra_flags` (e.g. sanitizers) give a separately cached variant."""
    table = isa_table.header()
    engine = str(engine_library.build())  # (its name carries engine.cc's hash)
    cache = Cache(cache_dir(), "the C runtime library", "NEURONISH_RUNTIME_CACHE")
    files = snapshot()
    with tempfile.TemporaryDirectory(prefix="neuronish-capi-") as generated:
        (Path(generated) / "isa_table.h").write_text(table)
        for name, data in files.items():
            path = Path(generated) / name
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(data)
        return cache.build(library_name(table, engine, extra_flags, files),
                           lambda out: build_command(out, generated, engine, extra_flags))
