"""Subgraphs written without copies of their weights (neuronish/subgraph_files.py): the
file the compiler reads is byte for byte the subgraph encapsulated with its constants."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish import subgraph_files
from tests.neuronish.test_saved_model_compile import assert_matches_original


def _model(path: Path) -> str:
    """Dense layers whose weights (2 MiB and 8 MiB) are held back,
    a small bias that is not, and a Cumsum kept on TensorFlow making two subgraphs."""
    module = tf.Module()
    rng = np.random.default_rng(0)
    module.w1 = tf.Variable(rng.standard_normal((512, 1024)).astype(np.float32) * 0.05)
    module.b1 = tf.Variable(rng.standard_normal(1024).astype(np.float32))
    module.w2 = tf.Variable(rng.standard_normal((1024, 2048)).astype(np.float32) * 0.05)

    @tf.function(input_signature=[tf.TensorSpec([None, 512], tf.float32, name="x")])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        h = tf.nn.relu(tf.matmul(x, module.w1) + module.b1)
        h = tf.math.cumsum(h, axis=1)
        return {"y": tf.nn.relu(tf.matmul(h, module.w2))}

    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return str(path)


def test_files_are_the_complete_subgraphs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    src = _model(tmp_path / "src")
    monkeypatch.setenv("NEURONISH_COMPILE_CACHE", "off")
    held_names: list[str] = []
    hold = subgraph_files.hold_constants

    def spy(index):  # noqa: ANN001, ANN202
        held = hold(index)
        held_names.extend(held)
        return held

    monkeypatch.setattr(neuronish.saved_model, "hold_constants", spy)
    report = neuronish.saved_model.compile(src, str(tmp_path / "held"), batch_size=2,
                                           no_fuse_ops=["Cumsum"],
                                           compiler_workdir=str(tmp_path / "work_held"))
    assert len(held_names) == 2  # the two weights, not the bias
    assert len(report["NeuronOps"]) == 2
    # verify=True keeps every subgraph whole in memory and writes sg.serialize() as it is.
    neuronish.saved_model.compile(src, str(tmp_path / "whole"), batch_size=2, verify=True,
                                  no_fuse_ops=["Cumsum"],
                                  compiler_workdir=str(tmp_path / "work_whole"))
    for op in report["NeuronOps"]:
        held = (tmp_path / "work_held" / op["name"] / "graph.pb").read_bytes()
        whole = (tmp_path / "work_whole" / op["name"] / "graph.pb").read_bytes()
        assert held == whole and len(held) > 2 << 20
    assert_matches_original(src, tmp_path / "held", tmp_path)
