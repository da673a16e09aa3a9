"""`TensorSignature`, the one record of a tensor's signature: the io-config parser and the
executable both use it, and neither file changes a byte for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuronish.cc.compiler import compile_graph
from neuronish.cc.ioconfig import parse_io_config
from neuronish.runtime.executable import from_bytes, to_bytes
from neuronish.runtime.signature import TensorSignature, first_difference
from tests.graphs import conv_bn_relu, dense_relu

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.mark.parametrize("text", [
    # The spellings docs/contracts.md allows: a batch axis given or not (-1 = none),
    # outputs as a list or as a map to batch axes.
    '{"inputs": {"x:0": [[1, 224, 224, 3], "float32"]}, "outputs": ["logits:0"]}',
    '{"inputs": {"x:0": [[4, 16], "float32", 0], "m:1": [[16], "int32", -1]}, '
    '"outputs": {"y:0": 0, "z:0": -1}}',
    '{"inputs": {"s:0": [[], "bool"], "x:0": [[2, 3], "float16", 1]}, "outputs": ["y:0"]}',
])
def test_an_io_config_round_trips_unchanged(text: str) -> None:
    io = parse_io_config(text)
    assert not io.problems
    assert json.dumps(io.to_json()) == text
    assert parse_io_config(json.dumps(io.to_json())) == io


def test_io_config_inputs_are_signature_records() -> None:
    io = parse_io_config('{"inputs": {"x:0": [[4, 16], "float32"], "k:0": [[3], "int64", -1]},'
                         ' "outputs": ["y:0"]}')
    assert io.inputs == (TensorSignature("x:0", "float32", (4, 16), 0),
                         TensorSignature("k:0", "int64", (3,), -1))
    # Only `k` stated its axis: `x`'s is the default, which lets a graph that mixes
    # samples compile for a fixed batch (docs/contracts.md, batch safety).
    assert io.given_batch_axes == {"k:0"}


def test_the_executable_states_the_io_configs_records() -> None:
    """What the compiler read from the io-config is what the executable says it takes,
    record for record, and the value ids stay beside them."""
    g = dense_relu(batch=4)
    io = {"inputs": {"x:0": [[4, 16], "float32", 0]}, "outputs": {"Identity:0": 0}}
    exe = from_bytes(compile_graph(g.graph_def, io))
    assert exe.inputs == list(parse_io_config(io).inputs)
    assert exe.outputs == [TensorSignature("Identity:0", "float32", (4, 8), 0)]
    assert len(exe.input_values) == 1 and len(exe.output_values) == 1
    assert exe.input_values[0] in exe.values and exe.output_values[0] in exe.values


@pytest.mark.parametrize("build", [
    lambda: (GOLDEN / "conv_bn.neff").read_bytes(),  # written before the record existed
    lambda: compile_graph(dense_relu(batch=3).graph_def,
                          {"inputs": {"x:0": [[3, 16], "float32", 0]},
                           "outputs": {"Identity:0": 0}}),
    lambda: compile_graph(conv_bn_relu(batch=2, seed=1).graph_def,
                          conv_bn_relu(batch=2, seed=1).io_config, pipeline_cores=2),
], ids=["golden", "dense", "conv-two-cores"])
def test_a_compiled_executable_round_trips_unchanged(build) -> None:
    data = build()
    exe = from_bytes(data)
    assert to_bytes(exe) == data
    assert to_bytes(from_bytes(to_bytes(exe))) == data


def test_accepts_shape_and_bounds() -> None:
    sig = TensorSignature("ids", "int32", (-1, -1), bounds=(None, (1, 128)))
    assert sig.accepts_shape((3, 7)) and not sig.accepts_shape((3,))
    assert sig.out_of_bounds((3, 7)) is None
    assert sig.out_of_bounds((3, 129)) == (1, 1, 128)
    assert TensorSignature("x", "float32", None).accepts_shape((1, 2, 3))
    assert not TensorSignature("x", "float32", (2, 3)).accepts_shape((2, 4))
    assert sig.describe() == "'ids' int32[-1,-1] batch axis -1"
    assert TensorSignature("x", "float32", None).shape_text == "[?]"


def test_first_difference_names_the_field() -> None:
    a = TensorSignature("x:0", "float32", (4, 16), 0)
    assert first_difference([a], [a]) is None
    assert first_difference([a], [a, a]) == (-1, "count")
    assert first_difference([a, a], [a, TensorSignature("x:0", "float32", (4, 16), -1)]) == \
        (1, "batch_axis")
    assert first_difference([a], [TensorSignature("x:0", "int32", (4, 16), 0)]) == (0, "dtype")
