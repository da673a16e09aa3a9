"""`neuronish.saved_model.compile` end to end: the zoo compiled in one call, loaded in a
fresh process with `import neuronish; tf.saved_model.load`, matching the original model
at batch 1, at the compiled batch and at 3x the compiled batch plus one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from models.cache import cached_saved_model
from models.zoo import SPECS

COMPILED_BATCH = 2
BATCHES = (1, COMPILED_BATCH, 3 * COMPILED_BATCH + 1)
# Zoo models with no op the device cannot run, and the extra models.
FULLY_SUPPORTED = [*SPECS, "tf1_mlp"]

# Runs in a fresh process: only `import neuronish` may make NeuronOp loadable.
_RUN_COMPILED = textwrap.dedent("""
    import json, sys
    import numpy as np
    import neuronish
    import tensorflow as tf
    from neuronish.runtime import get_device

    model_dir, feeds_path, out_path, key = sys.argv[1:5]
    fn = tf.saved_model.load(model_dir).signatures[key]
    feeds = np.load(feeds_path)
    results = {}
    for batch in sorted({int(k.split("/")[0]) for k in feeds.files}):
        args = {k.split("/")[1]: tf.constant(feeds[k]) for k in feeds.files
                if k.startswith(f"{batch}/")}
        for name, value in fn(**args).items():
            results[f"{batch}/{name}"] = value.numpy()
    np.savez(out_path, **results)
    used = sum(c["used"] for c in get_device().memory_report().values())
    print(json.dumps({"device_bytes_used": used}))
""")


def random_feeds(fn: object, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Inputs for a signature: floats ~N(0,1); ints in [0, 2) (valid ids for every model)."""
    rng = np.random.default_rng(seed)
    _, specs = fn.structured_input_signature
    feeds = {}
    for key, spec in sorted(specs.items()):
        shape = [batch if d is None else d for d in spec.shape.as_list()]
        if spec.dtype.is_integer:
            feeds[key] = rng.integers(0, 2, shape).astype(spec.dtype.as_numpy_dtype)
        else:
            feeds[key] = rng.standard_normal(shape).astype(spec.dtype.as_numpy_dtype)
    return feeds


def run_in_fresh_process(model_dir: Path, feeds: dict[int, dict[str, np.ndarray]],
                         tmp_path: Path, key: str = "serving_default") -> tuple[dict, dict]:
    feeds_path, out_path = tmp_path / "feeds.npz", tmp_path / "outputs.npz"
    np.savez(feeds_path, **{f"{b}/{k}": v for b, f in feeds.items() for k, v in f.items()})
    r = subprocess.run([sys.executable, "-c", _RUN_COMPILED, str(model_dir), str(feeds_path),
                        str(out_path), key], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    outs = np.load(out_path)
    got: dict[int, dict[str, np.ndarray]] = {}
    for k in outs.files:
        batch, name = k.split("/")
        got.setdefault(int(batch), {})[name] = outs[k]
    return got, info


def assert_matches_original(original_dir: str, compiled_dir: Path, tmp_path: Path) -> None:
    original = tf.saved_model.load(original_dir).signatures["serving_default"]
    feeds = {b: random_feeds(original, b, seed=b) for b in BATCHES}
    got, info = run_in_fresh_process(compiled_dir, feeds, tmp_path)
    assert info["device_bytes_used"] > 0, "the compiled model never reached the device"
    for batch in BATCHES:
        want = {k: v.numpy() for k, v in original(**{k: tf.constant(v) for k, v in
                                                     feeds[batch].items()}).items()}
        assert set(got[batch]) == set(want)
        for key, w in want.items():
            g = got[batch][key]
            assert g.shape == w.shape and g.dtype == w.dtype, (batch, key, g.shape, w.shape)
            err = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30)
            assert err <= 1e-4, f"batch {batch} {key}: relative error {err:.2e}"


def _param(name: str):
    slow = name in SPECS and SPECS[name].slow
    return pytest.param(name, marks=[pytest.mark.slow] if slow else [], id=name)


@pytest.mark.parametrize("name", [_param(n) for n in FULLY_SUPPORTED])
def test_zoo_model_compiles_in_one_call_and_matches(name: str, tmp_path: Path) -> None:
    src = cached_saved_model(name)
    out = tmp_path / "compiled"
    report = neuronish.saved_model.compile(src, str(out), batch_size=COMPILED_BATCH)
    assert report["OnNeuronRatio"] >= 0.95, report["OnTensorFlow"]
    assert len(report["NeuronOps"]) >= 1 and not report["compile_failures"]
    assert_matches_original(src, out, tmp_path)


def test_unsupported_op_in_the_middle_stays_on_tensorflow(tmp_path: Path) -> None:
    src = cached_saved_model("cnn_cumsum")
    out = tmp_path / "compiled"
    report = neuronish.saved_model.compile(src, str(out), batch_size=COMPILED_BATCH)
    assert list(report["OnTensorFlow"]) == ["CumulativeLogsumexp"], report["OnTensorFlow"]
    (reason,) = report["OnTensorFlow"]["CumulativeLogsumexp"]["reasons"]
    assert "not supported" in reason
    # Device before and after the scan: two NeuronOps, nearly everything on the device.
    assert len(report["NeuronOps"]) == 2
    assert 0.8 < report["OnNeuronRatio"] < 1.0
    assert_matches_original(src, out, tmp_path)



def test_custom_gradient_left_on_tensorflow_saves(tmp_path: Path) -> None:
    # tf.custom_gradient marks its result with an IdentityN naming a gradient function
    # (Keras' silu: IdentityN(x * sigmoid(x), x, beta)); the loaded original registers
    # that function, capturing tensors of its own graph. With the IdentityN on TensorFlow,
    # saving the compiled model traced it into the new graph and failed ("Found invalid
    # capture beta:0 when saving custom gradients": keras_hub's Qwen3.5 and SmolLM3).
    # A served model is never differentiated; it must save without them.
    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32)])
        def serve(self, x: tf.Tensor) -> dict:
            return {"y": tf.nn.silu(x * 3.0) * 2.0}

    model, src, out = Model(), str(tmp_path / "src"), tmp_path / "compiled"
    tf.saved_model.save(model, src, signatures={"serving_default": model.serve})
    report = neuronish.saved_model.compile(src, str(out), batch_size=COMPILED_BATCH,
                                           no_fuse_ops=["IdentityN"])
    assert report["NeuronOps"], report
    graph = tf.saved_model.load(str(out)).signatures["serving_default"].graph.as_graph_def()
    kept = [n for f in graph.library.function for n in f.node_def
            if n.op == "IdentityN" and "_gradient_op_type" in n.attr]
    assert kept, "the custom gradient's IdentityN should have stayed on TensorFlow"
    assert_matches_original(src, out, tmp_path)
