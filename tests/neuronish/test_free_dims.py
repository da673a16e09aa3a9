"""Models whose inputs leave more than the batch free (`keras.applications.X(input_shape=
(None, None, 3))`, a keras_hub text model exported with free sequence lengths) compile in
one call with no shape arguments; every call within the bounds runs on the device, on an
executable compiled for its shape, and gives TensorFlow's numbers; a call outside them
is refused naming the input, the dimension and the bounds, or runs on TensorFlow with the
runtime fallback on. A shape given at compile fixes it, and the new SignatureDef says so."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish import fallback
from neuronish.errors import SavedModelError
from neuronish.freeze import freeze_signatures
from neuronish.runtime import get_device
from neuronish.shape_specialize import wait_for_compiles

MAX_LENGTH = 32  # the tiny BERT's position-embedding table: the bound the model implies


def _free_image_model(path: Path) -> str:
    keras.utils.set_random_seed(0)
    x = keras.Input((None, None, 3), name="image")
    y = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(x)
    y = keras.layers.BatchNormalization()(y)
    y = keras.layers.Conv2D(4, 3, activation="relu")(y)
    y = keras.layers.MaxPooling2D()(y)
    keras.Model(x, keras.layers.GlobalAveragePooling2D()(y)).export(str(path), verbose=False)
    return str(path)


def _free_text_model(path: Path) -> str:
    """A keras_hub BERT backbone (tiny) with a Dense head; its signature takes
    token_ids, segment_ids and padding_mask of shape [None, None]."""
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=50, num_layers=2, num_heads=2,
                                             hidden_dim=16, intermediate_dim=32,
                                             max_sequence_length=MAX_LENGTH)
    head = keras.layers.Dense(3)(backbone(backbone.input)["pooled_output"])
    keras.Model(backbone.input, head).export(str(path), verbose=False)
    return str(path)


def _text(batch: int, length: int, seed: int) -> dict[str, tf.Tensor]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), np.int32)
    mask[0, length // 2 + 1:] = 0  # padded positions, as a tokenizer gives them
    return {"token_ids": tf.constant(rng.integers(0, 50, (batch, length)), tf.int32),
            "segment_ids": tf.constant(rng.integers(0, 2, (batch, length)), tf.int32),
            "padding_mask": tf.constant(mask)}


def _labels(before: frozenset = frozenset()) -> list[str]:
    """Labels of the models loaded on the device now (not those in `before`)."""
    return [str(getattr(m, "label", "")) for m in get_device().loaded_models()
            if not getattr(m, "_unloaded", False) and id(m) not in before]


def _loaded() -> frozenset:
    return frozenset(id(m) for m in get_device().loaded_models())


def test_text_model_with_free_lengths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                      ) -> None:
    src, out = _free_text_model(tmp_path / "src"), tmp_path / "out"
    monkeypatch.setenv(fallback.ENV_FALLBACK, "0")  # a new shape's call waits for its compile
    report = neuronish.saved_model.compile(src, str(out))
    assert report["OnNeuronRatio"] == 1.0
    bounds = {(d["input"], d["axis"]): (d["low"], d["high"]) for d in report["free_dims"]}
    assert bounds == {(k, 1): (1, MAX_LENGTH) for k in ("padding_mask", "segment_ids",
                                                       "token_ids")}
    assert "position_embedding" in report["free_dims"][0]["bound_from"]
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(str(out)).signatures["serving_default"]
    counts = fallback.fallback_counts()
    for batch, length in ((1, 7), (3, 16), (2, MAX_LENGTH), (1, 1), (5, 7)):
        feeds = _text(batch, length, seed=length)
        got, want = compiled(**feeds)["output_0"], original(**feeds)["output_0"]
        assert got.shape == (batch, 3)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert fallback.fallback_counts() == counts  # every call on the device
    # one executable per length, at the call's batch (a power of two: 3 -> 4), labelled
    # (as `neuronish ls` shows it) with the shape it runs
    loaded = [label for label in _labels() if label.startswith("neuron_op_0@")]
    assert {"neuron_op_0@1x7;1x7;1x7", "neuron_op_0@4x16;4x16;4x16"} <= set(loaded), loaded

    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(
            f"has size {MAX_LENGTH + 1} in dimension 1; the model accepts 1 to {MAX_LENGTH} "
            "there (bound from the model: ")) as e:
        compiled(**_text(1, MAX_LENGTH + 1, seed=0))
    assert re.search(r"input '(padding_mask|segment_ids|token_ids)'", str(e.value))


def test_image_model_with_free_sides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _free_image_model(tmp_path / "src")
    report = neuronish.saved_model.compile(src, str(tmp_path / "out"), batch_size=2)
    (op,) = report["NeuronOps"]
    assert report["OnNeuronRatio"] == 1.0 and op["dynamic_batch"]
    sides = {d["axis"]: (d["low"], d["high"]) for d in report["free_dims"]}
    # the smallest side the convolutions accept (3x3 valid, then a 2x2 pool, after a
    # stride-2 conv: 5 -> 3 -> 1 -> 0 fails, 6 -> 3 ... so shape inference says 5)
    assert sides[1][1] == sides[2][1] == 1024 and 2 <= sides[1][0] <= 10
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    rng = np.random.default_rng(0)
    monkeypatch.setenv("NEURONISH_MAX_SHAPES", "2")
    monkeypatch.setenv(fallback.ENV_FALLBACK, "0")
    before = _loaded()
    for batch, h, w in ((1, 16, 16), (3, 33, 20), (2, 64, 64), (1, 97, 41)):
        x = tf.constant(rng.standard_normal((batch, h, w, 3)), tf.float32)
        np.testing.assert_allclose(compiled(image=x)["output_0"], original(image=x)["output_0"],
                                   rtol=1e-5, atol=1e-5)
    held = [label for label in _labels(before) if "@" in label]
    assert len(held) <= 2, held  # the least recently used shapes were unloaded

    # Bounds given: a call outside them names the input, the dimension and the bounds,
    # or, with the runtime fallback on, runs on TensorFlow and is counted.
    out = tmp_path / "bounded"
    report = neuronish.saved_model.compile(src, str(out), shape_bounds={
        "image": {1: (8, 40), 2: (8, 40)}})
    assert {(d["axis"], d["low"], d["high"]) for d in report["free_dims"]} == {
        (1, 8, 40), (2, 8, 40)}
    # `neuronish-cc inspect` (no TensorFlow) shows the same bounds from the op's attr.
    inspect = [str(Path(sys.executable).parent / "neuronish-cc"), "inspect", str(out)]
    shown = subprocess.run([*inspect, "--json"], check=True, capture_output=True, text=True)
    (info,) = json.loads(shown.stdout)
    assert {(d["axis"], d["low"], d["high"]) for d in info["free_dimensions"]} == {
        (1, 8, 40), (2, 8, 40)}
    text = subprocess.run(inspect, check=True, capture_output=True, text=True).stdout
    assert "free dimensions (compiled per size on first use):" in text and "8..40" in text
    compiled = tf.saved_model.load(str(out)).signatures["serving_default"]
    x = tf.constant(rng.standard_normal((2, 48, 24, 3)), tf.float32)
    monkeypatch.setenv(fallback.ENV_FALLBACK, "0")
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(
            "input 'image' has size 48 in dimension 1; the model accepts 8 to 40 there "
            "(bound from given (shape_bounds))")):
        compiled(image=x)
    monkeypatch.setenv(fallback.ENV_FALLBACK, "1")
    counts = fallback.fallback_counts()
    with warnings.catch_warnings():  # (warned once per op name in a process: maybe earlier)
        warnings.simplefilter("ignore", fallback.FallbackWarning)
        got = compiled(image=x)["output_0"]
    np.testing.assert_allclose(got, original(image=x)["output_0"], rtol=1e-5, atol=1e-5)
    assert sum(c["calls"] for c in fallback.fallback_counts().values()) > sum(
        c["calls"] for c in counts.values())

    with pytest.raises(SavedModelError, match=re.escape(
            "shape_bounds names 'image' dimension 3, which is not a free dimension")):
        neuronish.saved_model.compile(src, str(tmp_path / "bad"), shape_bounds={
            "image": {3: (1, 2)}})


def test_an_op_fed_by_tensorflow_gets_its_bounds_from_the_signatures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node kept on TensorFlow between two NeuronOps: the second op's input is an inner
    tensor, whose free sizes are the first conv's outputs (half the image's, bounded
    accordingly), and both ops compile per shape."""
    monkeypatch.setenv(fallback.ENV_FALLBACK, "0")  # every call on the device
    src = _free_image_model(tmp_path / "src")
    relu = next(n.name for n in freeze_signatures(src).frozen[0].graph_def.node
                if n.op == "Relu")
    report = neuronish.saved_model.compile(src, str(tmp_path / "out"), no_fuse_ops=[relu],
                                           shape_bounds={"image": {1: (8, 64), 2: (8, 64)}})
    first, second = report["NeuronOps"]
    assert {(d["axis"], d["low"], d["high"]) for d in first["free_dims"]} == {
        (1, 8, 64), (2, 8, 64)}
    assert {(d["axis"], d["low"], d["high"]) for d in second["free_dims"]} == {
        (1, 4, 32), (2, 4, 32)}  # after the stride-2 convolution
    assert second["free_dims"][0]["input"].startswith(f"tensor '{relu}:0'")
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for batch, h, w in ((2, 33, 21), (1, 64, 9)):
        x = tf.constant(np.random.default_rng(h).standard_normal((batch, h, w, 3)), tf.float32)
        np.testing.assert_allclose(compiled(image=x)["output_0"], original(image=x)["output_0"],
                                   rtol=1e-5, atol=1e-5)


