"""Freezing a SavedModel signature: nested and XLA-marked function calls are inlined, so
the partitioner sees every op; what truly cannot be frozen is named with its cause."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import neuronish.freeze
import neuronish.saved_model
from neuronish.errors import SavedModelError
from neuronish.freeze import VARIABLE_OPS, freeze_signature
from tests.neuronish.test_saved_model_compile import assert_matches_original

_rng = np.random.default_rng(7)


class _NestedXla(tf.Module):
    """A grouped convolution inside a function compiled for XLA, called from another
    XLA function (the way Keras runs `Conv2D(groups=...)`), then a plain one."""

    def __init__(self) -> None:
        super().__init__()
        self.depthwise = tf.Variable(_rng.standard_normal((3, 3, 1, 8)).astype("float32"))
        self.grouped = tf.Variable(_rng.standard_normal((3, 3, 4, 8)).astype("float32"))
        self.scale = tf.Variable(np.float32(0.5))

    @tf.function(jit_compile=True)
    def _grouped(self, x: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv2d(x, self.grouped, 1, "SAME")

    @tf.function(jit_compile=True)
    def _block(self, x: tf.Tensor) -> tf.Tensor:
        y = tf.nn.conv2d(x, self.depthwise, 1, "SAME")  # groups = channels
        return tf.nn.relu(self._grouped(y)) * self.scale

    @tf.function(input_signature=[tf.TensorSpec([None, 6, 6, 8], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": self._block(x) + 1.0}


class _Counter(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = tf.Variable(0.0)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        self.calls.assign_add(1.0)
        return {"y": x * 2.0}


def _save(module: tf.Module, path: Path) -> str:
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return str(path)


@pytest.fixture(scope="module")
def nested_xla(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _save(_NestedXla(), tmp_path_factory.mktemp("nested") / "model")


def test_nested_xla_calls_are_inlined(nested_xla: str) -> None:
    frozen = freeze_signature(nested_xla)
    ops = [n.op for n in frozen.graph_def.node]
    assert not {"PartitionedCall", "StatefulPartitionedCall"} & set(ops), ops
    assert ops.count("Conv2D") == 2, ops
    # The frozen graph computes what the SavedModel does.
    x = _rng.standard_normal((2, 6, 6, 8)).astype("float32")
    want = tf.saved_model.load(nested_xla).signatures["serving_default"](x=x)["y"].numpy()
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(frozen.graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        got = session.run(frozen.outputs["y"], {frozen.inputs[0].tensor: x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_nested_xla_model_compiles_whole_and_matches(nested_xla: str, tmp_path: Path) -> None:
    out = tmp_path / "compiled"
    report = neuronish.saved_model.compile(nested_xla, str(out), batch_size=2)
    assert report["OnNeuronRatio"] == 1.0, report["OnTensorFlow"]
    assert len(report["NeuronOps"]) == 1 and report["NeuronOps"][0]["dynamic_batch"]
    assert_matches_original(nested_xla, out, tmp_path)


def test_freezing_twice_gives_the_same_bytes(nested_xla: str) -> None:
    # Compile cache keys and golden files depend on it.
    first = freeze_signature(nested_xla).graph_def.SerializeToString(deterministic=True)
    assert freeze_signature(nested_xla).graph_def.SerializeToString(deterministic=True) == first


class _DeadShape(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        tf.reduce_prod(tf.shape(x)[1:])  # computed, read by nothing (as Keras leaves some)
        return {"y": x * 2.0}


def test_nodes_no_output_needs_are_dropped(tmp_path: Path) -> None:
    frozen = freeze_signature(_save(_DeadShape(), tmp_path / "dead"))
    ops = sorted(n.op for n in frozen.graph_def.node)
    assert "Shape" not in ops and "Prod" not in ops and "Placeholder" in ops, ops


class _CountingOutput(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = tf.Variable(0.0)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        self.calls.assign_add(1.0)
        return {"y": x * self.calls}


def test_a_signature_whose_output_sees_a_variable_write_is_refused_naming_it(
        tmp_path: Path) -> None:
    model = _save(_CountingOutput(), tmp_path / "counter")
    with pytest.raises(SavedModelError) as info:
        freeze_signature(model)
    text = str(info.value)
    assert "AssignAddVariableOp" in text and "writes a variable at serving time" in text, text


def test_a_variable_write_no_output_sees_is_dropped_and_named(tmp_path: Path) -> None:
    """The output is x * 2 at every call: the counter's write changes nothing it returns."""
    frozen = freeze_signature(_save(_Counter(), tmp_path / "counter"))
    assert len(frozen.dropped_writes) == 1 and "AssignAddVariableOp" in frozen.dropped_writes[0]
    assert not {n.op for n in frozen.graph_def.node} & VARIABLE_OPS


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "int32", "int64",
                                   "uint8", "bool", "bfloat16"])
