"""Executable fuzzing: mutants of real executables, each loaded and run in a child process.

An executable is untrusted input: a file whose checksum was re-sealed after
any change must be refused with one of the runtime's own errors, or load and run;
never crash the process (a signal), hang, or escape as a foreign exception.

- Seeds are real executables: the golden file (two pipeline cores) and small graphs
  compiled here by neuronish-cc's own pipeline (built as TF nodes, no TensorFlow)
  covering every instruction kind, one with `--auto-cast matmult`.
- Mutants are field-level (the msgpack body: attrs, shapes, dtypes, value ids,
  offsets, scratch, programs, signatures, constants) and byte-level (flipped,
  inserted, deleted or truncated bytes of the body), always with the header's
  length and SHA-256 re-sealed, so every mutant reaches the body's checks.
- Children each take a batch of mutants and report `start i` before and the outcome
  after each one; the parent gives each mutant a deadline, so a hang or a crash is
  pinned to its mutant, the child is replaced and the batch goes on after it.

`tests/runtime/test_executable_fuzz.py` runs 6000 mutants in CI (4000 on the native engine,
2000 on numpy); `scripts/fuzz_executables.py` runs more and prints the figures.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "conv_bn.neff"
HEADER = struct.Struct("<8sIIQ32s")
HEADER_SIZE = HEADER.size

# --- seeds: real executables ---------------------------------------------------------------


class _Graph:
    """A few TF nodes, as neuronish-cc's GraphDef reader would produce them."""

    def __init__(self) -> None:
        from neuronish.cc.graphdef import TensorRef, TFNode

        self._node, self._ref = TFNode, TensorRef
        self.nodes: list = []
        self.rng = np.random.default_rng(7)

    def op(self, name: str, op: str, inputs: list[str], **attr: object) -> str:
        self.nodes.append(self._node(name, op, [self._ref.parse(i) for i in inputs], [], attr))
        return name

    def const(self, name: str, value: object, dtype: str = "float32") -> str:
        from neuronish.cc.proto import tf_graph_pb2 as pb

        a = np.asarray(value, dtype=dtype)
        enum = {"float32": pb.DT_FLOAT, "int32": pb.DT_INT32, "int64": pb.DT_INT64}[dtype]
        shape = pb.TensorShapeProto(dim=[pb.TensorShapeProto.Dim(size=d) for d in a.shape])
        tensor = pb.TensorProto(dtype=enum, tensor_shape=shape, tensor_content=a.tobytes())
        return self.op(name, "Const", [], dtype=dtype, value=tensor)

    def weights(self, name: str, *shape: int) -> str:
        return self.const(name, self.rng.standard_normal(shape).astype(np.float32) * 0.3)


def _cnn() -> tuple[list, dict]:
    """conv (bias, relu) → dilated depthwise → max pool → 1x1 conv + residual → relu6 →
    avg pool → mean → matmul → softmax, and a 1x1 stride-2 projection of the relu6."""
    g = _Graph()
    nhwc = {"T": "float32", "data_format": "NHWC"}
    g.op("x", "Placeholder", [], dtype="float32")
    g.op("c1", "Conv2D", ["x", g.weights("w1", 3, 3, 4, 8)], strides=[1, 2, 2, 1],
         padding="SAME", dilations=[1, 1, 1, 1], **nhwc)
    g.op("b1", "BiasAdd", ["c1", g.weights("bias1", 8)], **nhwc)
    g.op("r1", "Relu", ["b1"], T="float32")
    g.op("d1", "DepthwiseConv2dNative", ["r1", g.weights("wd", 3, 3, 8, 1)],
         strides=[1, 1, 1, 1], padding="SAME", dilations=[1, 2, 2, 1], **nhwc)
    g.op("m1", "MaxPool", ["d1"], ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="SAME",
         **nhwc)
    g.op("c2", "Conv2D", ["m1", g.weights("w2", 1, 1, 8, 8)], strides=[1, 1, 1, 1],
         padding="VALID", dilations=[1, 1, 1, 1], **nhwc)
    g.op("a2", "AddV2", ["c2", "m1"], T="float32")
    g.op("r2", "Relu6", ["a2"], T="float32")
    # A ResNet-style 1x1 stride-2 projection: its output shape does not depend on the
    # dilation, so a hostile dilation keeps every type consistent (it once crashed the engine).
    g.op("proj", "Conv2D", ["r2", g.weights("w3", 1, 1, 8, 6)], strides=[1, 2, 2, 1],
         padding="VALID", dilations=[1, 1, 1, 1], **nhwc)
    g.op("ap", "AvgPool", ["r2"], ksize=[1, 2, 2, 1], strides=[1, 1, 1, 1], padding="VALID",
         **nhwc)
    g.op("mean", "Mean", ["ap", g.const("axes", [1, 2], "int32")], T="float32",
         Tidx="int32", keep_dims=False)
    g.op("mm", "MatMul", ["mean", g.weights("wm", 8, 5)], T="float32", transpose_a=False,
         transpose_b=False)
    g.op("sm", "Softmax", ["mm"], T="float32")
    io = {"inputs": {"x:0": [[2, 9, 9, 4], "float32"]}, "outputs": ["sm:0", "r2:0", "proj:0"]}
    return g.nodes, io


