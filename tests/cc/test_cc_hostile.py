"""neuronish-cc on hostile input: hundreds of damaged GraphDefs, io-configs and
paths. Every one ends with exit status 0, 1 or 2, never a traceback, nothing at
--output unless it compiled, and bounded memory.

Most cases run in-process through the same `main()` the `neuronish-cc` script
calls (fast); a sample, the memory-hungry ones among them, runs as the real
subprocess with its peak RSS measured. GraphDefs are built with the compiler's
own protobuf schema, so no TensorFlow is needed here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from neuronish.cc import cli
from neuronish.cc.proto import tf_graph_pb2 as pb

CC = str(Path(sys.executable).parent / "neuronish-cc")
IO = {"inputs": {"x:0": [[2, 4], "float32"]}, "outputs": ["y:0"]}
MAX_RSS_BYTES = 1 << 30  # peak RSS any one hostile compile may reach


# --------------------------------------------------------------------- graph builders


def _node(g: pb.GraphDef, name: str, op: str, inputs: tuple[str, ...] = (),
          **attrs: object) -> pb.NodeDef:
    n = g.node.add()
    n.name, n.op = name, op
    n.input.extend(inputs)
    for key, value in attrs.items():
        a = n.attr[key]
        if isinstance(value, pb.TensorProto):
            a.tensor.CopyFrom(value)
        elif isinstance(value, bytes):
            a.s = value
        elif isinstance(value, list):
            a.list.i.extend(value)
        elif isinstance(value, tuple):  # ("type", enum)
            a.type = value[1]
        else:
            a.i = value
    return n


def _tensor(shape: list[int], dtype: int = pb.DT_FLOAT, **fields: object) -> pb.TensorProto:
    t = pb.TensorProto(dtype=dtype)
    for d in shape:
        t.tensor_shape.dim.add(size=d)
    for key, value in fields.items():
        if isinstance(value, bytes):
            setattr(t, key, value)
        else:
            getattr(t, key).extend(value)
    return t


def good_weights() -> pb.TensorProto:
    return _tensor([4, 3], tensor_content=np.arange(12, dtype="<f4").tobytes())


def dense_graph(weights: pb.TensorProto | None = None,
                weight_dtype: int = pb.DT_FLOAT) -> pb.GraphDef:
    """y = relu(x @ w): x float32 [2, 4] fed, w a Const."""
    g = pb.GraphDef()
    _node(g, "x", "Placeholder", dtype=("type", pb.DT_FLOAT))
    _node(g, "w", "Const", dtype=("type", weight_dtype), value=weights or good_weights())
    _node(g, "m", "MatMul", ("x", "w"), T=("type", pb.DT_FLOAT))
    _node(g, "y", "Relu", ("m",), T=("type", pb.DT_FLOAT))
    return g


def pool_graph(op: str, ksize: int, padding: bytes) -> pb.GraphDef:
    g = pb.GraphDef()
    _node(g, "x", "Placeholder", dtype=("type", pb.DT_FLOAT))
    _node(g, "y", op, ("x",), T=("type", pb.DT_FLOAT), ksize=[1, ksize, ksize, 1],
          strides=[1, 1, 1, 1], padding=padding, data_format=b"NHWC")
    return g


# --------------------------------------------------------------------- the cases


@dataclass
class Case:
    name: str
    graph: bytes | str = b""  # bytes: written to g.pb; str: a path used as is
    io_config: str | dict = field(default_factory=lambda: dict(IO))
    args: tuple[str, ...] = ()
    output: str | None = None  # None: tmp/out.neff
    want: int | None = None  # the exit status, when the case decides it
    want_text: str = ""


def _constant_cases() -> Iterator[Case]:
    bad = {
        "negative dim": (_tensor([-1, 8], float_val=[1.0]), "every dim of a constant"),
        "2^31 x 1 splat": (_tensor([2**31, 1], float_val=[1.0]), "more than the limit"),
        "2^62 elements": (_tensor([2**31, 2**31], float_val=[1.0]), "more than the limit"),
        "rank 300": (_tensor([1] * 300, float_val=[1.0]), "at most 254"),
        "short content": (_tensor([4, 3], tensor_content=b"\0" * 47), "needs 48 bytes"),
        "long content": (_tensor([4, 3], tensor_content=b"\0" * 49), "needs 48 bytes"),
        "odd content": (_tensor([4, 3], tensor_content=b"\1" * 3), "needs 48 bytes"),
        "string dtype": (_tensor([4, 3], pb.DT_STRING), "dtype string"),
        "resource dtype": (_tensor([4, 3], pb.DT_RESOURCE), "dtype resource"),
        "unknown dtype 999": (_tensor([4, 3], 999), "dtype 999"),
    }
    for name, (tensor, text) in bad.items():
        yield Case(f"const {name}", dense_graph(tensor).SerializeToString(), want=1,
                   want_text=text)
    # Damaged but decodable the way TensorFlow decodes it: compiled (0) or refused (1)
    # by the lowerings' own checks; either way never a crash.
    odd = {
        "too many values": _tensor([4, 3], float_val=[1.0] * 20),
        "no values": _tensor([4, 3]),
        "wrong shape": _tensor([3, 4], float_val=[1.0]),
        "empty shape": _tensor([0, 3]),
        "scalar": _tensor([], float_val=[2.0]),
        "nan and inf": _tensor([4, 3], float_val=[float("nan"), float("inf"), -float("inf")]),
        "int8 out of range": _tensor([4, 3], pb.DT_INT8, int_val=[300, -300, 2**31 - 1]),
        "half out of range": _tensor([4, 3], pb.DT_HALF, half_val=[70000, -1, 2**31 - 1]),
        "uint8 content": _tensor([4, 3], pb.DT_UINT8, tensor_content=bytes(range(12))),
        "bool values": _tensor([4, 3], pb.DT_BOOL, bool_val=[True, False]),
        "int64 extremes": _tensor([4, 3], pb.DT_INT64, int64_val=[-(2**63), 2**63 - 1]),
        "double content": _tensor([4, 3], pb.DT_DOUBLE, tensor_content=b"\xff" * 96),
    }
    for name, tensor in odd.items():
        yield Case(f"const {name}", dense_graph(tensor).SerializeToString())
        yield Case(f"const {name} (dtype attr int32)",
                   dense_graph(tensor, pb.DT_INT32).SerializeToString())


def _graph_cases() -> Iterator[Case]:
    good = dense_graph().SerializeToString()
    yield Case("the good graph", good, want=0)
    rng = random.Random(12)
    for i in range(40):
        cut = rng.randrange(1, len(good))
        yield Case(f"truncated at {cut} ({i})", good[:cut])
    for i in range(40):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        yield Case(f"bit flips ({i})", bytes(data))
    for i in range(25):
        yield Case(f"random bytes ({i})", rng.randbytes(rng.randint(1, 400)))
    yield Case("empty file", b"", want=1, want_text="no nodes")
    yield Case("zeros", b"\0" * 1000, want=1)
    yield Case("deeply nested message", b"\x0a\x02" * 5000 + b"\x0a\x00", want=1)

    def graph(*nodes: tuple) -> bytes:
        g = pb.GraphDef()
        for args in nodes:
            _node(g, *args[:3], **(args[3] if len(args) > 3 else {}))
        return g.SerializeToString()

    f32 = {"T": ("type", pb.DT_FLOAT)}
    x = ("x", "Placeholder", (), {"dtype": ("type", pb.DT_FLOAT)})
    w = ("w", "Const", (), {"dtype": ("type", pb.DT_FLOAT), "value": good_weights()})
    cycles = {
        "control-edge cycle": graph(x, w, ("m", "MatMul", ("x", "w", "^y"), f32),
                                    ("y", "Relu", ("m",), f32)),
        "control-only cycle": graph(x, w, ("a", "NoOp", ("^b",)), ("b", "NoOp", ("^a",)),
                                    ("m", "MatMul", ("x", "w", "^a"), f32),
                                    ("y", "Relu", ("m",), f32)),
        "data cycle": graph(x, w, ("m", "MatMul", ("x", "y"), f32), ("y", "Relu", ("m",), f32)),
        "self loop": graph(x, w, ("m", "MatMul", ("x", "w"), f32),
                           ("y", "Relu", ("m", "^y"), f32)),
        "cycle off the outputs' path": graph(x, w, ("m", "MatMul", ("x", "w"), f32),
                                             ("y", "Relu", ("m",), f32),
                                             ("p", "Relu", ("q",), f32),
                                             ("q", "Relu", ("p",), f32)),
    }
    for name, data in cycles.items():
        yield Case(name, data, want=1, want_text="cycle")
    yield Case("Const without value", graph(x, ("w", "Const", (), {"dtype": ("type", pb.DT_FLOAT)}),
                                            ("m", "MatMul", ("x", "w"), f32),
                                            ("y", "Relu", ("m",), f32)),
               want=1, want_text="attribute 'value' is missing")
    yield Case("Const value not a tensor", graph(x, ("w", "Const", (), {"value": 5}),
                                                 ("m", "MatMul", ("x", "w"), f32),
                                                 ("y", "Relu", ("m",), f32)),
               want=1, want_text="attribute 'value' is not a tensor")
    yield Case("duplicate node name", graph(x, x, w, ("m", "MatMul", ("x", "w"), f32),
                                            ("y", "Relu", ("m",), f32)),
               want=1, want_text="appears twice")
    yield Case("input from a missing node", graph(x, ("m", "MatMul", ("x", "nope"), f32),
                                                  ("y", "Relu", ("m",), f32)), want=1)
    yield Case("control input from a missing node",
               graph(x, w, ("m", "MatMul", ("x", "w", "^nope"), f32),
                     ("y", "Relu", ("m",), f32)))
    yield Case("huge output index", graph(x, w, ("m", "MatMul", ("x", "w:99999999999999"), f32),
                                          ("y", "Relu", ("m",), f32)), want=1)
    yield Case("bad tensor name", graph(x, w, ("m", "MatMul", ("x", "w:zz"), f32),
                                        ("y", "Relu", ("m",), f32)), want=1)
    yield Case("unknown op", graph(x, ("y", "FrobnicateV9", ("x",), f32)), want=1)
    yield Case("op without attrs", graph(x, w, ("m", "MatMul", ("x", "w")),
                                         ("y", "Relu", ("m",))))
    for op in ("MaxPool", "AvgPool"):
        for ksize in (0, -3, 10**9, 2**62):
            for padding in (b"VALID", b"SAME", b"BOGUS"):
                yield Case(f"{op} ksize {ksize} {padding.decode()}",
                           pool_graph(op, ksize, padding).SerializeToString(),
                           {"inputs": {"x:0": [[1, 5, 5, 2], "float32"]}, "outputs": ["y:0"]})
    yield Case("text GraphDef garbage", b"node { name: 'x' op: ", want=1)


def _io_config_cases(tmp: Path) -> Iterator[Case]:
    good = dense_graph().SerializeToString()
    dtypes = ["(", "f4,f4", "V", "U", "O", "S3", "bfloat16", "string", "", " float32", "M8[zz]",
              "a" * 5000, "\u0000", "float32\n", "complex64", "object", ">f4", "()f4", "i8",
              "uint64", "qint8", "float128", "int4", "resource", "variant", "[", "{}", "half",
              "np.float32", "float32" * 100]
    for d in dtypes:
        yield Case(f"dtype {d[:20]!r}", good, {"inputs": {"x:0": [[2, 4], d]},
                                               "outputs": ["y:0"]})
    shapes: list[object] = [[-1, 4], [10**30, 4], [2**31, 2], [], [1] * 20, [1.5, 4], ["a"],
                            [True, 4], None, "2,4", [[2], [4]], [2, 4, 1], [0, 4], [2**62, 2**62]]
    for shape in shapes:
        yield Case(f"shape {str(shape)[:30]}", good, {"inputs": {"x:0": [shape, "float32"]},
                                                      "outputs": ["y:0"]})
    for axis in (99, -5, "0", 1e3, None, 2**70, True):
        yield Case(f"batch axis {axis!r}", good, {"inputs": {"x:0": [[2, 4], "float32", axis]},
                                                  "outputs": ["y:0"]})
    for name in ("x", "x:a", ":0", "x:0:0", "", "nope:0", "x:7", "w:0", "y:0"):
        yield Case(f"input name {name!r}", good, {"inputs": {name: [[2, 4], "float32"]},
                                                  "outputs": ["y:0"]})
    for outputs in ([], {}, "y:0", ["nosuch:0"], [1], [None], ["y:0", "y:0"], {"y:0": "a"},
                    {"y:0": 5}, ["x:0"], ["y:1"]):
        yield Case(f"outputs {str(outputs)[:30]}", good, {"inputs": IO["inputs"],
                                                          "outputs": outputs})
    texts = {
        "top-level list": "[]", "top-level string": '"x"', "top-level null": "null",
        "top-level number": "1", "extra key": json.dumps({**IO, "extra": 1}),
        "not JSON": "{inputs: x}", "truncated JSON": json.dumps(IO)[:-3],
        "nested 100000 deep": "[" * 100000 + "]" * 100000,
        "nested object 50000 deep": '{"a":' * 50000 + "1" + "}" * 50000,
        "nested inside inputs": '{"inputs": {"x:0": ' + "[" * 100000 + "]" * 100000 + "}}",
        "huge integer": '{"inputs": {"x:0": [[' + "9" * 5000 + ', 4], "float32"]}, '
                        '"outputs": ["y:0"]}',
        "1e999": '{"inputs": {"x:0": [[1e999, 4], "float32"]}, "outputs": ["y:0"]}',
        "NaN dim": '{"inputs": {"x:0": [[NaN, 4], "float32"]}, "outputs": ["y:0"]}',
        "duplicate keys": '{"inputs": {"x:0": [[2,4],"float32"], "x:0": [[2,4],"int32"]}, '
                          '"outputs": ["y:0"]}',
        "lone surrogate": '{"inputs": {"\\ud800": [[2,4],"float32"]}, "outputs": ["y:0"]}',
    }
    for name, text in texts.items():
        yield Case(f"io-config {name}", good, text)
    (tmp / "latin1.json").write_bytes(b'{"inputs": {"\xe9:0": [[2,4],"float32"]}}')
    (tmp / "big.json").write_bytes(b" " * (17 << 20) + json.dumps(IO).encode())
    (tmp / "a_dir").mkdir(exist_ok=True)
    files = {"/dev/zero": "larger than", str(tmp / "latin1.json"): "not UTF-8",
             str(tmp / "big.json"): "larger than", str(tmp / "a_dir"): "neither JSON",
             str(tmp / "missing.json"): "neither JSON", "/dev/null": "not valid JSON"}
    for path, text in files.items():
        yield Case(f"io-config file {path}", good, path, want=2, want_text=text)


def _path_cases(tmp: Path) -> Iterator[Case]:
    good = dense_graph().SerializeToString()
    a_file = tmp / "plain_file"
    a_file.write_text("keep me")
    (tmp / "out_dir").mkdir(exist_ok=True)
    yield Case("--output a directory", good, output=str(tmp / "out_dir"), want=2,
               want_text="is a directory")
    yield Case("--output /dev/full", good, output="/dev/full", want=2,
               want_text="not a regular file")
    yield Case("--output /dev/null", good, output="/dev/null", want=2)
    yield Case("--output under a file", good, output=str(a_file / "x.neff"), want=2)
    yield Case("--workdir a file", good, args=("--workdir", str(a_file)), want=2,
               want_text="not a directory")
    yield Case("--workdir under a file", good, args=("--workdir", str(a_file / "w")), want=2)
    yield Case("--workdir /dev/null", good, args=("--workdir", "/dev/null"), want=2)
    yield Case("graph is a directory", str(tmp / "out_dir"), want=1)
    yield Case("graph does not exist", str(tmp / "missing.pb"), want=1)
    yield Case("graph /dev/null", "/dev/null", want=1)
    for cores in ("1000000000", "65", "0", "-1", "abc", "1e3", str(2**70)):
        yield Case(f"--neuroncore-pipeline-cores {cores}", good,
                   args=("--neuroncore-pipeline-cores", cores), want=2)
    yield Case("--neuroncore-pipeline-cores 64", good,
               args=("--neuroncore-pipeline-cores", "64"), want=0)
    for flags in (("--auto-cast", "bogus"), ("--framework", "PYTORCH"), ("--verbose", "x"),
                  ("--unknown-flag",)):
        yield Case(f"flags {' '.join(flags)}", good, args=flags, want=2)


def all_cases(tmp: Path) -> list[Case]:
    cases = [*_constant_cases(), *_graph_cases(), *_io_config_cases(tmp), *_path_cases(tmp)]
    assert len({c.name for c in cases}) == len(cases), "case names must be unique"
    return cases


# --------------------------------------------------------------------- running them


def _argv(case: Case, workdir: Path) -> tuple[list[str], Path]:
    if isinstance(case.graph, bytes):
        graph = workdir / "g.pb"
        graph.write_bytes(case.graph)
    else:
        graph = Path(case.graph)
    io_config = case.io_config if isinstance(case.io_config, str) else json.dumps(case.io_config)
    if len(io_config) > 60_000:  # longer than one command-line argument may be
        (workdir / "io.json").write_text(io_config)
        io_config = str(workdir / "io.json")
    output = Path(case.output) if case.output else workdir / "out.neff"
    argv = ["compile", str(graph), "--framework", "TENSORFLOW", "--io-config", io_config,
            "--output", str(output)]
    flags = list(case.args)
    if "--framework" in flags:  # the case replaces the framework
        i = argv.index("--framework")
        del argv[i:i + 2]
    return [*argv, *flags], output


def _run_in_process(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 2
    return code, err.getvalue()


def _check(case: Case, code: int, stderr: str, output: Path, existed: bool) -> list[str]:
    wrong = []
    if code not in (0, 1, 2):
        wrong.append(f"exit status {code}")
    if case.want is not None and code != case.want:
        wrong.append(f"exit status {code}, want {case.want}")
    if "Traceback" in stderr:
        wrong.append("a traceback on stderr")
    if code != 0 and not stderr.strip():
        wrong.append("failed without a message")
    if case.want_text and case.want_text not in stderr:
        wrong.append(f"stderr lacks {case.want_text!r}")
    if code != 0 and not existed and os.path.lexists(output):
        wrong.append(f"left {output} behind")
    if code != 0 and output.parent.is_dir() and not str(output).startswith("/dev/"):
        leftovers = [p.name for p in output.parent.glob(f".{output.name}.*.tmp")]
        if leftovers:
            wrong.append(f"left temporary files {leftovers}")
    return [f"{case.name}: {w}\n{stderr[-1500:]}" for w in wrong]


def test_hostile_inputs_in_process(tmp_path: Path) -> None:
    cases = all_cases(tmp_path)
    assert len(cases) >= 200
    failures, codes = [], {0: 0, 1: 0, 2: 0}
    for i, case in enumerate(cases):
        workdir = tmp_path / f"case{i}"
        workdir.mkdir()
        argv, output = _argv(case, workdir)
        existed = os.path.lexists(output)
        code, stderr = _run_in_process(argv)
        codes[code] = codes.get(code, 0) + 1
        failures += _check(case, code, stderr, output, existed)
        if code == 0:
            assert output.is_file() and output.stat().st_size > 0, case.name
    # Device nodes are never replaced by a file.
    assert Path("/dev/full").is_char_device() and Path("/dev/null").is_char_device()
    assert (tmp_path / "plain_file").read_text() == "keep me"
    print(f"{len(cases)} hostile cases: exit statuses {codes}")
    assert not failures, "\n\n".join(failures)


SUBPROCESS_SAMPLE = ("const 2^31 x 1 splat", "const 2^62 elements", "io-config file /dev/zero",
                     "io-config nested 100000 deep", "io-config huge integer",
                     "--output /dev/full", "--output a directory", "--workdir a file",
                     "--neuroncore-pipeline-cores 1000000000", "control-edge cycle",
                     "const negative dim", "MaxPool ksize 1000000000 SAME", "the good graph")


def _peak_rss(pid: int) -> int:
    """VmHWM of `pid` once it runs neuronish-cc (before its exec, the forked child still
    counts this test process's memory, TensorFlow and all); 0 if not readable."""
    try:
        if b"neuronish-cc" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _run_subprocess(argv: list[str]) -> tuple[int, str, int]:
    """Exit status, stderr and peak RSS (sampled every 5 ms) of one real neuronish-cc."""
    with open(os.devnull, "wb") as devnull, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([CC, *argv], stdout=devnull, stderr=err)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _peak_rss(proc.pid))
            time.sleep(0.005)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    return proc.returncode, stderr, peak


