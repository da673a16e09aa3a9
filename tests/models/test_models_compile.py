"""Whole models: frozen zoo graphs compiled by the real `neuronish-cc` subprocess and
run on the device match TensorFlow, at the compiled batch and at other batches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from models.cache import cached_frozen_graph
from models.freeze import example_inputs
from models.zoo import SPECS
from neuronish.runtime import load

COMPILED_BATCH = 2


def _param(name: str):
    marks = [pytest.mark.slow] if SPECS[name].slow else []
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_param(n) for n in SPECS])
def test_zoo_model_matches_tensorflow(name: str, tmp_path: Path) -> None:
    # Frozen with a free batch and compiled at COMPILED_BATCH with the batch axes given, as
    # the partitioner does: the compiler can then prove the graph per sample (a graph
    # frozen at one batch bakes it into its reshapes and is compiled for that batch only).
    frozen = cached_frozen_graph(name, None)
    pb = tmp_path / f"{name}.pb"
    pb.write_bytes(frozen.graph_def)
    out = tmp_path / f"{name}.neff"
    io = frozen.io_config()
    io["inputs"] = {k: [[COMPILED_BATCH, *v[0][1:]], v[1], 0] for k, v in io["inputs"].items()}
    r = subprocess.run(
        [str(Path(sys.executable).parent / "neuronish-cc"), "compile", str(pb), "--framework",
         "TENSORFLOW", "--io-config", json.dumps(io), "--output", str(out)],
        capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with load(out, duplicates=2) as model:
        for batch in (COMPILED_BATCH, 1, 3 * COMPILED_BATCH + 1):
            feeds = example_inputs(frozen, batch, seed=batch)
            got = model.run(feeds)
            want = frozen.run_tf(feeds)
            for key in frozen.outputs:
                assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype
                err = np.max(np.abs(got[key] - want[key])) / np.max(np.abs(want[key]))
                assert err <= 1e-4, f"{name} batch {batch} {key}: relative error {err:.2e}"
