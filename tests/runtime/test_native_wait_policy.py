"""How long the native engine's OpenMP threads wait awake: a short spin unless the user
chose (runtime/native/library.py). libgomp reads its variables once, when it loads, so
each case runs in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from neuronish.runtime.native import library

_PROBE = ("import os; from neuronish.runtime.native import library; "
          "assert library.load() is not None, library.why_not(); "
          "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))")


@pytest.mark.parametrize("given, want", [
    ({}, f"None {library.SPIN_COUNT}"),
    ({"OMP_WAIT_POLICY": "passive"}, "passive None"),
    ({"GOMP_SPINCOUNT": "0"}, "None 0"),
])
def test_threads_spin_briefly_unless_the_user_chose(given: dict, want: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**env, **given},
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == want.split()


def test_the_c_runtime_loaded_alone_gets_the_same_spin() -> None:
    """The Python NeuronOp may load the C runtime (which links the engine's libgomp)
    before anything loads the Python runtime's engine."""
    probe = ("import os; from neuronish.runtime.capi import binding; binding.load_library(); "
             "from neuronish.runtime.native import library; assert library._lib is None; "
             "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", probe], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["None", str(library.SPIN_COUNT)]