def test_hostile_inputs_as_subprocesses(tmp_path: Path) -> None:
    by_name = {c.name: c for c in all_cases(tmp_path)}
    failures, peaks = [], []
    for i, name in enumerate(SUBPROCESS_SAMPLE):
        workdir = tmp_path / f"sub{i}"
        workdir.mkdir()
        argv, output = _argv(by_name[name], workdir)
        existed = os.path.lexists(output)
        code, stderr, rss = _run_subprocess(argv)
        failures += _check(by_name[name], code, stderr, output, existed)
        if rss > MAX_RSS_BYTES:
            failures.append(f"{name}: peak RSS {rss >> 20} MiB")
        peaks.append((rss, name, code))
    rss, name, code = max(peaks)
    print(f"{len(peaks)} hostile cases as neuronish-cc subprocesses: exit statuses "
          f"{sorted(c for _, _, c in peaks)}, largest peak RSS {rss >> 20} MiB ({name})")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("op", ["MaxPool", "AvgPool"])
def test_a_same_window_larger_than_the_input_is_the_whole_input(op: str, tmp_path: Path) -> None:
    """TensorFlow's reference kernel computes a SAME pool with ksize 10^9 at once (its
    oneDNN kernel refuses it): every output is the max/mean over the whole input."""
    from neuronish.runtime import load

    graph = tmp_path / "g.pb"
    graph.write_bytes(pool_graph(op, 10**9, b"SAME").SerializeToString())
    io_config = {"inputs": {"x:0": [[1, 5, 5, 2], "float32"]}, "outputs": ["y:0"]}
    code, stderr = _run_in_process(["compile", str(graph), "--framework", "TENSORFLOW",
                                    "--io-config", json.dumps(io_config),
                                    "--output", str(tmp_path / "p.neff")])
    assert code == 0, stderr
    x = np.random.default_rng(0).standard_normal((1, 5, 5, 2)).astype(np.float32)
    model = load(str(tmp_path / "p.neff"))
    try:
        y = model.run({"x:0": x})["y:0"]
    finally:
        model.unload()
    reduce = np.max if op == "MaxPool" else np.mean
    want = np.broadcast_to(reduce(x, axis=(1, 2), keepdims=True), x.shape)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
