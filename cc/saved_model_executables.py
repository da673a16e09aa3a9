"""The executables of a compiled SavedModel's `NeuronOp`s, without TensorFlow
(`neuronish-cc inspect MODEL_DIR`).

An executable is either inline (the op's `executable` attribute) or in
`assets/<sha256>.neff`, the attribute then holding
`neuronish-external:v1:<sha256>:<size>` (neuronish/external.py). Both are read
here; an external file is checked against its size and hash.

saved_model.pb is walked at the protobuf wire level, following only the fields
on the way to a NodeDef (TensorFlow's field numbers):

    SavedModel.meta_graphs = 2 -> MetaGraphDef.graph_def = 2 -> GraphDef.node = 1
                                                             GraphDef.library = 2
    FunctionDefLibrary.function = 1 -> FunctionDef.node_def = 3
    NodeDef: name = 1, op = 2, attr = 5 (map entry: key = 1, value = 2)
    AttrValue.s = 2   (the `executable` and `dynamic_shapes` attributes)

Everything else is skipped by its length, so a 2 GiB file costs no parsing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from neuronish.runtime.files import FileRefused, read_regular

MAX_SAVED_MODEL_BYTES = (2 << 30) - 1  # protobuf's limit for one message
_REFERENCE = re.compile(rb"neuronish-external:v1:([0-9a-f]{64}):(\d{1,15})")


class SavedModelReadError(ValueError):
    """saved_model.pb is not what a compiled SavedModel holds."""


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise SavedModelReadError("truncated or malformed varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: memoryview) -> Iterator[tuple[int, memoryview | int]]:
    """(field number, bytes or int) for every field of one message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise SavedModelReadError("a field runs past the end of its message")
            yield number, buf[pos:pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise SavedModelReadError(f"unsupported wire type {wire}")


def _sub(buf: memoryview, number: int) -> Iterator[memoryview]:
    for n, value in _fields(buf):
        if n == number and isinstance(value, memoryview):
            yield value


@dataclass
class NeuronOpExecutable:
    node: str            # the NeuronOp's name (in its function, if inside one)
    executable: bytes
    stored: str          # "inline" or the asset file's path
    free_dimensions: list[dict] = field(default_factory=list)  # see `_free_dimensions`


def _node_executable(node: memoryview) -> tuple[str, bytes, bytes] | None:
    """(name, executable attr, dynamic_shapes attr) of a NeuronOp node, else None."""
    name = op = ""
    strings: dict[bytes, memoryview] = {}
    for n, value in _fields(node):
        if n == 1 and isinstance(value, memoryview):
            name = bytes(value).decode(errors="replace")
        elif n == 2 and isinstance(value, memoryview):
            op = bytes(value).decode(errors="replace")
        elif n == 5 and isinstance(value, memoryview):
            entry = dict(_fields(value))
            key, attr = entry.get(1), entry.get(2)
            if isinstance(key, memoryview) and bytes(key) in (b"executable", b"dynamic_shapes"):
                strings[bytes(key)] = next(_sub(attr, 2), memoryview(b"")) \
                    if isinstance(attr, memoryview) else memoryview(b"")
    if op != "NeuronOp" or b"executable" not in strings:
        return None
    return name, bytes(strings[b"executable"]), bytes(strings.get(b"dynamic_shapes", b""))


def _free_dimensions(node: str, text: bytes) -> list[dict]:
    """The op's free dimensions from its `dynamic_shapes` attr (docs/contracts.md): one
    {"input", "axis", "low", "high", "from"} per free axis, in input order."""
    if not text:
        return []
    try:
        raw = json.loads(text)
        return [{"input": str(i["label"]), "axis": int(axis), "low": int(b[0]),
                 "high": int(b[1]), "from": str(b[2])}
                for i in raw["inputs"] for axis, b in sorted(i["free"].items(),
                                                             key=lambda kv: int(kv[0]))]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise SavedModelReadError(f"NeuronOp '{node}': its dynamic_shapes attr is not what "
                                  f"neuronish writes ({e})") from None


def neuron_op_executables(model_dir: str | Path) -> list[NeuronOpExecutable]:
    """Every NeuronOp's executable in the SavedModel at `model_dir`, external ones read
    from assets/ and checked. Raises SavedModelReadError or OSError."""
    root = Path(model_dir)
    data = memoryview(read_regular(root / "saved_model.pb", MAX_SAVED_MODEL_BYTES,
                                   "saved_model.pb"))
    found: list[NeuronOpExecutable] = []
    for meta in _sub(data, 2):
        for graph in _sub(meta, 2):
            nodes = list(_sub(graph, 1))
            for library in _sub(graph, 2):
                for function in _sub(library, 1):
                    nodes += list(_sub(function, 3))
            for node in nodes:
                got = _node_executable(node)
                if got is None:
                    continue
                name, value, dynamic = got
                free = _free_dimensions(name, dynamic)
                ref = _REFERENCE.fullmatch(value)
                if ref is None:
                    found.append(NeuronOpExecutable(name, value, "inline", free))
                    continue
                digest, size = ref.group(1).decode(), int(ref.group(2))
                path = root / "assets" / f"{digest}.neff"
                try:  # the size the reference declares, checked before reading
                    exe = read_regular(path, size, f"executable of NeuronOp '{name}' "
                                                   f"(declared {size} bytes)")
                except FileRefused as e:
                    raise SavedModelReadError(str(e)) from None
                if len(exe) != size or hashlib.sha256(exe).hexdigest() != digest:
                    raise SavedModelReadError(f"NeuronOp '{name}': {path} does not hash to the "
                                              "executable the op was compiled with (sha256 "
                                              "mismatch); the file is damaged or was replaced")
                found.append(NeuronOpExecutable(name, exe, str(path), free))
    return found


def inspect_saved_model(model_dir: Path, as_json: bool) -> int:
    """`neuronish-cc inspect MODEL_DIR`: each NeuronOp's executable, where it is stored,
    its signature and size. Exit 0, or 1 with a message when one cannot be read."""
    import json
    import sys

    from neuronish.runtime.errors import ExecutableError
    from neuronish.runtime.executable import describe, from_bytes

    try:
        found = neuron_op_executables(model_dir)
        infos = [{"node": f.node, "stored": f.stored, "bytes": len(f.executable),
                  **describe(from_bytes(f.executable)),
                  **({"free_dimensions": f.free_dimensions} if f.free_dimensions else {})}
                 for f in found]
    except (OSError, SavedModelReadError, ExecutableError) as e:
        print(f"neuronish-cc: error: {model_dir}: {e}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(infos, indent=1))
        return 0
    print(f"{model_dir}: {len(infos)} NeuronOp(s)")
    for info in infos:
        ins = ", ".join(f"{s['name']} {s['dtype']}{s['shape']}" for s in info["inputs"])
        outs = ", ".join(f"{s['name']} {s['dtype']}{s['shape']}" for s in info["outputs"])
        print(f"  {info['node']}: {info['bytes']} bytes, {info['stored']}\n"
              f"    inputs: {ins}\n    outputs: {outs}")
        if info.get("free_dimensions"):
            # The executable is the one compiled at the probe size; other sizes within
            # these bounds are compiled when first called (docs/saved-model-compile.md).
            free = ", ".join(f"{d['input']} axis {d['axis']}: {d['low']}..{d['high']} "
                             f"({d['from']})" for d in info["free_dimensions"])
            print(f"    free dimensions (compiled per size on first use): {free}")
    return 0
