"""3x3 float32 convolutions at stride 1 on the native engine's Winograd loop
(runtime/native/engine_winograd.cc), on both runtimes, against TensorFlow within 1e-4:

- convolutions that take it: SAME and VALID padding, an image whose sides are odd (its
  last 2x2 tiles reach past the image), with and without a bias, with ReLU, ReLU6 (a clip)
  or no activation; compiled at batch 2 and called at 2 and 5, twice (the second call's
  data pointers are its own);
- convolutions it leaves to oneDNN (a stride of 2, 32 channels, a dilation, a 5x5 image)
  still give TensorFlow's numbers, and the Python runtime names which kernel each ran;
- NEURONISH_NATIVE_WINOGRAD=off leaves every convolution to oneDNN, and a value other
  than auto, on or off is refused with the variable's name;
- bfloat16 computed in float32 (a CPU without bfloat16 kernels) takes it too, its weights
  rounded to bfloat16 as oneDNN's path rounds them;
- a small Keras ResNet-style model (3x3 convs with batch norms folded, residual adds that
  the loop adds before the activation) matches TensorFlow with the loop on.

The engine reads NEURONISH_NATIVE_WINOGRAD when an instruction is added, so these tests
set it to `on`, which takes the loop on any CPU with AVX2 and FMA (by default it is taken
only where it was measured to pay: AVX2 without AVX-512).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.cc.host import cpu_flags
from neuronish.runtime import load
from neuronish.runtime.native import library
from tests.graphs import TracedGraph, trace

ROOT = Path(__file__).resolve().parents[2]
WINOGRAD = "neuronish:winograd_conv"
RNG = np.random.default_rng(11)

pytestmark = pytest.mark.skipif(
    library.load() is None or not {"avx2", "fma"} <= cpu_flags(),
    reason="the Winograd loop needs the native engine and a CPU with AVX2 and FMA")


def runtimes() -> list[str]:
    return ["python", "c"] if shutil.which("g++") else ["python"]


def _const(*shape: int, scale: float = 1.0) -> tf.Tensor:
    return tf.constant((RNG.standard_normal(shape) * scale).astype(np.float32))


def conv_graph(size: tuple[int, int], ic: int, oc: int, padding: str, bias: bool,
               act: str | None, batch: int = 2, stride: int = 1,
               dilation: int = 1) -> TracedGraph:
    w = _const(3, 3, ic, oc, scale=1.0 / np.sqrt(9 * ic))
    b = _const(oc)

    def fn(x: tf.Tensor) -> tf.Tensor:
        y = tf.nn.conv2d(x, w, stride, padding, dilations=dilation)
        if bias:
            y = tf.nn.bias_add(y, b)
        if act == "relu":
            y = tf.nn.relu(y)
        elif act == "relu6":
            y = tf.nn.relu6(y)
        return y

    return trace(fn, tf.TensorSpec([None, *size, ic], tf.float32, name="x"), batch=batch)


def _kinds_and_impls(model: object) -> list[tuple[str, str]]:
    program = model._idle.get()
    model._idle.put(program)
    impls = program.implementations()
    return [(ins.kind, impls[i]) for i, ins in enumerate(program.instructions)]


def _check(graph: TracedGraph, model: object, calls: tuple[int, ...]) -> None:
    name, (shape, _) = next(iter(graph.io_config["inputs"].items()))
    for n in calls:
        feeds = {name: RNG.standard_normal((n, *shape[1:])).astype(np.float32)}
        want = graph.reference(feeds)
        for _ in range(2):
            got = model.run(feeds)
            for out in want:
                np.testing.assert_allclose(got[out], want[out], rtol=1e-4, atol=1e-4)


TAKEN = [
    ((14, 14), 64, 64, "SAME", True, "relu"),
    ((9, 11), 64, 96, "SAME", False, "relu6"),
    ((13, 9), 72, 64, "VALID", True, None),
    ((7, 7), 128, 128, "SAME", True, "relu"),
]


@pytest.mark.parametrize("runtime", runtimes())
@pytest.mark.parametrize("case", TAKEN, ids=lambda c: f"{c[0][0]}x{c[0][1]}-{c[1]}-{c[2]}-{c[3]}")
def test_convolutions_on_the_winograd_loop_match_tensorflow(
        case: tuple, runtime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_NATIVE_WINOGRAD", "on")
    graph = conv_graph(*case)
    with load(compile_graph(graph.graph_def, graph.io_config), runtime=runtime) as model:
        if runtime == "python":  # (the C runtime does not say which kernel ran)
            assert [impl for kind, impl in _kinds_and_impls(model) if kind == "conv2d"] == \
                [WINOGRAD]
        _check(graph, model, (2, 5))


LEFT = [
    dict(size=(14, 14), ic=64, oc=64, stride=2),
    dict(size=(14, 14), ic=32, oc=64),
    dict(size=(14, 14), ic=64, oc=64, dilation=2),
    dict(size=(5, 5), ic=64, oc=64),
]


def _left_to_onednn(graph: TracedGraph, setting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded under NEURONISH_NATIVE_WINOGRAD=`setting`, no convolution of `graph` takes
    the loop, and the model still gives TensorFlow's numbers."""
    executable = compile_graph(graph.graph_def, graph.io_config)
    monkeypatch.setenv("NEURONISH_NATIVE_WINOGRAD", setting)
    with load(executable, runtime="python") as model:
        convs = [impl for kind, impl in _kinds_and_impls(model) if kind == "conv2d"]
        assert convs and WINOGRAD not in convs
        _check(graph, model, (2,))