def _wide() -> tuple[list, dict]:
    """Convolutions with thousands of output pixels: the im2col kernel works in blocks of
    at least 2048 rows, so its scratch no longer grows with the output and a hostile
    window reaches its strided view (in small seeds the scratch check stops it first).
    16 channels throughout, so the native engine keeps the chain channel-blocked."""
    g = _Graph()
    nhwc = {"T": "float32", "data_format": "NHWC"}
    g.op("x", "Placeholder", [], dtype="float32")
    g.op("c1", "Conv2D", ["x", g.weights("w1", 3, 3, 16, 16)], strides=[1, 1, 1, 1],
         padding="SAME", dilations=[1, 1, 1, 1], **nhwc)
    g.op("d1", "DepthwiseConv2dNative", ["c1", g.weights("wd", 3, 3, 16, 1)],
         strides=[1, 1, 1, 1], padding="VALID", dilations=[1, 1, 1, 1], **nhwc)
    g.op("m1", "MaxPool", ["d1"], ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="VALID",
         **nhwc)
    g.op("c2", "Conv2D", ["m1", g.weights("w2", 3, 3, 16, 16)], strides=[1, 1, 1, 1],
         padding="VALID", dilations=[1, 1, 1, 1], **nhwc)
    io = {"inputs": {"x:0": [[1, 96, 96, 16], "float32"]}, "outputs": ["c2:0"]}
    return g.nodes, io


