"""Harness for per-op conformance: a TF function, example inputs, compare.

A `Case` names the TF op type it exercises; `run_case` traces the function with
TensorFlow, checks the op really is in the traced graph, compiles that graph
with the real compiler pipeline, runs it on the device and compares values,
shapes and dtypes against TensorFlow's own result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import tensorflow as tf

from neuronish.runtime.native import library
from tests.helpers import compile_and_run


@pytest.fixture(params=["numpy", "native"])
def both_engines(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a conformance test on the numpy reference engine and on the native one (a
    native engine that cannot be built fails the test instead of quietly using numpy)."""
    monkeypatch.setenv("NEURONISH_ENGINE", request.param)
    if request.param == "native":
        assert library.load() is not None, f"native engine unavailable: {library.why_not()}"
    return request.param


@dataclass
class Case:
    op_type: str
    fn: Callable[..., object]
    inputs: list[np.ndarray]
    id: str = ""
    rtol: float = 1e-5
    atol: float = 1e-6
    options: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.op_type}-{self.id}" if self.id else self.op_type


def trace(case: Case) -> tuple[bytes, dict, tf.types.experimental.ConcreteFunction]:
    specs = [tf.TensorSpec(x.shape, tf.as_dtype(x.dtype), name=f"in{i}")
             for i, x in enumerate(case.inputs)]
    concrete = tf.function(case.fn, autograph=False).get_concrete_function(*specs)
    graph_def = concrete.graph.as_graph_def()
    ops = {n.op for n in graph_def.node}
    assert case.op_type in ops, f"case {case} does not produce a {case.op_type} node: {ops}"
    placeholders = [t for t in concrete.inputs if t.dtype != tf.resource]
    io = {
        "inputs": {t.name: [list(x.shape), x.dtype.name] for t, x in zip(placeholders,
                                                                        case.inputs)},
        "outputs": [t.name for t in concrete.outputs],
    }
    return graph_def.SerializeToString(), io, concrete


def run_case(case: Case) -> None:
    graph_def, io, concrete = trace(case)
    expected = concrete(*[tf.constant(x) for x in case.inputs])
    expected = expected if isinstance(expected, (list, tuple)) else [expected]
    feeds = dict(zip(io["inputs"], case.inputs))
    got = compile_and_run(graph_def, io, feeds, **case.options)
    for name, want in zip(io["outputs"], expected):
        want = want.numpy()
        have = got[name]
        assert have.dtype == want.dtype, f"{case} {name}: dtype {have.dtype}, TF gives {want.dtype}"
        assert have.shape == want.shape, f"{case} {name}: shape {have.shape}, TF gives {want.shape}"
        if want.dtype.kind == "f":
            np.testing.assert_allclose(have, want, rtol=case.rtol, atol=case.atol,
                                       err_msg=f"{case} {name}")
        else:
            np.testing.assert_array_equal(have, want, err_msg=f"{case} {name}")
