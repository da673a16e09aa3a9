"""A binary takes the add and the activation that follow it: a pre-activation BatchNorm
(x * a + b, then ReLU, on a concat or a pool that no weights can absorb: DenseNet's blocks,
ResNetV2's) is one pass over its tensor instead of three, and the numbers stay TensorFlow's
on every engine."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.cc.graphdef import parse_graph_def
from neuronish.cc.ioconfig import parse_io_config
from neuronish.cc.ir import format_graph
from neuronish.cc.lower import lower
from neuronish.cc.pipeline import Dumper, build_pipeline, run_pipeline
from neuronish.runtime import isa, load
from tests.graphs import TracedGraph, trace
from tests.helpers import onednn_exec_lines, run_reporting_numpy


def _dense_block(shift: bool, activation: str = "relu", stem: bool = False) -> TracedGraph:
    """DenseNet's layer: concat(x, conv(x)), its BatchNorm as Keras exports it (a scale, and
    a shift unless the offset and mean are zero, as with fresh weights), the activation and
    the next 1x1 convolution. `stem`: x is a convolution's output first (so that under
    --auto-cast matmult the whole block is a bfloat16 region)."""
    rng = np.random.default_rng(7)
    w_stem = tf.constant(rng.standard_normal((1, 1, 8, 8)).astype(np.float32) * 0.3)
    w_grow = tf.constant(rng.standard_normal((3, 3, 8, 4)).astype(np.float32) * 0.3)
    w_next = tf.constant(rng.standard_normal((1, 1, 12, 6)).astype(np.float32) * 0.3)
    scale = tf.constant(rng.uniform(-1.5, 1.5, 12).astype(np.float32))
    offset = tf.constant(rng.standard_normal(12).astype(np.float32))
    act = {"relu": tf.nn.relu, "relu6": tf.nn.relu6, "sigmoid": tf.sigmoid}[activation]

    def fn(x: tf.Tensor) -> tf.Tensor:
        if stem:
            x = tf.nn.conv2d(x, w_stem, 1, "VALID")
        grown = tf.concat([x, tf.nn.conv2d(x, w_grow, 1, "SAME")], axis=3)
        h = grown * scale + offset if shift else grown * scale
        return tf.nn.conv2d(act(h), w_next, 1, "VALID")

    return trace(fn, tf.TensorSpec([2, 7, 7, 8], tf.float32, name="x"))


def _optimized(g: TracedGraph):
    graph = lower(parse_graph_def(g.graph_def), parse_io_config(g.io_config))
    return run_pipeline(graph, build_pipeline("none"), Dumper(None))


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"x:0": np.random.default_rng(seed).standard_normal((2, 7, 7, 8)).astype(np.float32)}


def _runs_as_tensorflow(g: TracedGraph, feeds: dict[str, np.ndarray]) -> None:
    """Compiled, `g` gives TensorFlow's numbers on both runtimes, every instruction on the
    native engine."""
    exe = compile_graph(g.graph_def, g.io_config)
    want = g.reference(feeds)["Identity:0"]
    got, left = run_reporting_numpy(exe, feeds)
    assert left == []
    np.testing.assert_allclose(got["Identity:0"], want, rtol=1e-5, atol=1e-5)
    with load(exe) as model:  # the C runtime
        np.testing.assert_allclose(model.run(feeds)["Identity:0"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shift", [False, True], ids=["scale", "scale_shift"])
@pytest.mark.parametrize("activation", ["relu", "relu6", "sigmoid"])
def test_pre_activation_batchnorm_takes_its_activation(shift: bool, activation: str) -> None:
    """The BatchNorm is one binary: the scale's mul, the shift as its addend, and the
    activation as an attribute; no unary or add is left, and both runtimes (every
    instruction on the native engine) and the numpy reference engine give TensorFlow's
    numbers."""
    g = _dense_block(shift, activation)
    graph = _optimized(g)
    assert [n.kind for n in graph.nodes if n.kind == "unary"] == [], format_graph(graph)
    binaries = [n for n in graph.nodes if n.kind == "binary"]
    assert [(n.attrs["fn"], n.attrs.get("activation", "none"), len(n.inputs))
            for n in binaries] == [("mul", activation, 3 if shift else 2)], format_graph(graph)
    assert any(activation in o.lower() for o in binaries[-1].origin)  # (names the TF op)
    assert any(o.lower().endswith("add") for o in binaries[-1].origin) == shift
    _runs_as_tensorflow(g, _feeds())


def test_numpy_engine_applies_a_binarys_activation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference engine defines the attribute: without it, a negative product would
    survive and the comparison with TensorFlow fails."""
    monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
    g = _dense_block(shift=True)
    with load(compile_graph(g.graph_def, g.io_config), runtime="python") as model:
        got = model.run(_feeds(1))["Identity:0"]
    np.testing.assert_allclose(got, g.reference(_feeds(1))["Identity:0"], rtol=1e-5, atol=1e-5)


