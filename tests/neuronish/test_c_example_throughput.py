"""examples/c/tf_saved_model.c -T: many threads calling one session of a compiled model (and
of the original, alternating) in a host without Python. Checks the mode runs and reports
every figure, with the outputs right; never how fast (that is benchmarks/capi_binding.py's
figure 2b)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish import native_op_library
from tests.neuronish.test_op_library_c import _build_program, _run, _signature

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to build the op library and the C program")


class _Dense(tf.Module):
    def __init__(self) -> None:
        self.w = tf.Variable(np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.nn.relu(tf.matmul(x, self.w))}


def test_threads_call_one_session_and_every_figure_is_reported(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "compiled"
    module = _Dense()
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    neuronish.saved_model.compile(str(src), str(out), batch_size=1)
    (ins, outs), (_, base_outs) = _signature(out), _signature(src)
    program, library = _build_program(tmp_path / "tf_saved_model"), str(native_op_library.build())
    x = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    r = _run(program, "-l", library, "-i", str(tmp_path / "x.bin"), "-o", str(tmp_path / "y.bin"),
             "-T", "3", "-S", "0.1", "-B", str(src), str(out), f"{ins['x']}=float32:1,16", "--",
             outs["y"], "--", base_outs["y"])
    assert r.returncode == 0, r.stderr[-3000:]
    want = module(tf.constant(x))["y"].numpy()
    np.testing.assert_allclose(np.frombuffer((tmp_path / "y.bin").read_bytes(), np.float32),
                               want.ravel(), rtol=1e-5, atol=1e-6)
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("calls_per_s ")]
    assert [row[1] for row in rows] == [str(out), str(src)], r.stdout
    for _, _, one_thread, one_rate, threads, many_rate, word, ratio in rows:
        assert (one_thread, threads, word) == ("1", "3", "ratio")
        assert float(one_rate) > 0 and float(many_rate) > 0 and float(ratio) > 0
    # Out of range or not a number: the usage, exit status 2.
    for bad in ("65", "0", "abc"):
        r = _run(program, "-l", library, "-T", bad, str(out), f"{ins['x']}=float32:1,16", "--",
                 outs["y"])
        assert r.returncode == 2 and "usage:" in r.stderr and "-T THREADS" in r.stderr, r.stderr
