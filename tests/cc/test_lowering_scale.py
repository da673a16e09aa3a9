"""The shortcuts that make lowering a 100k-node graph take seconds change no
decision: an instruction's checked types are reused only for the very same signature,
a refusal is never remembered, and the batch check's second lowering reuses a node's
lowering (with the inputs it read as constants) only for an identical one."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import compiler_scale
from neuronish.cc import lower as lower_module
from neuronish.cc.compiler import compile_executable
from neuronish.cc.errors import NodeError, UnsupportedNodes
from neuronish.cc.graphdef import parse_graph_def
from neuronish.cc.ioconfig import parse_io_config
from neuronish.cc.ir import TensorType, Value
from neuronish.cc.ops.registry import LowerCtx, signature_key, value_key
from neuronish.cc.proto import tf_graph_pb2 as pb
from neuronish.runtime.native.spec import numpy_instructions
from tests.cc.test_batch_safety import _compile


def test_keys_tell_values_of_different_types_and_signs_apart() -> None:
    keys = [value_key(v) for v in (1, True, 1.0, "1", 0.0, -0.0, [1], (1,), None)]
    assert None not in keys
    assert len(set(keys)) == len(keys)
    assert value_key(float("nan")) == value_key(float("nan"))
    assert value_key({"b": 1, "a": [2.5]}) == value_key({"a": [2.5], "b": 1})
    assert value_key(np.int64(1)) is None  # numpy values are not keyed: never cached
    assert value_key({"t": np.zeros(2)}) is None
    f32 = TensorType((4, 8), "float32")
    assert signature_key("unary", [f32], {"fn": "relu"}) != \
        signature_key("unary", [TensorType((5, 8), "float32")], {"fn": "relu"})
    assert signature_key("unary", [TensorType([4, 8], "float32")], {}) is None


def test_a_refused_instruction_is_refused_every_time() -> None:
    ctx = LowerCtx({}, lambda node: node.outputs)
    a = Value(TensorType((4, 8), "float32"))
    ok = ctx.emit1("binary", [a, Value(TensorType((8,), "float32"))], {"fn": "add"})
    again = ctx.emit1("binary", [a, Value(TensorType((8,), "float32"))], {"fn": "add"})
    assert ok.type == again.type == TensorType((4, 8), "float32")
    for _ in range(2):
        with pytest.raises(NodeError, match="do not broadcast"):
            ctx.emit1("binary", [a, Value(TensorType((3,), "float32"))], {"fn": "add"})
    for _ in range(2):  # the same shapes, another attribute value: checked again
        with pytest.raises(NodeError):
            ctx.emit1("binary", [a, Value(TensorType((8,), "float32"))], {"fn": "nope"})


def _reshape_twice_by_shape(x: tf.Tensor) -> tf.Tensor:
    s = tf.shape(x)  # a compile-time value that follows the batch size
    return tf.reshape(tf.reshape(tf.nn.relu(x), s), s) + 1.0


def test_a_reused_lowering_keeps_its_constant_reads(tmp_path) -> None:  # noqa: ANN001
    # Both Reshapes lower alike at the compiled batch + 1 (same input type, the same shape
    # value); the second reuses the first's lowering, and with it the fact that the shape
    # is a shape operand, not data: read as data it would be reported as mixing samples.
    done = _compile(tmp_path, _reshape_twice_by_shape)
    assert done.returncode == 0, done.stderr


def _chain_then_times_batch(x: tf.Tensor) -> tf.Tensor:
    for _ in range(6):
        x = tf.nn.relu(x)
    return x * tf.cast(tf.shape(x)[0], tf.float32)


def _chain_then_cumsum(x: tf.Tensor) -> tf.Tensor:
    for _ in range(6):
        x = tf.nn.relu(x)
    return tf.cumsum(x, axis=0)


@pytest.mark.parametrize("fn, op", [(_chain_then_times_batch, "Mul"),
                                    (_chain_then_cumsum, "Cumsum")])
def test_a_mixing_node_after_a_chain_of_alike_nodes_is_named(tmp_path, fn, op) -> None:  # noqa: ANN001
    done = _compile(tmp_path, fn)
    assert done.returncode == 1, done.stderr
    line = next(ln for ln in done.stderr.splitlines() if "mixes samples" in ln)
    assert f"({op})" in line



def _weighted_graph(shapes: list[list[int]]) -> bytes:
    """x [2, 4, 2] -> one Reshape per shape (each an int32 weight of its own)."""
    g = pb.GraphDef()
    x = g.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = pb.DT_FLOAT
    for i, shape in enumerate(shapes):
        c = g.node.add(name=f"shape{i}", op="Const")
        c.attr["dtype"].type = pb.DT_INT32
        t = c.attr["value"].tensor
        t.dtype = pb.DT_INT32
        t.tensor_shape.dim.add(size=len(shape))
        t.tensor_content = np.asarray(shape, np.int32).tobytes()
        r = g.node.add(name=f"reshape{i}", op="Reshape", input=["x", f"shape{i}"])
        r.attr["T"].type = pb.DT_FLOAT
        r.attr["Tshape"].type = pb.DT_INT32
    return g.SerializeToString()


def _lowerings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    done: list[str] = []
    real = lower_module._lower_node

    def counting(ctx: LowerCtx, node: object) -> object:
        done.append(node.name)  # type: ignore[attr-defined]
        return real(ctx, node)  # type: ignore[arg-type]

    monkeypatch.setattr(lower_module, "_lower_node", counting)
    return done


def test_a_lowering_that_looked_at_a_weight_is_not_reused_for_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Both Reshapes read an input of one type and a weight of one type; the second's
    # fixed shape [2, 8] does not fit batch 3. Reused by the weights' type, the first's
    # lowering at batch 3 would hide that; the lowering reads the shape's values, so it
    # is lowered again and named.
    done = _lowerings(monkeypatch)
    io = {"inputs": {"x:0": [[2, 4, 2], "float32", 0]},
          "outputs": ["reshape0:0", "reshape1:0"]}
    with pytest.raises(UnsupportedNodes) as caught:
        compile_executable(_weighted_graph([[-1, 8], [2, 8]]), io)
    assert [p.node for p in caught.value.problems] == ["reshape1"]
    assert "does not accept batch size 3" in caught.value.problems[0].reason
    assert done.count("reshape0") == 2 and done.count("reshape1") == 2


def test_a_lowering_that_never_looked_at_its_weight_is_done_once_per_type(
        monkeypatch: pytest.MonkeyPatch) -> None:
    done = _lowerings(monkeypatch)
    n = 40
    g = compiler_scale.addn(n)  # n Muls, each by its own weight, and one AddN
    io = {"inputs": {"x:0": [[4, compiler_scale.FEATURES], "float32", 0]}, "outputs": ["y:0"]}
    compile_executable(g.SerializeToString(), io)
    # at the compiled batch: every Const, Mul and the AddN; at batch 5 one Mul and the AddN
    assert sum(name.startswith("m") for name in done) == n + 1
    assert len(done) == 2 * n + 1 + 2


@pytest.mark.parametrize("exclude", ["", "binary", "binary,unary,matmul"])
def test_numpy_instructions_asked_once_per_kind_of_instruction_list_every_one(
        monkeypatch: pytest.MonkeyPatch, exclude: str) -> None:
    # NEURONISH_NATIVE_EXCLUDE leaves kinds to numpy: the list must then name every
    # instruction of those kinds, as the runtime's own walk over each one does.
    monkeypatch.setenv("NEURONISH_NATIVE_EXCLUDE", exclude)
    io = {"inputs": {"x:0": [[4, compiler_scale.FEATURES], "float32", 0]}}
    for build in (compiler_scale.addn, compiler_scale.fusable, compiler_scale.relu_chain):
        g = build(60)
        exe = compile_executable(g.SerializeToString(),
                                 {**io, "outputs": [f"{g.node[-1].name}:0"]})
        listed = numpy_instructions(exe.programs, exe.values, exe.constants)
        assert exe.stats["numpy_instructions"] == listed
        assert [list(f) for f in exe.stats["numpy_instructions"]] == [list(f) for f in listed]
        if not exclude or "matmul" in exclude:  # none, or every graph has some
            assert bool(listed) == bool(exclude)


def test_the_verifier_skips_an_unedited_graph_unless_asked_for_full_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from neuronish.cc import verify as verify_module
    from neuronish.cc.pipeline import Pass, run_pipeline

    walks: list[int | str] = []
    real = verify_module.verify

    def counting(graph: object, changed: object = None) -> None:
        walks.append("full" if changed is None else len(changed))  # type: ignore[arg-type]
        real(graph, changed)  # type: ignore[arg-type]

    monkeypatch.setattr(verify_module, "verify", counting)
    g = compiler_scale.relu_chain(30)
    io = parse_io_config({"inputs": {"x:0": [[4, compiler_scale.FEATURES], "float32", 0]},
                          "outputs": ["r29:0"]})
    graph = lower_module.lower(parse_graph_def(g.SerializeToString()), io)
    noops = [Pass(f"noop{i}", lambda graph: graph) for i in range(5)]
    run_pipeline(graph, noops)
    # on entry (structure; the lowering typed every node) and after the last pass only
    assert walks == [0, "full"]
    walks.clear()
    monkeypatch.setattr(verify_module, "FULL", True)
    run_pipeline(graph, noops)
    assert walks == ["full"] * 7  # on entry, after each of the 5 passes, at the end