def _tensors() -> tuple[list, dict]:
    """Movement, gather/one-hot, select, reductions, casts, resizes."""
    g = _Graph()
    f32 = {"T": "float32"}
    g.op("x", "Placeholder", [], dtype="float32")
    g.op("idx", "Placeholder", [], dtype="int32")
    g.op("rs", "Reshape", ["x", g.const("s1", [2, 3, 2], "int32")], Tshape="int32", **f32)
    g.op("tp", "Transpose", ["rs", g.const("perm", [0, 2, 1], "int32")], Tperm="int32", **f32)
    g.op("cc", "ConcatV2", ["tp", "tp", g.const("ax1", 1, "int32")], N=2, Tidx="int32", **f32)
    g.op("ss", "StridedSlice", ["cc", g.const("b", [0, 3, 0], "int32"),
                                g.const("e", [2, 0, 3], "int32"),
                                g.const("st", [1, -1, 2], "int32")], Index="int32",
         begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0, **f32)
    g.op("mp", "MirrorPad", ["ss", g.const("mpad", [[0, 0], [1, 1], [1, 0]], "int32")],
         mode="REFLECT", Tpaddings="int32", **f32)
    g.op("pd", "Pad", ["mp", g.const("pads", [[0, 0], [0, 1], [2, 0]], "int32")],
         Tpaddings="int32", **f32)
    g.op("tl", "Tile", ["pd", g.const("mult", [1, 1, 2], "int32")], Tmultiples="int32", **f32)
    g.op("gt", "GatherV2", ["x", "idx", g.const("gax", 1, "int32")], Tparams="float32",
         Tindices="int32", Taxis="int32", batch_dims=1)
    g.op("oh", "OneHot", ["idx", g.const("depth", 4, "int32"), g.const("on", 1.0),
                          g.const("off", 0.0)], T="float32", TI="int32", axis=-1)
    g.op("pos", "Greater", ["gt", g.const("zero", 0.0)], **f32)
    g.op("ex", "Exp", ["gt"], **f32)
    g.op("sel", "SelectV2", ["pos", "gt", "ex"], **f32)
    g.op("am", "ArgMax", ["tl", g.const("amax", 2, "int32")], T="float32", Tidx="int32",
         output_type="int64")
    g.op("cast", "Cast", ["am"], SrcT="int64", DstT="float32")
    g.op("sum", "Sum", ["oh", g.const("sax", [2], "int32")], T="float32", Tidx="int32",
         keep_dims=True)
    g.op("bc", "BroadcastTo", ["sel", g.const("bshape", [3, 2, 3], "int32")], Tidx="int32",
         **f32)
    g.op("img", "Reshape", ["x", g.const("s2", [2, 2, 3, 1], "int32")], Tshape="int32", **f32)
    g.op("rb", "ResizeBilinear", ["img", g.const("size", [4, 5], "int32")],
         align_corners=False, half_pixel_centers=True, **f32)
    g.op("rn", "ResizeNearestNeighbor", ["img", g.const("size2", [3, 7], "int32")],
         align_corners=True, half_pixel_centers=False, **f32)
    g.op("lsm", "LogSoftmax", ["tl"], **f32)
    io = {"inputs": {"x:0": [[2, 6], "float32"], "idx:0": [[2, 3], "int32"]},
          "outputs": ["x:0", "tl:0", "sel:0", "am:0", "cast:0", "sum:0", "bc:0", "rb:0", "rn:0",
                      "lsm:0"]}
    return g.nodes, io


def seed_executables() -> dict[str, bytes]:
    """The golden file and executables compiled here, each covering other kinds."""
    from neuronish.cc.compiler import compile_graph

    seeds = {"golden_conv_bn": GOLDEN.read_bytes()}
    nodes, io = _cnn()
    seeds["cnn"] = compile_graph(nodes, io)
    seeds["cnn_bf16_2cores"] = compile_graph(nodes, io, auto_cast="matmult",
                                             auto_cast_type="bf16", pipeline_cores=2)
    seeds["wide"] = compile_graph(*_wide())
    nodes, io = _tensors()
    seeds["tensors"] = compile_graph(nodes, io)
    return seeds


# --- mutations -----------------------------------------------------------------------------

INTS = [-(2**63), -(2**31), -10**9, -2, -1, 0, 1, 2, 3, 7, 64, 255, 2**16, 2**31 - 1, 2**31,
        10**9, 2**62, 2**64 - 1]
STRS = ["", "none", "relu", "max", "avg", "sum", "float32", "float64", "int32", "bool",
        "bfloat16", "complex64", "object", "S8", "V4", "conv2d", "pool", "matmul", "copy",
        "reflect", "nearest", "nhwc", "nChw16c", "\x00", "x" * 300]
WINDOWED = ("conv2d", "depthwise_conv2d", "pool")
FLOATS = [float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 0.5, 1e308, -1e-308]


def seal(body: bytes, version: int = 1) -> bytes:
    return HEADER.pack(b"NRNISHEX", version, 0, len(body), hashlib.sha256(body).digest()) + body


