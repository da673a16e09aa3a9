"""Shortcuts the compiler takes for 100,000-node graphs (benchmarks/compiler_scale.py)
give what the long way gives: attribute keys remembered while the executable is made,
constants frozen in place, parsed nodes' attribute keys, the identity test's early exit."""

from __future__ import annotations

import numpy as np

from neuronish.cc.graphdef import TFNode
from neuronish.cc.ir import Graph, Node, TensorType, Value, constant
from neuronish.cc.passes.simplify import eliminate_identities
from neuronish.cc.signature import attrs_fixed, attrs_key, value_key


def test_attribute_keys_inside_a_fixed_block_are_value_keys() -> None:
    a, b = {"fn": "mul", "alpha": 0.5}, {"fn": "mul", "alpha": -0.0}
    with attrs_fixed():
        assert attrs_key(a) == value_key(a) and attrs_key(b) == value_key(b)
        assert attrs_key(a) == value_key(a)  # (remembered)
        assert attrs_key(a) != attrs_key(b)
        with attrs_fixed():  # nested: the same cache
            assert attrs_key(b) == value_key(b)
    a["alpha"] = 2.0  # outside the block nothing is remembered
    assert attrs_key(a) == value_key(a) != value_key({"fn": "mul", "alpha": 0.5})


def test_owned_constants_are_frozen_in_place_and_others_copied() -> None:
    fresh = np.arange(4, dtype=np.float32)
    v = constant(fresh, owned=True)
    assert v.data is fresh and not fresh.flags.writeable
    assert v.type == TensorType((4,), "float32")
    shared = np.arange(4, dtype=np.float32)
    w = constant(shared)  # not owned: the caller may still write it
    assert w.data is not shared and not w.data.flags.writeable and shared.flags.writeable
    view = np.arange(8, dtype=np.float64)[::2]
    u = constant(view, owned=True)  # a view is never frozen in place
    assert u.data is not view and u.type == TensorType((4,), "float64")


def test_parsed_node_attribute_key_is_worked_out_once() -> None:
    node = TFNode("m", "Mul", [], [], {"T": "float32"})
    assert node.attr_key() == value_key({"T": "float32"})
    assert node.attr_key() is node.attr_key()
    assert TFNode("t", "Const", [], [], {"value": np.zeros(2)}).attr_key() is None


def _mul_graph(c: np.ndarray) -> Graph:
    x = Value(TensorType((2, 3), "float32"), name="x")
    node = Node("binary", [x, constant(c)], [], {"fn": "mul"})
    node.outputs = [Value(TensorType((2, 3), "float32"), producer=node)]
    return Graph([x], [node.outputs[0]], [node], [0], [0])


def test_identity_multiply_is_found_whatever_its_first_element() -> None:
    """A Mul by ones goes (here a copy stays: an output may not alias the input); by a
    constant whose first element is 1 but not the rest, or whose first is not 1, the Mul
    stays (the early exit looks at the first element only)."""
    def kinds(c: np.ndarray) -> list[str]:
        return [n.kind for n in eliminate_identities(_mul_graph(c)).nodes]

    assert kinds(np.ones(3, np.float32)) == ["copy"]
    assert kinds(np.array([1, 1, 2], np.float32)) == ["binary"]
    assert kinds(np.array([2, 1, 1], np.float32)) == ["binary"]
    assert kinds(np.array([np.nan], np.float32)) == ["binary"]
