"""Every test compiles with its own, empty compile cache (neuronish/compile_cache.py):
a test that checks what the compiler did must not get a previous test's executable."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _fresh_compile_cache(tmp_path_factory: pytest.TempPathFactory,
                         monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path_factory.mktemp("compile-cache")
    monkeypatch.setenv("NEURONISH_COMPILE_CACHE", str(cache))
    monkeypatch.delenv("NEURONISH_CC_FLAGS", raising=False)
    return cache
