"""benchmarks/c_host_zoo.py: a zoo model compiled and run by TensorFlow's C API with the
native NeuronOp library matches TensorFlow at the compiled batch and the next; a model it
cannot build is a failed row and a non-zero exit, not a crash."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "c_host_zoo.py"
_spec = importlib.util.spec_from_file_location("c_host_zoo", _PATH)
c_host_zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(c_host_zoo)

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None,
                                reason="gcc and g++ are needed to build the op library and the "
                                       "C program")


def test_a_zoo_model_matches_tensorflow_in_the_c_host(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert c_host_zoo.main(["mlp"]) == 0
    [row] = [line.split() for line in capsys.readouterr().out.splitlines()
             if line.startswith("mlp ")]
    _, ratio, ops, numpy, err2, err3 = row
    assert (float(ratio), int(ops), int(numpy)) == (1.0, 1, 0), row
    assert float(err2) < 1e-5 and float(err3) < 1e-5, row


def test_a_model_that_fails_is_a_row_and_the_exit_status(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert c_host_zoo.main(["no_such_model"]) == 1
    out = capsys.readouterr().out
    assert "no_such_model" in out and "unknown model 'no_such_model'" in out, out
    assert "1 of 1 model(s) failed" in out, out