@pytest.mark.parametrize("shape", [(3, 5), (1,), (), (0, 4)])
def test_constants_without_astype_are_tensorflows_protos(dtype: str,
                                                         shape: tuple[int, ...]) -> None:
    """Freezing builds a variable's TensorProto without make_tensor_proto's first copy;
    whatever it handles itself must be exactly TensorFlow's proto, the rest TensorFlow's."""
    from tensorflow.python.framework import tensor_util

    from neuronish.freeze import _constant_proto

    values = (np.arange(int(np.prod(shape))) % 7).astype(tf.as_dtype(dtype).as_numpy_dtype)
    values = values.reshape(shape)
    handled = 0
    for as_dtype in (tf.as_dtype(dtype), tf.as_dtype(dtype).as_datatype_enum):
        proto = _constant_proto(values, as_dtype)
        if proto is not None:
            handled += 1
            assert proto == tensor_util.make_tensor_proto(values, as_dtype, values.shape)
    # the arrays TensorFlow stores whole are the ones built here
    assert handled == (2 if values.size > 1 and dtype != "bool" else 0), handled


class _Weights(tf.Module):
    """A dense layer and a loop over its weights: constants TensorFlow's converter and
    `_constant_proto` both build, and a While body whose argument types it rewrites."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = tf.Variable(rng.standard_normal((16, 16)).astype("float32"))
        self.b = tf.Variable(rng.standard_normal(16).astype("float32"))
        self.steps = tf.Variable(seed % 3 + 1)  # a scalar: TensorFlow's own proto

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        i = tf.constant(0)
        while i < self.steps:
            x = tf.tanh(tf.matmul(x, self.w) + self.b)
            i += 1
        return {"y": x}


def test_two_threads_freezing_at_once_get_their_own_graphs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Freezing changes nothing of TensorFlow's modules, so freezes on several threads
    each give the graph a freeze alone gives, and TensorFlow is as it was afterwards.
    (It once swapped convert_to_constants.tensor_util for the process while it turned
    variables into constants: two freezes inside that at once left it swapped. Here
    both threads are held there together, at the proto of their scalar variable.)"""
    import sys
    import threading

    from tensorflow.python.framework import convert_to_constants, tensor_util

    paths = [_save(_Weights(seed), tmp_path / f"m{seed}") for seed in range(2)]
    alone = [freeze_signature(p) for p in paths]
    together = threading.Barrier(2, timeout=120)
    held: list[int] = []  # the threads, in the order they got there
    first_done = threading.Event()
    make_tensor_proto = tensor_util.make_tensor_proto

    def meet_there(*args: object, **kwargs: object) -> object:
        caller = sys._getframe(1).f_globals.get("__name__", "")  # noqa: SLF001
        if caller in (convert_to_constants.__name__, "neuronish.freeze") and \
                threading.get_ident() not in held:
            held.append(threading.get_ident())
            together.wait()
            if held[-1] == threading.get_ident():  # the later one finishes last
                first_done.wait(timeout=120)
        return make_tensor_proto(*args, **kwargs)

    monkeypatch.setattr(tensor_util, "make_tensor_proto", meet_there)
    got: dict[int, object] = {}
    errors: list[BaseException] = []

    def freeze(k: int) -> None:
        try:
            got[k] = freeze_signature(paths[k])
        except BaseException as e:  # noqa: BLE001 (the test asserts there is none)
            errors.append(e)
            together.abort()
        finally:
            first_done.set()

    threads = [threading.Thread(target=freeze, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(held) == 2  # both were inside the conversion at once
    assert convert_to_constants.tensor_util is tensor_util

    def consts(frozen: object) -> dict[str, bytes]:
        return {n.name: n.attr["value"].tensor.SerializeToString(deterministic=True)
                for n in frozen.graph_def.node if n.op == "Const"}

    for k in range(2):
        frozen = got[k]
        assert consts(frozen) == consts(alone[k])
        assert sorted((n.name, n.op, tuple(n.input)) for n in frozen.graph_def.node) == \
            sorted((n.name, n.op, tuple(n.input)) for n in alone[k].graph_def.node)
        x = np.ones((2, 16), np.float32)
        want = tf.saved_model.load(paths[k]).signatures["serving_default"](
            x=tf.constant(x))["y"].numpy()
        np.testing.assert_allclose(_run(frozen, x), want, rtol=1e-6, atol=1e-6)
    assert consts(alone[0]) != consts(alone[1])  # two models: a mix-up would show


def _run(frozen: object, x: np.ndarray) -> np.ndarray:
    """The frozen graph's output "y" on input x, by TensorFlow."""
    (feed,) = frozen.inputs
    fn = tf.compat.v1.wrap_function(
        lambda: tf.graph_util.import_graph_def(frozen.graph_def, name=""), [])
    run = fn.prune([fn.graph.get_tensor_by_name(feed.tensor)],
                   [fn.graph.get_tensor_by_name(frozen.outputs["y"])])
    return run(tf.constant(x))[0].numpy()


def test_renamed_nodes_keep_their_colocations() -> None:
    """Stripping call prefixes renames nodes; a colocation naming one ("loc:@...", as
    Keras 2's LSTM carries) is renamed with it, or TensorFlow refuses the graph (the
    LSTM's compile failed with "expects to be colocated with unknown node")."""
    from neuronish.freeze import _strip_call_prefixes
    from neuronish.graph import Graph

    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant(1.0, name="StatefulPartitionedCall/lstm/Identity")
        with tf.compat.v1.colocate_with(a):
            tf.identity(a, name="Func/StatefulPartitionedCall/input/_12")
    graph_def = graph.as_graph_def()
    indexed = Graph(graph_def)
    renamed = _strip_call_prefixes(indexed)
    assert renamed["StatefulPartitionedCall/lstm/Identity"] == "lstm/Identity"
    indexed.verify()  # the rename kept the Graph's indexes current
    graph_def = indexed.graph_def
    (reader,) = [n for n in graph_def.node if n.op == "Identity"]
    assert list(reader.attr["_class"].list.s) == [b"loc:@lstm/Identity"]
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph_def, name="")


class _Parent(tf.Module):
    """A module whose child points back at it, as Keras layers and their model do: the
    object tf.saved_model.load gives back is then cyclic garbage once frozen."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(2.0)
        self.child = tf.Module()
        self.child.parent = self

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": x * self.w}


def test_the_loaded_savedmodel_is_freed_when_freezing_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Freezing collects the SavedModel it loaded (cyclic garbage once the graph is
    frozen) rather than leaving it, and its variables, held until the collector next runs
    somewhere in the rewrites (NASNetMobile: 215 MiB, 1.6 s)."""
    import gc
    import weakref

    model = _save(_Parent(), tmp_path / "parent")
    loads: list[weakref.ref] = []
    load = tf.saved_model.load

    def watched(*args: object, **kwargs: object) -> object:
        loaded = load(*args, **kwargs)
        loads.append(weakref.ref(loaded))
        return loaded

    monkeypatch.setattr(tf.saved_model, "load", watched)
    was_enabled = gc.isenabled()
    gc.disable()  # only freezing's own collection may free it
    try:
        frozen = freeze_signature(model)
        assert len(loads) == 1 and loads[0]() is None
        assert frozen.graph.graph_def is frozen.graph_def
    finally:
        if was_enabled:
            gc.enable()


def test_loading_runs_with_the_collector_paused_and_restores_it(
        nested_xla: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading makes long-lived objects and next to no garbage: the collector's full passes
    during it freed nothing (NASNetMobile: three, 8.5 s under load), so freezing pauses
    it, and turns it back on when done."""
    import gc

    during: list[bool] = []
    load = tf.saved_model.load

    def watched(*args: object, **kwargs: object) -> object:
        during.append(gc.isenabled())
        return load(*args, **kwargs)

    monkeypatch.setattr(tf.saved_model, "load", watched)
    assert gc.isenabled()
    neuronish.freeze.freeze_signatures(nested_xla)
    assert during == [False] and gc.isenabled()