def test_calls_at_new_shapes_from_several_threads(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads calling at shapes not yet compiled: each shape is compiled once at each
    batch (the others wait for it, or run on the same shape at another batch meanwhile)
    and every call gives TensorFlow's numbers."""
    from concurrent.futures import ThreadPoolExecutor

    from neuronish.shape_specialize import live_tables, wait_for_compiles

    monkeypatch.setenv(fallback.ENV_FALLBACK, "0")
    counts = fallback.fallback_counts()
    src = _free_image_model(tmp_path / "src")
    neuronish.saved_model.compile(src, str(tmp_path / "out"))
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    shapes = [(1 + i % 3, 20 + 4 * (i % 2), 28) for i in range(8)]
    images = [tf.constant(np.random.default_rng(i).standard_normal(s), tf.float32)
              for i, s in enumerate((*s, 3) for s in shapes)]
    before, tables = _loaded(), set(live_tables())
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda x: compiled(image=x)["output_0"].numpy(), images))
    for x, g in zip(images, got, strict=True):
        np.testing.assert_allclose(g, original(image=x)["output_0"], rtol=1e-5, atol=1e-5)
    assert wait_for_compiles(300)
    (table,) = set(live_tables()) - tables
    # each (batch, shape) compiled once (batches 1, 2 and 3 -> 1, 2 and 4), none twice
    want = sorted(f"neuron_op_0@{b}x{h}x28x3" for b in (1, 2, 4) for h in (20, 24))
    assert sorted(table.compiled) == want, table.compiled
    held = sorted(label for label in _labels(before) if "@" in label)
    assert held == sorted([*want, "neuron_op_0@1x64x64x3"]), held  # and the probe's
    assert fallback.fallback_counts() == counts


