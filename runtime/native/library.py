"""Find oneDNN, build the native engine (engine.cc) on first use, load it with ctypes.

The engine is compiled once per source and build command into
`$NEURONISH_ENGINE_CACHE` (default ~/.cache/neuronish/engine) and linked against the
oneDNN that `pip` installed from the `onednn-cpu-gomp` and `onednn-devel-cpu-gomp` wheels
(they put `libdnnl.so.3` in `<prefix>/lib` and the headers in `<prefix>/include`);
`NEURONISH_ONEDNN_ROOT` points elsewhere. When anything here fails, `load()` returns
None and `why_not()` says why; the runtime then says so once and runs the numpy engine.

oneDNN runs its primitives on OpenMP (GNU libgomp) threads. libgomp's default lets them
spin ~300,000 pauses after each primitive, which took CPU from TensorFlow's own threads
when a `NeuronOp` runs inside a TensorFlow graph on a busy host (TF's convolutions up to
1.8x slower). Sleeping at once (OMP_WAIT_POLICY=passive, the former default) costs a
wake-up per primitive instead: ~80 us on this 2-vCPU VM, 4.5 ms of MobileNetV2's 33 ms
call. So unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT, the threads spin a short
while (SPIN_COUNT pauses, well under a millisecond): enough to bridge the gaps between
one call's primitives, not to hold a CPU long after the call. Measured on 2 vCPUs (the
process at real-time priority, i.e. a quiet host): MobileNetV2 fp32 batch 8 33.5 ->
29.0 ms; TensorFlow's 3x3 conv right after a device call no slower than alone. On a
host oversubscribed by other processes spinning costs instead (MobileNetV2 ~1.4x
slower at load 7): set OMP_WAIT_POLICY=passive there.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import site
import sys
import threading
from pathlib import Path

from ..buildcache import BuildError, Cache

SOURCE = Path(__file__).resolve().parent / "engine.cc"
SOURCES = (SOURCE, *(SOURCE.parent / f"engine_{part}.cc" for part in (
    "loops", "small_matmul", "winograd", "int8", "any_dtype")))
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_why_not: str | None = None
_tried = False
SPIN_COUNT = 20000  # libgomp's GOMP_SPINCOUNT unless the user chose a wait policy


def cache_dir() -> Path:
    env = os.environ.get("NEURONISH_ENGINE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "neuronish" / "engine"


def onednn_root() -> Path:
    """The prefix holding lib/libdnnl.so.3 and include/oneapi/dnnl/dnnl.hpp."""
    env = os.environ.get("NEURONISH_ONEDNN_ROOT")
    candidates = [Path(env)] if env else [Path(sys.prefix), Path(sys.base_prefix),
                                          Path(site.getuserbase())]
    for root in candidates:
        if (root / "lib" / "libdnnl.so.3").exists() and \
                (root / "include" / "oneapi" / "dnnl" / "dnnl.hpp").exists():
            return root
    raise BuildError(
        "oneDNN was not found (looked for lib/libdnnl.so.3 and include/oneapi/dnnl/dnnl.hpp "
        f"under {', '.join(map(str, candidates))}). Install it with `pip install "
        "onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0` (the README's set-up does) "
        "or set NEURONISH_ONEDNN_ROOT")


def build_command(output: str, root: Path) -> list[str]:
    return [os.environ.get("CXX", "g++"), "-std=c++17", "-O2", "-shared", "-fPIC", "-fopenmp",
            "-fvisibility=hidden", "-fvisibility-inlines-hidden",
            str(SOURCE), "-o", output, f"-I{root / 'include'}", f"-L{root / 'lib'}", "-ldnnl",
            f"-Wl,-rpath,{root / 'lib'}"]


def library_path(root: Path) -> Path:
    key = hashlib.sha256()
    for part in SOURCES:  # engine.cc and the files it includes
        key.update(part.read_bytes())
    key.update("\0".join(build_command("OUT", root)).encode())
    return cache_dir() / f"engine-{key.hexdigest()[:16]}.so"


def build() -> Path:
    """Build the engine unless cached; return its path (BuildError when it cannot)."""
    root = onednn_root()
    cache = Cache(cache_dir(), "the native engine", "NEURONISH_ENGINE_CACHE")
    return cache.build(library_path(root).name, lambda out: build_command(out, root))


def _declare(lib: ctypes.CDLL) -> None:
    i64, vp, cp = ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p
    p64 = ctypes.POINTER(ctypes.c_int64)
    pf = ctypes.POINTER(ctypes.c_float)
    lib.ne_version.restype = i64
    lib.ne_create.argtypes = [i64, i64, cp, i64]
    lib.ne_create.restype = vp
    lib.ne_destroy.argtypes = [vp]
    lib.ne_destroy.restype = None
    lib.ne_pool_create.argtypes = []
    lib.ne_pool_create.restype = vp
    lib.ne_use_pool.argtypes = [vp, vp]
    lib.ne_use_pool.restype = i64
    lib.ne_bind.argtypes = [vp, i64, vp, cp, i64]
    lib.ne_bind.restype = i64
    lib.ne_add.argtypes = [vp, p64, i64, pf, i64, cp, i64]
    lib.ne_add.restype = i64
    lib.ne_set_timing.argtypes = [vp, ctypes.POINTER(ctypes.c_double)]
    lib.ne_set_timing.restype = i64
    lib.ne_set_threads.argtypes = [vp, i64]
    lib.ne_set_threads.restype = i64
    lib.ne_finalize.argtypes = [vp, cp, i64]
    lib.ne_finalize.restype = i64
    lib.ne_bytes.argtypes = [vp]
    lib.ne_bytes.restype = i64
    lib.ne_run.argtypes = [vp, i64, i64, i64, ctypes.POINTER(vp), i64, vp, ctypes.c_double,
                           cp, i64]
    lib.ne_run.restype = i64
    lib.ne_impl.argtypes = [vp, i64, cp, i64]
    lib.ne_impl.restype = i64


def set_wait_policy() -> None:
    """The short spin above, unless the user chose a wait policy: call it before anything
    that links libgomp (this engine, the C runtime) is loaded, since libgomp reads it then."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)


def load() -> ctypes.CDLL | None:
    """The engine library, built and loaded once per process; None if it cannot be."""
    global _lib, _why_not, _tried
    if _tried:
        return _lib
    with _lock:
        if not _tried:
            try:
                set_wait_policy()
                path = build()
                lib = ctypes.CDLL(str(path))
                _declare(lib)
                if lib.ne_version() != 1:
                    raise BuildError(f"{path} is an engine of another version; remove it")
                _lib = lib
            except (BuildError, OSError, AttributeError) as e:
                _why_not = str(e)
            _tried = True
    return _lib


def why_not() -> str | None:
    """Why `load()` returned None (None if it did not, or was not called)."""
    return _why_not
