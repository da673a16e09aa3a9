"""A batch that sits behind a leading axis (a mixture of experts' `[experts, B * seq, d]`)
is still per sample, and a model built that way compiles whole and gives TensorFlow's
numbers at every batch. A reshape that really interleaves samples stays on TensorFlow.

keras_hub's GPT-OSS flattens its tokens to `[B * seq, d]`, runs every expert on them
(`[E, B * seq, d]`) and weights each expert by its router score, transposed and
expanded to `[E, B * seq, 1]`. The compiler's batch check took that ExpandDims for a
reshape that interleaves samples (it allowed nothing but size-1 axes before the batch),
and the partitioner then kept the whole mixture of experts on TensorFlow: gpt_oss_tiny
fell from OnNeuronRatio 1.0 to 0.026."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

import neuronish.saved_model

SEQ, DIM, EXPERTS = 4, 6, 3
COMPILED_BATCH = 2
CALLED_BATCHES = (1, 3, 5)  # fewer than compiled, and not multiples of it (padded chunks)


def _save(serve: object, module: tf.Module, path: Path) -> str:
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return str(path)


def _moe_model(path: Path) -> tuple[str, object]:
    """GPT-OSS's sparse mixture of experts, in miniature."""
    module = tf.Module()
    rng = np.random.default_rng(0)
    module.router = tf.Variable(rng.standard_normal((DIM, EXPERTS)).astype(np.float32))
    module.experts = tf.Variable(rng.standard_normal((EXPERTS, DIM, DIM)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, SEQ, DIM], tf.float32, name="x")])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        tokens = tf.reshape(x, [-1, DIM])                                # [B * seq, d]
        scores = tf.nn.softmax(tf.matmul(tokens, module.router))         # [B * seq, E]
        outs = tf.einsum("th,ehm->etm", tokens, module.experts)          # [E, B * seq, d]
        weights = tf.expand_dims(tf.transpose(scores), -1)               # [E, B * seq, 1]
        mixed = tf.reduce_sum(tf.nn.gelu(outs) * weights, axis=0)        # [B * seq, d]
        return {"y": tf.reshape(mixed, [-1, SEQ, DIM])}

    return _save(serve, module, path), serve


def _interleaving_model(path: Path) -> tuple[str, object]:
    """`[B, seq, d]` transposed to `[seq, B, d]`, then read back as `[B, seq * d]`: each
    output row takes entries of several samples, so the reshape must stay on TensorFlow."""
    module = tf.Module()

    @tf.function(input_signature=[tf.TensorSpec([None, SEQ, DIM], tf.float32, name="x")])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        seq_major = tf.transpose(tf.tanh(x), [1, 0, 2])                  # [seq, B, d]
        return {"y": tf.sigmoid(tf.reshape(seq_major, [-1, SEQ * DIM]))}

    return _save(serve, module, path), serve


def _compile_and_compare(src: str, dst: Path, serve: object) -> dict:
    report = neuronish.saved_model.compile(src, str(dst), batch_size=COMPILED_BATCH)
    compiled = tf.saved_model.load(str(dst)).signatures["serving_default"]
    for batch in (COMPILED_BATCH, *CALLED_BATCHES):
        x = np.random.default_rng(batch).standard_normal((batch, SEQ, DIM)).astype(np.float32)
        np.testing.assert_allclose(compiled(x=tf.constant(x))["y"].numpy(),
                                   serve(tf.constant(x))["y"].numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=f"at batch {batch}")
    return report


def test_experts_over_flattened_tokens_compile_whole(tmp_path: Path) -> None:
    src, serve = _moe_model(tmp_path / "moe")
    report = _compile_and_compare(src, tmp_path / "moe_neuron", serve)
    assert report["OnNeuronRatio"] == 1.0, report["OnTensorFlowNodes"]
    (op,) = report["NeuronOps"]
    assert op["dynamic_batch"], op["dynamic_batch_note"]