def test_sizes_compiled_ahead_are_found_in_the_compile_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("NEURONISH_COMPILE_CACHE", str(cache))
    src, out = _free_image_model(tmp_path / "src"), tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), shape_buckets={
        "image": {1: [24, 40], 2: [24]}})
    assert report["shapes_compiled_ahead"] == [
        "'image' dimension 1=24, 'image' dimension 2=24",
        "'image' dimension 1=40, 'image' dimension 2=24"]
    entries = set(cache.glob("*.neff"))
    assert len(entries) == 3  # the probe's and the two buckets'
    compiled = tf.saved_model.load(str(out)).signatures["serving_default"]
    monkeypatch.setenv(fallback.ENV_FALLBACK, "0")  # each call waits for its executable
    compiled(image=tf.zeros((1, 40, 24, 3)))  # a bucket: loaded from the SavedModel
    assert set(cache.glob("*.neff")) == entries
    # The same size at batch 3 runs at once on the batch-1 executable (three programs)
    # while it compiles at batch 4 in the background (one, for later calls).
    compiled(image=tf.zeros((3, 40, 24, 3)))
    assert wait_for_compiles(300)
    assert len(set(cache.glob("*.neff")) - entries) == 1
    compiled(image=tf.zeros((1, 40, 25, 3)))  # a new shape: compiled, and cached
    assert len(set(cache.glob("*.neff")) - entries) == 2
    with pytest.raises(SavedModelError, match="outside its bounds"):
        neuronish.saved_model.compile(src, str(tmp_path / "bad"), shape_buckets={
            "image": {1: [2000]}})
    from neuronish.cli import parse_shape_buckets

    assert parse_shape_buckets(["token_ids:1=16,64"]) == {"token_ids": {1: [16, 64]}}


