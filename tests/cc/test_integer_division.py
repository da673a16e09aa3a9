"""Integer division by a constant zero: TensorFlow fails such a node when it
runs ("Integer division by zero"); the compiler refuses it naming the node (numpy would
quietly give 0, and it once failed with "IR verification failed", naming no node)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.graphs import trace

BIN = Path(sys.executable).parent

CASES = {
    "floordiv": lambda x: tf.math.floordiv(x * 2 + 1, tf.constant(0, tf.int32)) + 3,
    "floormod": lambda x: tf.math.floormod(x, tf.constant([1, 0, 2, 3], tf.int32)),
    "folded divisor": lambda x: tf.math.floordiv(x, tf.range(4)),  # 0 once Range is folded
}


@pytest.mark.parametrize("case", list(CASES))
def test_integer_division_by_a_constant_zero_names_the_node(tmp_path: Path, case: str) -> None:
    g = trace(CASES[case], tf.TensorSpec([4], tf.int32, name="x"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Integer division by zero"):
        g.fn(tf.constant(np.arange(4, dtype=np.int32)))  # what TensorFlow does
    (tmp_path / "g.pb").write_bytes(g.graph_def)
    proc = subprocess.run([str(BIN / "neuronish-cc"), "compile", str(tmp_path / "g.pb"),
                           "--framework", "TENSORFLOW", "--io-config", json.dumps(g.io_config),
                           "--output", str(tmp_path / "g.neff"), "--workdir",
                           str(tmp_path / "w")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "VerificationError" not in proc.stderr and "Traceback" not in proc.stderr
    report = json.loads((tmp_path / "w" / "errors.json").read_text())
    (node,) = report["nodes"]
    assert node["op"] in ("FloorDiv", "FloorMod") and node["node"], report
    assert "integer division by zero" in node["reason"] and "holding 0" in node["reason"]
    assert not (tmp_path / "g.neff").exists()


def test_a_non_zero_constant_divisor_still_compiles(tmp_path: Path) -> None:
    g = trace(lambda x: tf.math.floordiv(x, tf.constant([1, -2, 3, 4])),
              tf.TensorSpec([4], tf.int32, name="x"))
    (tmp_path / "g.pb").write_bytes(g.graph_def)
    proc = subprocess.run([str(BIN / "neuronish-cc"), "compile", str(tmp_path / "g.pb"),
                           "--framework", "TENSORFLOW", "--io-config", json.dumps(g.io_config),
                           "--output", str(tmp_path / "g.neff")], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
