"""Test programs in C over the runtime's header (tests/c_api/*.c), built against the
runtime library (a sanitizer variant when `flags` ask for one) and run from their path."""

from __future__ import annotations

import subprocess
from pathlib import Path

from runtime.capi import library

C_API = Path(__file__).resolve().parents[1] / "c_api"
TSAN = ("-fsanitize=thread", "-fno-omit-frame-pointer")


def build(source: str, out: Path, flags: tuple[str, ...] = (), std: str = "c99") -> Path:
    """tests/c_api/`source` compiled and linked as `out` against the library built with
    `flags` (the same flags for both, so a sanitizer sees both sides)."""
    lib = library.build(flags)
    subprocess.run(["gcc", f"-std={std}", "-Wall", "-Werror", *flags, f"-I{library.INCLUDE}",
                    str(C_API / source), "-o", str(out), str(lib),
                    f"-Wl,-rpath,{lib.parent}", "-lpthread"],
                   check=True, capture_output=True, text=True)
    return out