def _any_value(rng: random.Random, depth: int = 0) -> object:
    pick = rng.randrange(9 if depth < 2 else 6)
    if pick == 0:
        return rng.choice(INTS)
    if pick == 1:
        return rng.choice(STRS)
    if pick == 2:
        return rng.choice(FLOATS)
    if pick == 3:
        return rng.choice([True, False, None])
    if pick == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(12)))
    if pick == 5:
        return rng.randrange(-4, 40)
    if pick == 6:
        return [_any_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    if pick == 7:
        return [rng.choice(INTS) for _ in range(rng.randrange(1, 6))]
    return {rng.choice(STRS): _any_value(rng, depth + 1) for _ in range(rng.randrange(3))}


def _tweak(value: object, rng: random.Random) -> object:
    """A plausible-but-wrong variant of `value` (same type mostly), or anything."""
    if rng.random() < 0.15:
        return _any_value(rng)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([value + rng.choice([-2, -1, 1, 2]), -value, -1, 0, value * 2,
                           value * 1000, rng.choice(INTS)])
    if isinstance(value, float):
        return rng.choice([*FLOATS, value * -1, value + 1])
    if isinstance(value, str):
        return rng.choice(STRS)
    if isinstance(value, bytes):
        cut = rng.randrange(len(value) + 1)
        return rng.choice([value[:cut], value + value[:cut], b""])
    if isinstance(value, list):
        if not value or rng.random() < 0.2:
            return rng.choice([[], value + [rng.choice(INTS)], value[:-1], [value],
                               value * 2])
        out = list(value)
        i = rng.randrange(len(out))
        out[i] = _tweak(out[i], rng)
        return out
    if isinstance(value, dict):
        out = dict(value)
        if out and rng.random() < 0.3:
            out.pop(rng.choice(list(out)))
        elif out:
            k = rng.choice(list(out))
            out[k] = _tweak(out[k], rng)
        return out
    return _any_value(rng)


def _paths(obj: object, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys / indices) into the body, except constant payload bytes."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


def _get(obj: object, path: tuple) -> object:
    for k in path:
        obj = obj[k]  # type: ignore[index]
    return obj


def _set(obj: object, path: tuple, value: object) -> None:
    _get(obj, path[:-1])[path[-1]] = value  # type: ignore[index]


def _instructions(body: dict) -> list[dict]:
    return [i for p in body["programs"] for i in p]


def _mutate_instruction(body: dict, rng: random.Random) -> str:
    found = _instructions(body)
    if not found:
        return "no-instruction"
    # Windowed kinds index strided views by their attributes: mutate them more often.
    ins = rng.choices(found, [3 if i.get("kind") in WINDOWED else 1 for i in found])[0]
    kind = ins["kind"]
    r = rng.random()
    attrs = ins["attrs"]
    if r < 0.55 and attrs:  # one attribute: the class of mutant that once crashed the engine
        key = rng.choice(list(attrs))
        attrs[key] = _tweak(attrs[key], rng)
        return f"attr:{kind}.{key}"
    if r < 0.62:
        if attrs and rng.random() < 0.5:
            key = rng.choice(list(attrs))
            del attrs[key]
            return f"attr-drop:{kind}.{key}"
        attrs[rng.choice(["groups", "residual", "layout", "axis", "alpha", "fn"])] = \
            _any_value(rng)
        return f"attr-add:{kind}"
    if r < 0.72:
        field_ = rng.choice(["in", "out"])
        ins[field_] = _tweak(ins[field_], rng)
        return f"ids:{kind}.{field_}"
    if r < 0.80:
        ins["kind"] = rng.choice(["conv2d", "depthwise_conv2d", "pool", "matmul", "reduce",
                                  "unary", "binary", "transpose", "reshape", "strided_slice",
                                  "pad", "tile", "gather", "concat", "one_hot", "resize",
                                  "softmax", "argminmax", "copy", "cast", "fft"])
        return f"kind:{kind}->{ins['kind']}"
    if r < 0.88:
        ins["scratch"] = _tweak(ins["scratch"], rng) if ins["scratch"] else \
            [rng.choice(INTS), rng.choice(INTS)]
        return f"scratch:{kind}"
    if r < 0.94:
        ins["tf"] = _tweak(ins["tf"], rng)
        return f"tf:{kind}"
    ins.pop(rng.choice(["kind", "in", "out", "attrs", "scratch", "tf"]))
    return f"field-drop:{kind}"


def _mutate_window(body: dict, rng: random.Random) -> str:
    """One entry of a windowed instruction's strides/dilations/pads/ksize: the values
    that once made strided views read outside their buffers."""
    found = [i for i in _instructions(body) if i.get("kind") in WINDOWED]
    if not found:
        return _mutate_instruction(body, rng)
    ins = rng.choice(found)
    key = rng.choice([k for k in ("strides", "dilations", "pads", "ksize") if k in ins["attrs"]])
    values = list(ins["attrs"][key])
    for _ in range(1 + (rng.random() < 0.3)):
        values[rng.randrange(len(values))] = rng.choice(
            [-(10**9), -1000, -7, -2, -1, 0, 2, 3, 5, 17, 10**9])
    ins["attrs"][key] = values
    return f"window:{ins['kind']}.{key}={values}"


def _mutate_body(body: dict, rng: random.Random) -> str:
    r = rng.random()
    if r < 0.15:
        return _mutate_window(body, rng)
    if r < 0.5:
        return _mutate_instruction(body, rng)
    if r < 0.55:  # value types
        v = rng.choice(body["values"])
        i = rng.randrange(3)
        v[i] = _tweak(v[i], rng)
        return f"values[{i}]"
    if r < 0.63:  # memory plan
        mem = body["memory"]
        if rng.random() < 0.3 or not mem["offsets"]:
            mem["arena_bytes"] = _tweak(mem["arena_bytes"], rng)
            return "arena_bytes"
        off = rng.choice(mem["offsets"])
        i = rng.randrange(2)
        off[i] = _tweak(off[i], rng)
        return f"offsets[{i}]"
    if r < 0.71:  # signatures
        sig = rng.choice(body[rng.choice(["inputs", "outputs"])])
        key = rng.choice(list(sig))
        sig[key] = _tweak(sig[key], rng)
        return f"sig.{key}"
    if r < 0.77:  # constants (not the payload's bytes: byte-level mutants do those)
        c = rng.choice(body["constants"])
        key = rng.choice(["value", "shape", "dtype", "data"])
        c[key] = _tweak(c[key], rng)
        return f"constant.{key}"
    if r < 0.85:  # programs: reorder, drop, duplicate, move between cores
        progs = body["programs"]
        p = rng.choice(progs)
        op = rng.randrange(5)
        if op == 0 and len(p) > 1:
            i, j = rng.sample(range(len(p)), 2)
            p[i], p[j] = p[j], p[i]
        elif op == 1 and p:
            p.pop(rng.randrange(len(p)))
        elif op == 2 and p:
            p.insert(rng.randrange(len(p) + 1), copy.deepcopy(rng.choice(p)))
        elif op == 3:
            progs.append([])
        else:
            progs.reverse()
        return f"programs:{op}"
    # anything anywhere
    paths = [p for p in _paths(body) if p]
    path = rng.choice(paths)
    if rng.random() < 0.2 and isinstance(_get(body, path[:-1]), dict):
        del _get(body, path[:-1])[path[-1]]  # type: ignore[attr-defined]
        return f"drop:{path[0]}"
    _set(body, path, _tweak(_get(body, path), rng))
    return f"any:{path[0]}"


def _mutate_bytes(body: bytes, rng: random.Random) -> tuple[bytes, str]:
    b = bytearray(body)
    op = rng.randrange(5)
    if op == 0:
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b), "bytes:set"
    if op == 1:
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
        return bytes(b), "bytes:bitflip"
    if op == 2:
        i = rng.randrange(len(b))
        return bytes(b[:i] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
                     + b[i:]), "bytes:insert"
    if op == 3:
        i = rng.randrange(len(b))
        return bytes(b[:i] + b[i + rng.randrange(1, 9):]), "bytes:delete"
    return bytes(b[:rng.randrange(len(b))]), "bytes:truncate"


