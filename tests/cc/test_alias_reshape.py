"""A reshape of a value in the arena is the same bytes under other dims: the memory plan
puts its output on its input's buffer (cc/memory.py), the native engine copies nothing,
the validator accepts exactly that sharing and nothing looser, and the numbers stay
TensorFlow's on both engines at several batch sizes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from neuronish.runtime.errors import ExecutableError
from neuronish.runtime.executable import from_bytes
from neuronish.runtime.native import library
from neuronish.runtime.program import LoadedProgram
from neuronish.runtime.validate import check_executable
from tests.graphs import trace

RNG = np.random.default_rng(7)


def _model(x: tf.Tensor) -> tf.Tensor:
    """tanh -> reshape -> softmax over the merged axis -> reshape back, plus the tanh
    again: the first buffer is read through its alias and then under its own name after
    the alias's reader, so sharing must keep it alive across both."""
    y = tf.tanh(x)
    s = tf.nn.softmax(tf.reshape(y, [-1, 6 * 8]))
    return tf.reshape(s, [-1, 6, 8]) * 3.0 + y


def _compiled(batch: int) -> tuple[object, bytes]:
    g = trace(_model, tf.TensorSpec([None, 6, 8], tf.float32, name="x"), batch=batch)
    return g, compile_graph(g.graph_def, g.io_config)


def _aliased(exe: object) -> list[int]:
    """Indices of the reshapes whose output sits on their input's bytes."""
    flat = [i for p in exe.programs for i in p]
    return [k for k, i in enumerate(flat) if i.kind == "reshape"
            and i.inputs[0] in exe.offsets and i.outputs[0] in exe.offsets
            and exe.offsets[i.inputs[0]] == exe.offsets[i.outputs[0]]]


@pytest.mark.parametrize("engine", ["numpy", "native"])
@pytest.mark.parametrize("batch", [1, 3])
def test_reshapes_share_bytes_and_match_tensorflow(engine: str, batch: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    g, exe_bytes = _compiled(batch)
    exe = from_bytes(exe_bytes)
    assert len(_aliased(exe)) == 2, [(i.kind, i.inputs, i.outputs) for p in exe.programs
                                     for i in p]
    x = RNG.standard_normal((batch, 6, 8)).astype(np.float32)
    with load(exe_bytes, runtime="python") as model:
        got = model.run({"x:0": x})
    for key, want in g.reference({"x:0": x}).items():
        np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-6)


def test_native_engine_copies_nothing_for_an_aliased_reshape() -> None:
    lib = library.load()
    assert lib is not None, library.why_not()
    _, exe_bytes = _compiled(2)
    exe = from_bytes(exe_bytes)
    program = LoadedProgram(exe, exe.constants, lib, 2)
    impl = program.implementations()
    assert all(impl[k] == "neuronish:alias" for k in _aliased(exe)), impl


def test_validator_refuses_a_value_placed_over_a_shared_buffer() -> None:
    """The softmax's output moved onto the bytes the tanh and its alias share while the
    tanh is still to be read (by the final add): refused, naming both."""
    _, exe_bytes = _compiled(2)
    exe = from_bytes(exe_bytes)
    flat = [i for p in exe.programs for i in p]
    softmax = next(i for i in flat if i.kind == "softmax")
    first = flat[_aliased(exe)[0]]
    offsets = {**exe.offsets, softmax.outputs[0]: exe.offsets[first.inputs[0]]}
    arena = max(exe.arena_bytes, offsets[softmax.outputs[0]] + 2 * 6 * 8 * 4)
    with pytest.raises(ExecutableError, match=r"puts .* over .*while both are in use"):
        check_executable(dataclasses.replace(exe, offsets=offsets, arena_bytes=arena))


def test_validator_refuses_a_reshape_that_only_half_overlaps_its_input() -> None:
    """Sharing means the very same bytes: a reshape output shifted by one element over its
    still-live input is two buffers overlapping, and refused."""
    _, exe_bytes = _compiled(2)
    exe = from_bytes(exe_bytes)
    flat = [i for p in exe.programs for i in p]
    first = flat[_aliased(exe)[0]]
    offsets = {**exe.offsets, first.outputs[0]: exe.offsets[first.inputs[0]] + 4}
    with pytest.raises(ExecutableError, match=r"puts .* over .*while both are in use"):
        check_executable(dataclasses.replace(exe, offsets=offsets,
                                             arena_bytes=exe.arena_bytes + 64))
