"""Our GraphDef schema reads what TensorFlow writes (wire compatibility)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format

from neuronish.cc.errors import InvalidGraph
from neuronish.cc.graphdef import parse_graph_def, tensor_to_numpy


def _graph() -> tf.compat.v1.GraphDef:
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3], name="x")
        w = tf.constant(np.arange(3 * 3 * 3 * 4, dtype=np.float32).reshape(3, 3, 3, 4), name="w")
        y = tf.nn.conv2d(x, w, strides=[1, 2, 2, 1], padding="SAME", dilations=1, name="conv")
        splat = tf.constant(2.5, shape=[4], name="splat")  # stored as one float_val
        z = tf.add(y, splat, name="add")
        i64 = tf.constant([1, -2, 3], dtype=tf.int64, name="i64")
        tf.constant([True, False], name="flags")
        tf.constant(np.float16([1.5, -2.0]), name="half")
        with tf.control_dependencies([z.op]):
            tf.identity(i64, name="after")
    return g.as_graph_def()


def test_parses_what_tensorflow_serializes() -> None:
    gd = _graph()
    nodes = {n.name: n for n in parse_graph_def(gd.SerializeToString())}
    assert set(nodes) == {n.name for n in gd.node}
    conv = nodes["conv"]
    assert conv.op == "Conv2D"
    assert [str(r) for r in conv.inputs] == ["x:0", "w:0"]
    assert conv.attr["strides"] == [1, 2, 2, 1]
    assert conv.attr["padding"] == "SAME"
    assert conv.attr["data_format"] == "NHWC"
    assert conv.attr["T"] == "float32"
    assert nodes["x"].attr["shape"] == (-1, 8, 8, 3)
    assert nodes["after"].control_inputs == ["add"]
    for name in ("w", "splat", "i64", "flags", "half"):
        tf_value = tf.make_ndarray(next(n for n in gd.node if n.name == name).attr["value"].tensor)
        ours = tensor_to_numpy(nodes[name].attr["value"])
        assert ours.dtype == tf_value.dtype and ours.shape == tf_value.shape, name
        np.testing.assert_array_equal(ours, tf_value)


def test_parses_text_format() -> None:
    gd = _graph()
    text = text_format.MessageToString(gd).encode()
    nodes = parse_graph_def(text, text=True)
    assert [n.name for n in nodes] == [n.name for n in gd.node]


@pytest.mark.parametrize("data", [b"\xff\xff\xff\xff", b"", b"hello world"])
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(InvalidGraph):
        parse_graph_def(data)


def test_generated_schema_code_is_reproducible(tmp_path: Path) -> None:
    """The command in tf_graph.proto's header regenerates tf_graph_pb2.py byte for byte
    (grpcio-tools comes with the `test` extra)."""
    proto = Path(__file__).resolve().parents[2] / "cc" / "proto"
    header = (proto / "tf_graph.proto").read_text()
    assert "python -m grpc_tools.protoc -I cc/proto --python_out=cc/proto" in header
    r = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto}",
                        f"--python_out={tmp_path}", str(proto / "tf_graph.proto")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "tf_graph_pb2.py").read_bytes() == (proto / "tf_graph_pb2.py").read_bytes()


def _big_graph() -> tf.compat.v1.GraphDef:
    """Constants above the size from which the reader cuts tensor_content out of a node
    (kept as views of the file's bytes), next to small ones parsed whole."""
    g = tf.Graph()
    rng = np.random.default_rng(0)
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 256], name="x")
        w = tf.constant(rng.standard_normal((256, 512)).astype(np.float32), name="w")  # 512 KB
        b = tf.constant(rng.standard_normal(512).astype(np.float16), name="b")
        idx = tf.constant(rng.integers(0, 9, 40_000).astype(np.int64), name="idx")  # 320 KB
        tf.add(tf.matmul(x, w), tf.cast(b, tf.float32), name="y")
        tf.identity(idx, name="i")
    return g.as_graph_def()


def test_large_constants_are_views_of_the_file_and_equal_tensorflows(tmp_path: Path) -> None:
    from neuronish.cc.graphdef import TensorValue, load_graph_def
    from neuronish.cc.ir import constant

    gd = _big_graph()
    path = tmp_path / "g.pb"
    path.write_bytes(gd.SerializeToString())
    for nodes in (load_graph_def(path), parse_graph_def(gd.SerializeToString())):
        by_name = {n.name: n for n in nodes}
        assert [n.name for n in nodes] == [n.name for n in gd.node]
        assert isinstance(by_name["w"].attr["value"], TensorValue)  # cut out, not copied
        assert not isinstance(by_name["b"].attr["value"], TensorValue)  # small: parsed whole
        assert by_name["w"].attr["dtype"] == "float32"
        for name in ("w", "b", "idx"):
            want = tf.make_ndarray(next(n for n in gd.node if n.name == name).attr["value"].tensor)
            got = tensor_to_numpy(by_name[name].attr["value"])
            assert got.dtype == want.dtype and not got.flags.writeable
            np.testing.assert_array_equal(got, want)
        # The compiler's IR takes the views as they are (immutable: no copy of the weights).
        weights = tensor_to_numpy(by_name["w"].attr["value"])
        assert np.shares_memory(constant(weights).data, weights)