def mutants(seeds: dict[str, bytes], count: int, seed: int) -> list[tuple[str, bytes]]:
    """`count` re-sealed mutants, about 3/4 field-level and 1/4 byte-level."""
    rng = random.Random(seed)
    names = sorted(seeds)
    bodies = {n: seeds[n][HEADER_SIZE:] for n in names}
    out = []
    for _ in range(count):
        name = rng.choice(names)
        if rng.random() < 0.25:
            data, what = _mutate_bytes(bodies[name], rng)
        else:
            while True:  # until a mutation applies (a first one can break the second's
                # path) and the mutant is msgpack-encodable (ints within 64 bits)
                body = msgpack.unpackb(bodies[name], strict_map_key=False)
                try:
                    what = "; ".join(_mutate_body(body, rng)
                                     for _ in range(1 + (rng.random() < 0.2)))
                    data = msgpack.packb(body, use_bin_type=True)
                    break
                except (KeyError, IndexError, TypeError, AttributeError, ValueError,
                        OverflowError):
                    continue
        out.append((f"{name} {what}", seal(data)))
    return out


# --- the child: load and run each mutant, report each outcome ------------------------------

def _inputs(model: object, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for sig in model.inputs:  # type: ignore[attr-defined]
        dtype = np.dtype(sig.dtype)
        if dtype.kind == "f":
            x = rng.standard_normal(sig.shape).astype(dtype)
        elif dtype.kind == "b":
            x = rng.random(sig.shape) < 0.5
        else:
            x = rng.integers(0, 3, size=sig.shape).astype(dtype)  # valid indices mostly
        feeds[sig.name] = x
    return feeds


def child(path: str, start: int) -> None:
    """Run mutants start.. of the file at `path`; print `S i` before, `R i outcome` after."""
    from neuronish.cc.device_model import estimate, load_device
    from neuronish.runtime import Device, DeviceError, load
    from neuronish.runtime.config import DeviceConfig
    from neuronish.runtime.executable import describe, from_bytes

    device_model = load_device(None)

    items = msgpack.unpackb(Path(path).read_bytes())
    device = Device(DeviceConfig.from_env({"NEURONISH_NUM_CORES": "4",
                                           "NEURONISH_CORE_MEMORY": "256MiB"}))
    rng = np.random.default_rng(0)
    out = sys.stdout
    canary = dict(kv.split("=")[::-1] for kv in os.environ.get(
        "NEURONISH_FUZZ_CANARY", "").split(",") if kv)  # index -> what (harness self-test)
    for i in range(start, len(items)):
        out.write(f"S {i}\n")
        out.flush()
        outcome = "ok"
        if canary.get(str(i)) == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if canary.get(str(i)) == "hang":
            time.sleep(3600)
        try:
            if canary.get(str(i)) == "foreign":
                raise TypeError("canary")
            # What `neuronish-cc inspect --json` shows of a file that passes the reader.
            exe = from_bytes(items[i])
            json.dumps({**describe(exe), "modelled": estimate(exe, device_model).to_stats()})
            model = load(items[i], device=device)
            try:
                model.run(_inputs(model, rng))
            finally:
                model.unload()
        except DeviceError as e:
            outcome = f"runtime:{type(e).__name__} " + str(e).replace("\n", " ")[:300]
        except Exception as e:  # a finding: not one of the runtime's errors
            text = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            outcome = f"foreign:{text}"
        used = sum(m["used"] for m in device.memory_report().values())
        if used and not outcome.startswith("foreign"):
            outcome = f"leak:{used} bytes still reserved after {outcome}"
            device = Device(DeviceConfig.from_env({"NEURONISH_NUM_CORES": "4",
                                                   "NEURONISH_CORE_MEMORY": "256MiB"}))
        out.write(f"R {i} {outcome}\n")
        out.flush()


# --- the parent: children, deadlines, figures ----------------------------------------------

@dataclass
class Report:
    total: int = 0
    outcomes: Counter = field(default_factory=Counter)  # ok / runtime:<class> / ...
    crashes: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    examples: dict = field(default_factory=dict)  # outcome -> a few of its mutants
    seconds: float = 0.0

    @property
    def failures(self) -> list[str]:
        return self.crashes + self.hangs + self.foreign + self.leaks

    def summary(self) -> str:
        lines = [f"{self.total} mutants in {self.seconds:.1f} s: {len(self.crashes)} crashes, "
                 f"{len(self.hangs)} hangs, {len(self.foreign)} foreign exceptions, "
                 f"{len(self.leaks)} leaks"]
        lines += [f"  {n:5d}  {k}" for k, n in self.outcomes.most_common()]
        lines += [f"  FAIL {f}" for f in self.failures[:50]]
        return "\n".join(lines)


def _child_env(engine: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if engine:
        env["NEURONISH_ENGINE"] = engine
    env.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "NEURONISH_KERNEL_THREADS": "1", "PYTHONPATH": str(ROOT)})
    return env


