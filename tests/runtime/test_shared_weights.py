"""A model's copies share their reordered weights in host memory (engine.cc `WeightPool`,
used by runtime/model.py and runtime/capi/model.cc for the copies of one load): a
NeuronOp loads four copies, and each used to reorder every weight for itself (ResNet50:
four times ~100 MB). The device still charges each core for its copy.

A constant of 64 KiB or more is also kept once per process by content (runtime/capi/
engine_program.cc `shared_block`, runtime/model.py `_device_copy`), with the weights
reordered from it: a NeuronOp with free dimensions loads one executable per shape, each
with the same weights.

Held by the memory a load adds to a fresh process: a model of two 16 MiB matmul weights
loaded with four copies grows the process, on each runtime, by less than half those
weights more than with one copy (three more reordered sets would be 96 MiB); and each copy
computes the same numbers as numpy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from tests.graphs import trace

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(11)
W1 = RNG.standard_normal((1024, 4096)).astype(np.float32) / 32
W2 = RNG.standard_normal((4096, 1024)).astype(np.float32) / 64
WEIGHT_MIB = (W1.nbytes + W2.nbytes) / 2**20  # 32 MiB

_PROBE = """
import json, sys
import numpy as np
from neuronish.runtime import load, get_device

def resident_mib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024

x = np.load(sys.argv[2])
before = resident_mib()
with load(sys.argv[1], duplicates=int(sys.argv[4]), runtime=sys.argv[3]) as model:
    grown = resident_mib() - before
    ys = [next(iter(model.run({"x:0": x}).values())) for _ in range(4)]
    charged = sum(c["used"] for c in get_device().memory_report().values()) / 2**20
print(json.dumps({"grown": grown, "charged": charged, "y": [y.tolist() for y in ys]}))
"""


@pytest.fixture(scope="module")
def exe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("shared")
    g = trace(lambda x: tf.matmul(tf.nn.relu(tf.matmul(x, W1)), W2),
              tf.TensorSpec([8, 1024], tf.float32, name="x"))
    path = tmp / "two_matmuls.neff"
    path.write_bytes(compile_graph(g.graph_def, g.io_config))
    np.save(tmp / "x.npy", RNG.standard_normal((8, 1024)).astype(np.float32))
    return path, tmp / "x.npy"


@pytest.mark.parametrize("runtime", ["python", "c"])
def test_four_copies_hold_their_reordered_weights_once(runtime: str, exe: tuple[Path, Path]
                                                       ) -> None:
    path, x_file = exe
    got = {}
    for copies in (1, 4):  # each in a fresh process: no memory freed by one reused by other
        run = subprocess.run([sys.executable, "-c", _PROBE, str(path), str(x_file), runtime,
                              str(copies)], cwd=ROOT, capture_output=True, text=True,
                             timeout=300, env=dict(os.environ, NEURONISH_ENGINE="native"))
        assert run.returncode == 0, run.stderr[-3000:]
        got[copies] = json.loads(run.stdout.strip().splitlines()[-1])
    x = np.load(x_file)
    want = np.maximum(x @ W1, 0) @ W2
    for y in got[4]["y"]:
        np.testing.assert_allclose(np.array(y), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    more = got[4]["grown"] - got[1]["grown"]
    assert more < WEIGHT_MIB / 2, (got[1]["grown"], got[4]["grown"])
    # Each core is still charged for a whole copy: the device's ledger is as before.
    assert got[4]["charged"] >= 4 * WEIGHT_MIB > got[1]["charged"], \
        (got[1]["charged"], got[4]["charged"])


_TWO_LOADS_PROBE = """
import json, sys
import numpy as np
from neuronish.runtime import load

def resident_mib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024

out = {"grown": [], "y": []}
models = []
for path, x_file in zip(sys.argv[2::2], sys.argv[3::2]):
    before = resident_mib()
    models.append(load(path, runtime=sys.argv[1]))
    out["grown"].append(resident_mib() - before)
    out["y"].append(next(iter(models[-1].run({"x:0": np.load(x_file)}).values())).tolist())
print(json.dumps(out))
"""


def _two_matmuls(tmp: Path, name: str, w1: np.ndarray, w2: np.ndarray, batch: int
                 ) -> tuple[str, str, np.ndarray]:
    g = trace(lambda x: tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2),
              tf.TensorSpec([batch, 1024], tf.float32, name="x"))
    (tmp / f"{name}.neff").write_bytes(compile_graph(g.graph_def, g.io_config))
    x = RNG.standard_normal((batch, 1024)).astype(np.float32)
    np.save(tmp / f"{name}.npy", x)
    return str(tmp / f"{name}.neff"), str(tmp / f"{name}.npy"), np.maximum(x @ w1, 0) @ w2


@pytest.mark.parametrize("runtime", ["python", "c"])
def test_executables_with_the_same_weights_share_them_and_others_do_not(
        runtime: str, tmp_path: Path) -> None:
    """The same weights compiled at batch 8 and at batch 3 (two shapes of a NeuronOp), then
    weights of the same sizes with other values: each computes its own numbers, and the
    second load adds two sets of weights fewer than the third (the placed constants and
    their reordered copy; each load still holds its executable's bytes)."""
    other1, other2 = W1[::-1].copy(), W2[:, ::-1].copy()
    runs = [_two_matmuls(tmp_path, "b8", W1, W2, 8), _two_matmuls(tmp_path, "b3", W1, W2, 3),
            _two_matmuls(tmp_path, "other", other1, other2, 8)]
    args = [a for path, x_file, _ in runs for a in (path, x_file)]
    run = subprocess.run([sys.executable, "-c", _TWO_LOADS_PROBE, runtime, *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, NEURONISH_ENGINE="native"))
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for y, (_, _, want) in zip(got["y"], runs, strict=True):
        np.testing.assert_allclose(np.array(y), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    _, same, other = got["grown"]
    assert other - same > 1.5 * WEIGHT_MIB, got["grown"]
