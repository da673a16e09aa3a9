"""The reference models and their frozen graphs.

Each zoo model must freeze into a self-contained GraphDef (no function
calls, no variables, no run-time shape arithmetic) that computes what the
original SavedModel signature computes, at the frozen batch and at another.
Models come from the shared cache (`$NEURONISH_MODEL_CACHE`), so only a cold
cache pays for the builds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from models import cache, zoo  # noqa: E402
from models.freeze import (  # noqa: E402
    FrozenGraph,
    assert_fully_frozen,
    example_inputs,
    freeze_saved_model,
    unfrozen_nodes,
)

FAST = [n for n, s in zoo.SPECS.items() if not s.slow]
SLOW = [n for n, s in zoo.SPECS.items() if s.slow]
MODELS = [pytest.param(n) for n in FAST] + [pytest.param(n, marks=pytest.mark.slow) for n in SLOW]

BATCH = 2
OTHER_BATCH = 3


@pytest.fixture(scope="module")
def frozen_models() -> dict[str, tuple[str, FrozenGraph]]:
    """name -> (SavedModel dir, frozen at BATCH); filled lazily per model."""
    return {}


def _get(frozen_models: dict, name: str) -> tuple[str, FrozenGraph]:
    if name not in frozen_models:
        # The frozen graph is cached too, keyed by the freezer's source: a
        # change to models/freeze.py re-freezes, a warm run skips ResNet50's 15 s.
        export_dir = cache.cached_saved_model(name)
        frozen_models[name] = (export_dir, cache.cached_frozen_graph(name, BATCH))
    return frozen_models[name]


def _signature_outputs(export_dir: str, frozen: FrozenGraph, feeds: dict) -> list[np.ndarray]:
    """The original SavedModel signature, called eagerly on the same feeds."""
    sig = _load_signature(export_dir)
    kwargs = {
        key: tf.constant(feeds[name])
        for key, name in zip(frozen.input_keys, frozen.inputs, strict=True)
    }
    result = sig(**kwargs)
    return [result[k].numpy() for k in frozen.output_keys]


# Keep the loaded objects alive: a signature needs its owner's variables.
_LOADED: dict[str, object] = {}


def _load_signature(export_dir: str) -> Callable[..., dict]:
    if export_dir not in _LOADED:
        _LOADED[export_dir] = tf.saved_model.load(export_dir)
    return _LOADED[export_dir].signatures["serving_default"]


def _assert_close(got: np.ndarray, want: np.ndarray) -> None:
    # Scale-aware: float32 rounding differs between the fused signature and
    # the folded graph (e.g. BN folded into conv weights).
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * scale)


@pytest.mark.parametrize("name", MODELS)
def test_frozen_graph_is_self_contained(frozen_models: dict, name: str) -> None:
    _, frozen = _get(frozen_models, name)
    gd = frozen.parsed()
    assert unfrozen_nodes(gd) == []
    assert_fully_frozen(frozen.reference_graph_def)
    ops = {n.op for n in gd.node}
    # Static batch: no run-time shape arithmetic left for the compiler.
    assert not ops & {"Shape", "ShapeN", "Size", "Rank"}, ops
    assert not any(i.startswith("^") for n in gd.node for i in n.input)
    placeholders = {n.name + ":0" for n in gd.node if n.op == "Placeholder"}
    assert placeholders == set(frozen.inputs)
    for name_, (shape, _) in frozen.inputs.items():
        assert shape[0] == BATCH and all(d > 0 for d in shape), (name_, shape)


@pytest.mark.parametrize("name", MODELS)
def test_frozen_graph_matches_saved_model(frozen_models: dict, name: str) -> None:
    export_dir, frozen = _get(frozen_models, name)
    spec = zoo.SPECS[name]
    assert frozen.output_keys == sorted(spec.output_keys)
    assert frozen.input_keys == sorted(i.name for i in spec.inputs)
    for batch in (BATCH, OTHER_BATCH):
        feeds = example_inputs(frozen, batch, seed=batch)
        got = frozen.run_tf(feeds)
        want = _signature_outputs(export_dir, frozen, feeds)
        for out, ref in zip(frozen.outputs, want, strict=True):
            assert got[out].shape == ref.shape and got[out].shape[0] == batch
            _assert_close(got[out], ref)


def test_io_config_form(frozen_models: dict) -> None:
    _, frozen = _get(frozen_models, "bert_encoder")
    assert frozen.io_config() == {
        "inputs": {
            "input_ids:0": [[BATCH, zoo.BERT_SEQ_LEN], "int32"],
            "segment_ids:0": [[BATCH, zoo.BERT_SEQ_LEN], "int32"],
        },
        "outputs": ["Identity:0", "Identity_1:0"],
    }
    assert frozen.output_keys == ["pooled_output", "sequence_output"]


def test_tf_function_agrees_with_run_tf(frozen_models: dict) -> None:
    _, frozen = _get(frozen_models, "bert_encoder")
    feeds = example_inputs(frozen, BATCH, seed=1)
    got = frozen.tf_function()(*[tf.constant(feeds[n]) for n in frozen.inputs])
    want = frozen.run_tf(feeds)
    for out, tensor in zip(frozen.outputs, got, strict=True):
        _assert_close(tensor.numpy(), want[out])


def test_example_inputs_respect_vocab(frozen_models: dict) -> None:
    _, frozen = _get(frozen_models, "bert_encoder")
    feeds = example_inputs(frozen, 8, seed=0)
    assert feeds["input_ids:0"].dtype == np.int32 and feeds["input_ids:0"].shape == (8, 32)
    assert 0 <= feeds["input_ids:0"].min() and feeds["input_ids:0"].max() < zoo.BERT_VOCAB
    assert feeds["input_ids:0"].max() >= 2  # really drawn from the vocabulary
    assert set(np.unique(feeds["segment_ids:0"])) <= {0, 1}
    again = example_inputs(frozen, 8, seed=0)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)


def test_builds_are_deterministic(tmp_path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    zoo.build_mlp(a)
    zoo.build_mlp(b)
    fa, fb = freeze_saved_model(a, 1), freeze_saved_model(b, 1)
    assert fa.graph_def == fb.graph_def


def test_dynamic_batch_freeze(frozen_models: dict) -> None:
    export_dir, _ = _get(frozen_models, "small_cnn")
    frozen = freeze_saved_model(export_dir, None)
    assert frozen.inputs == {"x:0": ([-1, 32, 32, 3], "float32")}
    feeds = example_inputs(frozen, 5)
    out = frozen.run_tf(feeds)[frozen.outputs[0]]
    _assert_close(out, _signature_outputs(export_dir, frozen, feeds)[0])


def test_cached_frozen_graph_round_trip(tmp_path, frozen_models: dict) -> None:
    root = str(tmp_path)
    first = cache.cached_frozen_graph("mlp", 4, root=root)
    entries = sorted(os.listdir(root))
    second = cache.cached_frozen_graph("mlp", 4, root=root)
    assert sorted(os.listdir(root)) == entries  # nothing rebuilt, no temp dirs left
    assert not [e for e in entries if ".tmp-" in e]
    assert first.graph_def == second.graph_def and first.inputs == second.inputs
    frozen_dir = next(e for e in entries if "-frozen-b4" in e and not e.endswith(".lock"))
    assert os.path.exists(os.path.join(root, frozen_dir, "io_config.json"))
    feeds = example_inputs(first, 4)
    np.testing.assert_array_equal(
        first.run_tf(feeds)[first.outputs[0]], second.run_tf(feeds)[second.outputs[0]]
    )


def test_atomic_build_runs_once_under_contention(tmp_path) -> None:
    root = str(tmp_path)
    final = os.path.join(root, "entry")
    calls: list[int] = []

    def build(target: str) -> None:
        calls.append(1)
        os.makedirs(target)
        time.sleep(0.2)  # long enough for the other threads to pile up on the lock
        with open(os.path.join(target, "done"), "w") as f:
            f.write("ok")

    results: list[str] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(cache._build_atomically(final, "done", build, root))
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [final] * 4
    assert len(calls) == 1
    assert sorted(os.listdir(root)) == ["entry", "entry.lock"]


def test_failed_build_leaves_no_entry(tmp_path) -> None:
    root = str(tmp_path)
    final = os.path.join(root, "entry")

    def build(target: str) -> None:
        os.makedirs(target)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        cache._build_atomically(final, "done", build, root)
    assert sorted(os.listdir(root)) == ["entry.lock"]
