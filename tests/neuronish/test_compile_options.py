"""Every argument of `neuronish.saved_model.compile` (and its `neuronish compile` flag) has
the effect it promises, mistakes in them are reported, and models with functional control
flow compile with the loop left on TensorFlow."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import neuronish.saved_model
from neuronish.errors import CompileWarning, SavedModelError, SubgraphCompileError
from neuronish.runtime.executable import from_bytes
from tests.neuronish.test_compile_recovery import small_model
from tests.neuronish.test_saved_model_compile import assert_matches_original

NEURONISH = str(Path(sys.executable).parent / "neuronish")


def neuron_op_executables(model_dir: Path) -> list[bytes]:
    """The `executable` attribute of every NeuronOp in a compiled SavedModel."""
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((model_dir / "saved_model.pb").read_bytes())
    graph = saved.meta_graphs[0].graph_def
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return [n.attr["executable"].s for n in nodes if n.op == "NeuronOp"]


def two_signature_model(path: Path) -> str:
    """Signatures 'double' (x * 2 then relu) and 'square' (x * x then tanh), no default."""
    module = tf.Module()
    spec = tf.TensorSpec([None, 4], tf.float32, name="x")

    @tf.function(input_signature=[spec])
    def double(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.nn.relu(x * 2.0 + 1.0)}

    @tf.function(input_signature=[spec])
    def square(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": tf.tanh(x * x - 0.5)}

    tf.saved_model.save(module, str(path), signatures={"double": double, "square": square})
    return str(path)


def test_fuse_selectors_and_segment_size(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")  # MatMul -> Relu -> MatMul
    report = neuronish.saved_model.compile(src, str(tmp_path / "a"), no_fuse_ops=["Relu"])
    assert "listed in no_fuse_ops" in report["OnTensorFlow"]["Relu"]["reasons"]
    # With Relu on TensorFlow each MatMul is a cluster of one: too small by default...
    assert report["NeuronOps"] == []
    # ...unless forced, by op type.
    report = neuronish.saved_model.compile(src, str(tmp_path / "b"), no_fuse_ops=["Relu"],
                                           force_fuse_ops=["MatMul"])
    assert len(report["NeuronOps"]) == 2
    assert all(op["op_counts"] == {"MatMul": 1} for op in report["NeuronOps"])
    assert_matches_original(src, tmp_path / "b", tmp_path)
    report = neuronish.saved_model.compile(src, str(tmp_path / "c"), minimum_segment_size=4)
    assert report["NeuronOps"] == [] and report["OnNeuronRatio"] == 0.0


def test_a_fuse_selector_that_names_nothing_is_warned_and_reported(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    with pytest.warns(CompileWarning, match=r"\['Reluu'\].*ignored"):
        report = neuronish.saved_model.compile(src, str(tmp_path / "out"), no_fuse_ops=["Reluu"])
    assert report["ignored_fuse_selectors"] == ["Reluu"]
    assert report["OnNeuronRatio"] == 1.0


def test_report_describes_each_neuron_op(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), batch_size=3)
    (op,) = report["NeuronOps"]
    assert op["op_counts"] == {"MatMul": 2, "Relu": 1} and op["ops"] == 3
    assert list(op["inputs"].values()) == [[[3, 8], "float32"]]
    assert list(op["outputs"].values()) == [[[3, 4], "float32"]]
    assert op["outcome"] == "compiled" and op["compile_seconds"] > 0 and op["dynamic_batch"]
    (exe,) = neuron_op_executables(out)
    assert op["executable_bytes"] == len(exe)
    assert report["operations"] == report["operations_on_neuron"] == 3  # Identity not counted
    assert report["compile_failures"] == [] and report["ignored_fuse_selectors"] == []


def test_compiler_args_reach_the_compiler(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    out = tmp_path / "out"
    neuronish.saved_model.compile(src, str(out), batch_size=2,
                                  compiler_args=["--auto-cast", "all", "--auto-cast-type", "fp16"])
    (exe,) = neuron_op_executables(out)
    options = from_bytes(exe).compiler["options"]
    assert options["auto_cast"] == "all" and options["auto_cast_type"] == "fp16"


def test_a_compiler_flag_it_refuses_is_an_error_even_with_recovery(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    out = tmp_path / "out"
    with pytest.raises(SubgraphCompileError, match=r"bad_usage[\s\S]*--no-such-flag"):
        neuronish.saved_model.compile(src, str(out), compiler_args=["--no-such-flag"])
    assert not out.exists()


def test_fixed_batch_size_compiles_without_batch_splitting(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), batch_size=2, dynamic_batch_size=False)
    (op,) = report["NeuronOps"]
    assert not op["dynamic_batch"]
    fn = tf.saved_model.load(str(out)).signatures["serving_default"]
    ref = tf.saved_model.load(src).signatures["serving_default"]
    x = tf.constant(np.random.default_rng(0).standard_normal((2, 8)), tf.float32)
    np.testing.assert_allclose(fn(x=x)["y"], ref(x=x)["y"], rtol=1e-5, atol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"has shape \[3,8\]; expected"):
        fn(x=tf.zeros((3, 8)))


def test_signature_def_key_and_tags(tmp_path: Path) -> None:
    src = two_signature_model(tmp_path / "src")
    with pytest.raises(SavedModelError, match=r"no signature 'cube'.*'double', 'square'"):
        neuronish.saved_model.compile(src, str(tmp_path / "a"), signature_def_key="cube")
    with pytest.raises(SavedModelError, match=r"no MetaGraph tagged \['train'\].*\['serve'\]"):
        neuronish.saved_model.compile(src, str(tmp_path / "a"), tags=["train"])
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), signature_def_key="square",
                                           tags=["serve"])
    assert report["signature_def_key"] == "square"
    fn = tf.saved_model.load(str(out)).signatures["square"]
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(fn(x=tf.constant(x))["y"], np.tanh(x * x - 0.5), rtol=1e-5,
                               atol=1e-6)
    assert not (tmp_path / "a").exists()


def test_new_model_dir_inside_model_dir_is_refused(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    for name in ("compiled", "..compiled"):  # the second only looks like a way out
        with pytest.raises(SavedModelError, match="inside model_dir"):
            neuronish.saved_model.compile(src, str(Path(src) / name))
        assert not (Path(src) / name).exists()
    # A sibling whose name starts like model_dir's is outside it.
    report = neuronish.saved_model.compile(src, src + "-compiled")
    assert report["NeuronOps"]


def test_max_num_compilers_one_compiles_every_subgraph(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src", split=True)  # an op off the device splits it in two
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), batch_size=2, max_num_compilers=1,
                                           minimum_segment_size=1)
    assert [op["outcome"] for op in report["NeuronOps"]] == ["compiled", "compiled"]
    assert_matches_original(src, out, tmp_path)


def while_loop_model(path: Path, grow: bool = False) -> str:
    """Dense -> a tf.while_loop of three matmuls -> Dense, as a TF2 signature. With
    `grow`, each iteration also appends a row, so the loop changes the batch dim. The
    trip count is an input (`steps` + 2), so the loop cannot be unrolled: it stays on
    TensorFlow."""
    module = tf.Module()
    rng = np.random.default_rng(3)
    module.w = tf.Variable(rng.standard_normal((6, 6)).astype(np.float32) * 0.4)
    module.v = tf.Variable(rng.standard_normal((6, 3)).astype(np.float32))

    def body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        h = tf.tanh(tf.matmul(h, module.w))
        return i + 1, tf.concat([h, h[:1]], axis=0) if grow else h

    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32, name="x"),
                                  tf.TensorSpec([], tf.int32, name="steps")])
    def serve(x: tf.Tensor, steps: tf.Tensor) -> dict[str, tf.Tensor]:
        h = tf.nn.relu(tf.matmul(x, module.w)) + 1.0
        _, h = tf.while_loop(lambda i, h: i < steps + 2, body, [tf.constant(0), h],
                             shape_invariants=[tf.TensorShape([]), tf.TensorShape([None, 6])])
        return {"y": tf.reduce_sum(tf.matmul(h, module.v) * 2.0, axis=0, keepdims=True)
                if grow else tf.matmul(h, module.v) * 2.0}

    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return str(path)


def test_while_loop_stays_on_tensorflow_and_the_rest_compiles(tmp_path: Path) -> None:
    src = while_loop_model(tmp_path / "src")
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)  # nothing failed to compile
        report = neuronish.saved_model.compile(src, str(out), batch_size=2)
    assert "While" in report["OnTensorFlow"]
    # The loop keeps its inputs' shapes, so the ops after it compile too, batched.
    before, after = report["NeuronOps"]
    assert before["op_counts"]["MatMul"] == 1 and before["op_counts"]["Relu"] == 1
    assert after["op_counts"] == {"MatMul": 1, "Mul": 1} and after["dynamic_batch"]
    assert_matches_original(src, out, tmp_path)


def test_a_loop_that_changes_a_shape_keeps_what_follows_on_tensorflow(tmp_path: Path) -> None:
    src = while_loop_model(tmp_path / "src", grow=True)
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), batch_size=2)
    (before,) = report["NeuronOps"]
    assert before["op_counts"]["MatMul"] == 1 and before["op_counts"]["Relu"] == 1
    assert "shape not fully known" in str(report["OnTensorFlow"]["MatMul"]["reasons"])
    assert_matches_original(src, out, tmp_path)


def test_what_follows_a_conditional_compiles_batched(tmp_path: Path) -> None:
    """A tf.cond on a request's flag stays on TensorFlow; both branches return [b, 4], so
    the ops after it have known shapes and compile, with a dynamic batch."""
    module = tf.Module()
    rng = np.random.default_rng(6)
    module.a = tf.Variable(rng.standard_normal((5, 4)).astype(np.float32))
    module.b = tf.Variable(rng.standard_normal((5, 4)).astype(np.float32))
    module.c = tf.Variable(rng.standard_normal((4, 3)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.float32, name="x"),
                                  tf.TensorSpec([], tf.bool, name="flag")])
    def serve(x: tf.Tensor, flag: tf.Tensor) -> dict[str, tf.Tensor]:
        h = tf.cond(flag, lambda: tf.matmul(x, module.a), lambda: tf.matmul(x, module.b))
        return {"y": tf.nn.softmax(tf.matmul(tf.nn.relu(h), module.c))}

    src = tmp_path / "src"
    tf.saved_model.save(module, str(src), signatures={"serving_default": serve})
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(str(src), str(out), batch_size=2)
    assert "If" in report["OnTensorFlow"] or "StatelessIf" in report["OnTensorFlow"]
    (after,) = report["NeuronOps"]
    assert after["op_counts"]["MatMul"] == 1 and after["dynamic_batch"], after
    assert_matches_original(str(src), out, tmp_path)


def test_keras_lstm_compiles_whole_its_loop_unrolled(tmp_path: Path) -> None:
    # Keras's LSTM is a While over TensorLists: before functional control flow was
    # kept, freezing turned it into a cycle and the whole model failed to compile; its
    # trip count is the (static) sequence length, so it is unrolled onto the device.
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((10, 8)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.LSTM(12), keras.layers.Dense(4, activation="softmax")])
    src = str(tmp_path / "src")
    model.export(src)
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), batch_size=2)
    assert "While" not in report["OnTensorFlow"] and report["OnNeuronRatio"] > 0.9, report
    assert sum(op["op_counts"].get("MatMul", 0) for op in report["NeuronOps"]) > 10
    assert_matches_original(src, out, tmp_path)


def _jpeg(rng: np.random.Generator, height: int, width: int) -> bytes:
    return tf.io.encode_jpeg(rng.integers(0, 255, (height, width, 3), np.uint8)).numpy()


def image_bytes_model(path: Path) -> str:
    """The usual serving signature for images: JPEG bytes, decoded and resized with
    tf.map_fn (a loop over TensorLists), then the network."""
    keras.utils.set_random_seed(3)
    network = keras.Sequential([keras.Input((16, 16, 3)),
                                keras.layers.Conv2D(8, 3, activation="relu"),
                                keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
    module = tf.Module()
    module.network = network

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    def serve(image_bytes: tf.Tensor) -> dict[str, tf.Tensor]:
        def decode(jpeg: tf.Tensor) -> tf.Tensor:
            image = tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), [16, 16])
            return image / 127.5 - 1.0

        images = tf.map_fn(decode, image_bytes, fn_output_signature=tf.float32)
        return {"logits": network(images)}

    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return str(path)


def test_a_map_fn_decoding_images_leaves_the_network_whole_and_batched(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    src = image_bytes_model(tmp_path / "src")
    out = tmp_path / "out"
    example = np.array([_jpeg(rng, 20, 24)], dtype=object)  # (a string example is fine)
    report = neuronish.saved_model.compile(src, str(out), batch_size=1,
                                           model_feed_dict={"image_bytes": example})
    (op,) = report["NeuronOps"]
    assert op["dynamic_batch"] and op["op_counts"]["Conv2D"] == 1
    assert op["op_counts"]["MatMul"] == 1
    # Only the decoding loop's machinery stays on TensorFlow.
    assert set(report["OnTensorFlow"]) <= {"Shape", "StridedSlice", "StatelessWhile", "While",
                                           "TensorListFromTensor", "TensorListReserve",
                                           "TensorListStack"}, report["OnTensorFlow"]
    want = tf.saved_model.load(src).signatures["serving_default"]
    got = tf.saved_model.load(str(out)).signatures["serving_default"]
    # verify=True needs a real example of bytes: random ones are not JPEG.
    with pytest.raises(SavedModelError, match="'image_bytes' is string.*model_feed_dict"):
        neuronish.saved_model.compile(src, str(tmp_path / "verified"), verify=True)
    assert not (tmp_path / "verified").exists()
    for batch in (1, 3):  # the compiled batch and another
        images = tf.constant([_jpeg(rng, 18 + i, 30 - i) for i in range(batch)])
        np.testing.assert_allclose(got(image_bytes=images)["logits"].numpy(),
                                   want(image_bytes=images)["logits"].numpy(),
                                   rtol=1e-4, atol=1e-5)


def test_a_growing_tensor_array_is_not_given_its_reserved_length(tmp_path: Path) -> None:
    """A TensorArray with dynamic_size grows past the length it was reserved with: its
    stacked shape is unknown, and what reads it must not be compiled for a wrong one."""
    module = tf.Module()
    module.w = tf.Variable(np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        n = tf.shape(x)[0]
        rows = tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[4])
        for i in tf.range(2 * n):
            rows = rows.write(i, x[i % n] * tf.cast(i, tf.float32))
        hidden = tf.nn.relu(tf.matmul(rows.stack(), module.w) + 1.0)
        return {"y": tf.matmul(hidden, module.w, transpose_b=True) * 2.0}

    src = tmp_path / "src"
    tf.saved_model.save(module, str(src), signatures={"serving_default": serve})
    out = tmp_path / "out"
    neuronish.saved_model.compile(str(src), str(out), batch_size=2)
    want = tf.saved_model.load(str(src)).signatures["serving_default"]
    got = tf.saved_model.load(str(out)).signatures["serving_default"]
    for batch in (2, 3):
        x = tf.constant(np.random.default_rng(batch).standard_normal((batch, 4)), tf.float32)
        np.testing.assert_allclose(got(x=x)["y"].numpy(), want(x=x)["y"].numpy(), rtol=1e-5,
                                   atol=1e-5)


def test_a_lookup_table_is_carried_over_and_what_follows_it_compiles(tmp_path: Path) -> None:
    """StringLookup's table is a resource, not a variable: freezing leaves a placeholder
    for it, which the compiled model must feed (the table kept, with its initializer),
    and the lookup's result has the keys' shape, so the embedding and the network
    behind it compile with a dynamic batch."""
    keras.utils.set_random_seed(5)
    lookup = keras.layers.StringLookup(vocabulary=["red", "green", "blue"])
    embedding = keras.layers.Embedding(4, 6)
    network = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                keras.layers.Dense(1, activation="sigmoid")])
    module = tf.Module()
    module.layers = [lookup, embedding, network]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="colour"),
                                  tf.TensorSpec([None, 2], tf.float32, name="size")])
    def serve(colour: tf.Tensor, size: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"p": network(tf.concat([embedding(lookup(colour)), size], axis=1))}

    src = tmp_path / "src"
    tf.saved_model.save(module, str(src), signatures={"serving_default": serve})
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(str(src), str(out), batch_size=1)
    assert list(report["OnTensorFlow"]) == ["LookupTableFindV2"], report["OnTensorFlow"]
    (op,) = report["NeuronOps"]
    assert op["dynamic_batch"] and op["op_counts"]["MatMul"] == 2
    want = tf.saved_model.load(str(src)).signatures["serving_default"]
    got = tf.saved_model.load(str(out)).signatures["serving_default"]
    rng = np.random.default_rng(0)
    for colours in (["green"], ["blue", "purple", "red"]):  # "purple": out of vocabulary
        feeds = {"colour": tf.constant(colours),
                 "size": tf.constant(rng.standard_normal((len(colours), 2)), tf.float32)}
        np.testing.assert_allclose(got(**feeds)["p"].numpy(), want(**feeds)["p"].numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_a_text_model_compiles_what_follows_its_tokenizer(tmp_path: Path) -> None:
    """Keras TextVectorization (split, lookup, ragged to dense) on raw strings: the
    tokenizer stays on TensorFlow, the embedding and the network behind it compile,
    batched (the row count of the split is the batch)."""
    keras.utils.set_random_seed(2)
    vectorize = keras.layers.TextVectorization(max_tokens=40, output_sequence_length=6)
    vectorize.adapt(["the cat sat on the mat", "a dog ran home", "birds fly far away"])
    text = keras.Input((), dtype="string", name="text")
    hidden = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(40, 8)(
        vectorize(text)))
    model = keras.Model(text, keras.layers.Dense(2)(keras.layers.Dense(8, "relu")(hidden)))
    src = str(tmp_path / "src")
    model.export(src)
    out = tmp_path / "out"
    report = neuronish.saved_model.compile(src, str(out), batch_size=1)
    (op,) = report["NeuronOps"]
    assert op["dynamic_batch"] and op["op_counts"]["MatMul"] == 2, op["op_counts"]
    assert "GatherV2" in op["op_counts"] and "StringSplitV2" in report["OnTensorFlow"]
    want = tf.saved_model.load(src).signatures["serving_default"]
    got = tf.saved_model.load(str(out)).signatures["serving_default"]
    for texts in (["the dog sat"], ["a cat", "unknown words only", "far far away home"]):
        feeds = {"text": tf.constant(texts)}
        (key,) = want(**feeds)
        np.testing.assert_allclose(got(**feeds)[key].numpy(), want(**feeds)[key].numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_a_random_augmentation_layer_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    """Keras' RandomFlip flips at serving time too, by a seed variable it advances on
    every call: frozen, it would flip the same way forever."""
    image = keras.Input((8, 8, 3), name="image")
    flipped = keras.layers.RandomFlip()(image)
    model = keras.Model(image, keras.layers.Dense(2)(keras.layers.Flatten()(flipped)))
    model.export(str(tmp_path / "src"))
    with pytest.raises(SavedModelError, match="random_flip.*writes a variable.*without them"):
        neuronish.saved_model.compile(str(tmp_path / "src"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_tf1_graph_with_a_lookup_table_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    graph = tf.Graph()
    with graph.as_default():
        word = tf.compat.v1.placeholder(tf.string, [None], name="word")
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["x", "y"], [1.0, 2.0]), 0.0)
        y = table.lookup(word) * 2.0
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.tables_initializer())
            tf.compat.v1.saved_model.simple_save(
                session, str(tmp_path / "src"), {"word": word}, {"y": y},
                legacy_init_op=tf.compat.v1.tables_initializer())
    with pytest.raises(SavedModelError, match="TF1 graph with lookup tables .* Re-export"):
        neuronish.saved_model.compile(str(tmp_path / "src"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_cli_flags_map_onto_compile_arguments(tmp_path: Path) -> None:
    src = two_signature_model(tmp_path / "src")
    out = tmp_path / "out"
    r = subprocess.run([NEURONISH, "compile", src, str(out), "--signature-def-key", "double",
                        "--tags", "serve", "--input-shape", "x=5,4", "--fixed-batch-size",
                        "--minimum-segment-size", "1", "--no-fuse-ops", "Reluu",
                        "--compiler-args", "--auto-cast matmult", "--max-num-compilers", "1",
                        "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["signature_def_key"] == "double"
    assert report["ignored_fuse_selectors"] == ["Reluu"]
    assert "neuronish: warning: no_fuse_ops/force_fuse_ops entries ['Reluu']" in r.stderr
    (op,) = report["NeuronOps"]
    assert list(op["inputs"].values()) == [[[5, 4], "float32"]] and not op["dynamic_batch"]
    (exe,) = neuron_op_executables(out)
    assert from_bytes(exe).compiler["options"]["auto_cast"] == "matmult"


def test_freezing_keeps_exactly_the_functions_still_called() -> None:
    from tensorflow.core.framework import graph_pb2

    from neuronish.freeze import _keep_called_functions

    g = graph_pb2.GraphDef()
    for name in ("direct", "body", "inner", "dead"):
        g.library.function.add().signature.name = name
    g.node.add(name="call", op="direct")                 # the op is the function
    loop = g.node.add(name="loop", op="StatelessWhile")
    loop.attr["body"].func.name = "body"                 # a function-valued attr
    body = next(f for f in g.library.function if f.signature.name == "body")
    body.node_def.add(name="nested", op="PartitionedCall").attr["f"].func.name = "inner"
    _keep_called_functions(g)
    assert sorted(f.signature.name for f in g.library.function) == ["body", "direct", "inner"]
