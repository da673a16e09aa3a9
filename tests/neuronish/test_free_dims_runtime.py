"""How an op with free dimensions meets a shape at run time (neuronish/shape_specialize.py):
a shape is compiled at the call's batch (a power of two), so a call is one device
program; with the runtime fallback on, the first call at a new shape runs on TensorFlow
while the shape compiles in the background, and later calls run on the device; with it
off, the call waits for the compile, but no longer than its cancellation or deadline.

Real compiles (neuronish-cc as a subprocess), the real NeuronOp kernel; every number is
compared with TensorFlow's; what ran where is read from counters, never from timings."""

from __future__ import annotations

import json
import stat
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import neuronish.saved_model
from neuronish import fallback
from neuronish.runtime import Cancelled, DeadlineExceeded
from neuronish.runtime.cutoff import Cutoff
from neuronish.shape_specialize import ShapeTable, live_tables, wait_for_compiles


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A small fully convolutional image model with free height and width, and its
    compile (batch 1, probe 64x64)."""
    work = tmp_path_factory.mktemp("free-dims-runtime")
    keras.utils.set_random_seed(0)
    x = keras.Input((None, None, 3), name="image")
    y = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(x)
    y = keras.layers.Conv2D(4, 3, activation="relu")(y)
    keras.Model(x, keras.layers.GlobalAveragePooling2D()(y)).export(str(work / "src"),
                                                                    verbose=False)
    report = neuronish.saved_model.compile(str(work / "src"), str(work / "out"))
    assert report["OnNeuronRatio"] == 1.0
    return str(work / "src"), str(work / "out")


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run-time compiles miss the compile cache (so they really compile)."""
    monkeypatch.setenv("NEURONISH_COMPILE_CACHE", str(tmp_path / "cache"))
    yield
    assert wait_for_compiles(300)  # nothing left compiling into a removed directory


def _image(batch: int, h: int, w: int) -> tf.Tensor:
    return tf.constant(np.random.default_rng(h * w + batch).standard_normal((batch, h, w, 3)),
                       tf.float32)


def _new_table(before: set) -> ShapeTable:
    (table,) = set(live_tables()) - before
    return table


def _fallback_calls(table: ShapeTable) -> int:
    return sum(c["calls"] for c in fallback.fallback_counts().values()
               if c["op"] == table.node_name)