def _limit_memory() -> None:  # in the child, before exec: a runaway allocation fails
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def run_batch(items: list[tuple[str, bytes]], timeout: float, report: Report,
              engine: str | None = None) -> None:
    """Run `items` in children (replaced after a crash or hang), recording outcomes."""
    with tempfile.NamedTemporaryFile(suffix=".mutants", delete=False) as f:
        f.write(msgpack.packb([data for _, data in items], use_bin_type=True))
        path = f.name
    try:
        start = 0
        while start < len(items):
            start = _one_child(items, path, start, timeout, report, engine)
    finally:
        os.unlink(path)


def _one_child(items: list[tuple[str, bytes]], path: str, start: int, timeout: float,
               report: Report, engine: str | None) -> int:
    """Run a child from mutant `start`; returns where the next child must start."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from tests.runtime.executable_fuzz "
                             "import child; child(sys.argv[1], int(sys.argv[2]))",
                             path, str(start)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=ROOT, env=_child_env(engine), preexec_fn=_limit_memory)
    assert proc.stdout is not None
    current, buf = None, b""
    # The first mutant also waits for the child's imports.
    deadline = time.monotonic() + timeout + 30
    while True:
        wait = deadline - time.monotonic()
        ready = select.select([proc.stdout], [], [], max(wait, 0))[0] if wait > 0 else []
        if not ready:  # the mutant in progress hangs
            proc.kill()
            proc.wait()
            if current is None:
                raise RuntimeError(f"fuzz child did not start: {proc.stderr.read()[-2000:]!r}")
            report.hangs.append(f"#{current} {items[current][0]}")
            report.total += 1
            return current + 1
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:  # the child ended
            code = proc.wait()
            err = proc.stderr.read().decode(errors="replace")[-1500:] if proc.stderr else ""
            if current is None:
                if code == 0:
                    return len(items)
                raise RuntimeError(f"fuzz child failed to start (exit {code}): {err}")
            report.total += 1
            what = f"signal {-code}" if code < 0 else f"exit {code}"
            report.crashes.append(f"#{current} {items[current][0]}: {what} {err!r}")
            return current + 1
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            tag, _, rest = line.decode(errors="replace").partition(" ")
            if tag == "S":
                current = int(rest)
                deadline = time.monotonic() + timeout
            elif tag == "R":
                i, _, outcome = rest.partition(" ")
                report.total += 1
                label = f"#{i} {items[int(i)][0]}: {outcome}"
                if outcome.startswith("foreign:"):
                    report.foreign.append(label)
                    report.outcomes["foreign"] += 1
                elif outcome.startswith("leak:"):
                    report.leaks.append(label)
                    report.outcomes["leak"] += 1
                else:
                    key = outcome.partition(" ")[0]
                    report.outcomes[key] += 1
                    seen = report.examples.setdefault(key, [])
                    if len(seen) < 8:
                        seen.append(label)
                current = None
                if int(i) == len(items) - 1:
                    proc.wait()
                    return len(items)


def fuzz(count: int, seed: int = 0, children: int = 2, timeout: float = 10.0,
         engine: str | None = None) -> Report:
    """Build `count` mutants and run them split over `children` concurrent children, on
    `engine` (NEURONISH_ENGINE: native or numpy; None: the environment's choice)."""
    from concurrent.futures import ThreadPoolExecutor

    started = time.monotonic()
    items = mutants(seed_executables(), count, seed)
    shares = [items[k::children] for k in range(children)]
    reports = [Report() for _ in shares]
    with ThreadPoolExecutor(children) as pool:
        list(pool.map(lambda a: run_batch(a[0], timeout, a[1], engine), zip(shares, reports)))
    total = Report(seconds=time.monotonic() - started)
    for r in reports:
        total.total += r.total
        total.outcomes.update(r.outcomes)
        for k, v in r.examples.items():
            total.examples.setdefault(k, []).extend(v)
        for name in ("crashes", "hangs", "foreign", "leaks"):
            getattr(total, name).extend(getattr(r, name))
    return total
