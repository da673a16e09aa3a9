"""The C runtime asks for 2 MB pages for a copy's arena (madvise MADV_HUGEPAGE): with
transparent huge pages in the usual "madvise" mode, memory that does not ask stays on
4 KB pages, and a call streams through every byte of its arena."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from neuronish.runtime.capi import binding
from neuronish.runtime.executable import from_bytes
from tests.graphs import trace
from tests.runtime.test_capi_execute import compile_graph

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str:
    try:
        return re.search(r"\[(\w+)\]", THP.read_text()).group(1)  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return "unavailable"


def _eligible_mappings() -> dict[str, int]:
    """This process's mappings the kernel may back with huge pages: start -> bytes."""
    found, start, size = {}, None, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            start, size = head.group(1), int(head.group(2), 16) - int(head.group(1), 16)
        elif line.startswith("THPeligible:") and line.split()[1] == "1" and start:
            found[start] = size
    return found


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is needed to build the C runtime")
@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"),
                    reason=f"transparent huge pages are {_thp_mode()} on this kernel")
def test_a_large_arena_may_be_on_huge_pages(tmp_path: Path, monkeypatch) -> None:
    def fn(x: tf.Tensor) -> tf.Tensor:
        for i in range(4):
            x = tf.tanh(x) + float(i)
        return x

    g = trace(fn, tf.TensorSpec([None, 4096], tf.float32, name="x"), batch=256)
    data = compile_graph(tmp_path, "chain", g.graph_def, g.io_config)
    arena = from_bytes(data).arena_bytes
    assert arena >= 4 << 20, arena  # (4 MB values between the tanhs)
    monkeypatch.setenv("NEURONISH_NUM_CORES", "1")
    device = binding.Device(binding.load_library())
    before = _eligible_mappings()
    model = binding.Model(device, data, duplicates=1)
    try:
        x = np.ones((256, 4096), np.float32)
        np.testing.assert_allclose(model.run([x])[0], fn(tf.constant(x)).numpy(), rtol=1e-5)
        new = {s: n for s, n in _eligible_mappings().items() if s not in before}
        assert any(n >= arena for n in new.values()), (arena, new)
    finally:
        model.unload()
        device.close()