@pytest.mark.parametrize("case", LEFT, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_convolutions_the_loop_does_not_fit_stay_on_onednn(
        case: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    _left_to_onednn(conv_graph(padding="SAME", bias=True, act="relu", **case), "on",
                    monkeypatch)


def test_off_leaves_every_convolution_to_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    _left_to_onednn(conv_graph(*TAKEN[0]), "off", monkeypatch)


def test_a_bad_setting_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = conv_graph(*TAKEN[0])
    executable = compile_graph(graph.graph_def, graph.io_config)
    monkeypatch.setenv("NEURONISH_NATIVE_WINOGRAD", "fast")
    words = "NEURONISH_NATIVE_WINOGRAD must be auto, on or off, got 'fast'"
    with load(executable, runtime="python") as model:  # (the instruction goes to numpy)
        program = model._idle.get()
        model._idle.put(program)
        why = [w for st in program.stages for w in st.native.rejected.values()]
        assert why and all(words in w for w in why)
    if "c" in runtimes():  # (the C runtime runs every instruction natively or refuses)
        with pytest.raises(Exception, match=words):
            load(executable, runtime="c").close()


def keras_resnet_block(batch: int) -> TracedGraph:
    tf.keras.utils.set_random_seed(7)
    inputs = tf.keras.Input((16, 16, 64))
    h = inputs
    for _ in range(2):
        y = tf.keras.layers.Conv2D(64, 3, padding="same", use_bias=False)(h)
        y = tf.keras.layers.BatchNormalization()(y)
        y = tf.keras.layers.ReLU()(y)
        y = tf.keras.layers.Conv2D(64, 3, padding="same")(y)
        h = tf.keras.layers.ReLU()(y + h)
    h = tf.keras.layers.Conv2D(128, 3, padding="valid", activation="relu")(h)
    outputs = tf.keras.layers.Dense(10)(tf.keras.layers.GlobalAveragePooling2D()(h))
    model = tf.keras.Model(inputs, outputs)
    for layer in model.layers:  # batch norms that are not the identity
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            n = layer.moving_mean.shape[0]
            layer.moving_mean.assign(RNG.standard_normal(n).astype(np.float32) * 0.1)
            layer.moving_variance.assign(RNG.uniform(0.5, 2.0, n).astype(np.float32))
    return trace(lambda x: model(x, training=False),
                 tf.TensorSpec([None, 16, 16, 64], tf.float32, name="x"), batch=batch)


@pytest.mark.parametrize("runtime", runtimes())
def test_a_keras_resnet_block_matches_tensorflow(runtime: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_NATIVE_WINOGRAD", "on")
    graph = keras_resnet_block(4)
    with load(compile_graph(graph.graph_def, graph.io_config), runtime=runtime) as model:
        if runtime == "python":
            impls = [impl for kind, impl in _kinds_and_impls(model) if kind == "conv2d"]
            assert impls == [WINOGRAD] * 5  # (two with the residual added)
        _check(graph, model, (4, 3))


_BF16_PROBE = """
import json, sys
import numpy as np
from neuronish.runtime import load
paths, x = json.loads(sys.argv[1]), np.load(sys.argv[2])
out = {}
for name, path in paths.items():
    for runtime in ("python", "c"):
        with load(path, runtime=runtime) as model:
            [out[f"{name}:{runtime}"]] = model.run({"x:0": x}).values()
            if runtime == "python":
                program = model._idle.get()
                model._idle.put(program)
                impls = program.implementations()
                out[name + ":winograd"] = np.array(sum(
                    impls[i] == "neuronish:winograd_conv"
                    for i, ins in enumerate(program.instructions) if ins.kind == "conv2d"))
np.savez(sys.argv[3], **out)
"""


def test_bf16_computed_in_float32_takes_the_loop_with_weights_rounded(
        tmp_path: Path) -> None:
    """`--auto-cast matmult` on a CPU without bfloat16 kernels (forced here by
    NEURONISH_NATIVE_BF16=float32): the convolutions, whose values stay float32, take the
    loop, with their float32 weights rounded to bfloat16 first as oneDNN's path rounds
    them. So the loop's numbers are the direct path's to float32 rounding, and a
    bfloat16 weight's error away from the fp32 program's (which would fail were the
    weights not rounded)."""
    w1, w2 = (_const(3, 3, 64, 64, scale=1 / 24) for _ in range(2))
    b1 = _const(64)

    def fn(x: tf.Tensor) -> tf.Tensor:
        h = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME") + b1)
        return tf.nn.relu(tf.nn.conv2d(h, w2, 1, "SAME") + x)

    g = trace(fn, tf.TensorSpec([2, 10, 10, 64], tf.float32, name="x"))
    paths = {}
    for name, options in {"fp32": {}, "bf16": {"auto_cast": "matmult"}}.items():
        paths[name] = str(tmp_path / f"{name}.neff")
        Path(paths[name]).write_bytes(compile_graph(g.graph_def, g.io_config, **options))
    x = RNG.standard_normal((2, 10, 10, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = {}
    for setting in ("on", "off"):
        env = dict(os.environ, NEURONISH_ENGINE="native", NEURONISH_NATIVE_BF16="float32",
                   NEURONISH_NATIVE_WINOGRAD=setting)
        run = subprocess.run([sys.executable, "-c", _BF16_PROBE, json.dumps(paths),
                              str(tmp_path / "x.npy"), str(tmp_path / f"{setting}.npz")],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        out.update({f"{k}:{setting}": v for k, v in np.load(tmp_path / f"{setting}.npz").items()})

    def off(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.abs(a - b).max() / np.abs(b).max())

    assert int(out["bf16:winograd:on"]) == 2 and int(out["bf16:winograd:off"]) == 0
    assert int(out["fp32:winograd:on"]) == 2
    for runtime in runtimes():
        on, direct = out[f"bf16:{runtime}:on"], out[f"bf16:{runtime}:off"]
        assert off(on, direct) < 1e-5, runtime
        assert off(on, out[f"fp32:{runtime}:on"]) > 1e-4, runtime
        assert off(out[f"fp32:{runtime}:on"], fn(x).numpy()) < 1e-5, runtime
    if "c" in runtimes():
        assert out["bf16:python:on"].tobytes() == out["bf16:c:on"].tobytes()