def test_a_new_shape_compiles_at_the_calls_batch(model: tuple[str, str], fresh_cache: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A call of 3 at a new size compiles it at batch 4 (the next power of two): one
    program, not three of the batch-1 probe's; a call of 4 at that size uses the same
    executable, and one of 1 runs on it at once (padded) while batch 1 compiles."""
    monkeypatch.setenv(fallback.ENV_FALLBACK, "0")  # every call on the device
    src, out = model
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(out).signatures["serving_default"]
    before = set(live_tables())
    for batch in (3, 4):
        x = _image(batch, 20, 28)
        np.testing.assert_allclose(compiled(image=x)["output_0"], original(image=x)["output_0"],
                                   rtol=1e-5, atol=1e-5)
    table = _new_table(before)
    assert table.compiled == ["neuron_op_0@4x20x28x3"]
    assert table.calls()["neuron_op_0@4x20x28x3"] == 2
    (entry,) = [e for k, e in table._entries.items() if k[0] == 4]
    assert entry.model.batch_size == 4  # so the runtime runs a call of 3 or 4 as one chunk
    x = _image(1, 20, 28)
    np.testing.assert_allclose(compiled(image=x)["output_0"], original(image=x)["output_0"],
                               rtol=1e-5, atol=1e-5)
    assert table.calls()["neuron_op_0@4x20x28x3"] == 3  # ran on batch 4, padded: no wait
    assert wait_for_compiles(300)
    assert table.compiled == ["neuron_op_0@4x20x28x3", "neuron_op_0@1x20x28x3"]
    compiled(image=x)
    assert table.calls()["neuron_op_0@1x20x28x3"] == 1


def test_a_new_shape_runs_on_tensorflow_while_it_compiles(
        model: tuple[str, str], fresh_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the runtime fallback on, the first call at a new shape is computed on
    TensorFlow (counted as a fallback call) while the shape compiles in the background,
    once; after the compile, calls at that shape run on the device."""
    monkeypatch.setenv(fallback.ENV_FALLBACK, "1")
    src, out = model
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(out).signatures["serving_default"]
    before = set(live_tables())
    x = _image(2, 24, 17)
    want = original(image=x)["output_0"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fallback.FallbackWarning)  # (warned once per op)
        np.testing.assert_allclose(compiled(image=x)["output_0"], want, rtol=1e-5, atol=1e-5)
        table = _new_table(before)
        label = "neuron_op_0@2x24x17x3"
        counted = _fallback_calls(table)
        assert counted >= 1 and label not in table.calls()  # the first call: on TensorFlow
        for _ in range(3):  # while it compiles, or after
            np.testing.assert_allclose(compiled(image=x)["output_0"], want, rtol=1e-5,
                                       atol=1e-5)
        assert wait_for_compiles(300)
        assert table.compiled == [label]  # compiled once, however many calls asked
        on_device = table.calls()[label]
        fell_back = _fallback_calls(table)
        assert on_device + fell_back - counted == 3
        np.testing.assert_allclose(compiled(image=x)["output_0"], want, rtol=1e-5, atol=1e-5)
    assert _fallback_calls(table) == fell_back  # the later call ran on the device
    assert table.calls()[label] == on_device + 1


@pytest.fixture
def slow_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_cache: None) -> None:
    """The real neuronish-cc, started 3 s late: a compile that certainly outlasts the
    moment a test takes to cancel the call waiting for it."""
    real = Path(sys.executable).parent / "neuronish-cc"
    script = tmp_path / "slow-neuronish-cc"
    script.write_text(f'#!/bin/sh\nif [ "$1" = compile ]; then sleep 3; fi\nexec "{real}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("NEURONISH_CC", str(script))


@pytest.fixture
def picky_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_cache: None) -> Path:
    """The real neuronish-cc, behind a script that logs each compile's io-config (one
    line per compiler run) and refuses any shape 33 high, as the compiler refuses a
    subgraph it cannot compile (exit 1)."""
    real = Path(sys.executable).parent / "neuronish-cc"
    log = tmp_path / "compiles.log"
    script = tmp_path / "picky-neuronish-cc"
    script.write_text(f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
if args[:1] == ["compile"]:
    io = args[args.index("--io-config") + 1]
    config = json.load(open(io)) if os.path.exists(io) else json.loads(io)
    shapes = [v[0] for v in config["inputs"].values()]
    with open({str(log)!r}, "a") as f:
        f.write(json.dumps(shapes) + "\\n")
    if any(len(s) == 4 and s[1] == 33 for s in shapes):
        sys.exit("CompileError: refused for the test: height 33")
os.execv({str(real)!r}, [{str(real)!r}, *args])
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("NEURONISH_CC", str(script))
    return log


def test_a_shape_the_compiler_refuses_is_not_compiled_again(
        model: tuple[str, str], picky_compiler: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its calls run on TensorFlow (fallback on, counted) or fail naming the op and the
    shape (fallback off), without running the compiler again."""
    src, out = model
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(out).signatures["serving_default"]
    before = set(live_tables())
    x = _image(1, 33, 20)
    monkeypatch.setenv(fallback.ENV_FALLBACK, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fallback.FallbackWarning)
        for _ in range(2):
            np.testing.assert_allclose(compiled(image=x)["output_0"],
                                       original(image=x)["output_0"], rtol=1e-5, atol=1e-5)
            assert wait_for_compiles(300)
    table = _new_table(before)
    assert _fallback_calls(table) >= 2 and table.compiled == []
    monkeypatch.setenv(fallback.ENV_FALLBACK, "0")
    with pytest.raises(tf.errors.InternalError, match="(?s)compiling it for the new shape "
                       "neuron_op_0@1x33x20x3 failed: .*refused for the test"):
        compiled(image=x)
    runs = [json.loads(line) for line in picky_compiler.read_text().splitlines()]
    assert runs == [[[1, 33, 20, 3]]]  # one compiler run for the three calls


def _wait_until(condition, what: str) -> None:
    end = time.monotonic() + 120  # (a hang guard only: the condition is met in seconds)
    while not condition():
        assert time.monotonic() < end, f"gave up waiting until {what}"
        time.sleep(0.01)


def test_a_call_waiting_for_a_compile_can_be_cancelled(
        model: tuple[str, str], slow_compiler: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the fallback off, a call waits for its shape's compile; cancelled meanwhile
    (as the model server cancels a request past its deadline), it ends at once with
    CANCELLED naming the op and the shape, and the compile goes on for later calls."""
    from neuronish.serving.cancellation import Cancellation

    monkeypatch.setenv(fallback.ENV_FALLBACK, "0")
    src, out = model
    compiled = tf.saved_model.load(out).signatures["serving_default"]
    before = set(live_tables())
    x = _image(1, 30, 30)
    cancellation, result = Cancellation(), {}

    def call() -> None:
        try:
            result["value"] = cancellation.run(lambda: compiled(image=x))
        except tf.errors.OpError as e:
            result["error"] = e

    thread = threading.Thread(target=call)
    thread.start()
    _wait_until(lambda: any(t.compiling() for t in set(live_tables()) - before),
                "the call's shape is compiling")
    table = _new_table(before)
    cancellation.cancel()
    thread.join()
    assert "value" not in result, "the call waited for the compile instead of stopping"
    assert isinstance(result["error"], tf.errors.CancelledError), result["error"]
    assert "waited for its new shape neuron_op_0@1x30x30x3 to compile" in \
        result["error"].message and table.node_name in result["error"].message
    assert wait_for_compiles(300)
    assert table.compiled == ["neuron_op_0@1x30x30x3"]  # the compile went on
    original = tf.saved_model.load(src).signatures["serving_default"]
    np.testing.assert_allclose(compiled(image=x)["output_0"], original(image=x)["output_0"],
                               rtol=1e-5, atol=1e-5)
    assert table.calls()["neuron_op_0@1x30x30x3"] == 1


def test_a_call_waiting_for_a_compile_ends_at_its_deadline(
        model: tuple[str, str], slow_compiler: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline (model_config's timeout_s, which the bridge makes the call's cutoff)
    ends the wait with DeadlineExceeded naming the op and the shape; a cancel flag set
    before ends it with Cancelled."""
    monkeypatch.setenv(fallback.ENV_FALLBACK, "0")
    _, out = model
    compiled = tf.saved_model.load(out).signatures["serving_default"]
    before = set(live_tables())
    compiled(image=_image(1, 64, 64))  # the probe's shape: loads the op
    table = _new_table(before)
    shapes = [(1, 40, 12, 3)]
    with pytest.raises(DeadlineExceeded, match="NeuronOp '.*neuron_op_0': the call's deadline "
                       "passed while it waited for its new shape neuron_op_0@1x40x12x3 to "
                       "compile; the compile goes on"):
        table.entry(shapes, cutoff=Cutoff(time.monotonic() + 0.5))
    with pytest.raises(Cancelled, match="cancelled by its caller while it waited for its "
                       "new shape neuron_op_0@1x40x12x3"):
        table.entry(shapes, cutoff=Cutoff(None, bytearray(b"\x01")))
    assert table.compiling() == ["neuron_op_0@1x40x12x3"]  # once, however many waited
    assert wait_for_compiles(300)
    entry = table.entry(shapes, cutoff=Cutoff(time.monotonic() + 0.5))
    table.done(entry)
    assert table.compiled == ["neuron_op_0@1x40x12x3"]



def test_calls_that_do_not_wait_queue_no_more_shapes_than_the_op_holds(
        model: tuple[str, str], slow_compiler: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With NEURONISH_MAX_SHAPES=1, a burst of three new shapes (on TensorFlow meanwhile)
    queues at most one behind the compile under way; the third is compiled only once a
    later call brings it again."""
    monkeypatch.setenv(fallback.ENV_FALLBACK, "1")
    monkeypatch.setenv("NEURONISH_MAX_SHAPES", "1")
    src, out = model
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(out).signatures["serving_default"]
    before = set(live_tables())
    images = [_image(1, side, side) for side in (21, 22, 23)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fallback.FallbackWarning)
        for x in images:  # within the first compile's 3 s
            np.testing.assert_allclose(compiled(image=x)["output_0"],
                                       original(image=x)["output_0"], rtol=1e-5, atol=1e-5)
        table = _new_table(before)
        assert "neuron_op_0@1x23x23x3" not in table.compiling()
        assert wait_for_compiles(300)
        assert table.compiled[0] == "neuron_op_0@1x21x21x3"
        assert "neuron_op_0@1x23x23x3" not in table.compiled
        compiled(image=images[2])  # room now: queued
        assert wait_for_compiles(300)
    assert table.compiled[-1] == "neuron_op_0@1x23x23x3"
