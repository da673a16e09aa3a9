"""What identifies this compiler to a compile cache: its version and a digest of the
sources that decide what it writes.

The compiler reads the instruction declarations (runtime/isa.py), folds constants and
calibrates int8 with the reference kernels, writes the executable format and asks the
native engine's encoders what will run natively, so an edit to any Python file of
`neuronish.cc` or `neuronish.runtime` can change its output while the version number
stays. `neuronish-cc --version` prints both, so every host that caches compiles (the
Python one, neuronish/compile_cache.py; the C one, neuronish/ops/neuron_op_compile_cache.h)
keys on the same text without reading our sources itself.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from . import __version__


def source_digest() -> str:
    """SHA-256 over the path and bytes of every Python file of the compiler and runtime."""
    h = hashlib.sha256()
    for package in ("neuronish.cc", "neuronish.runtime"):
        spec = importlib.util.find_spec(package)
        roots = list(spec.submodule_search_locations or []) if spec else []
        for root in roots:
            for path in sorted(Path(root).rglob("*.py")):
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def version_text() -> str:
    """The line `neuronish-cc --version` prints."""
    return f"neuronish-cc {__version__} (sources sha256:{source_digest()})"
