"""benchmarks/zoo.py's error metric, which every zoo and precision table is measured with."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "zoo.py"
_spec = importlib.util.spec_from_file_location("zoo_metric", _PATH)
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)


def test_relative_to_the_largest_reference_value() -> None:
    want = {"a": np.array([1.0, -4.0], "f4"), "b": np.array([2.0], "f4")}
    got = {"a": np.array([1.2, -4.0], "f4"), "b": np.array([2.0], "f4")}
    assert math.isclose(zoo.max_rel_error(got, want), 0.2 / 4.0, rel_tol=1e-6)
    assert zoo.max_rel_error({"a": want["a"][:1], "b": want["b"]}, want) == math.inf


def test_a_nan_or_infinity_on_one_side_only_is_an_infinite_error() -> None:
    want = {"a": np.array([1.0, 2.0], "f4")}
    assert zoo.max_rel_error({"a": np.array([np.nan, 2.0], "f4")}, want) == math.inf
    assert zoo.max_rel_error({"a": np.array([np.inf, 2.0], "f4")}, want) == math.inf
    # ... and the same NaN or infinity on both sides is no error.
    both = {"a": np.array([np.nan, np.inf, 3.0], "f4")}
    assert zoo.max_rel_error(both, {"a": np.array([np.nan, np.inf, 3.0], "f4")}) == 0.0
    assert zoo.max_rel_error(both, {"a": np.array([np.nan, -np.inf, 3.0], "f4")}) == math.inf