def test_cut_nodes_follow_protobufs_last_one_wins() -> None:
    """A map entry repeated for one key, or tensor_content given twice, means what
    protobuf's own parser makes of it: the later one."""
    from neuronish.cc.graphdef import TensorValue
    from neuronish.cc.proto import tf_graph_pb2 as pb

    def const(values: np.ndarray) -> bytes:
        node = pb.NodeDef(name="c", op="Const")
        node.attr["dtype"].type = pb.DT_FLOAT
        node.attr["value"].tensor.dtype = pb.DT_FLOAT
        node.attr["value"].tensor.tensor_shape.dim.add().size = values.size
        node.attr["value"].tensor.tensor_content = values.tobytes()
        return node.SerializeToString()

    first, second = np.zeros(40_000, np.float32), np.arange(40_000, dtype=np.float32)
    later = pb.NodeDef(attr={"value": pb.AttrValue(i=7)}).SerializeToString()
    for parts, want in (((const(first), const(second)), second),  # the later content wins
                        ((const(first), later), None)):  # the later entry replaces the tensor
        node = b"".join(parts)  # a message given twice: protobuf merges the two
        data = b"\x0a" + _varint(len(node)) + node  # GraphDef.node
        (parsed,) = parse_graph_def(data)
        reference = pb.GraphDef.FromString(data).node[0]
        if want is None:
            assert parsed.attr["value"] == 7 == reference.attr["value"].i
        else:
            assert isinstance(parsed.attr["value"], TensorValue)
            np.testing.assert_array_equal(tensor_to_numpy(parsed.attr["value"]), want)
            np.testing.assert_array_equal(tensor_to_numpy(reference.attr["value"].tensor), want)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def test_cut_reader_agrees_with_protobuf_on_damaged_bytes() -> None:
    """Byte-level damage to a GraphDef with large constants (around the structure the
    reader walks: tags and lengths of nodes, attribute entries, tensors): whatever
    protobuf's parser makes of it, the reader makes too, or both refuse it."""
    from neuronish.cc.proto import tf_graph_pb2 as pb

    data = _big_graph().SerializeToString()
    marks = [i for i in range(len(data) - 4) if data[i] in (0x0A, 0x2A, 0x12, 0x42, 0x22)]
    rng = np.random.default_rng(1)
    for _ in range(300):
        damaged = bytearray(data)
        at = int(rng.choice(marks)) + int(rng.integers(0, 4))
        damaged[at] = int(rng.integers(0, 256))
        try:
            want = pb.GraphDef.FromString(bytes(damaged))
        except Exception:  # noqa: BLE001 (protobuf refuses it: so must the reader)
            want = None
        try:
            got = parse_graph_def(bytes(damaged))
        except InvalidGraph:
            got = None
        if want is None or len({n.name for n in want.node}) < len(want.node) or not want.node:
            continue  # refused by protobuf, or by the reader's own checks either way
        assert got is not None, at
        assert [(n.name, n.op) for n in got] == [(n.name, n.op) for n in want.node], at
        for ours, theirs in zip(got, want.node, strict=True):
            for key, value in theirs.attr.items():
                if value.WhichOneof("value") == "tensor":
                    try:
                        expected = tensor_to_numpy(value.tensor)
                    except Exception:  # noqa: BLE001
                        continue
                    np.testing.assert_array_equal(tensor_to_numpy(ours.attr[key]), expected)


def test_runs_of_small_nodes_read_as_protobuf_reads_them() -> None:
    """Small nodes are parsed a run at a time: runs broken by a large node, by other
    GraphDef fields between nodes, and nodes whose length takes 1, 2 or 3 bytes (or an
    overlong varint) come out as protobuf's own parse of the whole GraphDef."""
    from neuronish.cc.proto import tf_graph_pb2 as pb

    def node(name: str, size: int = 0, inputs: tuple[str, ...] = ()) -> bytes:
        n = pb.NodeDef(name=name, op="Const", input=list(inputs))
        n.attr["value"].tensor.dtype = pb.DT_FLOAT
        n.attr["value"].tensor.tensor_shape.dim.add().size = size
        n.attr["value"].tensor.tensor_content = np.arange(size, dtype=np.float32).tobytes()
        return n.SerializeToString()

    def field(number: int, body: bytes, overlong: bool = False) -> bytes:
        length = _varint(len(body))
        if overlong:  # the same length in one byte more
            length = bytes(b | 0x80 for b in length) + b"\x00"
        return _varint(number << 3 | 2) + length + body

    versions = pb.VersionDef(producer=1).SerializeToString()
    data = b"".join([
        field(1, node("a")), field(1, node("b", 40, ("a", "^a"))),  # 1- and 2-byte lengths
        field(4, versions), field(1, node("c", 2, ("b:0",))),       # another field between
        field(1, node("big", 40_000)),                              # cut out (3-byte length)
        field(1, node("d", 3), overlong=True), field(1, node("e", 1, ("d", "big:0"))),
    ])
    want = pb.GraphDef.FromString(data)
    got = parse_graph_def(data)
    assert [n.name for n in got] == [n.name for n in want.node] == ["a", "b", "c", "big", "d", "e"]
    for ours, theirs in zip(got, want.node, strict=True):
        assert [str(r) for r in ours.inputs] + [f"^{c}" for c in ours.control_inputs] == \
            [i if i.startswith("^") else (i if ":" in i else f"{i}:0") for i in theirs.input]
        np.testing.assert_array_equal(tensor_to_numpy(ours.attr["value"]),
                                      tensor_to_numpy(theirs.attr["value"].tensor))
