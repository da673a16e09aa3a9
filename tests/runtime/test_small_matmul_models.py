"""Whole compiled models whose matmuls run on the native engine's small-matmul loop
(engine_small_matmul.cc), on both runtimes, against TensorFlow within 1e-4: a Keras MLP
(Dense layers with bias and relu) and a Dense output added to a residual (the fused
residual read by the loop), compiled at batch 1 and 3 and called at that batch and a
larger one."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from tests.graphs import TracedGraph, trace

SMALL = "neuronish:small_matmul"


def keras_mlp(batch: int) -> TracedGraph:
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([
        tf.keras.Input((12,)), tf.keras.layers.Dense(20, activation="relu"),
        tf.keras.layers.Dense(17, activation="relu"), tf.keras.layers.Dense(5)])
    return trace(lambda x: model(x), tf.TensorSpec([None, 12], tf.float32, name="x"),
                 batch=batch)


def dense_residual(batch: int) -> TracedGraph:
    rng = np.random.default_rng(5)
    w1, w2 = (tf.constant(rng.standard_normal((16, 16)).astype(np.float32) * 0.5)
              for _ in range(2))
    b1, b2 = (tf.constant(rng.standard_normal(16).astype(np.float32)) for _ in range(2))

    def fn(x: tf.Tensor) -> tf.Tensor:
        h = tf.nn.relu(x @ w1 + b1)
        return tf.nn.relu(h @ w2 + b2 + x)

    return trace(fn, tf.TensorSpec([None, 16], tf.float32, name="x"), batch=batch)


def runtimes() -> list[str]:
    return ["python", "c"] if shutil.which("g++") else ["python"]


@pytest.mark.parametrize("runtime", runtimes())
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("build", [keras_mlp, dense_residual])
def test_models_on_the_small_matmul_loop_match_tensorflow(build: object, batch: int,
                                                           runtime: str) -> None:
    graph = build(batch)
    name, (shape, _) = next(iter(graph.io_config["inputs"].items()))
    with load(compile_graph(graph.graph_def, graph.io_config), runtime=runtime) as model:
        if runtime == "python":  # (the C runtime does not say which kernel ran)
            program = model._idle.get()
            model._idle.put(program)
            kinds = {i: ins.kind for i, ins in enumerate(program.instructions)}
            impls = program.implementations()
            assert impls and all(impls[i] == SMALL for i, k in kinds.items() if k == "matmul")
        rng = np.random.default_rng(batch)
        for calls in (batch, 5):
            feeds = {name: rng.standard_normal((calls, *shape[1:])).astype(np.float32)}
            want = graph.reference(feeds)
            for _ in range(2):  # (a second call: the data pointers are the call's own)
                got = model.run(feeds)
                for out in want:
                    np.testing.assert_allclose(got[out], want[out], rtol=1e-4, atol=1e-4)
