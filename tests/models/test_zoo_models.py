"""Models nobody here wrote (a representative slice of `benchmarks/zoo.py`), compiled at
batch 2 in one call: whole on the device, a dynamic batch, and TensorFlow's numbers at
batch 2 and at batch 3, which is no multiple of it (the last chunk padded). ConvNeXt
holds grouped convolutions inside XLA-marked functions; EfficientNet's swish returns an
IdentityN beside the batch; the keras_hub backbones are BERT- and GPT-2-style text
models with integer inputs and masks, a Llama-style decoder (rotary embeddings: sin,
cos), FNet (real FFTs, rewritten as DFT matmuls), Swin (rolled windows, slice updates)
Mixtral (top-k routing) and GPT-OSS (its experts' weights
`[experts, B * seq, 1]`: the batch behind a leading axis, 2.6% on the device before
cc/batch.py's reshape rule took it as per sample). The user models
(`models/user_models.py`) bring a dilated
causal Conv1D (run by TF through SpaceToBatchND), transposed convolutions, Keras' causal
attention mask (a cumsum), Conv3D, and LSTM and GRU (one bidirectional) as
`tf.while_loop`s, which the compile unrolls, and with `unroll=True`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from models import third_party
from models.cache import cached_saved_model
from tests.neuronish.test_saved_model_compile import run_in_fresh_process

# Whole-model builds and compiles of a few seconds to a minute each: CI runs them all.
MODELS = [pytest.param("bert_tiny"), pytest.param("gpt2_tiny"), pytest.param("llama_tiny"),
          pytest.param("mixtral_tiny"), pytest.param("gpt_oss_tiny"), pytest.param("swin_tiny"),
          pytest.param("keras_conv1d"), pytest.param("keras_conv_transpose"),
          pytest.param("keras_text_classifier"), pytest.param("keras_rnn_loop"),
          pytest.param("keras_rnn_unrolled"), pytest.param("fnet_tiny"),
          pytest.param("keras_conv3d"),
          pytest.param("EfficientNetB0", marks=pytest.mark.slow),
          pytest.param("ConvNeXtTiny", marks=pytest.mark.slow)]
COMPILED_BATCH, BATCHES = 2, (2, 3)


@pytest.mark.parametrize("name", MODELS)
def test_third_party_model_compiles_whole_and_matches(name: str, tmp_path: Path) -> None:
    src = cached_saved_model(name)
    out = tmp_path / "compiled"
    report = neuronish.saved_model.compile(src, str(out), batch_size=COMPILED_BATCH)
    assert report["OnNeuronRatio"] >= 0.98, report["OnTensorFlow"]
    assert not report["compile_failures"]
    assert all(op["dynamic_batch"] for op in report["NeuronOps"]), \
        [op["dynamic_batch_note"] for op in report["NeuronOps"]]
    original = tf.saved_model.load(src).signatures["serving_default"]
    feeds = {b: third_party.example_inputs(name, original, b, seed=b) for b in BATCHES}
    got, info = run_in_fresh_process(out, feeds, tmp_path)
    assert info["device_bytes_used"] > 0, "the compiled model never reached the device"
    for batch in BATCHES:
        want = original(**{k: tf.constant(v) for k, v in feeds[batch].items()})
        for key, w in want.items():
            w, g = w.numpy(), got[batch][key]
            assert g.shape == w.shape and g.dtype == w.dtype, (batch, key, g.shape, w.shape)
            err = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30)
            assert err <= 1e-4, f"batch {batch} {key}: relative error {err:.2e}"


@pytest.mark.parametrize("name, node, words", [
    # strings have no device dtype; noise drawn at serving differs from call to call
    ("keras_string_lookup", "LookupTableFindV2", ["dtype", "string"]),
    ("ops_random", "RandomStandardNormal", ["stateful"]),
])
def test_what_cannot_be_on_the_device_is_named_with_why(name: str, node: str, words: list[str],
                                                        tmp_path: Path) -> None:
    src = cached_saved_model(name)
    out = tmp_path / "compiled"
    report = neuronish.saved_model.compile(src, str(out), batch_size=1)
    assert report["NeuronOps"], "the rest of the model is on the device"
    named = {n: why for n, why in report["OnTensorFlowNodes"].items() if n.endswith(node)}
    assert len(named) == 1, report["OnTensorFlowNodes"]
    assert all(w in next(iter(named.values())) for w in words), named
