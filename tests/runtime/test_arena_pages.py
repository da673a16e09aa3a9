"""The C runtime asks for 2 MB pages for a copy's arena (madvise MADV_HUGEPAGE): with
transparent huge pages in the usual "madvise" mode, memory that does not ask stays on
4 KB pages, and a call streams through every byte of its arena."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from neuronish.runtime.executable import from_bytes
from tests.graphs import trace
from tests.runtime.test_capi_execute import compile_graph

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str:
    try:
        return re.search(r"\[(\w+)\]", THP.read_text()).group(1)  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return "unavailable"


# Run in a process of its own: in a long one (the whole suite) glibc hands out memory an
# earlier arena already had advised, so the mapping would not be new and could not be told
# apart. A fresh process that loads only this model has no such memory.
_LOAD_AND_LIST = """
import re, sys
from pathlib import Path
import numpy as np
from neuronish.runtime.capi import binding

def eligible():
    found, key = set(), None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            key = (int(head.group(1), 16), int(head.group(2), 16) - int(head.group(1), 16))
        elif line.startswith("THPeligible:") and line.split()[1] == "1" and key:
            found.add(key)
    return found

device = binding.Device(binding.load_library())
before = eligible()
model = binding.Model(device, Path(sys.argv[1]).read_bytes(), duplicates=1)
out = model.run([np.ones((256, 4096), np.float32)])[0]
np.save(sys.argv[2], out)
print(max([size for key, size in eligible() - before] or [0]))
model.unload()
device.close()
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is needed to build the C runtime")
@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"),
                    reason=f"transparent huge pages are {_thp_mode()} on this kernel")
def test_a_large_arena_may_be_on_huge_pages(tmp_path: Path) -> None:
    def fn(x: tf.Tensor) -> tf.Tensor:
        for i in range(4):
            x = tf.tanh(x) + float(i)
        return x

    g = trace(fn, tf.TensorSpec([None, 4096], tf.float32, name="x"), batch=256)
    data = compile_graph(tmp_path, "chain", g.graph_def, g.io_config)
    arena = from_bytes(data).arena_bytes
    assert arena >= 4 << 20, arena  # (4 MB values between the tanhs)
    (tmp_path / "chain.neff").write_bytes(data)
    done = subprocess.run([sys.executable, "-c", _LOAD_AND_LIST, str(tmp_path / "chain.neff"),
                           str(tmp_path / "out.npy")], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "NEURONISH_NUM_CORES": "1"})
    assert done.returncode == 0, done.stderr
    x = np.ones((256, 4096), np.float32)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), fn(tf.constant(x)).numpy(),
                               rtol=1e-5)
    # a mapping the kernel may put on huge pages appeared, large enough to hold the arena
    assert int(done.stdout.split()[-1]) >= arena, (arena, done.stdout)
