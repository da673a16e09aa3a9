"""The device's native engine: instructions as oneDNN primitives (engine.cc).

`engine_name()` is the engine this process's programs run on: `native` unless
NEURONISH_ENGINE=numpy, or unless the native library cannot be built or loaded, which
is said once on stderr, with the reason; numpy is then used.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

from . import library

ENGINES = ("native", "numpy")
_warned = threading.Event()


class EngineConfigError(ValueError):
    """NEURONISH_ENGINE has a value we do not know."""


def requested_engine() -> str:
    name = os.environ.get("NEURONISH_ENGINE", "native").strip().lower() or "native"
    if name not in ENGINES:
        raise EngineConfigError(f"NEURONISH_ENGINE={name!r}: expected one of {ENGINES}")
    return name


def native_library() -> ctypes.CDLL | None:
    """The engine library if the native engine is requested and works, else None."""
    if requested_engine() != "native":
        return None
    lib = library.load()
    if lib is None and not _warned.is_set():
        _warned.set()
        print(f"neuronish: the native engine is unavailable, running the numpy engine "
              f"(slower). Reason: {library.why_not()}", file=sys.stderr, flush=True)
    return lib


def engine_name() -> str:
    return "native" if native_library() is not None else "numpy"