def test_sizes_compiled_ahead_are_stored_in_the_savedmodel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a compile cache and without a compiler (a serving container), a size given
    in shape_buckets runs on the device from the executable stored in the SavedModel's
    assets, wherever the model is moved; a damaged one fails its own size, by name."""
    from neuronish.shape_specialize import live_tables

    monkeypatch.setenv("NEURONISH_COMPILE_CACHE", "off")
    src, out = _free_image_model(tmp_path / "src"), tmp_path / "out"
    neuronish.saved_model.compile(src, str(out), shape_buckets={"image": {1: [24, 40],
                                                                         2: [24]}})
    stored = sorted((out / "assets").glob("*.neff"))
    assert len(stored) == 2, stored
    moved = tmp_path / "moved"
    out.rename(moved)
    monkeypatch.setenv("NEURONISH_CC", str(tmp_path / "no-compiler-here"))
    monkeypatch.setenv(fallback.ENV_FALLBACK, "0")
    counts = fallback.fallback_counts()
    original = tf.saved_model.load(src).signatures["serving_default"]
    tables = set(live_tables())
    compiled = tf.saved_model.load(str(moved)).signatures["serving_default"]
    for batch, h in ((1, 24), (1, 40), (3, 40)):  # (batch 3: on the batch-1 executable)
        x = tf.constant(np.random.default_rng(h).standard_normal((batch, h, 24, 3)),
                        tf.float32)
        np.testing.assert_allclose(compiled(image=x)["output_0"], original(image=x)["output_0"],
                                   rtol=1e-5, atol=1e-5)
    assert fallback.fallback_counts() == counts
    assert wait_for_compiles(60)  # (batch 3 asked for its own executable: no compiler)
    (table,) = set(live_tables()) - tables
    assert table.loaded_stored == ["neuron_op_0@1x24x24x3", "neuron_op_0@1x40x24x3"]
    assert table.compiled == []
    del compiled, table
    # One stored executable damaged (same size): its size fails naming the file.
    path = moved / "assets" / stored[0].name
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    compiled = tf.saved_model.load(str(moved)).signatures["serving_default"]
    outcomes = {}
    for h in (24, 40):
        try:
            compiled(image=tf.zeros((1, h, 24, 3)))
            outcomes[h] = ""
        except tf.errors.OpError as e:
            outcomes[h] = e.message
    (bad,) = [h for h, why in outcomes.items() if why]
    assert f"loading its stored shape neuron_op_0@1x{bad}x24x3 failed" in outcomes[bad], outcomes
    assert f"{path} does not hash to the executable the op was compiled with" in outcomes[bad], \
        outcomes


def test_given_a_size_it_compiles_and_refuses_others_by_name(tmp_path: Path) -> None:
    src = _free_image_model(tmp_path / "src")
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), model_shape_feed_dict={
        "image": [1, 16, 16, 3]})
    assert report["OnNeuronRatio"] == 1.0 and "free_dims" not in report
    assert all(op["dynamic_batch"] for op in report["NeuronOps"])
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(str(out)).signatures["serving_default"]
    # the new SignatureDef (what a model server's metadata shows) says what is accepted
    (spec,) = compiled.structured_input_signature[1].values()
    assert spec.shape.as_list() == [None, 16, 16, 3]
    for batch in (1, 3):
        x = tf.constant(np.random.default_rng(batch).standard_normal((batch, 16, 16, 3)),
                        tf.float32)
        np.testing.assert_allclose(compiled(image=x)["output_0"],
                                   original(image=x)["output_0"], rtol=1e-5, atol=1e-6)
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError)):
        compiled(image=tf.zeros((1, 20, 20, 3)))


def test_the_batch_may_be_given_as_free_in_a_shape(tmp_path: Path) -> None:
    """[None, 16, 16, 3] or [-1, ...] (how TensorFlow writes a free batch) compiles at
    batch_size; a shape that is no list of integers is an error naming the input."""
    src = _free_image_model(tmp_path / "src")
    for i, batch in enumerate((None, -1)):
        report = neuronish.saved_model.compile(src, str(tmp_path / f"out{i}"), batch_size=2,
                                               model_shape_feed_dict={"image": [batch, 16, 16, 3]})
        (op,) = report["NeuronOps"]
        assert list(op["inputs"].values()) == [[[2, 16, 16, 3], "float32"]]
    with pytest.raises(SavedModelError, match=r"model_shape_feed_dict\['image'\] is 'big'"):
        neuronish.saved_model.compile(src, str(tmp_path / "a"),
                                      model_shape_feed_dict={"image": "big"})
    from neuronish.cli import _parse_shapes, parse_shape_bounds

    assert _parse_shapes(["image=?,16,16,3", "mask=-1,8"]) == {"image": [-1, 16, 16, 3],
                                                              "mask": [-1, 8]}
    assert parse_shape_bounds(["token_ids:1=1:512", "image:2=8:64"]) == {
        "token_ids": {1: (1, 512)}, "image": {2: (8, 64)}}
    with pytest.raises(SystemExit, match="expected KEY:AXIS=LOW:HIGH"):
        parse_shape_bounds(["token_ids=1:512"])


def test_benchmark_inputs_take_a_shape_for_free_dims() -> None:
    from neuronish.benchmark import BenchmarkError, make_inputs, parse_input_shapes

    specs = {"token_ids": tf.TensorSpec([None, None], tf.int32)}
    with pytest.raises(BenchmarkError, match=re.escape(
            "dimension 1 is free, and random inputs need a size for it: pass --input-shape "
            "token_ids=?,N")):
        make_inputs(specs, 2)
    feeds = make_inputs(specs, 2, shapes=parse_input_shapes(["token_ids=?,9"]))
    assert feeds["token_ids"].shape == (2, 9)
    with pytest.raises(BenchmarkError, match="names \\['mask'\\]"):
        make_inputs(specs, 2, shapes={"mask": [-1, 3]})


def test_a_damaged_dynamic_shapes_attr_is_refused_by_name() -> None:
    from neuronish.runtime import InvalidInput
    from neuronish.shape_specialize import DynamicSpec

    spec = DynamicSpec([{1: (1, 512, "the model")}], ["input 'token_ids'"], ["--auto-cast",
                                                                              "none"])
    assert DynamicSpec.parse(spec.to_json(), "op", 1) == spec
    for text in ("{", '{"version": 2, "inputs": []}', spec.to_json().replace("512", '"x"')):
        with pytest.raises(InvalidInput, match="NeuronOp 'op': its dynamic_shapes attr is not"):
            DynamicSpec.parse(text, "op", 1)
    with pytest.raises(InvalidInput, match="1 input\\(s\\) for an op with 2"):
        DynamicSpec.parse(spec.to_json(), "op", 2)


def test_a_new_version_accepting_other_shapes_is_told() -> None:
    """The model server logs, at a new version's load, each input whose accepted shape
    differs from the serving version's (serving/manager.py)."""
    from tensorflow.core.protobuf import meta_graph_pb2

    from neuronish.serving.signatures import accepted_shape_changes

    def defs(*dims: tuple[int, str]) -> dict[str, meta_graph_pb2.SignatureDef]:
        sd = meta_graph_pb2.SignatureDef()
        for size, name in dims:
            sd.inputs["token_ids"].tensor_shape.dim.add(size=size, name=name)
        return {"serving_default": sd}

    fixed, bounded = defs((-1, ""), (16, "")), defs((-1, ""), (-1, "1..128"))
    assert accepted_shape_changes(fixed, bounded) == [
        "serving_default/token_ids: [-1,16] -> [-1,1..128]"]
    assert accepted_shape_changes(bounded, bounded) == []