def _kept_apart(fn: object, *specs: tf.TensorSpec) -> list[str]:
    graph = _optimized(trace(fn, *specs))
    return [n.kind for n in graph.nodes]


def test_binaries_no_engine_streams_keep_their_activation_apart() -> None:
    """Only a float32 binary with one operand of the output's shape takes the activation
    (oneDNN's binary primitive with an eltwise post-op); anything else would leave the pair
    to the numpy engine, so the unary stays."""
    f32 = tf.float32
    # Both operands broadcast: [4, 1] + [1, 5].
    assert "unary" in _kept_apart(lambda a, b: tf.nn.relu(a + b),
                                  tf.TensorSpec([4, 1], f32), tf.TensorSpec([1, 5], f32))
    # Integers: the loops have no epilogue.
    assert "unary" in _kept_apart(lambda a, b: tf.nn.relu(a + b),
                                  tf.TensorSpec([4, 5], tf.int32), tf.TensorSpec([4, 5], tf.int32))
    def read_twice(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        p = a * b  # (one Mul, read by the Relu and the Add)
        return tf.nn.relu(p) + p

    # The product is read twice: the activation cannot replace it.
    assert "unary" in _kept_apart(read_twice,
                                  tf.TensorSpec([4, 5], f32), tf.TensorSpec([4, 5], f32))
    # A non-commutative binary whose first operand broadcasts: c - x.
    assert "unary" in _kept_apart(lambda a, b: tf.nn.relu(a - b),
                                  tf.TensorSpec([1, 5], f32), tf.TensorSpec([4, 5], f32))
    # And the plain case does fuse (so the asserts above are not vacuous).
    assert "unary" not in _kept_apart(lambda a, b: tf.nn.relu(a - b),
                                      tf.TensorSpec([4, 5], f32), tf.TensorSpec([1, 5], f32))


def test_bf16_binary_rounds_once_after_its_activation(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a bfloat16 region the binary reads and writes bfloat16: fn and the activation in
    float32, one rounding (the numpy engine's definition), which the native engine matches
    and which stays within bfloat16's error of TensorFlow."""
    g = _dense_block(shift=True, activation="sigmoid", stem=True)
    exe = compile_graph(g.graph_def, g.io_config, auto_cast="matmult")
    feeds = _feeds(2)
    got, left = run_reporting_numpy(exe, feeds)
    assert left == []
    with load(exe, runtime="python") as model:
        program = model._idle.get()
        model._idle.put(program)
        fused = [i for i in program.instructions
                 if i.kind == "binary" and i.attrs.get("activation") == "sigmoid"]
        assert len(fused) == 1, "the sigmoid was not fused into the binary"
        assert model.exe.values[fused[0].outputs[0]][1] == "bfloat16"  # (shape, dtype)
    monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
    with load(exe, runtime="python") as model:
        ref = model.run(feeds)["Identity:0"]
    np.testing.assert_allclose(got["Identity:0"], ref, rtol=2e-2, atol=2e-2)
    want = g.reference(feeds)["Identity:0"]
    np.testing.assert_allclose(got["Identity:0"], want, rtol=5e-2, atol=5e-2)


def test_isa_refuses_an_activation_on_an_integer_or_bool_result() -> None:
    rule = isa.KINDS["binary"].rule
    ints = [isa.Type((3,), "int32")] * 2
    assert rule(ints, {"fn": "add"})[0].dtype == "int32"
    with pytest.raises(isa.IsaError, match="activation relu needs a float32 or bfloat16"):
        rule(ints, {"fn": "add", "activation": "relu"})
    floats = [isa.Type((3,), "float32")] * 2
    with pytest.raises(isa.IsaError, match="got bool"):
        rule(floats, {"fn": "less", "activation": "relu"})
    assert rule(floats, {"fn": "mul", "activation": "relu"})[0].dtype == "float32"
    with pytest.raises(isa.IsaError, match="fn one of add, sub"):
        rule(floats, {"fn": "pow", "activation": "relu"})
    row, col = isa.Type((4, 1), "float32"), isa.Type((1, 5), "float32")
    with pytest.raises(isa.IsaError, match="of y's shape"):  # both operands broadcast
        rule([row, col], {"fn": "add", "activation": "relu"})
    full, vec = isa.Type((4, 5), "float32"), isa.Type((5,), "float32")
    assert rule([vec, full], {"fn": "add", "activation": "relu"})[0].shape == (4, 5)
    with pytest.raises(isa.IsaError, match="of y's shape"):  # c - x: the engine's a is y
        rule([vec, full], {"fn": "sub", "activation": "relu"})


def _shift_cases() -> dict[str, tuple[object, list[tf.TensorSpec]]]:
    rng = np.random.default_rng(3)
    scale = tf.constant(rng.uniform(0.5, 1.5, 6).astype(np.float32))
    offset = tf.constant(rng.standard_normal(6).astype(np.float32))
    image = tf.TensorSpec([2, 5, 5, 6], tf.float32)
    return {
        # A BatchNorm that no activation follows (Keras' last one before a pool).
        "no_activation": (lambda x: x * scale + offset, [image]),
        # The shift first in the add, and an activation with a slope.
        "shift_first": (lambda x: tf.nn.leaky_relu(offset + x * scale, 0.3), [image]),
        # A full tensor computed after the product: the fused binary waits for it.
        "full_later": (lambda x: tf.nn.relu(x * scale + tf.sin(x)), [image]),
    }


@pytest.mark.parametrize("case", ["no_activation", "shift_first", "full_later"])
def test_an_add_after_a_one_pass_binary_is_its_addend(case: str) -> None:
    """fn(a, b) + c becomes one binary with c as its third input, wherever c comes from,
    and gives TensorFlow's numbers on both runtimes with every instruction native."""
    fn, specs = _shift_cases()[case]
    g = trace(fn, *specs)
    graph = _optimized(g)
    binaries = [n for n in graph.nodes if n.kind == "binary"]
    assert [(n.attrs["fn"], len(n.inputs)) for n in binaries] == [("mul", 3)], \
        format_graph(graph)
    _runs_as_tensorflow(g, {
        "x:0": np.random.default_rng(4).standard_normal((2, 5, 5, 6)).astype(np.float32)})


def test_an_add_that_broadcasts_the_product_stays_apart() -> None:
    """[4, 1] * [1, 1] + [1, 5] is [4, 5]: the product is not the add's shape, so one pass
    over the product cannot compute the sum; the add stays an instruction of its own."""
    kinds = _kept_apart(lambda a, b, c: a * b + c, tf.TensorSpec([4, 1], tf.float32),
                        tf.TensorSpec([1, 1], tf.float32), tf.TensorSpec([1, 5], tf.float32))
    assert kinds.count("binary") == 2, kinds


_VERBOSE_PROBE = """
import sys
import numpy as np
from neuronish.runtime import executable, load
from runtime.program import one_instruction_program
fn, y_shape, b_shape, c_shape = sys.argv[1], *(eval(a) for a in sys.argv[2:5])
rng = np.random.default_rng(0)
shapes = (y_shape, b_shape) if c_shape is None else (y_shape, b_shape, c_shape)
arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
program, _ = one_instruction_program("binary", arrays, {"fn": fn, "activation": "relu"},
                                     [(y_shape, "float32")])
with load(executable.to_bytes(program.exe), runtime="python") as model:
    model.run({f"in{i}": a for i, a in enumerate(arrays)})
"""


def _binary_ran(y: tuple, b: tuple, c: tuple | None, fn: str = "mul") -> list[list[str]]:
    """ONEDNN_VERBOSE's fields for binary(fn, x[y], b, c) with a ReLU (c None: no addend),
    run once natively."""
    ran = [f for f in onednn_exec_lines(_VERBOSE_PROBE, fn, str(y), str(b), str(c))
           if f[3] == "binary"]
    assert ran, f"oneDNN logged no binary for {fn} {y} {b} {c}"
    return ran


def _binary_with_addend_ran(y: tuple, b: tuple, c: tuple) -> list[list[str]]:
    ran = _binary_ran(y, b, c)
    assert all("binary_add" in ",".join(fields) for fields in ran), ran
    return ran


def test_a_channel_addend_runs_on_onednns_own_kernel() -> None:
    """oneDNN 3.2 takes a binary post-op that broadcasts along a 4-D tensor's last dim to
    its reference code (a DenseNet-sized BatchNorm: 747 ms against 2 ms); the engine
    describes the operands as [rows, channels], where it is a per-channel post-op that
    its JIT kernels take. ONEDNN_VERBOSE names the implementation that ran."""
    ran = _binary_with_addend_ran((8, 14, 14, 32), (32,), (32,))
    assert not any(fields[4].startswith("ref") for fields in ran), ran


def test_one_value_scale_and_shift_run_flat() -> None:
    """An image's rescaling, x * s + o with one value each (Keras' Rescaling before
    MobileNetV3), is described as one flat run of elements: as [rows, 3] it took 5.9 ms
    for 8x224x224x3 on jit:uni's three-element rows, flat 0.45 ms."""
    ran = _binary_with_addend_ran((8, 24, 24, 3), (), ())
    shapes = [fields[-2] for fields in ran]  # e.g. "13824:1"
    assert all(shape == f"{8 * 24 * 24 * 3}:1" for shape in shapes), shapes
    assert not any(fields[4].startswith("ref") for fields in ran), ran


@pytest.mark.parametrize("fn, c", [("sub", None), ("mul", (3,))], ids=["sub", "mul_add"])
def test_a_vector_over_three_channels_runs_in_long_rows(fn: str, c: tuple | None) -> None:
    """Keras' Normalization on an RGB image, x - mean[3] and x * s[3] + o[3]: as
    [rows, 3] each pass took 4.9 ms for 8x224x224x3 on oneDNN's three-element rows. The
    engine regroups the rows k at a time (here k = 32: 4608 rows of 3 become 144 of 96) and
    tiles the vectors to match; the shapes ONEDNN_VERBOSE prints say so."""
    ran = _binary_ran((8, 24, 24, 3), (3,), c, fn)
    shapes = [fields[-2].split(" ") for fields in ran]  # e.g. ["144x96:1x96"]
    assert all(parts[0].split(":")[0] == "144x96" for parts in shapes), shapes
    assert not any(fields[4].startswith("ref") for fields in ran), ran


def test_isa_refuses_an_addend_one_pass_cannot_take() -> None:
    rule = isa.KINDS["binary"].rule
    full, vec = isa.Type((4, 5), "float32"), isa.Type((5,), "float32")
    assert rule([full, vec, vec], {"fn": "mul"})[0].shape == (4, 5)
    assert rule([vec, full, isa.Type((4, 1), "float32")], {"fn": "mul"})[0].shape == (4, 5)
    with pytest.raises(isa.IsaError, match="c must be float32 and broadcast to y"):
        rule([full, vec, isa.Type((4,), "float32")], {"fn": "mul"})  # (4 against 5)
    with pytest.raises(isa.IsaError, match="c must be float32 and broadcast to y"):
        rule([full, vec, isa.Type((2, 4, 5), "float32")], {"fn": "mul"})  # (widens y)
    with pytest.raises(isa.IsaError, match="c must be float32"):
        rule([full, vec, isa.Type((5,), "bfloat16")], {"fn": "mul"})
    ints = isa.Type((4, 5), "int32")
    with pytest.raises(isa.IsaError, match="addend c needs a float32 or bfloat16"):
        rule([ints, ints, ints], {"fn": "add"})
    with pytest.raises(isa.IsaError, match="fn one of add, sub"):
        rule([full, vec, vec], {"fn": "pow"})
    with pytest.raises(isa.IsaError, match="of y's shape"):  # c - x: the engine's a is y
        rule([vec, full, vec], {"fn": "sub"})