def test_reshape_that_interleaves_samples_stays_on_tensorflow(tmp_path: Path) -> None:
    src, serve = _interleaving_model(tmp_path / "interleave")
    report = _compile_and_compare(src, tmp_path / "interleave_neuron", serve)
    reshape = next(n for n in report["OnTensorFlowNodes"] if n.endswith("Reshape"))
    assert report["OnTensorFlowNodes"][reshape].startswith("mixes samples across the batch")
    assert report["operations_on_neuron"] > 0  # the tanh before it stays on the device


def _neuronish_cc(tmp_path: Path, fn: object) -> subprocess.CompletedProcess:
    """`fn` frozen and compiled by neuronish-cc alone at COMPILED_BATCH, x's batch axis 0."""
    f = tf.function(fn).get_concrete_function(tf.TensorSpec([None, SEQ, DIM], tf.float32,
                                                            name="x"))
    frozen = convert_variables_to_constants_v2(f)
    (tmp_path / "g.pb").write_bytes(frozen.graph.as_graph_def().SerializeToString())
    io = {"inputs": {"x:0": [[COMPILED_BATCH, SEQ, DIM], "float32", 0]},
          "outputs": [f"{frozen.outputs[0].op.name}:0"]}
    return subprocess.run(
        [sys.executable, "-m", "neuronish.cc.cli", "compile", str(tmp_path / "g.pb"),
         "--framework", "TENSORFLOW", "--io-config", json.dumps(io), "--output",
         str(tmp_path / "g.neff")], capture_output=True, text=True, timeout=300)


def _seq_major(x: tf.Tensor) -> tf.Tensor:
    return tf.transpose(tf.tanh(x), [1, 0, 2])  # [seq, B, d]: `seq` entries before the batch


def _batch_major(t: tf.Tensor) -> tf.Tensor:
    return tf.transpose(t, [1, 0, *range(2, len(t.shape))])  # back to [B, seq, ...]


BEHIND_A_LEADING_AXIS = {  # each reshapes a tensor whose batch has `seq` entries before it
    "expand_dims": lambda x: _batch_major(tf.expand_dims(_seq_major(x), -1)),
    "squeeze": lambda x: _batch_major(tf.squeeze(_seq_major(x)[:, :, None, :], 2)),
    "merge_trailing": lambda x: _batch_major(tf.reshape(
        tf.sigmoid(tf.reshape(_seq_major(x), [SEQ, -1])), [SEQ, -1, DIM])),
    "split_leading": lambda x: _batch_major(tf.reshape(
        tf.sigmoid(tf.reshape(_seq_major(x), [2, SEQ // 2, -1, DIM])), [SEQ, -1, DIM])),
}


@pytest.mark.parametrize("case", sorted(BEHIND_A_LEADING_AXIS))
def test_compiler_keeps_a_reshape_behind_a_leading_axis(tmp_path: Path, case: str) -> None:
    # At the compiler alone: the batch check's verdict, not the partitioner's, decides.
    from neuronish.runtime import load

    fn = BEHIND_A_LEADING_AXIS[case]
    done = _neuronish_cc(tmp_path, fn)
    assert done.returncode == 0, done.stderr
    model = load((tmp_path / "g.neff").read_bytes())
    try:
        for batch in CALLED_BATCHES:
            x = np.random.default_rng(batch).standard_normal((batch, SEQ, DIM)).astype(
                np.float32)
            (got,) = model.run({"x:0": x}).values()
            np.testing.assert_allclose(got, fn(tf.constant(x)).numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"at batch {batch}")
    finally:
        model.unload()


def test_compiler_names_a_reshape_that_interleaves_samples(tmp_path: Path) -> None:
    done = _neuronish_cc(tmp_path, lambda x: tf.reshape(tf.transpose(x, [1, 0, 2]),
                                                        [-1, SEQ * DIM]))
    assert done.returncode == 1, done.stderr
    line = next(ln for ln in done.stderr.splitlines() if "mixes samples" in ln)
    assert "(Reshape)" in line and "samples interleave" in line
